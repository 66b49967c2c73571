// ReLU.  forward:  y = max(x, 0)                 x, y: any shape   (=)
//        backward: dx = dy * (y > 0)                               (=)
// Backward reads the output, not the input, so the tape saves y (which the next op usually
// saves anyway) and x can be freed.
#pragma once

#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
template <class D> void relu_forward(Tensor& y, const Tensor& x);
template <class D> void relu_backward(Tensor& dx, const Tensor& dy, const Tensor& y);
}  // namespace mg
