// Dropout (inverted).  x, y: any shape, n elements, F = per_sample elements per sample.
//   keep_i = philox_uniform(seed, counter_i) >= p
//   counter_i = offset + i                                       (sample_stride == 0: contiguous)
//             = offset + (i / F) * sample_stride + i % F         (samples spread over the counters:
//                                                                 Note [dropout by sample], ranks)
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
void dropout_forward(Tensor& y, const Tensor& x, float p, uint64_t seed, uint64_t offset, int64_t per_sample = 0,
                     uint64_t sample_stride = 0);
template <class D>
void dropout_backward(Tensor& dx, const Tensor& dy, float p, uint64_t seed, uint64_t offset, int64_t per_sample = 0,
                      uint64_t sample_stride = 0);
}  // namespace mg
