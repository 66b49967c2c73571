// Element-wise kernels. All tensors contiguous float32 of equal numel, on one device.
//   add:          y = a + b            (=)
//   mul:          y = a * b            (=)   also mul's backward: da = dy * b, db = dy * a
//   add_inplace:  y += x               (+=)  the gradient add-in-place used by accumulation
//   scale:        y = s * x            (=)   y may be x
//   fill:         y = v                (=)
//   zero_many:    every y of ys = 0    (=)   one launch for the whole list (Optimizer::zero_grad)
//   sum_squares_into: out[slot] = sum over xs of sum(x^2), accumulated in double, in a fixed
//                 order (deterministic); xs float32 of any sizes, out float64 on their device (=)
//   store_scalar: out[slot] = x[0] as double; x one float32, out float64, one device          (=)
// The last two fill the statistics an optimizer step reads back in one copy (the window's
// losses and the squared gradient norm: minigrad/optim/accumulate.h), so the host never waits per tensor
// or per micro-batch.
#pragma once

#include <cstdint>
#include <vector>

#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
template <class D> void add_forward(Tensor& y, const Tensor& a, const Tensor& b);
template <class D> void mul_forward(Tensor& y, const Tensor& a, const Tensor& b);
template <class D> void add_inplace(Tensor& y, const Tensor& x);
template <class D> void scale_forward(Tensor& y, const Tensor& x, float s);
template <class D> void fill(Tensor& y, float v);
template <class D> void zero_many(const std::vector<Tensor>& ys);
template <class D> void sum_squares_into(const std::vector<Tensor>& xs, Tensor& out, int64_t slot);
template <class D> void store_scalar(Tensor& out, int64_t slot, const Tensor& x);
// The argument checks both devices' multi-tensor kernels make (one place): every tensor float32
// on `d`; the statistics tensor float64 with `slot` inside it.
void check_float_list(const char* op, const std::vector<Tensor>& xs, Device d);
void check_stats_args(const char* op, const std::vector<Tensor>& xs, const Tensor& out, int64_t slot);
void check_store_scalar_args(const Tensor& out, int64_t slot, const Tensor& x);
// Copies bytes between two tensors of equal size on any pair of devices (D = the non-CPU side).
template <class D> void copy_bytes(Tensor& dst, const Tensor& src);
}  // namespace mg
