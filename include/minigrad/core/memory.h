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
// An allocation that fails throws mg::OutOfMemoryError (minigrad/core/error.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include <minigrad/core/device.h>

namespace mg {

struct MemoryStats {
  size_t in_use = 0;         // bytes in live allocations
  size_t peak_in_use = 0;    // high-water mark of in_use since the last reset
  size_t reserved = 0;       // bytes held from the system (in use + cached)
  size_t peak_reserved = 0;  // high-water mark of reserved since the last reset
  uint64_t alloc_count = 0;  // allocations served since start
  uint64_t system_alloc_count = 0;  // calls to the system allocator (malloc / cudaMalloc)
};

MemoryStats memory_stats(Device d);
void reset_peak_memory_stats(Device d);
// Returns cached, unused memory of the device's allocator to the system.
void empty_cache(Device d);

// Caps the memory of a device's allocator at `bytes` (0: no cap, the default): an allocation that
// would take in_use past the cap throws mg::OutOfMemoryError, as a full device does, so a small
// GPU can be emulated on any machine. The CUDA allocator keeps `reserved` (its cached segments
// included) within the cap as well, releasing wholly free cached segments before it refuses. A
// cap below what is in use already refuses every further allocation until enough is freed.
//
//   mg::set_memory_limit(mg::Device::cpu(), 64 << 20);   // this process now has 64 MiB
void set_memory_limit(Device d, size_t bytes);
size_t memory_limit(Device d);  // 0 when there is none

// The most bytes in use the device's allocator could reach now: what is in use plus what the
// device has free (CPU: MemAvailable of /proc/meminfo; CUDA: cudaMemGetInfo's free bytes plus
// the pool's cached blocks), and no more than the cap of set_memory_limit. A memory budget of
// "what the device has" (minigrad/nn/train_plan.h) is this.
size_t memory_capacity(Device d);

// The host pool: where offloaded activations wait between their forward and their backward
// (Note [offload] in minigrad/core/checkpoint.h). Page-locked memory (cudaHostAlloc) where the
// build has CUDA and a device is present, so that copies run at the link's full rate; ordinary
// memory otherwise, kept apart from the CPU allocator so that on a CPU the "device" (the CPU
// allocator, capped with set_memory_limit) and the host are counted separately. Freed blocks are
// kept for the next step's requests of the same size; host_empty_cache returns them.
// set_host_memory_limit caps it (0: no cap, the default): the checkpoint planner then offloads no
// more than the cap (ChainCost::host_limit in minigrad/nn/checkpoint_plan.h).
MemoryStats host_memory_stats();
void reset_host_peak_memory_stats();
void set_host_memory_limit(size_t bytes);
size_t host_memory_limit();
void host_empty_cache();

}  // namespace mg
