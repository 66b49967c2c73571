// ReLU.  forward:  y = max(x, 0)                 x, y: any shape, n elements   (=)
//        backward: dx = dy * (y > 0)                                            (=)
// Backward reads the output (the tape saves y), as on CPU.
#include "kernels/cuda/common.cuh"
#include "kernels/relu.h"

namespace mg {
namespace {

__global__ void relu_forward_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void relu_backward_kernel(float* dx, const float* dy, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

}  // namespace

template <> void relu_forward<Cuda>(Tensor& y, const Tensor& x) {
  const int64_t n = y.numel();
  if (n == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  relu_forward_kernel<<<cuda::grid_for(n), cuda::kThreads, 0, stream>>>(y.data<float>(), x.data<float>(), n);
  MG_CUDA_CHECK_LAUNCH();
}

template <> void relu_backward<Cuda>(Tensor& dx, const Tensor& dy, const Tensor& y) {
  const int64_t n = dx.numel();
  if (n == 0) return;
  const int dev = cuda::device_of(dx);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  relu_backward_kernel<<<cuda::grid_for(n), cuda::kThreads, 0, stream>>>(dx.data<float>(), dy.data<float>(),
                                                                          y.data<float>(), n);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg
