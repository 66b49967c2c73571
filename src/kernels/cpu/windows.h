// Where a sliding window (a convolution's or a pool's, stride s) meets the input: shared by the
// CPU kernels of conv2d and the pools.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

namespace mg::cpu {

// Smallest j >= 0 with j * s >= a (a may be negative).
inline int64_t first_at_least(int64_t a, int64_t s) { return a <= 0 ? 0 : (a + s - 1) / s; }

// The outputs [j0, j1) of `out` whose window's tap q (column j s - pad + q) lies inside an input of
// `in` columns; the others meet the padding there.
inline std::pair<int64_t, int64_t> window_outputs(int64_t q, int64_t pad, int64_t s, int64_t in, int64_t out) {
  const int64_t j0 = std::min(first_at_least(pad - q, s), out);
  return {j0, std::max(std::min(first_at_least(in + pad - q, s), out), j0)};
}

}  // namespace mg::cpu
