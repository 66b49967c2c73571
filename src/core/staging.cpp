// BatchStage and its host buffers (Note [staged batches] in src/core/staging.h).
#include "core/staging.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_set>
#include <utility>

#include "core/allocator.h"
#include "core/tape.h"

namespace mg {

// Host blocks by rounded size. A block goes back here when its buffer is destroyed and is freed
// with the pool: batches come in a few sizes, and freeing page-locked memory waits for the device.
struct StagingPool {
  explicit StagingPool(bool pinned) : pinned(pinned) {}
  ~StagingPool() {
    for (const auto& [size, p] : free) {
      if (locked.count(p)) cuda_host_free(p);
      else std::free(p);
    }
  }
  const bool pinned;
  std::mutex mu;
  std::multimap<size_t, void*> free;
  std::unordered_set<void*> locked;  // the page-locked ones (cudaHostAlloc may refuse: then ordinary)
};

namespace {

constexpr size_t kPage = 4096;

}  // namespace

HostBuffer::HostBuffer(std::shared_ptr<StagingPool> pool, void* data, size_t bytes)
    : pool_(std::move(pool)), data_(data), bytes_(bytes) {}

HostBuffer::~HostBuffer() { release(); }

HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : pool_(std::move(o.pool_)), data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = std::move(o.pool_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void HostBuffer::release() noexcept {
  if (data_ != nullptr && pool_) {
    std::lock_guard<std::mutex> lock(pool_->mu);
    pool_->free.emplace(bytes_, data_);
  }
  data_ = nullptr;
  pool_.reset();
}

BatchStage::BatchStage(Device device) : device_(device), pool_(std::make_shared<StagingPool>(device.is_cuda())) {}

BatchStage::~BatchStage() {
  try {
    clear();
    retire(/*wait=*/true);
  } catch (...) {  // a device error at the end of a run: the error that ended it is the one to see
  }
}

HostBuffer BatchStage::host_buffer(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  {
    std::lock_guard<std::mutex> lock(pool_->mu);
    // The smallest kept block that fits, unless it is more than twice the size (the last, shorter
    // batch of an epoch must not take a full one's block for good).
    auto it = pool_->free.lower_bound(rounded);
    if (it != pool_->free.end() && it->first <= 2 * rounded) {
      HostBuffer b(pool_, it->second, it->first);
      pool_->free.erase(it);
      return b;
    }
  }
  void* p = pool_->pinned ? cuda_host_alloc_on(rounded, device_.index) : nullptr;
  const bool locked = p != nullptr;
  if (p == nullptr) p = std::aligned_alloc(kPage, rounded);
  if (p == nullptr) {
    throw OutOfMemoryError("host memory for a batch on its way to " + device_.str() + ": the system could not allocate " +
                               exact_bytes(rounded),
                           rounded);
  }
  if (locked) {
    std::lock_guard<std::mutex> lock(pool_->mu);
    pool_->locked.insert(p);
  }
  return HostBuffer(pool_, p, rounded);
}

void BatchStage::reserve(int64_t id, const std::vector<Spec>& specs) {
  clear();
  retire(false);
  std::vector<Tensor> tensors;
  for (const Spec& s : specs) tensors.push_back(Tensor::empty(s.shape, TensorOptions{s.dtype, device_}));
  if (device_.is_cuda()) mark_ = cuda_stage_mark(device_.index);
  tensors_ = std::move(tensors);
  specs_ = specs;
  id_ = id;
  reserved_ = true;
  sent_ = false;
}

void BatchStage::send(std::vector<HostBuffer> host) {
  MG_CHECK(reserved_ && !sent_, "BatchStage::send: no batch reserved, or it was sent already");
  MG_CHECK(host.size() == specs_.size(), "BatchStage::send: " << host.size() << " host buffers for " << specs_.size() << " tensors");
  std::vector<StageCopy> copies;
  for (size_t i = 0; i < host.size(); ++i) {
    const size_t n = specs_[i].nbytes();
    MG_CHECK(host[i].size() >= n, "BatchStage::send: a host buffer of " << host[i].size() << " bytes for a tensor of "
                                                                          << n << " bytes (" << shape_str(specs_[i].shape) << ")");
    if (n > 0) copies.push_back({tensors_[i].raw_data(), host[i].data(), n});
  }
  if (device_.is_cuda()) {
    done_ = cuda_stage_copy(device_.index, std::exchange(mark_, nullptr), copies.data(), copies.size());
  } else {
    for (const StageCopy& c : copies) std::memcpy(c.dst, c.src, c.nbytes);
  }
  host_ = std::move(host);
  sent_ = true;
}

std::vector<Tensor> BatchStage::take(int64_t id) {
  MG_CHECK(reserved_ && sent_ && id_ == id, "BatchStage::take: batch " << id << " is not staged (holding "
                                                << (reserved_ ? std::to_string(id_) : std::string("none"))
                                                << (reserved_ && !sent_ ? ", not sent" : "") << ")");
  if (done_ != nullptr) cuda_stage_join(device_.index, done_);
  in_flight_.push_back({std::move(host_), std::exchange(done_, nullptr)});
  std::vector<Tensor> out = std::move(tensors_);
  tensors_.clear();
  host_.clear();
  reserved_ = sent_ = false;
  id_ = -1;
  retire(false);
  return out;
}

void BatchStage::clear() {
  if (!reserved_) return;
  if (done_ != nullptr) cuda_stage_join(device_.index, done_);  // before its memory can go to anyone
  if (mark_ != nullptr) cuda_event_free(std::exchange(mark_, nullptr));
  if (!host_.empty() || done_ != nullptr) in_flight_.push_back({std::move(host_), std::exchange(done_, nullptr)});
  tensors_.clear();
  host_.clear();
  specs_.clear();
  reserved_ = sent_ = false;
  id_ = -1;
}

void BatchStage::retire(bool wait) {
  std::vector<InFlight> left;
  for (InFlight& f : in_flight_) {
    if (f.done != nullptr) {
      if (wait) {
        cuda_offload_wait(std::exchange(f.done, nullptr));  // waits, then frees the event
      } else if (cuda_event_done(f.done)) {
        cuda_event_free(std::exchange(f.done, nullptr));
      }
    }
    if (f.done == nullptr) {
      f.host.clear();  // back to the pool
    } else {
      left.push_back(std::move(f));
    }
  }
  in_flight_ = std::move(left);
}

}  // namespace mg
