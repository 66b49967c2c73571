#include "kernels/embedding.h"

#include <algorithm>
#include <cstring>

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"
#include "kernels/cpu/half_rows.h"

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
  const char* pw = static_cast<const char*>(w.raw_data());
  char* py = static_cast<char*>(y.raw_data());
  const size_t ws = dtype_size(w.dtype()), ys = dtype_size(y.dtype());
  const int64_t grain = cpu::items_per_piece(c);
  const Tensor none;  // a table of y's dtype is copied as it is: no float32 rows
  const cpu::FloatRowRoom room(cpu::parallel_for_slots(n, grain), {{w.dtype() == y.dtype() ? &none : &w, c}});
  cpu::parallel_for_slot(n, grain, [&](int64_t p0, int64_t p1, int slot) {
    if (w.dtype() == y.dtype()) {
      for (int64_t p = p0; p < p1; ++p) std::memcpy(py + p * c * ys, pw + pi[p] * c * ws, static_cast<size_t>(c) * ys);
      return;
    }
    // A float32 table into a bf16 or f16 output (autocast keeps the table float32), or one low
    // dtype into the other: each value widened and rounded, as apply() would round a float32 output.
    const cpu::FloatRows table = room.rows(slot, 0);
    for (int64_t p = p0; p < p1; ++p) cpu::narrow_span(py + p * c * ys, y.dtype(), table.read(pi[p]), c);
  });
}

template <> void embedding_backward<Cpu>(Tensor& dw, const Tensor& dy, const Tensor& idx, bool accumulate) {
  const int64_t v = dw.size(0), c = dw.size(1);
  const EmbeddingBuckets b = embedding_buckets(idx.data<int64_t>(), idx.numel(), v);
  const int64_t grain = cpu::items_per_piece(c);
  const cpu::FloatRowRoom room(cpu::parallel_for_slots(v, grain), {{&dy, c}, {&dw, c}});
  cpu::parallel_for_slot(v, grain, [&](int64_t v0, int64_t v1, int slot) {
    const cpu::FloatRows dys = room.rows(slot, 0), dws = room.rows(slot, 1);
    for (int64_t r = v0; r < v1; ++r) {
      const int64_t k0 = b.offset[static_cast<size_t>(r)], k1 = b.offset[static_cast<size_t>(r) + 1];
      float* row = accumulate ? dws.update(r) : dws.write(r);
      if (!accumulate) std::fill(row, row + c, 0.0f);
      for (int64_t k = k0; k < k1; ++k) {
        const float* g = dys.read(b.pos[static_cast<size_t>(k)]);
        for (int64_t j = 0; j < c; ++j) row[j] += g[j];
      }
      dws.store(r);
    }
  });
}

}  // namespace mg
