// Layer normalisation of x: (..., C) over its last dimension, M = numel / C rows.
//   forward:   mean_r = (1/C) sum_c x,  rstd_r = 1 / sqrt((1/C) sum_c (x - mean_r)^2 + eps)
//              y = (x - mean_r) rstd_r w_c + b_c                                  (=; mean, rstd =)
//   backward:  xhat = (x - mean_r) rstd_r,  g = dy w_c
//              dx = rstd_r (g - (1/C) sum_c g - xhat (1/C) sum_c g xhat)          (= or +=)
//              dw_c = sum_r dy xhat,  db_c = sum_r dy                             (= or +=)
// Row sums run over c in order, in double; dw and db add the rows in order onto the buffer
// (onto 0 when not accumulating), so micro-batches accumulated in order add the same terms in
// the same order as the big batch, and nothing depends on the thread count (Note [fixed pieces]).
// With add_dx, dx += the value rounded to dx's dtype, in float32, rounded again: add_into_kernel's
// bits on a separate dx (Note [adding into pending gradients] in src/core/autograd.cpp).
#pragma once

#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
template <class D>
void layer_norm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                        float eps);
// s = a + b (add_forward's bits, in s's dtype), then y, mean and rstd = layer_norm_forward of s
// (Note [fused residual layer_norm] in src/ops/layer_norm.cpp): on CUDA one pass over each row,
// which reads a and b and writes s and y, where the two kernels read s once more; on the CPU the
// two kernels.
template <class D>
void add_layer_norm_forward(Tensor& s, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                            const Tensor& w, const Tensor& bias, float eps);
template <class D>
void layer_norm_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                         const Tensor& mean, const Tensor& rstd, bool accumulate, bool add_dx = false);
}  // namespace mg
