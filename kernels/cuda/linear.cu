#include "kernels/linear.h"
#include "kernels/cuda/common.cuh"
namespace mg {
template <> void linear_forward<Cuda>(Tensor&, const Tensor&, const Tensor&, const Tensor&) { MG_FAIL("CUDA kernel not yet written"); }
template <> void linear_backward<Cuda>(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&, bool) { MG_FAIL("CUDA kernel not yet written"); }
}
