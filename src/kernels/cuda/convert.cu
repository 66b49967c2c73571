// convert (src/kernels/convert.h): one thread per element, the CPU kernel's element function
// (half::convert_element, Note [half conversions]), so both devices give the same bits.
#include "kernels/convert.h"
#include "kernels/cuda/common.cuh"

namespace mg {
namespace {

__global__ void convert_kernel(void* d, DType to, const void* s, DType from, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    half::convert_element(d, to, s, from, i);
}

}  // namespace

template <> void convert<Cuda>(Tensor& dst, const Tensor& src) {
  check_convert_args(dst, src);
  const int64_t n = dst.numel();
  if (n == 0) return;
  const int dev = cuda::device_of(dst);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  const int64_t capped = n < int64_t{65536} * cuda::kThreads ? n : int64_t{65536} * cuda::kThreads;
  convert_kernel<<<cuda::grid_for(capped), cuda::kThreads, 0, stream>>>(
      dst.raw_data(), dst.dtype(), src.raw_data(), src.dtype(), n);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg
