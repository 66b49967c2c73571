// Batches of any Dataset (minigrad/data/dataset.h), in an order drawn from (seed, epoch), optionally one
// shard of it, assembled by a background thread and delivered on the model's device.
//
//   mg::Tensor images = mg::Tensor::full({1000, 1, 28, 28}, 0.5f);
//   mg::Tensor labels = mg::Tensor::from_vector(std::vector<int64_t>(1000, 3), {1000});
//   mg::data::TensorDataset train(images, labels);  // or an IdxDataset (minigrad/data/idx.h), ImageFolder, ...
//   mg::data::DataLoader loader(train, {.batch_size = 16, .seed = 1, .device = mg::Device::cpu()});
//   loader.start_epoch(/*epoch=*/0);
//   mg::data::Batch b;
//   while (loader.next(b)) { /* b.x: (B, 1, 28, 28) float32, b.y: (B) int64 */ }
//
// The loader borrows a data set passed by reference (it must outlive the loader: the prefetch
// thread reads it) and shares one passed as a std::shared_ptr.
//
// Note [batch-size independent order]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The order of samples in an epoch is
// epoch_permutation(size, seed, epoch), a pure function of (seed, epoch) computed with the
// counter-based Philox RNG; batch k is elements [k*B, (k+1)*B) of it. So every batch size walks
// the same sequence, and batch 16 x 4 accumulated sees exactly the samples of batch 64, in the
// same order, including the short last batch. Gradient accumulation's exactness
// (Note [accumulation normalises by samples], minigrad/optim/accumulate.h) depends on it.
//
// Note [shards]
// ~~~~~~~~~~~~~
// With num_shards = W, shard s walks positions s, s + W, s + 2W, ... of that order,
// batched as above. The W shards of an epoch partition the data set (each sample in exactly one),
// their sizes differ by at most one, and so can their numbers of batches. Batch k of all W shards
// together holds exactly batch k of one unsharded loader with batch size W * B (positions
// [k*W*B, (k+1)*W*B), the short last batch included): W data-parallel workers see what one worker
// with W times the batch sees, as accumulation does. drop_last drops each shard's own short batch.
//
// Note [loader host buffers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The prefetch thread (Note [reading ahead] in src/data/ahead.h) has Dataset::read_batch write
// into host vectors, not tensors; next() makes the batch's tensors on the caller's thread. So
// batches waiting in the queue never show in memory_stats (only the batch handed out does).
// Batches for CUDA are copied from these ordinary host vectors with Tensor::to(), on the device's
// stream, when next() hands them out. mg::Trainer reads its micro-batches its own way, into
// page-locked buffers, and copies the next one on the copy stream while one computes (Note
// [prefetched micro-batches] in minigrad/train/trainer.h); a loop of one's own over a DataLoader
// does not.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/data/dataset.h>

namespace mg::data {

struct LoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  bool flatten = false;           // x as (B, sample numel), e.g. (B, 784) instead of (B, 1, 28, 28)
  Device device = Device::cpu();
  int prefetch = 2;               // batches assembled ahead (0: no background thread)
  int64_t shard = 0;              // this loader's part of every epoch, 0 <= shard < num_shards
  int64_t num_shards = 1;         // (Note [shards])
};

// The sample order of an epoch (Note [batch-size independent order]): Fisher-Yates driven by
// philox_u32 under a key mixed from (seed, epoch).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

template <class T> class ReadAhead;  // src/data/ahead.h

class DataLoader {
 public:
  // Borrows `data`, which must outlive the loader.
  DataLoader(const Dataset& data, LoaderOptions opts);
  DataLoader(const Dataset&& data, LoaderOptions opts) = delete;  // would dangle: pass a shared_ptr
  // Shares ownership of `data`.
  DataLoader(std::shared_ptr<const Dataset> data, LoaderOptions opts);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Begins epoch `epoch` (any order; epochs are independent), skipping the first `skip_batches`
  // batches (to resume mid-epoch). Stops a previous epoch's prefetching.
  void start_epoch(int64_t epoch, int64_t skip_batches = 0);
  // The next batch of the current epoch; false at its end.
  bool next(Batch& out);
  // Batches of `batch_size` from the next start_epoch on (which must follow): the epoch's sample
  // order does not depend on the batch size, so start_epoch(epoch, first_sample / batch_size)
  // continues an epoch at first_sample (a multiple of it) with smaller batches
  // (Note [recovering from out-of-memory] in minigrad/optim/accumulate.h).
  void set_batch_size(int64_t batch_size);

  int64_t num_batches() const;  // per epoch (of this shard)
  int64_t num_samples() const;  // per epoch (of this shard; fewer with drop_last)
  int64_t epoch() const { return epoch_; }
  const LoaderOptions& options() const { return opts_; }
  const Dataset& dataset() const { return *data_; }

 private:
  struct HostBatch {
    std::vector<float> x;
    std::vector<int64_t> y;
    int64_t index = 0;
  };
  HostBatch assemble(int64_t batch_index) const;

  std::shared_ptr<const Dataset> data_;  // owning or not (see the constructors)
  LoaderOptions opts_;
  Shape sample_shape_;
  int64_t shard_size_ = 0;      // this shard's samples per epoch, before drop_last
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;  // this shard's samples in this epoch's order
  int64_t next_batch_ = 0, end_batch_ = 0;
  std::unique_ptr<ReadAhead<HostBatch>> ahead_;  // the prefetch thread (Note [reading ahead])
};

}  // namespace mg::data
