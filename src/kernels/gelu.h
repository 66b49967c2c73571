// GELU, tanh form (GPT-2's, PyTorch's approximate="tanh"):
//   forward:  y = x/2 (1 + t),  t = tanh(k (x + 0.044715 x^3)),  k = sqrt(2/pi)        (=)
//   backward: dx = dy (1/2 (1 + t) + x/2 (1 - t^2) k (1 + 3 * 0.044715 x^2))           (=)
// x, y: any shape. Backward reads the input (the tape saves x).
#pragma once

#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
template <class D> void gelu_forward(Tensor& y, const Tensor& x);
template <class D> void gelu_backward(Tensor& dx, const Tensor& dy, const Tensor& x);
}  // namespace mg
