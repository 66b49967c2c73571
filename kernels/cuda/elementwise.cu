#include "kernels/elementwise.h"
#include "kernels/cuda/common.cuh"
namespace mg {
template <> void add_forward<Cuda>(Tensor&, const Tensor&, const Tensor&) { MG_FAIL("CUDA kernel not yet written"); }
template <> void add_inplace<Cuda>(Tensor&, const Tensor&) { MG_FAIL("CUDA kernel not yet written"); }
template <> void scale_forward<Cuda>(Tensor&, const Tensor&, float) { MG_FAIL("CUDA kernel not yet written"); }
template <> void fill<Cuda>(Tensor&, float) { MG_FAIL("CUDA kernel not yet written"); }
template <> double sum_squares<Cuda>(const Tensor&) { MG_FAIL("CUDA kernel not yet written"); }
template <> void copy_bytes<Cuda>(Tensor&, const Tensor&) { MG_FAIL("CUDA kernel not yet written"); }
}
