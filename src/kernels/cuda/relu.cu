// ReLU.  forward:  y = max(x, 0)                 x, y: any shape, n elements   (=)
//        backward: dx = dy * (y > 0)                                            (=)
// Backward reads the output (the tape saves y), as on CPU. Storage float32, bf16 or f16 (Note [cuda
// half kernels] in src/kernels/cuda/storage.cuh): relu moves values, so no rounding happens.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/storage.cuh"
#include "kernels/relu.h"

namespace mg {
namespace {

template <class T> __global__ void relu_forward_kernel(T* y, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = cuda::load(x, i);
    cuda::store(y, i, v > 0.0f ? v : 0.0f);
  }
}

template <class T> __global__ void relu_backward_kernel(T* dx, const T* dy, const T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    cuda::store(dx, i, cuda::load(y, i) > 0.0f ? cuda::load(dy, i) : 0.0f);
}

}  // namespace

template <> void relu_forward<Cuda>(Tensor& y, const Tensor& x) {
  const int64_t n = y.numel();
  if (n == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("relu", cuda::check_same_dtype("relu", {&y, &x}), [&](auto tag) {
    using T = decltype(tag);
    relu_forward_kernel<<<cuda::grid_for(n), cuda::kThreads, 0, stream>>>(cuda::elems<T>(y), cuda::elems<T>(x), n);
  });
  MG_CUDA_CHECK_LAUNCH();
}

template <> void relu_backward<Cuda>(Tensor& dx, const Tensor& dy, const Tensor& y) {
  const int64_t n = dx.numel();
  if (n == 0) return;
  const int dev = cuda::device_of(dx);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("relu", cuda::check_same_dtype("relu", {&dx, &dy, &y}), [&](auto tag) {
    using T = decltype(tag);
    relu_backward_kernel<<<cuda::grid_for(n), cuda::kThreads, 0, stream>>>(cuda::elems<T>(dx), cuda::elems<T>(dy),
                                                                            cuda::elems<T>(y), n);
  });
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg
