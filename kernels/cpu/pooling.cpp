#include "kernels/pooling.h"

namespace mg {
template <> void max_pool2d_forward<Cpu>(Tensor&, Tensor&, const Tensor&, int, int, int) { MG_FAIL("todo"); }
template <> void max_pool2d_backward<Cpu>(Tensor&, const Tensor&, const Tensor&) { MG_FAIL("todo"); }
template <> void adaptive_avg_pool2d_forward<Cpu>(Tensor&, const Tensor&) { MG_FAIL("todo"); }
template <> void adaptive_avg_pool2d_backward<Cpu>(Tensor&, const Tensor&) { MG_FAIL("todo"); }
}  // namespace mg
