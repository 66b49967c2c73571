#include "core/allocator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include <minigrad/core/error.h>
#include <minigrad/util/bytes.h>

namespace mg {

bool StatsCounter::try_alloc(size_t bytes, size_t* peak_before) {
  std::lock_guard<std::mutex> lock(mu_);
  if (limit_ != 0 && (bytes > limit_ || s_.in_use > limit_ - bytes)) return false;
  *peak_before = s_.peak_in_use;
  s_.in_use += bytes;
  s_.peak_in_use = std::max(s_.peak_in_use, s_.in_use);
  most_in_use_ = std::max(most_in_use_, s_.in_use);
  s_.alloc_count++;
  return true;
}

void StatsCounter::cancel_alloc(size_t bytes, size_t peak_before) {
  std::lock_guard<std::mutex> lock(mu_);
  // The peak this allocation set goes (another thread's allocation since may keep it higher).
  if (s_.peak_in_use == s_.in_use) s_.peak_in_use = std::max(peak_before, s_.in_use - bytes);
  s_.in_use -= bytes;
  s_.alloc_count--;
}

void StatsCounter::set_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = bytes;
}

size_t StatsCounter::limit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limit_;
}

std::string exact_bytes(size_t n) {
  std::string s = format_bytes(n);
  return n < 1024 ? s : s + " (" + std::to_string(n) + " bytes)";
}

const char* const kOutOfMemoryHint =
    "---> HINT: hold less per step: gradient accumulation (minigrad/optim/accumulate.h: smaller "
    "micro-batches, the same gradients), gradient checkpointing (mg::checkpoint in "
    "minigrad/core/checkpoint.h, or a memory budget plan that picks the segments to drop: "
    "mg::nn::make_plan(cost, \"budget=...\") in minigrad/nn/checkpoint_plan.h), or a smaller batch.";

void throw_over_limit(const std::string& device, size_t nbytes, const MemoryStats& s, size_t limit) {
  std::ostringstream os;
  os << device << " out of memory: tried to allocate " << exact_bytes(nbytes) << " with "
     << exact_bytes(s.in_use) << " in use and " << exact_bytes(s.reserved)
     << " reserved; the memory limit is " << exact_bytes(limit) << " (mg::set_memory_limit).\n"
     << kOutOfMemoryHint;
  throw OutOfMemoryError(os.str(), nbytes);
}

void StatsCounter::on_alloc(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  s_.in_use += bytes;
  s_.peak_in_use = std::max(s_.peak_in_use, s_.in_use);
  most_in_use_ = std::max(most_in_use_, s_.in_use);
  s_.alloc_count++;
}

void StatsCounter::on_free(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  s_.in_use -= bytes;
}

void StatsCounter::on_reserve(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  s_.reserved += bytes;
  s_.peak_reserved = std::max(s_.peak_reserved, s_.reserved);
  s_.system_alloc_count++;
}

void StatsCounter::on_release(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  s_.reserved -= bytes;
}

MemoryStats StatsCounter::get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_;
}

void StatsCounter::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  s_.peak_in_use = s_.in_use;
  s_.peak_reserved = s_.reserved;
}

size_t StatsCounter::most_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return most_in_use_;
}

namespace {

constexpr size_t kAlign = 64;

// Below nbytes when nbytes + kAlign - 1 overflows.
size_t rounded_size(size_t nbytes) { return (nbytes + kAlign - 1) / kAlign * kAlign; }

// Note [reusing large CPU blocks]: nothing is kept under AddressSanitizer.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kKeepBlocks = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kKeepBlocks = false;
#else
constexpr bool kKeepBlocks = true;
#endif
#else
constexpr bool kKeepBlocks = true;
#endif

}  // namespace

void* CpuAllocator::take_cached(size_t rounded) {
  if (!kKeepBlocks || rounded < kCacheMin) return nullptr;
  std::lock_guard<std::mutex> lock(cache_mu_);
  auto it = cache_.find(rounded);
  if (it == cache_.end()) return nullptr;
  void* p = it->second;
  cache_.erase(it);
  cached_bytes_ -= rounded;
  return p;
}

void* CpuAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  size_t peak_before = 0;
  if (!stats_.try_alloc(nbytes, &peak_before)) throw_over_limit("cpu", nbytes, stats_.get(), stats_.limit());
  const size_t rounded = rounded_size(nbytes);
  void* p = nullptr;
  if (rounded >= nbytes) {  // otherwise the size overflowed: out of memory below
    if ((p = take_cached(rounded)) != nullptr) return p;
    p = std::aligned_alloc(kAlign, rounded);
    // Kept blocks of other sizes back to the system, then once more.
    if (p == nullptr && release_kept()) p = std::aligned_alloc(kAlign, rounded);
  }
  if (p == nullptr) {
    stats_.cancel_alloc(nbytes, peak_before);
    std::ostringstream os;
    os << "cpu out of memory: the system could not allocate " << exact_bytes(nbytes) << " ("
       << exact_bytes(stats_.get().in_use) << " in use by libminigrad).\n" << kOutOfMemoryHint;
    throw OutOfMemoryError(os.str(), nbytes);
  }
  stats_.on_reserve(rounded);
  return p;
}

void CpuAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  stats_.on_free(nbytes);
  const size_t rounded = rounded_size(nbytes);
  if (kKeepBlocks && rounded >= kCacheMin) {
    const size_t most = stats_.most_in_use();
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cached_bytes_ + rounded <= most) {
      cache_.emplace(rounded, ptr);
      cached_bytes_ += rounded;
      return;
    }
  }
  std::free(ptr);
  stats_.on_release(rounded);
}

void CpuAllocator::empty_cache() { release_kept(); }

bool CpuAllocator::release_kept() {
  std::multimap<size_t, void*> kept;
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    kept.swap(cache_);
    cached_bytes_ = 0;
  }
  for (const auto& [size, p] : kept) {
    std::free(p);
    stats_.on_release(size);
  }
  return !kept.empty();
}

// In use, plus what the system could still give: MemAvailable of /proc/meminfo (free memory and
// the page cache the kernel would reclaim), or free pages where that file cannot be read.
size_t CpuAllocator::capacity() {
  size_t available = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  if (available == 0) available = static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t reachable = stats_.get().in_use + available;
  const size_t cap = stats_.limit();
  return cap != 0 && cap < reachable ? cap : reachable;
}

namespace {

// The host pool (minigrad/core/memory.h): page-locked blocks where CUDA can give them, aligned
// ordinary ones otherwise, chosen by the first allocation. Every freed block is kept by its
// rounded size: the next step offloads the same sizes, and a page-locked allocation is slow.
class HostPool final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    size_t peak_before = 0;
    if (!stats_.try_alloc(nbytes, &peak_before)) throw_over_limit("host pool", nbytes, stats_.get(), stats_.limit());
    const size_t rounded = rounded_size(nbytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = kept_.find(rounded); it != kept_.end()) {
        void* p = it->second;
        kept_.erase(it);
        return p;
      }
      if (pinned_ < 0) pinned_ = probe_pinned() ? 1 : 0;
    }
    void* p = nullptr;
    if (rounded >= nbytes) p = pinned_ == 1 ? cuda_host_alloc(rounded) : std::aligned_alloc(kAlign, rounded);
    if (p == nullptr) {
      stats_.cancel_alloc(nbytes, peak_before);
      std::ostringstream os;
      os << "host pool out of memory: the system could not allocate " << exact_bytes(nbytes) << " ("
         << exact_bytes(stats_.get().in_use) << " offloaded already). Offload less: a smaller batch, "
         << "or set_host_memory_limit so that the planner recomputes instead.";
      throw OutOfMemoryError(os.str(), nbytes);
    }
    stats_.on_reserve(rounded);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    stats_.on_free(nbytes);
    if (!kKeepBlocks) {  // Note [reusing large CPU blocks]: nothing kept under AddressSanitizer
      release(ptr);
      stats_.on_release(rounded_size(nbytes));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    kept_.emplace(rounded_size(nbytes), ptr);
  }
  MemoryStats stats() const override { return stats_.get(); }
  void reset_peak() override { stats_.reset_peak(); }
  void empty_cache() override {
    std::multimap<size_t, void*> kept;
    {
      std::lock_guard<std::mutex> lock(mu_);
      kept.swap(kept_);
    }
    for (const auto& [size, p] : kept) {
      release(p);
      stats_.on_release(size);
    }
  }
  void set_limit(size_t bytes) override { stats_.set_limit(bytes); }
  size_t limit() const override { return stats_.limit(); }
  size_t capacity() override { return allocator_for(Device::cpu()).capacity(); }

 private:
  void release(void* p) const {
    if (pinned_ == 1) cuda_host_free(p);
    else std::free(p);
  }
  // cuda_host_alloc(0) is null even with a device; ask for one page to learn whether it works.
  static bool probe_pinned() {
    void* p = cuda_host_alloc(4096);
    if (p == nullptr) return false;
    cuda_host_free(p);
    return true;
  }
  StatsCounter stats_;
  std::mutex mu_;
  std::multimap<size_t, void*> kept_;
  int pinned_ = -1;  // unknown until the first allocation
};

}  // namespace

Allocator& host_pool() {
  static HostPool* pool = new HostPool;  // leaked: offloaded tensors may outlive other statics
  return *pool;
}

MemoryStats host_memory_stats() { return host_pool().stats(); }
void reset_host_peak_memory_stats() { host_pool().reset_peak(); }
void set_host_memory_limit(size_t bytes) { host_pool().set_limit(bytes); }
size_t host_memory_limit() { return host_pool().limit(); }
void host_empty_cache() { host_pool().empty_cache(); }

Allocator& allocator_for(Device d) {
  if (d.is_cpu()) {
    static CpuAllocator cpu;
    return cpu;
  }
  return cuda_allocator(d.index);
}

MemoryStats memory_stats(Device d) { return allocator_for(d).stats(); }
void reset_peak_memory_stats(Device d) { allocator_for(d).reset_peak(); }
void empty_cache(Device d) { allocator_for(d).empty_cache(); }
void set_memory_limit(Device d, size_t bytes) { allocator_for(d).set_limit(bytes); }
size_t memory_limit(Device d) { return allocator_for(d).limit(); }
size_t memory_capacity(Device d) { return allocator_for(d).capacity(); }

}  // namespace mg
