#include <minigrad/data/loader.h>

#include <cstring>
#include <exception>

#include <minigrad/core/rng.h>

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

DataLoader::DataLoader(const Dataset& data, LoaderOptions opts) : data_(data), opts_(opts) {
  MG_CHECK(opts.batch_size > 0, "DataLoader: batch size must be > 0, got " << opts.batch_size);
  MG_CHECK(opts.prefetch >= 0, "DataLoader: prefetch must be >= 0, got " << opts.prefetch);
  MG_CHECK(data.size() > 0, "DataLoader: empty data set");
  MG_CHECK(!opts.drop_last || data.size() >= opts.batch_size,
           "DataLoader: drop_last with batch size " << opts.batch_size << " leaves no batch of a data set of "
                                                    << data.size());
}

DataLoader::~DataLoader() { stop_worker(); }

int64_t DataLoader::num_batches() const {
  const int64_t n = data_.size(), b = opts_.batch_size;
  return opts_.drop_last ? n / b : (n + b - 1) / b;
}

int64_t DataLoader::num_samples() const {
  return opts_.drop_last ? num_batches() * opts_.batch_size : data_.size();
}

DataLoader::HostBatch DataLoader::assemble(int64_t k) const {
  const int64_t b0 = k * opts_.batch_size;
  const int64_t b1 = std::min(b0 + opts_.batch_size, data_.size());
  const int64_t f = data_.features();
  HostBatch h;
  h.index = k;
  h.x.resize(static_cast<size_t>((b1 - b0) * f));
  h.y.resize(b1 - b0);
  for (int64_t i = b0; i < b1; ++i) {
    const int64_t s = order_[i];
    data_.normalized_image(s, h.x.data() + (i - b0) * f);
    h.y[i - b0] = data_.labels()[s];
  }
  return h;
}

void DataLoader::worker_loop(int64_t first, int64_t end) {
  try {
    for (int64_t k = first; k < end; ++k) {
      HostBatch h = assemble(k);
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || static_cast<int>(queue_.size()) < opts_.prefetch; });
      if (stop_) return;
      queue_.push_back(std::move(h));
      cv_.notify_all();
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lk(mu_);
    worker_failed_ = true;
    worker_error_ = e.what();
    cv_.notify_all();
  }
}

void DataLoader::stop_worker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
  queue_.clear();
  stop_ = false;
  worker_failed_ = false;
}

void DataLoader::start_epoch(int64_t epoch, int64_t skip_batches) {
  MG_CHECK(epoch >= 0, "DataLoader::start_epoch: epoch " << epoch);
  MG_CHECK(skip_batches >= 0 && skip_batches <= num_batches(),
           "DataLoader::start_epoch: cannot skip " << skip_batches << " of " << num_batches() << " batches");
  stop_worker();
  epoch_ = epoch;
  if (opts_.shuffle) {
    order_ = epoch_permutation(data_.size(), opts_.seed, epoch);
  } else {
    order_.resize(data_.size());
    for (int64_t i = 0; i < data_.size(); ++i) order_[i] = i;
  }
  next_batch_ = skip_batches;
  end_batch_ = num_batches();
  if (opts_.prefetch > 0) worker_ = std::thread(&DataLoader::worker_loop, this, next_batch_, end_batch_);
}

bool DataLoader::next(Batch& out) {
  MG_CHECK(epoch_ >= 0, "DataLoader::next: call start_epoch(epoch) first");
  if (next_batch_ >= end_batch_) return false;
  HostBatch h;
  if (opts_.prefetch > 0) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !queue_.empty() || worker_failed_; });
    if (queue_.empty()) MG_FAIL("DataLoader: the prefetch thread failed: " << worker_error_);
    h = std::move(queue_.front());
    queue_.pop_front();
    cv_.notify_all();
  } else {
    h = assemble(next_batch_);
  }
  MG_CHECK(h.index == next_batch_, "DataLoader: internal error, batch " << h.index << " came for " << next_batch_);
  ++next_batch_;
  const int64_t b = static_cast<int64_t>(h.y.size());
  Shape xs = opts_.flatten ? Shape{b, data_.features()} : Shape{b, 1, data_.rows(), data_.cols()};
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
