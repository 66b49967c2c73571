// The block logic of the CUDA caching allocator, written against an abstract "system allocator"
// so it runs (and is tested) on machines without a GPU: tests/test_cuda_allocator_logic.cpp
// drives it with a fake system; src/kernels/cuda/allocator.cu with cudaMalloc/cudaFree.
//
//   struct System {                    // what BlockPool needs from below
//     void* malloc(size_t bytes);      // nullptr when out of memory (other failures throw)
//     void free(void* p);
//     SystemMemInfo mem_info();        // free and total bytes of the device
//     std::string name();              // "cuda:0", for messages
//   };
//   mg::cuda::BlockPool<System> pool(System{...});
//   void* p = pool.allocate(1000);     // a 1024-byte block of a 2 MiB segment
//   pool.deallocate(p, 1000);          // back to the cache, not to the system
//
// Note [caching allocator]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// (The design of PyTorch's CUDACachingAllocator, reduced to one
// stream): requests are rounded up to 512 bytes. Requests up to 1 MiB come from a small pool
// that grows in 2 MiB segments; larger ones from a large pool whose segments are 20 MiB for
// requests under 10 MiB and the request rounded up to 2 MiB otherwise. A request takes the
// smallest cached free block that fits (best fit); the rest of that block is split off and
// stays cached when it is worth keeping (>= 512 B in the small pool, > 1 MiB in the large
// pool). A freed block merges with free neighbours of its segment. When the system refuses a
// new segment, every wholly free cached segment is returned to it and the request retried once;
// a second refusal throws mg::Error naming the request, the statistics and the remedies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>

#include "core/allocator.h"
#include <minigrad/core/error.h>

namespace mg::cuda {

constexpr size_t kMinBlockSize = 512;
constexpr size_t kSmallSize = size_t{1} << 20;
constexpr size_t kSmallSegment = size_t{2} << 20;
constexpr size_t kMinLargeAlloc = size_t{10} << 20;
constexpr size_t kLargeBuffer = size_t{20} << 20;
constexpr size_t kRoundLarge = size_t{2} << 20;

struct SystemMemInfo {
  size_t free = 0, total = 0;
};

inline size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// Bytes of the segment that a block of `size` (already rounded) starts.
inline size_t segment_size_for(size_t size) {
  if (size <= kSmallSize) return kSmallSegment;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return round_up(size, kRoundLarge);
}

template <class System>
class BlockPool {
 public:
  explicit BlockPool(System system) : system_(std::move(system)) {}
  // The device memory of the segments is left to the process's end (see allocator.cu); the
  // bookkeeping is freed, every block being either cached (a free set) or handed out (active_).
  ~BlockPool() {
    for (FreeSet* pool : {&free_small_, &free_large_}) {
      for (Block* b : *pool) delete b;
    }
    for (auto& [ptr, b] : active_) delete b;
  }
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  void* allocate(size_t nbytes) {
    if (nbytes == 0) return nullptr;
    const size_t size = round_up(nbytes, kMinBlockSize);
    const bool small = size <= kSmallSize;
    std::lock_guard<std::mutex> lock(mu_);
    if (const size_t limit = stats_.limit(); limit != 0) {
      const MemoryStats s = stats_.get();
      if (nbytes > limit || s.in_use > limit - nbytes) throw_over_limit(system_.name(), nbytes, s, limit);
    }
    FreeSet& pool = small ? free_small_ : free_large_;
    Block* b = best_fit(pool, size);
    if (b != nullptr) {
      pool.erase(b);
    } else {
      b = new_segment(size, nbytes);
    }
    if (should_split(b, size, small)) {
      Block* rest = new Block{b->ptr + size, b->size - size, 0, false, small, b, b->next};
      if (b->next != nullptr) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      pool.insert(rest);
    }
    b->allocated = true;
    b->requested = nbytes;
    active_[b->ptr] = b;
    allocated_bytes_ += b->size;
    stats_.on_alloc(nbytes);
    return b->ptr;
  }

  void deallocate(void* p, size_t nbytes) {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = active_.find(p);
    MG_CHECK(it != active_.end(), system_.name() << " allocator: freeing pointer " << p
                                                 << " that it did not allocate (or freed twice)");
    Block* b = it->second;
    MG_CHECK(b->requested == nbytes, system_.name() << " allocator: freeing " << nbytes << " bytes at " << p
                                                    << ", but " << b->requested << " were allocated there");
    active_.erase(it);
    stats_.on_free(b->requested);
    allocated_bytes_ -= b->size;
    b->allocated = false;
    b->requested = 0;
    FreeSet& pool = b->small ? free_small_ : free_large_;
    if (b->prev != nullptr && !b->prev->allocated) b = merge(pool, b->prev, b);
    if (b->next != nullptr && !b->next->allocated) b = merge(pool, b, b->next);
    pool.insert(b);
  }

