// convert (src/kernels/convert.h): one thread per element, the CPU kernel's element functions
// (Note [half conversions]), so both devices give the same bits.
#include "kernels/convert.h"
#include "kernels/cuda/common.cuh"

namespace mg {
namespace {

__device__ __forceinline__ float load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f64: return static_cast<float>(static_cast<const double*>(p)[i]);
    case DType::bf16: return half::float_from_bf16(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return half::float_from_f16(static_cast<const uint16_t*>(p)[i]);
    default: return 0.0f;
  }
}

__global__ void convert_kernel(void* d, DType to, const void* s, DType from, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    if (from == DType::f64 && to == DType::f64) {
      static_cast<double*>(d)[i] = static_cast<const double*>(s)[i];
      continue;
    }
    const float v = load(s, from, i);
    switch (to) {
      case DType::f32: static_cast<float*>(d)[i] = v; break;
      case DType::f64: static_cast<double*>(d)[i] = v; break;
      case DType::bf16: static_cast<uint16_t*>(d)[i] = half::bf16_from_float(v); break;
      case DType::f16: static_cast<uint16_t*>(d)[i] = half::f16_from_float(v); break;
      default: break;
    }
  }
}

}  // namespace

template <> void convert<Cuda>(Tensor& dst, const Tensor& src) {
  check_convert_args(dst, src);
  const int64_t n = dst.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(cuda::device_of(dst));
  const int64_t capped = n < int64_t{65536} * cuda::kThreads ? n : int64_t{65536} * cuda::kThreads;
  convert_kernel<<<cuda::grid_for(capped), cuda::kThreads>>>(dst.raw_data(), dst.dtype(), src.raw_data(), src.dtype(), n);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg
