#include "core/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <minigrad/core/error.h>

namespace mg {

void StatsCounter::on_alloc(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  s_.in_use += bytes;
  s_.peak_in_use = std::max(s_.peak_in_use, s_.in_use);
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

void* CpuAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  constexpr size_t kAlign = 64;
  size_t rounded = (nbytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  MG_CHECK(p != nullptr, "out of host memory: could not allocate " << nbytes << " bytes ("
                             << stats_.get().in_use << " bytes in use by libminigrad). "
                             << "---> HINT: lower the batch size and use gradient accumulation, "
                                "or gradient checkpointing (mg::checkpoint, a memory budget).");
  stats_.on_reserve(nbytes);
  stats_.on_alloc(nbytes);
  return p;
}

void CpuAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  std::free(ptr);
  stats_.on_free(nbytes);
  stats_.on_release(nbytes);
}

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

}  // namespace mg
