#include "kernels/conv2d.h"

namespace mg {
template <> void conv2d_forward<Cpu>(Tensor&, const Tensor&, const Tensor&, const Tensor&, int, int) {
  MG_FAIL("conv2d: CPU kernel not written yet");
}
template <>
void conv2d_backward<Cpu>(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&, int,
                          int, bool) {
  MG_FAIL("conv2d: CPU kernel not written yet");
}
}  // namespace mg
