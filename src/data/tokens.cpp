#include <minigrad/data/tokens.h>

#include <algorithm>
#include <cstring>

#include <minigrad/util/file.h>

#include "util/file.h"

namespace mg::data {

namespace {

int32_t le_int32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}

}  // namespace

uint16_t TokenFile::max_token() const {
  return tokens.empty() ? uint16_t{0} : *std::max_element(tokens.begin(), tokens.end());
}

TokenFile load_token_file(const std::string& path) {
  const std::string what = "token file '" + path + "'";
  ReadOnlyFile f = open_regular_file(path, what);
  constexpr size_t kHeader = 256 * sizeof(int32_t);
  MG_CHECK(f.size >= kHeader, what << ": " << f.size << " bytes, shorter than the 1024-byte header of llm.c's format");
  unsigned char header[kHeader];
  MG_CHECK(read_up_to(f, header, kHeader, what) == kHeader, what << ": the header ends early");
  const int32_t magic = le_int32(header), version = le_int32(header + 4), n = le_int32(header + 8);
  MG_CHECK(magic == kTokenFileMagic, what << ": magic " << magic << ", expected " << kTokenFileMagic
                                          << " (llm.c's .bin token format)");
  MG_CHECK(version == kTokenFileVersion, what << ": version " << version << ", expected " << kTokenFileVersion
                                              << " (uint16 tokens)");
  MG_CHECK(n >= 0, what << ": the header says " << n << " tokens");
  const uint64_t expected = kHeader + 2 * static_cast<uint64_t>(n);
  MG_CHECK(f.size == expected, what << ": the header says " << n << " tokens (" << expected << " bytes in all), the file has "
                                    << f.size << " bytes");
  TokenFile out;
  out.tokens.resize(static_cast<size_t>(n));
  std::vector<unsigned char> raw(2 * static_cast<size_t>(n));
  MG_CHECK(read_up_to(f, raw.data(), raw.size(), what) == raw.size(), what << ": the tokens end early");
  for (size_t i = 0; i < out.tokens.size(); ++i) {
    out.tokens[i] = static_cast<uint16_t>(raw[2 * i] | raw[2 * i + 1] << 8);
  }
  return out;
}

void save_token_file(const std::string& path, const std::vector<uint16_t>& tokens) {
  MG_CHECK(tokens.size() <= 0x7fffffffu, "save_token_file: " << tokens.size() << " tokens do not fit the int32 count");
  std::string bytes(1024 + 2 * tokens.size(), '\0');
  auto put32 = [&](size_t at, int32_t v) {
    for (int k = 0; k < 4; ++k) bytes[at + static_cast<size_t>(k)] = static_cast<char>((static_cast<uint32_t>(v) >> (8 * k)) & 0xff);
  };
  put32(0, kTokenFileMagic);
  put32(4, kTokenFileVersion);
  put32(8, static_cast<int32_t>(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i) {
    bytes[1024 + 2 * i] = static_cast<char>(tokens[i] & 0xff);
    bytes[1024 + 2 * i + 1] = static_cast<char>(tokens[i] >> 8);
  }
  mg::write_file_atomic(path, bytes);
}

TokenBatches::TokenBatches(const std::vector<uint16_t>& tokens, int64_t batch, int64_t seq_len, int64_t shard,
                           int64_t shards, int64_t vocab_size)
    : tokens_(tokens), b_(batch), t_(seq_len), shard_(shard), shards_(shards), vocab_(vocab_size) {
  MG_CHECK(batch >= 1 && seq_len >= 1, "TokenBatches: batch and sequence length must be >= 1, got " << batch << " and "
                                                                                                   << seq_len);
  MG_CHECK(shards >= 1 && shard >= 0 && shard < shards, "TokenBatches: shard " << shard << " of " << shards);
  const int64_t need = shards * batch * seq_len + 1;
  MG_CHECK(static_cast<int64_t>(tokens.size()) >= need,
           "TokenBatches: " << tokens.size() << " tokens, fewer than one step's " << need << " (" << shards << " x "
                            << batch << " x " << seq_len << " + 1); use a smaller batch or sequence length");
}

// Where the next window starts in the stream; a window that would run past the end starts a new epoch.
int64_t TokenBatches::next_start() {
  int64_t start = start_of(window_);
  if (window_ >= windows_per_epoch()) {  // this step's windows would run past the end
    window_ = 0;
    ++epoch_;
    start = start_of(0);
  }
  ++window_;
  last_start_ = start;
  return start;
}

TokenBatch TokenBatches::next(Device device) { return rows(next_start(), b_, device); }

int64_t TokenBatches::start_of(int64_t window) const { return (window * shards_ + shard_) * b_ * t_; }

int64_t TokenBatches::windows_per_epoch() const {
  return (static_cast<int64_t>(tokens_.size()) - 1) / (shards_ * b_ * t_);
}

Batch TokenBatches::window_rows(int64_t step, int64_t first, int64_t count) const {
  MG_CHECK(step >= 0 && first >= 0 && count >= 1 && first + count <= b_,
           "TokenBatches::window_rows: rows [" << first << ", " << first + count << ") of step " << step
                                               << "'s window of " << b_);
  const TokenBatch tb = rows(start_of(step % windows_per_epoch()) + first * t_, count, Device::cpu());
  Batch out;
  out.x = tb.x;
  out.y = tb.y;
  return out;
}

std::vector<TokenBatch> TokenBatches::next_split(int64_t micro, Device device) {
  MG_CHECK(micro >= 1, "TokenBatches::next_split: the micro-batch must be >= 1 sequence, got " << micro);
  next_start();
  return split_last(micro, device);
}

std::vector<TokenBatch> TokenBatches::split_last(int64_t micro, Device device) const {
  MG_CHECK(micro >= 1, "TokenBatches::split_last: the micro-batch must be >= 1 sequence, got " << micro);
  MG_CHECK(last_start_ >= 0, "TokenBatches::split_last: no window has been read yet");
  std::vector<TokenBatch> out;
  for (int64_t r = 0; r < b_; r += micro) out.push_back(rows(last_start_ + r * t_, std::min(micro, b_ - r), device));
  return out;
}

// `count` sequences of t_ tokens from stream position `start`, and the tokens after each.
TokenBatch TokenBatches::rows(int64_t start, int64_t count, Device device) const {
  const int64_t span = count * t_;
  std::vector<int64_t> x(static_cast<size_t>(span)), y(static_cast<size_t>(span));
  for (int64_t i = 0; i < span; ++i) {
    const int64_t a = tokens_[static_cast<size_t>(start + i)], b = tokens_[static_cast<size_t>(start + i + 1)];
    MG_CHECK(vocab_ <= 0 || (a < vocab_ && b < vocab_),
             "TokenBatches: token " << std::max(a, b) << " at position " << (a >= vocab_ ? start + i : start + i + 1)
                                    << " is outside the vocabulary of " << vocab_);
    x[static_cast<size_t>(i)] = a;
    y[static_cast<size_t>(i)] = b;
  }
  Tensor tx = Tensor::from_vector(x, {count, t_}), ty = Tensor::from_vector(y, {count, t_});
  if (device.is_cuda()) tx = tx.to(device), ty = ty.to(device);  // to() always copies: not for the host
  return {tx, ty};
}

}  // namespace mg::data