  // Returns every wholly free cached segment to the system.
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    release_free_segments();
  }

  MemoryStats stats() const { return stats_.get(); }
  void reset_peak() { stats_.reset_peak(); }
  void set_limit(size_t bytes) { stats_.set_limit(bytes); }
  size_t limit() const { return stats_.limit(); }
  // mg::memory_capacity: what in_use could reach now (the device's free memory and this pool's
  // own segments), no more than the cap.
  size_t capacity() {
    size_t reserved = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reserved = stats_.get().reserved;
    }
    const size_t reachable = system_.mem_info().free + reserved;
    const size_t cap = stats_.limit();
    return cap != 0 && cap < reachable ? cap : reachable;
  }
  // Bytes of free blocks held in the cache.
  size_t cached_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_.get().reserved - allocated_bytes_;
  }
  size_t segment_count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return segments_;
  }
  System& system() { return system_; }

 private:
  struct Block {
    char* ptr;
    size_t size;       // bytes of the block (rounded)
    size_t requested;  // bytes asked for (0 while free)
    bool allocated;
    bool small;
    Block* prev;  // neighbours within the segment
    Block* next;
  };
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using FreeSet = std::set<Block*, BySizeThenAddress>;

  static Block* best_fit(FreeSet& pool, size_t size) {
    Block key{nullptr, size, 0, false, false, nullptr, nullptr};
    auto it = pool.lower_bound(&key);
    return it == pool.end() ? nullptr : *it;
  }

  static bool should_split(const Block* b, size_t size, bool small) {
    const size_t rest = b->size - size;
    return small ? rest >= kMinBlockSize : rest > kSmallSize;
  }

  // Merges two free neighbours, a below b, into a. One of them is the block being freed (not
  // in the set), the other is cached (in the set): both leave the set before a is resized.
  static Block* merge(FreeSet& pool, Block* a, Block* b) {
    pool.erase(a);
    pool.erase(b);
    a->size += b->size;
    a->next = b->next;
    if (b->next != nullptr) b->next->prev = a;
    delete b;
    return a;
  }

  Block* new_segment(size_t size, size_t nbytes) {
    const size_t seg = segment_size_for(size);
    // Under a cap, the segments stay within it too: cached ones go first, as on a refusal.
    const size_t limit = stats_.limit();
    auto over_limit = [&] { return limit != 0 && (seg > limit || stats_.get().reserved > limit - seg); };
    if (over_limit()) {
      release_free_segments();
      if (over_limit()) throw_over_limit(system_.name(), nbytes, stats_.get(), limit);
    }
    void* p = system_.malloc(seg);
    bool retried = false;
    if (p == nullptr) {
      retried = release_free_segments() > 0;
      p = system_.malloc(seg);
    }
    if (p == nullptr) throw_oom(nbytes, seg, retried);
    stats_.on_reserve(seg);
    ++segments_;
    return new Block{static_cast<char*>(p), seg, 0, false, size <= kSmallSize, nullptr, nullptr};
  }

  size_t release_free_segments() {
    size_t released = 0;
    for (FreeSet* pool : {&free_small_, &free_large_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (b->prev == nullptr && b->next == nullptr) {
          system_.free(b->ptr);
          stats_.on_release(b->size);
          --segments_;
          ++released;
          it = pool->erase(it);
          delete b;
        } else {
          ++it;
        }
      }
    }
    return released;
  }

  [[noreturn]] void throw_oom(size_t nbytes, size_t seg, bool retried) {
    const MemoryStats s = stats_.get();
    const SystemMemInfo info = system_.mem_info();
    std::ostringstream os;
    os << system_.name() << " out of memory: tried to allocate " << exact_bytes(nbytes)
       << " (needs a new segment of " << exact_bytes(seg) << ").\n"
       << "  libminigrad on " << system_.name() << ": " << exact_bytes(s.in_use) << " in use by tensors, "
       << exact_bytes(s.reserved) << " reserved, of which " << exact_bytes(s.reserved - allocated_bytes_)
       << " cached in free blocks of partly used segments"
       << (retried ? " (wholly free cached segments were released and the request retried)" : "")
       << ".\n  Device: " << exact_bytes(info.free) << " free of " << exact_bytes(info.total) << " total.\n"
       << kOutOfMemoryHint;
    throw OutOfMemoryError(os.str(), nbytes);
  }

  System system_;
  mutable std::mutex mu_;
  StatsCounter stats_;
  FreeSet free_small_, free_large_;
  std::unordered_map<void*, Block*> active_;
  size_t allocated_bytes_ = 0;  // rounded bytes of allocated blocks
  size_t segments_ = 0;
};

}  // namespace mg::cuda
