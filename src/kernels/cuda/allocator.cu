// The CUDA caching allocator: BlockPool (Note [caching allocator] in block_pool.h) over
// cudaMalloc/cudaFree, one per device, created on first use and kept for the whole program.
#include <atomic>
#include <mutex>

#include "core/allocator.h"
#include "kernels/cuda/block_pool.h"
#include "kernels/cuda/common.cuh"

namespace mg {
namespace {

struct CudaSystem {
  int device = 0;

  void* malloc(size_t bytes) {
    cuda::DeviceGuard guard(device);
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the sticky-free error so later checks do not see it
      return nullptr;
    }
    MG_CUDA_CHECK(err);
    return p;
  }
  void free(void* p) {
    cuda::DeviceGuard guard(device);
    // A cached segment is free to the pool as soon as the kernels using it were queued
    // (Note [cuda stream]): wait for them, on every stream, before the driver gets it back
    // (cudaFree only "may" wait).
    MG_CUDA_CHECK(cudaDeviceSynchronize());
    MG_CUDA_CHECK(cudaFree(p));
  }
  cuda::SystemMemInfo mem_info() {
    cuda::DeviceGuard guard(device);
    cuda::SystemMemInfo info;
    if (cudaMemGetInfo(&info.free, &info.total) != cudaSuccess) (void)cudaGetLastError();
    return info;
  }
  std::string name() const { return "cuda:" + std::to_string(device); }
};

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int device) : pool_(CudaSystem{device}) {}
  void* allocate(size_t nbytes) override { return pool_.allocate(nbytes); }
  void deallocate(void* ptr, size_t nbytes) override { pool_.deallocate(ptr, nbytes); }
  MemoryStats stats() const override { return pool_.stats(); }
  void reset_peak() override { pool_.reset_peak(); }
  void set_limit(size_t bytes) override { pool_.set_limit(bytes); }
  size_t limit() const override { return pool_.limit(); }
  size_t capacity() override {
    cuda::DeviceGuard guard(pool_device());
    return pool_.capacity();
  }
  void empty_cache() override {
    // cudaFree waits for the device anyway; waiting first keeps the release well defined.
    cuda::DeviceGuard guard(pool_device());
    MG_CUDA_CHECK(cudaDeviceSynchronize());
    pool_.empty_cache();
  }

 private:
  int pool_device() { return pool_.system().device; }
  cuda::BlockPool<CudaSystem> pool_;
};

}  // namespace

void* cuda_host_alloc(size_t nbytes) {
  if (cuda_device_count() == 0) return nullptr;
  void* p = nullptr;
  if (cudaHostAlloc(&p, nbytes, cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}

void* cuda_host_alloc_on(size_t nbytes, int device_index) {
  if (cuda_device_count() == 0) return nullptr;
  cuda::DeviceGuard guard(device_index);
  return cuda_host_alloc(nbytes);
}

void cuda_host_free(void* ptr) noexcept {
  // A copy out of the block may still be queued: wait for the device's work first. It runs in
  // destructors (a storage of the host pool, the staging pool), so it reports nothing: after a
  // sticky error (an illegal address) both calls fail, and a throw here would end the program in
  // std::terminate while the error that mattered is still on its way to the user.
  (void)cudaDeviceSynchronize();
  (void)cudaFreeHost(ptr);
  (void)cudaGetLastError();
}

Allocator& cuda_allocator(int device_index) {
  // Every tensor's allocation and free comes here: after the first call for a device, one
  // atomic load. The table is trivially destructible and the allocators are leaked on purpose,
  // so tensors in static storage freed after main returns (after other statics are destroyed)
  // still find their allocator.
  static std::atomic<CudaCachingAllocator*> allocators[cuda::kMaxDevices] = {};
  static std::mutex mu;
  if (device_index >= 0 && device_index < cuda::kMaxDevices) {
    if (CudaCachingAllocator* a = allocators[device_index].load(std::memory_order_acquire)) return *a;
  }
  const int n = cuda_device_count();
  MG_CHECK(n > 0, "no CUDA device is available (cudaGetDeviceCount found none), so cuda:"
                      << device_index << " cannot be used");
  MG_CHECK(device_index >= 0 && device_index < n,
           "cuda:" << device_index << " does not exist (" << n << " CUDA devices visible)");
  MG_CHECK(device_index < cuda::kMaxDevices, "cuda:" << device_index << ": at most " << cuda::kMaxDevices
                                                   << " CUDA devices are supported");
  std::lock_guard<std::mutex> lock(mu);
  CudaCachingAllocator* a = allocators[device_index].load(std::memory_order_relaxed);
  if (a == nullptr) {
    a = new CudaCachingAllocator(device_index);
    allocators[device_index].store(a, std::memory_order_release);
  }
  return *a;
}

}  // namespace mg
