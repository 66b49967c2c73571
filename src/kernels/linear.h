// Linear.   x: (N, K)   w: (M, K)   b: (M)   y: (N, M)
//   forward:  y  = x w^T + b                         (=)
//   backward: dx = dy w                              (=)   skipped when dx is undefined
//             dw = dy^T x                            (= or += when accumulate)
//             db = sum_n dy[n, :]                    (= or += when accumulate)
// `accumulate` lets the tape add weight gradients straight into the parameters' gradient
// buffers (beta = 1 in the GEMM), with no temporary and no extra pass.
#pragma once

#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
template <class D> void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b);
template <class D>
void linear_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& w, bool accumulate);
}  // namespace mg
