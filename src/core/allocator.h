// The allocators behind mg::memory_stats (include/minigrad/core/memory.h): one per device.
// Internal; the public API is memory.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

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
};

// The allocator of a device (created on first use; lives for the whole program).
Allocator& allocator_for(Device d);

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

// Defined in src/kernels/cuda/allocator.cu when the build has CUDA; throws otherwise.
Allocator& cuda_allocator(int device_index);

}  // namespace mg
