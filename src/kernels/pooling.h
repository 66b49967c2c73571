// Pooling.  x: (N, C, H, W)   y: (N, C, OH, OW)
// max_pool2d: y = max over each KxK window (stride s, implicit -inf padding p);
//             idx (int64, shape of y) = argmax as h * W + w within the plane.      (=)
//   backward: dx = 0, then dx[n,c,idx] += dy in output order                     (=)
//             (kernel, stride, pad: the forward's, so a device can gather instead of scatter)
// adaptive_avg_pool2d: window i spans rows [floor(i H / OH), ceil((i+1) H / OH)), likewise
//             columns (PyTorch's rule); y = mean over the window.               (=)
//   backward: dx = sum over windows containing the element of dy / window size   (=)
// channels_last: x, y, idx and the gradients (N, H, W, C) and (N, OH, OW, C); idx means the same.
#pragma once

#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
template <class D>
void max_pool2d_forward(Tensor& y, Tensor& idx, const Tensor& x, int kernel, int stride, int pad, bool channels_last);
template <class D>
void max_pool2d_backward(Tensor& dx, const Tensor& dy, const Tensor& idx, int kernel, int stride, int pad,
                         bool channels_last);
template <class D> void adaptive_avg_pool2d_forward(Tensor& y, const Tensor& x, bool channels_last);
template <class D> void adaptive_avg_pool2d_backward(Tensor& dx, const Tensor& dy, bool channels_last);
}  // namespace mg
