// Dropout (inverted).  x, y: any shape, n elements.
//   keep_i = philox_uniform(seed, offset + i) >= p
//   forward:  y  = keep ? x / (1 - p) : 0          (=)
//   backward: dx = keep ? dy / (1 - p) : 0         (=)
// The mask comes from the same __host__ __device__ Philox as the CPU kernel (minigrad/core/rng.h), so a
// (seed, offset) gives the same mask on both devices, and backward regenerates it. bf16/f16 (Note
// [cuda half kernels] in storage.cuh): one thread per element, each element's own draw (the same
// counters as the 4-block kernel, so the same mask).
#include <minigrad/core/rng.h>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/storage.cuh"
#include "kernels/cuda/dropout_math.h"
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

// Samples spread over the counters (data-parallel ranks), or bf16/f16: one thread per element.
template <class T>
__global__ void dropout_strided_kernel(T* out, const T* in, int64_t n, float p, float keep_scale, uint64_t seed,
                                       uint64_t offset, int64_t per_sample, uint64_t sample_stride) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t counter =
        offset + static_cast<uint64_t>(i / per_sample) * sample_stride + static_cast<uint64_t>(i % per_sample);
    cuda::store(out, i, philox_uniform(seed, counter) >= p ? cuda::load(in, i) * keep_scale : 0.0f);
  }
}

void masked_scale(Tensor& out, const Tensor& in, float p, uint64_t seed, uint64_t offset, int64_t per_sample,
                  uint64_t sample_stride) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const int dev = cuda::device_of(out);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  const bool contiguous = sample_stride == 0 || sample_stride == static_cast<uint64_t>(per_sample);
  const DType dtype = cuda::check_same_dtype("dropout", {&out, &in});
  if (contiguous && dtype == DType::f32) {
    dropout_kernel<<<cuda::grid_for((n + 3) / 4), cuda::kThreads, 0, stream>>>(
        out.data<float>(), in.data<float>(), n, p, 1.0f / (1.0f - p), seed, offset);
  } else {
    // Contiguous counters are the strided ones with one sample of n elements.
    const int64_t per = contiguous ? n : per_sample;
    const uint64_t stride = contiguous ? static_cast<uint64_t>(n) : sample_stride;
    cuda::with_storage("dropout", dtype, [&](auto tag) {
      using T = decltype(tag);
      dropout_strided_kernel<<<cuda::grid_for(n), cuda::kThreads, 0, stream>>>(
          cuda::elems<T>(out), cuda::elems<T>(in), n, p, 1.0f / (1.0f - p), seed, offset, per, stride);
    });
  }
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <>
void dropout_forward<Cuda>(Tensor& y, const Tensor& x, float p, uint64_t seed, uint64_t offset, int64_t per_sample,
                           uint64_t sample_stride) {
  masked_scale(y, x, p, seed, offset, per_sample, sample_stride);
}

template <>
void dropout_backward<Cuda>(Tensor& dx, const Tensor& dy, float p, uint64_t seed, uint64_t offset, int64_t per_sample,
                            uint64_t sample_stride) {
  masked_scale(dx, dy, p, seed, offset, per_sample, sample_stride);
}

}  // namespace mg
