// Where a sliding window (a convolution's or a pool's, stride s) meets the input: shared by the
// CPU kernels of conv2d and the pools.
#pragma once

#include <cstdint>

namespace mg::cpu {

// Smallest j >= 0 with j * s >= a (a may be negative): the first output column whose window tap
// lands at or after input column a's offset.
inline int64_t first_at_least(int64_t a, int64_t s) { return a <= 0 ? 0 : (a + s - 1) / s; }

}  // namespace mg::cpu
