// Batches of a Dataset, shuffled, normalised, assembled by a background thread and delivered on
// the model's device.
//
//   mg::data::DataLoader loader(train, {.batch_size = 16, .seed = 1, .device = mg::Device::cpu()});
//   loader.start_epoch(epoch);
//   mg::data::Batch b;
//   while (loader.next(b)) { /* b.x: (B, 1, 28, 28) float32, b.y: (B) int64 */ }
//
// Note [batch-size independent order]: the order of samples in an epoch is
// epoch_permutation(size, seed, epoch), a pure function of (seed, epoch) computed with the
// counter-based Philox RNG; batch k is elements [k*B, (k+1)*B) of it. So every batch size walks
// the same sequence, and batch 16 x 4 accumulated sees exactly the samples of batch 64, in the
// same order, including the short last batch. Gradient accumulation's exactness
// (Note [accumulation normalises by samples], minigrad/optim/accumulate.h) depends on it.
//
// Pinned host memory: the library has no page-locked allocation API yet, so batches for CUDA are
// assembled in ordinary host memory and copied with Tensor::to().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/data/dataset.h>

namespace mg::data {

struct LoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  bool flatten = false;           // x as (B, 784) instead of (B, 1, 28, 28)
  Device device = Device::cpu();
  int prefetch = 2;               // batches assembled ahead (0: no background thread)
};

struct Batch {
  Tensor x, y;
  int64_t index = 0;  // batch number within the epoch
  int64_t size() const { return y.defined() ? y.size(0) : 0; }
};

// The sample order of an epoch (Note [batch-size independent order]): Fisher-Yates driven by
// philox_u32 under a key mixed from (seed, epoch).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

// Keeps a reference to `data`, which must outlive the loader.
class DataLoader {
 public:
  DataLoader(const Dataset& data, LoaderOptions opts);
  DataLoader(Dataset&& data, LoaderOptions opts) = delete;  // would dangle
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Begins epoch `epoch` (any order; epochs are independent), skipping the first `skip_batches`
  // batches (to resume mid-epoch). Stops a previous epoch's prefetching.
  void start_epoch(int64_t epoch, int64_t skip_batches = 0);
  // The next batch of the current epoch; false at its end.
  bool next(Batch& out);

  int64_t num_batches() const;  // per epoch
  int64_t num_samples() const;  // per epoch (less than size() with drop_last)
  int64_t epoch() const { return epoch_; }
  const LoaderOptions& options() const { return opts_; }
  const Dataset& dataset() const { return data_; }

 private:
  struct HostBatch {
    std::vector<float> x;
    std::vector<int64_t> y;
    int64_t index = 0;
  };
  HostBatch assemble(int64_t batch_index) const;
  void stop_worker();
  void worker_loop(int64_t first, int64_t end);

  const Dataset& data_;
  LoaderOptions opts_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
  int64_t next_batch_ = 0, end_batch_ = 0;

  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<HostBatch> queue_;
  bool stop_ = false;
  bool worker_failed_ = false;
  std::string worker_error_;
};

}  // namespace mg::data
