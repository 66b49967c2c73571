// The allocators behind mg::memory_stats (include/minigrad/core/memory.h): one per device.
// Internal; the public API is memory.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include <minigrad/core/memory.h>

namespace mg {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Returns cached, unused memory to the system (no-op where nothing is cached).
  virtual void empty_cache() {}
  // The cap of mg::set_memory_limit (0: none).
  virtual void set_limit(size_t bytes) = 0;
  virtual size_t limit() const = 0;
  // What in_use could reach now (mg::memory_capacity).
  virtual size_t capacity() = 0;
};

// The allocator of a device (created on first use; lives for the whole program).
Allocator& allocator_for(Device d);

// Bookkeeping shared by the allocators: call on_alloc/on_free with the counted bytes.
class StatsCounter {
 public:
  // Counts an allocation of `bytes` unless it would take in_use past the limit (then false, and
  // nothing counted). *peak_before gets the peak before it, for cancel_alloc.
  bool try_alloc(size_t bytes, size_t* peak_before);
  // Takes back a counted allocation that the system then could not serve.
  void cancel_alloc(size_t bytes, size_t peak_before);
  void on_alloc(size_t bytes);
  void on_free(size_t bytes);
  void on_reserve(size_t bytes);
  void on_release(size_t bytes);
  MemoryStats get() const;
  void reset_peak();
  // The most ever in use: unlike peak_in_use, reset_peak does not lower it.
  size_t most_in_use() const;
  void set_limit(size_t bytes);
  size_t limit() const;

 private:
  mutable std::mutex mu_;
  MemoryStats s_;
  size_t most_in_use_ = 0;
  size_t limit_ = 0;  // 0: none
};

// "512 B", or "1.50 MiB (1572864 bytes)": for out-of-memory messages, where two sizes that round
// alike must still read as different.
std::string exact_bytes(size_t n);
// The message of an allocation refused by a cap, with the remedies (shared by the allocators).
[[noreturn]] void throw_over_limit(const std::string& device, size_t nbytes, const MemoryStats& s, size_t limit);
// The remedies, for every out-of-memory message.
extern const char* const kOutOfMemoryHint;

// CPU allocator: 64-byte aligned blocks from the system, counted, large ones kept for reuse.
//
// Note [reusing large CPU blocks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A training step asks for the same sizes every step. glibc serves blocks of this size with mmap
// or trims them off its heap when freed, so each step faulted the pages of its activations in
// again, and steps were slower than with glibc told to keep its memory (GLIBC_TUNABLES mmap and
// trim thresholds; measured: BENCHMARKS.md, "Convolutions in oneDNN").
// So a freed block of kCacheMin bytes or more is kept and handed to the next request of the same
// rounded size, as long as the kept bytes stay under the most ever in use (reserved <= twice
// that); mg::empty_cache(cpu) returns them, and so does a failed system allocation before its
// retry. With the blocks kept, a step faults far fewer pages and runs as fast as with the tunables.
// Only in use is the planner's figure; reserved counts the kept blocks too. Builds with
// AddressSanitizer keep nothing, so that a use after free is still caught.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kCacheMin = size_t{64} << 10;

  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  MemoryStats stats() const override { return stats_.get(); }
  void reset_peak() override { stats_.reset_peak(); }
  void empty_cache() override;
  void set_limit(size_t bytes) override { stats_.set_limit(bytes); }
  size_t limit() const override { return stats_.limit(); }
  size_t capacity() override;

 private:
  void* take_cached(size_t rounded);
  bool release_kept();  // the kept blocks back to the system; false when none was kept
  StatsCounter stats_;
  std::mutex cache_mu_;
  std::multimap<size_t, void*> cache_;  // rounded size -> block
  size_t cached_bytes_ = 0;
};

// Defined in src/kernels/cuda/allocator.cu when the build has CUDA; throws otherwise.
Allocator& cuda_allocator(int device_index);
// Page-locked host memory (cudaHostAlloc / cudaFreeHost): null without CUDA or a device, and when
// the driver refuses (the host pool then takes ordinary memory).
void* cuda_host_alloc(size_t nbytes);
void cuda_host_free(void* ptr) noexcept;  // after the device's work; never throws (destructors)
// The same with `device_index` the calling thread's device meanwhile: a reading thread's first CUDA
// call then binds it to the device it reads for (Note [staged batches] in src/core/staging.h).
void* cuda_host_alloc_on(size_t nbytes, int device_index);

// The host pool of mg::host_memory_stats (minigrad/core/memory.h): counted like the CPU
// allocator, every freed block kept for reuse by size.
Allocator& host_pool();

}  // namespace mg
