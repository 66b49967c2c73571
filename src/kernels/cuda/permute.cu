// permute on CUDA (kernels/permute.h): one thread per output element, its input offset from the
// output index digit by digit. Values are moved, never rounded: the CPU's bits.
#include "kernels/cuda/common.cuh"
#include "kernels/permute.h"

namespace mg {
namespace {

struct Geometry {
  int rank;
  int64_t out[kMaxPermuteRank];   // y's sizes
  int64_t step[kMaxPermuteRank];  // how far x moves when y's index i grows by one
};

template <class T> __global__ void permute_kernel(T* y, const T* x, int64_t n, Geometry g) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    int64_t src = 0, rest = e;
    for (int d = g.rank - 1; d >= 0; --d) {
      src += (rest % g.out[d]) * g.step[d];
      rest /= g.out[d];
    }
    y[e] = x[src];
  }
}

}  // namespace

template <> void permute_forward<Cuda>(Tensor& y, const Tensor& x, const Shape& dims) {
  const int r = static_cast<int>(dims.size());
  MG_CHECK(r >= 1 && r <= kMaxPermuteRank && x.dim() == r && y.dim() == r && y.dtype() == x.dtype(),
           "permute: kernel called with dims of " << r << " for shapes " << shape_str(x.shape()) << " and "
                                                  << shape_str(y.shape()));
  const int64_t n = y.numel();
  if (n == 0) return;
  Geometry g{};
  g.rank = r;
  int64_t stride[kMaxPermuteRank];
  stride[r - 1] = 1;
  for (int d = r - 2; d >= 0; --d) stride[d] = stride[d + 1] * x.size(d + 1);
  for (int i = 0; i < r; ++i) {
    g.out[i] = y.size(i);
    g.step[i] = stride[dims[i]];
  }
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  const unsigned blocks = cuda::grid_for(n);
  switch (dtype_size(x.dtype())) {
    case 2:
      permute_kernel<<<blocks, cuda::kThreads, 0, stream>>>(static_cast<uint16_t*>(y.raw_data()),
                                                             static_cast<const uint16_t*>(x.raw_data()), n, g);
      break;
    case 4:
      permute_kernel<<<blocks, cuda::kThreads, 0, stream>>>(static_cast<uint32_t*>(y.raw_data()),
                                                             static_cast<const uint32_t*>(x.raw_data()), n, g);
      break;
    case 8:
      permute_kernel<<<blocks, cuda::kThreads, 0, stream>>>(static_cast<uint64_t*>(y.raw_data()),
                                                             static_cast<const uint64_t*>(x.raw_data()), n, g);
      break;
    default: MG_FAIL("permute: no kernel for " << dtype_name(x.dtype()));
  }
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg
