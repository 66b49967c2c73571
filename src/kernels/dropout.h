// Dropout (inverted).  x, y: any shape, n elements.
//   keep_i = philox_uniform(seed, offset + i) >= p
//   forward:  y  = keep ? x / (1 - p) : 0          (=)
//   backward: dx = keep ? dy / (1 - p) : 0         (=)
// The mask is never stored: backward (and checkpoint replay) regenerate it from (seed, offset),
// identically on CPU and CUDA (minigrad/core/rng.h).
#pragma once

#include <cstdint>

#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
template <class D>
void dropout_forward(Tensor& y, const Tensor& x, float p, uint64_t seed, uint64_t offset);
template <class D>
void dropout_backward(Tensor& dx, const Tensor& dy, float p, uint64_t seed, uint64_t offset);
}  // namespace mg
