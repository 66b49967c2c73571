// Softmax over the last dimension on CUDA (kernels/softmax.h): one warp per row. Each lane walks
// the columns lane, lane + 32, ...; the lanes' partial maxima and sums meet in a fixed butterfly
// of shuffles: deterministic. x, y, dx and dy each float32, bf16 or f16 (Note [cuda half kernels]
// in storage.cuh: Elems), float32 math.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/storage.cuh"
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

__global__ void softmax_forward_kernel(cuda::Elems y, cuda::Elems x, int64_t rows, int64_t cols) {
  const int64_t r = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.y;
  if (r >= rows) return;  // the whole warp leaves together
  const int64_t row = r * cols;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += 32) m = fmaxf(m, cuda::load(x, row + c));
  m = warp_max(m);
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += 32) sum += expf(cuda::load(x, row + c) - m);
  const float inv = 1.0f / warp_sum(sum);
  for (int64_t c = threadIdx.x; c < cols; c += 32) cuda::store(y, row + c, expf(cuda::load(x, row + c) - m) * inv);
}

__global__ void softmax_backward_kernel(cuda::Elems dx, cuda::Elems dy, cuda::Elems y, int64_t rows, int64_t cols) {
  const int64_t r = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.y;
  if (r >= rows) return;
  const int64_t row = r * cols;
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += 32) dot += cuda::load(dy, row + c) * cuda::load(y, row + c);
  const float e = warp_sum(dot);
  for (int64_t c = threadIdx.x; c < cols; c += 32)
    cuda::store(dx, row + c, cuda::load(y, row + c) * (cuda::load(dy, row + c) - e));
}

unsigned blocks_for(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

}  // namespace

template <> void softmax_forward<Cuda>(Tensor& y, const Tensor& x, int64_t rows, int64_t cols) {
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  softmax_forward_kernel<<<blocks_for(rows), dim3(32, kWarpsPerBlock), 0, stream>>>(cuda::elems_of(y),
                                                                                     cuda::elems_of(x), rows, cols);
  MG_CUDA_CHECK_LAUNCH();
}

template <> void softmax_backward<Cuda>(Tensor& dx, const Tensor& dy, const Tensor& y, int64_t rows, int64_t cols) {
  const int dev = cuda::device_of(dx);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  softmax_backward_kernel<<<blocks_for(rows), dim3(32, kWarpsPerBlock), 0, stream>>>(
      cuda::elems_of(dx), cuda::elems_of(dy), cuda::elems_of(y), rows, cols);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg
