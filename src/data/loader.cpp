#include <minigrad/data/loader.h>

#include <algorithm>
#include <cstring>
#include <span>

#include <minigrad/core/rng.h>

#include "data/ahead.h"

namespace mg::data {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  MG_CHECK(n >= 0, "epoch_permutation: n = " << n);
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  const uint64_t key = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(epoch) + 0x0E90C4ull));
  for (int64_t i = n - 1; i > 0; --i) {
    // 64 random bits -> [0, i] by multiply-shift; bias < 2^-32 for any data set that fits in memory.
    const uint64_t r = (uint64_t{philox_u32(key, 2 * i)} << 32) | philox_u32(key, 2 * i + 1);
    const uint64_t j = static_cast<uint64_t>((static_cast<unsigned __int128>(r) * (i + 1)) >> 64);
    std::swap(p[i], p[j]);
  }
  return p;
}

// The reference constructor borrows: an aliasing shared_ptr that owns nothing.
DataLoader::DataLoader(const Dataset& data, LoaderOptions opts)
    : DataLoader(std::shared_ptr<const Dataset>(std::shared_ptr<const Dataset>(), &data), opts) {}

DataLoader::DataLoader(std::shared_ptr<const Dataset> data, LoaderOptions opts)
    : data_(std::move(data)), opts_(opts), ahead_(std::make_unique<ReadAhead<HostBatch>>()) {
  MG_CHECK(data_ != nullptr, "DataLoader: no data set (a null shared_ptr)");
  MG_CHECK(opts.batch_size > 0, "DataLoader: batch size must be > 0, got " << opts.batch_size);
  MG_CHECK(opts.prefetch >= 0, "DataLoader: prefetch must be >= 0, got " << opts.prefetch);
  MG_CHECK(opts.num_shards >= 1 && opts.shard >= 0 && opts.shard < opts.num_shards,
           "DataLoader: shard " << opts.shard << " of " << opts.num_shards
                                << ": expected num_shards >= 1 and 0 <= shard < num_shards");
  const int64_t n = data_->size();
  MG_CHECK(n > 0, "DataLoader: empty data set");
  // Written so that no sum can overflow, whatever the options (a batch size of INT64_MAX is one
  // batch of everything).
  shard_size_ = n / opts.num_shards + (opts.shard < n % opts.num_shards ? 1 : 0);
  MG_CHECK(shard_size_ > 0, "DataLoader: shard " << opts.shard << " of " << opts.num_shards
                                                 << " is empty: the data set has " << n << " samples");
  MG_CHECK(!opts.drop_last || shard_size_ >= opts.batch_size,
           "DataLoader: drop_last with batch size " << opts.batch_size << " leaves no batch of a data set of "
                                                    << shard_size_ << (opts.num_shards > 1 ? " (this shard's)" : ""));
  sample_shape_ = data_->sample_shape();
}

DataLoader::~DataLoader() = default;  // ahead_ stops its thread first

void DataLoader::set_batch_size(int64_t batch_size) {
  MG_CHECK(batch_size > 0, "DataLoader::set_batch_size: batch size must be > 0, got " << batch_size);
  MG_CHECK(!opts_.drop_last || shard_size_ >= batch_size,
           "DataLoader::set_batch_size: drop_last with batch size " << batch_size << " leaves no batch of a data set of "
                                                                    << shard_size_);
  ahead_->stop();
  opts_.batch_size = batch_size;
  epoch_ = -1;  // start_epoch again: the order is the same (Note [batch-size independent order])
}

int64_t DataLoader::num_batches() const {
  const int64_t n = shard_size_, b = opts_.batch_size;
  return opts_.drop_last ? n / b : n / b + (n % b != 0 ? 1 : 0);
}

int64_t DataLoader::num_samples() const {
  return opts_.drop_last ? num_batches() * opts_.batch_size : shard_size_;
}

DataLoader::HostBatch DataLoader::assemble(int64_t k) const {
  const int64_t b0 = k * opts_.batch_size;
  const int64_t b1 = b0 + std::min(opts_.batch_size, shard_size_ - b0);
  const std::span<const int64_t> indices(order_.data() + b0, static_cast<size_t>(b1 - b0));
  HostBatch h;
  h.index = k;
  h.x.resize(indices.size() * static_cast<size_t>(shape_numel(sample_shape_)));
  h.y.resize(indices.size());
  data_->read_batch(indices, epoch_, h.x, h.y);
  return h;
}

void DataLoader::start_epoch(int64_t epoch, int64_t skip_batches) {
  MG_CHECK(epoch >= 0, "DataLoader::start_epoch: epoch " << epoch);
  MG_CHECK(skip_batches >= 0 && skip_batches <= num_batches(),
           "DataLoader::start_epoch: cannot skip " << skip_batches << " of " << num_batches() << " batches");
  ahead_->stop();
  epoch_ = epoch;
  const int64_t n = data_->size();
  std::vector<int64_t> all;
  if (opts_.shuffle) {
    all = epoch_permutation(n, opts_.seed, epoch);
  } else {
    all.resize(n);
    for (int64_t i = 0; i < n; ++i) all[i] = i;
  }
  if (opts_.num_shards == 1) {
    order_ = std::move(all);
  } else {  // Note [shards]
    order_.resize(shard_size_);
    for (int64_t j = 0; j < shard_size_; ++j) order_[j] = all[opts_.shard + j * opts_.num_shards];
  }
  next_batch_ = skip_batches;
  end_batch_ = num_batches();
  // Note [reading ahead]: batches assembled on a thread (prefetch > 0), a read error rethrown by
  // the next() that would have read it.
  ahead_->start(end_batch_ - next_batch_, opts_.prefetch, [this, first = next_batch_](int64_t i) { return assemble(first + i); });
}

bool DataLoader::next(Batch& out) {
  MG_CHECK(epoch_ >= 0, "DataLoader::next: call start_epoch(epoch) first");
  if (next_batch_ >= end_batch_) return false;
  HostBatch h = ahead_->take();
  MG_CHECK(h.index == next_batch_, "DataLoader: internal error, batch " << h.index << " came for " << next_batch_);
  ++next_batch_;
  const int64_t b = static_cast<int64_t>(h.y.size());
  Shape xs{b};
  if (opts_.flatten) {
    xs.push_back(shape_numel(sample_shape_));
  } else {
    xs.insert(xs.end(), sample_shape_.begin(), sample_shape_.end());
  }
  Tensor x = Tensor::empty(xs);
  std::memcpy(x.data<float>(), h.x.data(), h.x.size() * sizeof(float));
  Tensor y = Tensor::from_vector(h.y, {b});
  if (opts_.device.is_cuda()) {
    x = x.to(opts_.device);
    y = y.to(opts_.device);
  }
  out.x = x;
  out.y = y;
  out.index = h.index;
  return true;
}

}  // namespace mg::data
