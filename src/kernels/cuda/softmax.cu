// Softmax over the last dimension on CUDA (kernels/softmax.h): one warp per row. Each lane walks
// the columns lane, lane + 32, ...; the lanes' partial maxima and sums meet in a fixed butterfly
// of shuffles: deterministic.
#include "kernels/cuda/common.cuh"
#include "kernels/softmax.h"

namespace mg {
namespace {

constexpr int kWarpsPerBlock = 8;

__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void softmax_forward_kernel(float* y, const float* x, int64_t rows, int64_t cols) {
  const int64_t r = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.y;
  if (r >= rows) return;  // the whole warp leaves together
  const float* in = x + r * cols;
  float* out = y + r * cols;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += 32) m = fmaxf(m, in[c]);
  m = warp_max(m);
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += 32) sum += expf(in[c] - m);
  const float inv = 1.0f / warp_sum(sum);
  for (int64_t c = threadIdx.x; c < cols; c += 32) out[c] = expf(in[c] - m) * inv;
}

__global__ void softmax_backward_kernel(float* dx, const float* dy, const float* y, int64_t rows, int64_t cols) {
  const int64_t r = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.y;
  if (r >= rows) return;
  const float *g = dy + r * cols, *yr = y + r * cols;
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += 32) dot += g[c] * yr[c];
  const float e = warp_sum(dot);
  for (int64_t c = threadIdx.x; c < cols; c += 32) dx[r * cols + c] = yr[c] * (g[c] - e);
}

unsigned blocks_for(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

}  // namespace

template <> void softmax_forward<Cuda>(Tensor& y, const Tensor& x, int64_t rows, int64_t cols) {
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  softmax_forward_kernel<<<blocks_for(rows), dim3(32, kWarpsPerBlock), 0, stream>>>(
      y.data<float>(), x.data<float>(), rows, cols);
  MG_CUDA_CHECK_LAUNCH();
}

template <> void softmax_backward<Cuda>(Tensor& dx, const Tensor& dy, const Tensor& y, int64_t rows, int64_t cols) {
  const int dev = cuda::device_of(dx);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  softmax_backward_kernel<<<blocks_for(rows), dim3(32, kWarpsPerBlock), 0, stream>>>(dx.data<float>(), dy.data<float>(),
                                                                                     y.data<float>(), rows, cols);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg
