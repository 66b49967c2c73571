// Allocators: one per device, and the single source of truth for every memory figure this
// project reports (tests, apps, benchmarks, docs).
//
//   mg::reset_peak_memory_stats(mg::Device::cpu());
//   train_step();
//   auto s = mg::memory_stats(mg::Device::cpu());
//   std::printf("peak in use: %zu bytes\n", s.peak_in_use);
//
// in_use counts the bytes of live tensors (as requested, before rounding); reserved counts what
// the allocator holds from the system, including cached free blocks (the CPU allocator caches
// nothing, so there reserved == in_use). Workspaces of cuBLAS/cuDNN are allocated here too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/device.h"

namespace mg {

struct MemoryStats {
  size_t in_use = 0;         // bytes in live allocations
  size_t peak_in_use = 0;    // high-water mark of in_use since the last reset
  size_t reserved = 0;       // bytes held from the system (in use + cached)
  size_t peak_reserved = 0;  // high-water mark of reserved since the last reset
  uint64_t alloc_count = 0;  // allocations served since start
  uint64_t system_alloc_count = 0;  // calls to the system allocator (malloc / cudaMalloc)
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Returns cached, unused memory to the system (no-op where nothing is cached).
  virtual void empty_cache() {}
};

// The allocator of a device (created on first use; lives for the whole program).
Allocator& allocator_for(Device d);

MemoryStats memory_stats(Device d);
void reset_peak_memory_stats(Device d);
void empty_cache(Device d);

// Bookkeeping shared by the allocators: call on_alloc/on_free with the counted bytes.
class StatsCounter {
 public:
  void on_alloc(size_t bytes);
  void on_free(size_t bytes);
  void on_reserve(size_t bytes);
  void on_release(size_t bytes);
  MemoryStats get() const;
  void reset_peak();

 private:
  mutable std::mutex mu_;
  MemoryStats s_;
};

// CPU allocator: 64-byte aligned blocks straight from the system, counted.
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  MemoryStats stats() const override { return stats_.get(); }
  void reset_peak() override { stats_.reset_peak(); }

 private:
  StatsCounter stats_;
};

// Defined in kernels/cuda/allocator.cu when the build has CUDA; throws otherwise.
Allocator& cuda_allocator(int device_index);

}  // namespace mg
