#include "kernels/embedding.h"

#include <algorithm>
#include <cstring>

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"

namespace mg {

EmbeddingBuckets embedding_buckets(const int64_t* idx, int64_t n, int64_t rows) {
  EmbeddingBuckets b;
  b.offset.assign(static_cast<size_t>(rows) + 1, 0);
  for (int64_t p = 0; p < n; ++p) {
    MG_CHECK(idx[p] >= 0 && idx[p] < rows, "embedding: index[" << p << "] = " << idx[p] << " is not a row of the table [0, "
                                                               << rows << ")");
    ++b.offset[static_cast<size_t>(idx[p]) + 1];
  }
  for (size_t v = 0; v < static_cast<size_t>(rows); ++v) b.offset[v + 1] += b.offset[v];
  b.pos.resize(static_cast<size_t>(n));
  std::vector<int64_t> next(b.offset.begin(), b.offset.end() - 1);
  for (int64_t p = 0; p < n; ++p) b.pos[static_cast<size_t>(next[static_cast<size_t>(idx[p])]++)] = p;
  return b;
}

template <> void embedding_forward<Cpu>(Tensor& y, const Tensor& idx, const Tensor& w) {
  const int64_t n = idx.numel(), v = w.size(0), c = w.size(1);
  const int64_t* pi = idx.data<int64_t>();
  for (int64_t p = 0; p < n; ++p) {
    MG_CHECK(pi[p] >= 0 && pi[p] < v, "embedding: index[" << p << "] = " << pi[p] << " is not a row of the table [0, "
                                                          << v << ")");
  }
  const float* pw = w.data<float>();
  float* py = y.data<float>();
  cpu::parallel_for(n, cpu::items_per_piece(c), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) std::memcpy(py + p * c, pw + pi[p] * c, static_cast<size_t>(c) * sizeof(float));
  });
}

template <> void embedding_backward<Cpu>(Tensor& dw, const Tensor& dy, const Tensor& idx, bool accumulate) {
  const int64_t v = dw.size(0), c = dw.size(1);
  const EmbeddingBuckets b = embedding_buckets(idx.data<int64_t>(), idx.numel(), v);
  const float* pdy = dy.data<float>();
  float* pdw = dw.data<float>();
  cpu::parallel_for(v, cpu::items_per_piece(c), [&](int64_t v0, int64_t v1) {
    for (int64_t r = v0; r < v1; ++r) {
      const int64_t k0 = b.offset[static_cast<size_t>(r)], k1 = b.offset[static_cast<size_t>(r) + 1];
      float* row = pdw + r * c;
      if (!accumulate) std::fill(row, row + c, 0.0f);
      for (int64_t k = k0; k < k1; ++k) {
        const float* g = pdy + b.pos[static_cast<size_t>(k)] * c;
        for (int64_t j = 0; j < c; ++j) row[j] += g[j];
      }
    }
  });
}

}  // namespace mg
