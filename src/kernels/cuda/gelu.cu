// GELU, tanh form (kernels/gelu.h): one thread per element, the same formulas as the CPU kernel.
// Storage float32, bf16 or f16, float32 math (Note [cuda half kernels] in src/kernels/cuda/storage.cuh).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/storage.cuh"
#include "kernels/gelu.h"

namespace mg {
namespace {

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

template <class T> __global__ void gelu_forward_kernel(T* y, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = cuda::load(x, i);
    cuda::store(y, i, 0.5f * v * (1.0f + tanhf(kGeluK * (v + kGeluC * v * v * v))));
  }
}

template <class T> __global__ void gelu_backward_kernel(T* dx, const T* dy, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = cuda::load(x, i);
    const float t = tanhf(kGeluK * (v + kGeluC * v * v * v));
    const float dt = (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * v * v);
    cuda::store(dx, i, cuda::load(dy, i) * (0.5f * (1.0f + t) + 0.5f * v * dt));
  }
}

}  // namespace

template <> void gelu_forward<Cuda>(Tensor& y, const Tensor& x) {
  const int64_t n = y.numel();
  if (n == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("gelu", cuda::check_same_dtype("gelu", {&y, &x}), [&](auto tag) {
    using T = decltype(tag);
    gelu_forward_kernel<<<cuda::grid_for(n), cuda::kThreads, 0, stream>>>(cuda::elems<T>(y), cuda::elems<T>(x), n);
  });
  MG_CUDA_CHECK_LAUNCH();
}

template <> void gelu_backward<Cuda>(Tensor& dx, const Tensor& dy, const Tensor& x) {
  const int64_t n = dx.numel();
  if (n == 0) return;
  const int dev = cuda::device_of(dx);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("gelu", cuda::check_same_dtype("gelu", {&dx, &dy, &x}), [&](auto tag) {
    using T = decltype(tag);
    gelu_backward_kernel<<<cuda::grid_for(n), cuda::kThreads, 0, stream>>>(cuda::elems<T>(dx), cuda::elems<T>(dy),
                                                                            cuda::elems<T>(x), n);
  });
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg
