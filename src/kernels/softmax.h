// Softmax over the last dimension: x, y viewed as (R, C) rows.
//   forward:  y_rc = exp(x_rc - m_r) / sum_c exp(x_rc - m_r),  m_r = max_c x_rc              (=)
//   backward: dx_rc = y_rc (dy_rc - sum_c dy_rc y_rc)                                          (=)
// A row of -inf (everything masked) gives NaN, as in PyTorch. Backward reads y (the tape saves it).
#pragma once

#include <cstdint>

#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
template <class D> void softmax_forward(Tensor& y, const Tensor& x, int64_t rows, int64_t cols);
template <class D> void softmax_backward(Tensor& dx, const Tensor& dy, const Tensor& y, int64_t rows, int64_t cols);
}  // namespace mg
