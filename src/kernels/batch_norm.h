// Batch normalisation of x: (N, C, S...) per channel c over its M = N * S values (S: the
// product of the dimensions after C; 1 for (N, C)).
//   stats:     mean_c = (1/M) sum x                 var_c = (1/M) sum (x - mean_c)^2   (biased; =)
//   forward:   y = (x - mean_c) r_c w_c + b_c,      r_c = 1 / sqrt(var_c + eps)        (=; w, b: 1, 0
//                                                                                       when undefined)
//   backward:  xhat = (x - mean_c) r_c,  db_c = sum dy,  dw_c = sum dy xhat            (= or +=)
//              batch statistics (mean, var of this x):  dx = w_c r_c (dy - db_c / M - xhat dw_c / M)
//              given statistics (running ones, eval):   dx = w_c r_c dy                 (=)
// Every sum runs over the images in order, each image's values in fixed lanes: the same bits for
// any thread count (Note [fixed pieces]) and, for dw and db added into a buffer, image by image
// (Note [weight gradients in sample order] in kernels/cpu/conv2d.cpp) on the CPU.
// channels_last: x, y and the gradients (N, S..., C), the channel the last dimension.
// relu: forward gives y = max(y, 0) (Note [fused relu] in src/ops/conv2d.cpp); the backward's dy
// is then the normalisation's output gradient, masked by the op.
#pragma once

#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
template <class D> void batch_norm_stats(Tensor& mean, Tensor& var, const Tensor& x, bool channels_last);
template <class D>
void batch_norm_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& mean,
                        const Tensor& var, float eps, bool channels_last, bool relu = false);
template <class D>
void batch_norm_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                         const Tensor& mean, const Tensor& var, float eps, bool batch_stats, bool accumulate,
                         bool channels_last);
}  // namespace mg
