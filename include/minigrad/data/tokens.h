// Token streams for language models, in llm.c's .bin format, and the (B, T) windows a GPT trains
// on (inputs and next-token targets).
//
//   mg::data::TokenFile f = mg::data::load_token_file("tiny_shakespeare_train.bin");   // validated
//   mg::data::TokenBatches batches(f.tokens, /*B=*/4, /*T=*/64);
//   mg::data::TokenBatch b = batches.next();          // b.x, b.y: int64 (4, 64); y is x shifted by one
//
// The file (llm.c, dev/data/data_common.py): a header of 256 little-endian int32, [0] = 20240520
// (the magic), [1] = 1 (the version: uint16 tokens), [2] = the number of tokens N; then N
// little-endian uint16 tokens. load_token_file checks all of it, and that the file holds exactly
// N tokens, and throws mg::Error naming the file and the problem otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/data/dataset.h>

namespace mg::data {

constexpr int32_t kTokenFileMagic = 20240520;
constexpr int32_t kTokenFileVersion = 1;

struct TokenFile {
  std::vector<uint16_t> tokens;
  uint16_t max_token() const;  // 0 for an empty stream
};

TokenFile load_token_file(const std::string& path);
// Writes tokens in that format, atomically (mg::write_file_atomic).
void save_token_file(const std::string& path, const std::vector<uint16_t>& tokens);

struct TokenBatch {
  Tensor x, y;  // int64 (B, T): tokens, and the token after each
};

// Consecutive windows of B * T + 1 tokens, as llm.c's DataLoader reads them: window k starts at
// (k * shards + shard) * B * T; a window that would run past the end starts over from the first
// (a new epoch). With shards > 1 (data parallelism, one shard per rank) the ranks read disjoint
// windows of the same stream. Tokens are checked against vocab_size (when > 0) as they are read.
class TokenBatches : public WindowData {
 public:
  TokenBatches(const std::vector<uint16_t>& tokens, int64_t batch, int64_t seq_len, int64_t shard = 0,
               int64_t shards = 1, int64_t vocab_size = 0);
  TokenBatch next(Device device = Device::cpu());
  // The next window cut into micro-batches of `micro` sequences in order, the last one the
  // remainder (B = 8, micro 3: 3, 3, 2): an optimizer step's micro-batches when the micro-batch
  // does not divide the sequences per step. The same tokens as next().
  std::vector<TokenBatch> next_split(int64_t micro, Device device = Device::cpu());
  // The window last read (by next or next_split) again, cut into micro-batches of `micro`: an
  // out-of-memory error redoes its window under a new plan (Note [recovering from out-of-memory]
  // in minigrad/optim/accumulate.h). Throws before the first window.
  std::vector<TokenBatch> split_last(int64_t micro, Device device = Device::cpu()) const;
  // WindowData: the rows of the window step `step` reads (the windows of an epoch in turn, as
  // next() reads them), without moving this reader. On the host.
  int64_t rows_per_window() const override { return b_; }
  Batch window_rows(int64_t step, int64_t first, int64_t count) const override;
  int64_t windows_per_epoch() const;
  int64_t epoch() const { return epoch_; }
  int64_t batch() const { return b_; }
  int64_t seq_len() const { return t_; }

 private:
  int64_t next_start();
  int64_t start_of(int64_t window) const;  // where this shard's window `window` of an epoch starts
  TokenBatch rows(int64_t start, int64_t count, Device device) const;
  const std::vector<uint16_t>& tokens_;
  int64_t b_, t_, shard_, shards_, vocab_;
  int64_t window_ = 0, epoch_ = 0;
  int64_t last_start_ = -1;  // the stream position of the window last read
};

}  // namespace mg::data
