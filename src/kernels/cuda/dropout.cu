// Dropout (inverted).  x, y: any shape, n elements.
//   keep_i = philox_uniform(seed, offset + i) >= p
//   forward:  y  = keep ? x / (1 - p) : 0          (=)
//   backward: dx = keep ? dy / (1 - p) : 0         (=)
// The mask comes from the same __host__ __device__ Philox as the CPU kernel (minigrad/core/rng.h), so a
// (seed, offset) gives the same mask on both devices, and backward regenerates it.
#include <minigrad/core/rng.h>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_math.h"
#include "kernels/dropout.h"

namespace mg {
namespace {

// One thread per Philox block of 4 draws: one philox4x32 call serves 4 elements.
__global__ void dropout_kernel(float* out, const float* in, int64_t n, float p, float keep_scale, uint64_t seed,
                               uint64_t offset) {
  for (int64_t first = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * 4; first < n;
       first += int64_t{gridDim.x} * blockDim.x * 4)
    cuda::math::dropout4(out, in, first, n, p, keep_scale, seed, offset);
}

void masked_scale(Tensor& out, const Tensor& in, float p, uint64_t seed, uint64_t offset) {
  const int64_t n = out.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(cuda::device_of(out));
  dropout_kernel<<<cuda::grid_for((n + 3) / 4), cuda::kThreads>>>(
      out.data<float>(), in.data<float>(), n, p, 1.0f / (1.0f - p), seed, offset);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <>
void dropout_forward<Cuda>(Tensor& y, const Tensor& x, float p, uint64_t seed, uint64_t offset) {
  masked_scale(y, x, p, seed, offset);
}

template <>
void dropout_backward<Cuda>(Tensor& dx, const Tensor& dy, float p, uint64_t seed, uint64_t offset) {
  masked_scale(dx, dy, p, seed, offset);
}

}  // namespace mg
