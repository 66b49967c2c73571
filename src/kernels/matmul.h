// Products of batches of matrices, row-major float32:
//   a (B, M, K), b (B, K, N)  ->  y (B, M, N)
//   forward:  y_i  = a_i b_i                                 (=)
//   backward: da_i = dy_i b_i^T,   db_i = a_i^T dy_i         (=; each skipped when undefined)
// Each product i is computed on its own, in an order fixed by the shapes: deterministic, and the
// same bits at any thread count.
#pragma once

#include <cstdint>

#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
struct MatmulDims {
  int64_t batch, m, k, n;
};
template <class D> void matmul_forward(Tensor& y, const Tensor& a, const Tensor& b, const MatmulDims& d);
template <class D>
void matmul_backward(Tensor& da, Tensor& db, const Tensor& dy, const Tensor& a, const Tensor& b, const MatmulDims& d);
}  // namespace mg
