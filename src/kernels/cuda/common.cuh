// What every CUDA kernel file shares: checks, the per-device context (handles, stream, error
// flag), a device guard, launch sizes and workspaces from the caching allocator.
// Note [cuda stream]
// ~~~~~~~~~~~~~~~~~~
// Each device has one stream, stream(device) (the same as Context::stream), and every kernel
// launch, copy, memset, event and cuBLAS/cuDNN call for that device takes it; NCCL runs on a
// stream of its own that events order against it (src/dist/nccl.cpp). By default that stream is
// the device's legacy default stream. MG_CUDA_STREAM=own makes it a stream of our own, created
// with cudaStreamNonBlocking on first use and, like the contexts, never destroyed. The own stream
// has not run on a GPU yet (docs/gpu-queue.md); legacy stays the default until it has.
// With one stream, its work is ordered without events, and a block freed to the caching allocator
// can be reused by the next launch at once: every use of the block was queued before, on the same
// stream (PyTorch reuses blocks so within one stream). The rest keeps that order with either
// stream: copies to the host wait for the stream (cudaStreamSynchronize) before the host reads;
// copies from pageable host memory are staged before cudaMemcpyAsync returns, so the host buffer
// may go at once; cudaFree comes after cudaDeviceSynchronize, which waits for every stream; a copy
// between two GPUs orders their streams with events (copy_bytes); NCCL's tensors are held until
// the stream has waited for its end. A non-blocking stream does not wait for the legacy one, so
// nothing here may use the legacy stream by omission (cudaMemcpy, cudaMemset, a launch without a
// stream, a library call without one). The host waits only where a value must come back: copies
// to the host and synchronize(), which then reads the error flag.
#pragma once

#include <atomic>

#include <cstdint>

#include <minigrad/core/tensor.h>
#include <minigrad/cuda.h>

#include "core/allocator.h"
#include "kernels/cuda/cuda_check.h"

namespace mg::cuda {

// Waits for the work queued on the device's stream (Note [cuda stream]), then reports any error
// flagged by a kernel (e.g. an out-of-range cross-entropy target). Copies to the host do the
// same. Public as mg::synchronize.
void synchronize(int device_index = 0);

constexpr int kThreads = 256;
// Size of the per-device tables (allocators, contexts): fixed, so lookups need no lock.
constexpr int kMaxDevices = 64;

// The stream all of a device's work goes to (Note [cuda stream]), the same as
// context(device_index).stream. Made on first use without the rest of the context, so a launch
// that needs no cuBLAS does not create its handle and workspace. One atomic load once made.
cudaStream_t stream(int device_index);

inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > (1 << 30) ? (1 << 30) : blocks));
}

// Makes `index` the current device for its lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// Per-device state, created on first use and kept for the whole program.
struct Context {
  int device = 0;
  cudaStream_t stream = nullptr;  // stream(device): Note [cuda stream]
  cublasHandle_t cublas = nullptr;
  // cuBLAS's workspace (cublasSetWorkspace), from the caching allocator; cuBLASLt's products use
  // it too (Note [cublaslt products] in src/kernels/cuda/cublaslt.h).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // cuDNN's, made on the first convolution (cudnn_handle): a run without one never loads cuDNN.
  std::atomic<cudnnHandle_t> cudnn{nullptr};
  // cuBLASLt's, made on its first product (cublaslt_handle). It holds no stream: each call names one.
  std::atomic<cublasLtHandle_t> cublaslt{nullptr};
  // Kernel-raised errors: [0] = error code (0: none), [1], [2] = details. Raised by kernels
  // (cross_entropy.cu), read by synchronize() in context.cu.
  long long* error_flag = nullptr;
};
Context& context(int device_index);
cudnnHandle_t cudnn_handle(int device_index);  // on the context's stream, made on first use
cublasLtHandle_t cublaslt_handle(int device_index);  // made on first use

// The compute type of a cuBLAS or cuBLASLt product: float32 sums, on TF32 tensor cores where
// `tf32` (float32 operands under set_tf32_matmul: Note [cuda math modes] in minigrad/cuda.h).
inline cublasComputeType_t compute_type(bool tf32) {
  return tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}
inline bool tf32_product(DType operands) { return operands == DType::f32 && tf32_matmul(); }

// The error codes kernels raise through Context::error_flag.
enum : long long { kFlagNone = 0, kFlagBadTarget = 1, kFlagBadIndex = 2 };
// Throws mg::Error if a kernel raised the flag since the last check (and clears it). Reads 24
// bytes from the device, so call it only where the host waits anyway.
void check_error_flag(int device_index);

// Scratch memory from the caching allocator (so it is counted), freed at scope exit. Stream
// order makes freeing right after the launches that use it safe (Note [cuda stream]).
class Workspace {
 public:
  Workspace(int device_index, size_t nbytes);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return ptr_; }
  size_t size() const { return nbytes_; }

 private:
  int device_;
  void* ptr_ = nullptr;
  size_t nbytes_ = 0;
};

inline int device_of(const Tensor& t) { return t.device().index; }

}  // namespace mg::cuda
