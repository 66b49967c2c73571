// Layer normalisation on the CPU (kernels/layer_norm.h): rows in pieces for y and dx, column
// blocks for dw and db (each column's rows in order).
//
// x, y, dy and dx may be bf16 or f16 (Note [half operands] in kernels/cpu/gemm.h), and the weight
// and bias too: each row is widened in turn into a buffer of its piece (cpu::FloatRows), its
// float32 code runs there, and y's and dx's rows are rounded on the way out; dw and db widen 64
// columns of a row at a time. mean and rstd stay float32, dw and db are summed in float32 and
// rounded once into a low buffer. The same calls run on float32 rows in place, so the bits are
// those of the float32 kernels on widened copies.
#include "kernels/layer_norm.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"
#include "kernels/convert.h"
#include "kernels/elementwise.h"
#include "kernels/cpu/half_rows.h"

namespace mg {

namespace {

int64_t rows_of(const Tensor& x, int64_t c) { return c > 0 ? x.numel() / c : 0; }

const float* values_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

// Values [j0, j1) of row r of t (rows of c) as float32: t's own when it is float32, else widened
// into buf.
const float* columns(const Tensor& t, int64_t c, int64_t r, int64_t j0, int64_t j1, float* buf) {
  if (t.dtype() == DType::f32) return t.data<float>() + r * c + j0;
  cpu::widen_span(buf, static_cast<const char*>(t.raw_data()) + static_cast<size_t>(r * c + j0) * dtype_size(t.dtype()),
                  t.dtype(), j1 - j0);
  return buf;
}

}  // namespace

template <>
void layer_norm_forward<Cpu>(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                             float eps) {
  const int64_t c = x.size(x.dim() - 1), m = rows_of(x, c);
  const Tensor w32 = w.defined() ? cpu::widened(w) : Tensor(), b32 = b.defined() ? cpu::widened(b) : Tensor();
  const float *pw = values_or_null(w32), *pb = values_or_null(b32);
  float *pm = mean.data<float>(), *pr = rstd.data<float>();
  const int64_t grain = cpu::items_per_piece(c);
  const cpu::FloatRowRoom room(cpu::parallel_for_slots(m, grain), {{&x, c}, {&y, c}});
  cpu::parallel_for_slot(m, grain, [&](int64_t r0, int64_t r1, int slot) {
    const cpu::FloatRows xs = room.rows(slot, 0), ys = room.rows(slot, 1);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xs.read(r);
      double s = 0;
      for (int64_t j = 0; j < c; ++j) s += xr[j];
      const double mu = s / static_cast<double>(c);
      double sq = 0;
      for (int64_t j = 0; j < c; ++j) sq += (xr[j] - mu) * (xr[j] - mu);
      const float mean_r = static_cast<float>(mu);
      const float rstd_r = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(c) + eps));
      pm[r] = mean_r;
      pr[r] = rstd_r;
      float* yr = ys.write(r);
      for (int64_t j = 0; j < c; ++j) {
        const float v = (xr[j] - mean_r) * rstd_r;
        yr[j] = v * (pw ? pw[j] : 1.0f) + (pb ? pb[j] : 0.0f);
      }
      ys.store(r);
    }
  });
}

template <>
void add_layer_norm_forward<Cpu>(Tensor& s, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                                 const Tensor& w, const Tensor& bias, float eps) {
  add_forward<Cpu>(s, a, b);
  layer_norm_forward<Cpu>(y, mean, rstd, s, w, bias, eps);
}

template <>
void layer_norm_backward<Cpu>(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                              const Tensor& mean, const Tensor& rstd, bool accumulate, bool add_dx) {
  const int64_t c = x.size(x.dim() - 1), m = rows_of(x, c);
  const Tensor w32 = w.defined() ? cpu::widened(w) : Tensor();
  const float* pw = values_or_null(w32);
  const float *pm = mean.data<float>(), *pr = rstd.data<float>();
  if (dx.defined()) {
    const int64_t grain = cpu::items_per_piece(c);
    const cpu::FloatRowRoom room(cpu::parallel_for_slots(m, grain), {{&x, c}, {&dy, c}, {&dx, c}});
    cpu::parallel_for_slot(m, grain, [&](int64_t r0, int64_t r1, int slot) {
      const cpu::FloatRows xs = room.rows(slot, 0), dys = room.rows(slot, 1), dxs = room.rows(slot, 2);
      for (int64_t r = r0; r < r1; ++r) {
        const float *xr = xs.read(r), *gr = dys.read(r);
        double sg = 0, sgx = 0;
        for (int64_t j = 0; j < c; ++j) {
          const float g = gr[j] * (pw ? pw[j] : 1.0f), xhat = (xr[j] - pm[r]) * pr[r];
          sg += g;
          sgx += static_cast<double>(g) * xhat;
        }
        const float mg = static_cast<float>(sg / static_cast<double>(c)), mgx = static_cast<float>(sgx / static_cast<double>(c));
        auto value = [&](int64_t j) {
          const float g = gr[j] * (pw ? pw[j] : 1.0f), xhat = (xr[j] - pm[r]) * pr[r];
          return pr[r] * (g - mg - xhat * mgx);
        };
        if (!add_dx) {
          float* dr = dxs.write(r);
          for (int64_t j = 0; j < c; ++j) dr[j] = value(j);
        } else {
          // Onto the row there, each value rounded as a separate dx would hold it: stored in a
          // block first, so that no build contracts its product into the add.
          float* acc = dxs.update(r);
          constexpr int64_t kBlock = 64;
          float v[kBlock];
          for (int64_t j0 = 0; j0 < c; j0 += kBlock) {
            const int64_t n = std::min(kBlock, c - j0);
            for (int64_t k = 0; k < n; ++k) v[k] = value(j0 + k);
            for (int64_t k = 0; k < n; ++k) acc[j0 + k] = acc[j0 + k] + half::rounded(dx.dtype(), v[k]);
          }
        }
        dxs.store(r);
      }
    });
  }
  if (!dw.defined() && !db.defined()) return;
  constexpr int64_t kCols = 64;  // a column block: its rows are read in order, 64 values at a time
  const int64_t blocks = (c + kCols - 1) / kCols;
  cpu::parallel_for(blocks, cpu::items_per_piece(m * kCols), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t j0 = k * kCols, j1 = std::min(c, j0 + kCols), n = j1 - j0;
      float aw[kCols], ab[kCols], xbuf[kCols], gbuf[kCols];
      std::fill_n(aw, n, 0.0f);
      std::fill_n(ab, n, 0.0f);
      if (accumulate && dw.defined()) std::copy_n(columns(dw, c, 0, j0, j1, xbuf), n, aw);
      if (accumulate && db.defined()) std::copy_n(columns(db, c, 0, j0, j1, xbuf), n, ab);
      for (int64_t r = 0; r < m; ++r) {
        const float *xr = columns(x, c, r, j0, j1, xbuf), *gr = columns(dy, c, r, j0, j1, gbuf);
        for (int64_t j = 0; j < n; ++j) {
          aw[j] += gr[j] * ((xr[j] - pm[r]) * pr[r]);
          ab[j] += gr[j];
        }
      }
      auto put = [&](Tensor& g, const float* sum) {
        cpu::narrow_span(static_cast<char*>(g.raw_data()) + static_cast<size_t>(j0) * dtype_size(g.dtype()), g.dtype(), sum, n);
      };
      if (dw.defined()) put(dw, aw);
      if (db.defined()) put(db, ab);
    }
  });
}

}  // namespace mg
