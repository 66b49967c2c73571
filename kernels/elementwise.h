// Element-wise kernels. All tensors contiguous float32 of equal numel, on one device.
//   add:          y = a + b            (=)
//   add_inplace:  y += x               (+=)  the gradient add-in-place used by accumulation
//   scale:        y = s * x            (=)   y may be x
//   fill:         y = v                (=)
//   sum_squares:  returns sum(x^2) in double (for the global gradient norm)
#pragma once

#include "core/tensor.h"
#include "kernels/dispatch.h"

namespace mg {
template <class D> void add_forward(Tensor& y, const Tensor& a, const Tensor& b);
template <class D> void add_inplace(Tensor& y, const Tensor& x);
template <class D> void scale_forward(Tensor& y, const Tensor& x, float s);
template <class D> void fill(Tensor& y, float v);
template <class D> double sum_squares(const Tensor& x);
// Copies bytes between two tensors of equal size on any pair of devices (D = the non-CPU side).
template <class D> void copy_bytes(Tensor& dst, const Tensor& src);
}  // namespace mg
