// 2-D convolution (cross-correlation, as in PyTorch), square stride and padding.
//   x: (N, C, H, W)   w: (O, C, KH, KW)   b: (O)   y: (N, O, OH, OW)
//   OH = (H + 2 pad - KH) / stride + 1, likewise OW
//   forward:  y[n,o,i,j] = b[o] + sum_{c,p,q} w[o,c,p,q] x[n,c, i*s-pad+p, j*s-pad+q]   (=)
//   backward: dx = conv_transpose(dy, w)                       (=)   skipped when undefined
//             dw[o,c,p,q] = sum_{n,i,j} dy[n,o,i,j] x[n,c,..]   (= or += when accumulate)
//             db[o] = sum_{n,i,j} dy[n,o,i,j]                  (= or += when accumulate)
// channels_last: x (N, H, W, C), w (O, KH, KW, C), y and dy (N, OH, OW, O), the same math (Note
// [channels last] in src/ops/conv2d.cpp; on the CPU, Note [channels last on the CPU]).
// relu: forward gives y = max(conv + b, 0) (Note [fused relu] in src/ops/conv2d.cpp); the
// backward's dy is then the gradient of the convolution's output, masked by the op.
// mask_dx: backward gives dx = x > 0 ? conv_transpose(dy, w) : 0 (a select, as the ReLU's backward),
// x being a ReLU's output (Note [relu mask in the consumer] in src/core/autograd.cpp); dx and x of
// one dtype.
#pragma once

#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
template <class D>
void conv2d_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, int stride,
                    int pad, bool channels_last, bool relu = false);
template <class D>
void conv2d_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& w, int stride, int pad, bool accumulate, bool channels_last,
                     bool mask_dx = false);
}  // namespace mg
