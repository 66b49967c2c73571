#include "kernels/pooling.h"
#include "kernels/cuda/common.cuh"
namespace mg {
template <> void max_pool2d_forward<Cuda>(Tensor&, Tensor&, const Tensor&, int, int, int) { MG_FAIL("CUDA kernel not yet written"); }
template <> void max_pool2d_backward<Cuda>(Tensor&, const Tensor&, const Tensor&) { MG_FAIL("CUDA kernel not yet written"); }
template <> void adaptive_avg_pool2d_forward<Cuda>(Tensor&, const Tensor&) { MG_FAIL("CUDA kernel not yet written"); }
template <> void adaptive_avg_pool2d_backward<Cuda>(Tensor&, const Tensor&) { MG_FAIL("CUDA kernel not yet written"); }
}
