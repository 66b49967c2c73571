// Embedding: rows of a table by index.
//   forward:  y[p, :] = w[idx[p], :]            idx: any shape, P = numel, int64 in [0, V);
//                                               w: (V, C); y: (idx's shape..., C)           (=)
//   backward: dw[v, :] = sum of dy[p, :] over the positions p with idx[p] = v, in increasing p,
//             added onto the buffer when accumulating (onto 0 otherwise; rows no index names
//             are then 0)                                                                   (= or +=)
// The positions of each row are summed in order whatever the thread count (no atomics), so the
// result is deterministic, and micro-batches accumulated in order add what the big batch adds.
// An index outside [0, V) is an mg::Error (CPU: in the forward; CUDA: flagged by the kernel and
// raised at the next synchronisation).
#pragma once

#include <cstdint>

#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
template <class D> void embedding_forward(Tensor& y, const Tensor& idx, const Tensor& w);
template <class D> void embedding_backward(Tensor& dw, const Tensor& dy, const Tensor& idx, bool accumulate);

// The positions of each row, in increasing order (CSR): positions of row v are
// pos[offset[v] .. offset[v + 1]). idx on the host; out-of-range indices are an error.
struct EmbeddingBuckets {
  std::vector<int64_t> offset, pos;
};
EmbeddingBuckets embedding_buckets(const int64_t* idx, int64_t n, int64_t rows);
}  // namespace mg
