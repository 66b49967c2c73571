// The keys, offsets and sums of embedding.cu's backward (kernels/embedding.h): embedding_buckets'
// CSR, made on the device.
// Plain C++ (no CUDA headers; MG_HOST_DEVICE comes from minigrad/core/rng.h): embedding.cu
// calls them on the GPU, tests/test_cuda_kernel_math.cpp checks them on the CPU.
#pragma once

#include <cstdint>

#include <minigrad/core/rng.h>

#include "kernels/cuda/element_math.h"  // value(p, i): dy of any storage type

namespace mg::cuda::math {

// Position p's sort key is its row, or `rows` for an index outside [0, rows) (the error flag has
// it): sorted stably, the keys put each row's positions together in increasing order, and the
// out-of-range ones after every row. offset[r], the number of keys below r, is where row r's
// positions start; offset[rows] ends the last row's.

MG_HOST_DEVICE uint64_t embedding_key(int64_t index, int64_t rows) {
  return static_cast<uint64_t>(index >= 0 && index < rows ? index : rows);
}

// The radix sort's end bit: every key (at most rows) is below 2^bits.
MG_HOST_DEVICE int embedding_key_bits(int64_t rows) {
  int bits = 1;
  while (bits < 64 && (uint64_t{1} << bits) <= static_cast<uint64_t>(rows)) ++bits;
  return bits;
}

// The first k with sorted[k] >= r (n when none): offset[r] for r in [0, rows].
MG_HOST_DEVICE int64_t embedding_offset(const uint64_t* sorted, int64_t n, int64_t r) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] < static_cast<uint64_t>(r)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// dw[r, j]: row r's positions' dy[p, j] added in order onto acc (the buffer, or 0).
template <class G>
MG_HOST_DEVICE float embedding_grad(float acc, G dy, const int64_t* offset, const int64_t* pos, int64_t r, int64_t j,
                                    int64_t c) {
  for (int64_t k = offset[r]; k < offset[r + 1]; ++k) acc += value(dy, pos[k] * c + j);
  return acc;
}

}  // namespace mg::cuda::math
