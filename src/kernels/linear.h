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
// linear_gelu (Note [fused gelu] in src/ops/linear.cpp): pre = x w^T + b and y = gelu(pre), the
// tanh form (kernels/gelu.h), pre and y of y's dtype (=). On CUDA one cuBLASLt product with the
// GELU_AUX_BIAS epilogue where cuBLASLt takes it; else, and on the CPU, linear then gelu.
template <class D>
void linear_gelu_forward(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& w, const Tensor& b);
template <class D>
void linear_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& w, bool accumulate);
}  // namespace mg
