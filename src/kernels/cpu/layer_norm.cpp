// Layer normalisation on the CPU (kernels/layer_norm.h): rows in pieces for y and dx, column
// blocks for dw and db (each column's rows in order).
#include "kernels/layer_norm.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"

namespace mg {

template <>
void layer_norm_forward<Cpu>(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                             float eps) {
  const int64_t c = x.size(x.dim() - 1), m = c > 0 ? x.numel() / c : 0;
  const float *px = x.data<float>(), *pw = w.defined() ? w.data<float>() : nullptr,
              *pb = b.defined() ? b.data<float>() : nullptr;
  float *py = y.data<float>(), *pm = mean.data<float>(), *pr = rstd.data<float>();
  cpu::parallel_for(m, cpu::items_per_piece(c), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = px + r * c;
      double s = 0;
      for (int64_t j = 0; j < c; ++j) s += xr[j];
      const double mu = s / static_cast<double>(c);
      double sq = 0;
      for (int64_t j = 0; j < c; ++j) sq += (xr[j] - mu) * (xr[j] - mu);
      const float mean_r = static_cast<float>(mu);
      const float rstd_r = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(c) + eps));
      pm[r] = mean_r;
      pr[r] = rstd_r;
      float* yr = py + r * c;
      for (int64_t j = 0; j < c; ++j) {
        const float v = (xr[j] - mean_r) * rstd_r;
        yr[j] = v * (pw ? pw[j] : 1.0f) + (pb ? pb[j] : 0.0f);
      }
    }
  });
}

template <>
void layer_norm_backward<Cpu>(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                              const Tensor& mean, const Tensor& rstd, bool accumulate) {
  const int64_t c = x.size(x.dim() - 1), m = c > 0 ? x.numel() / c : 0;
  const float *px = x.data<float>(), *pdy = dy.data<float>(), *pw = w.defined() ? w.data<float>() : nullptr;
  const float *pm = mean.data<float>(), *pr = rstd.data<float>();
  if (dx.defined()) {
    float* pdx = dx.data<float>();
    cpu::parallel_for(m, cpu::items_per_piece(c), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float *xr = px + r * c, *gr = pdy + r * c;
        double sg = 0, sgx = 0;
        for (int64_t j = 0; j < c; ++j) {
          const float g = gr[j] * (pw ? pw[j] : 1.0f), xhat = (xr[j] - pm[r]) * pr[r];
          sg += g;
          sgx += static_cast<double>(g) * xhat;
        }
        const float mg = static_cast<float>(sg / static_cast<double>(c)), mgx = static_cast<float>(sgx / static_cast<double>(c));
        float* dr = pdx + r * c;
        for (int64_t j = 0; j < c; ++j) {
          const float g = gr[j] * (pw ? pw[j] : 1.0f), xhat = (xr[j] - pm[r]) * pr[r];
          dr[j] = pr[r] * (g - mg - xhat * mgx);
        }
      }
    });
  }
  if (!dw.defined() && !db.defined()) return;
  float *pdw = dw.defined() ? dw.data<float>() : nullptr, *pdb = db.defined() ? db.data<float>() : nullptr;
  constexpr int64_t kCols = 64;  // a column block: its rows are read in order, 64 floats at a time
  const int64_t blocks = (c + kCols - 1) / kCols;
  cpu::parallel_for(blocks, cpu::items_per_piece(m * kCols), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t j0 = k * kCols, j1 = std::min(c, j0 + kCols);
      float aw[kCols], ab[kCols];
      for (int64_t j = j0; j < j1; ++j) {
        aw[j - j0] = pdw && accumulate ? pdw[j] : 0.0f;
        ab[j - j0] = pdb && accumulate ? pdb[j] : 0.0f;
      }
      for (int64_t r = 0; r < m; ++r) {
        const float *xr = px + r * c, *gr = pdy + r * c;
        for (int64_t j = j0; j < j1; ++j) {
          aw[j - j0] += gr[j] * ((xr[j] - pm[r]) * pr[r]);
          ab[j - j0] += gr[j];
        }
      }
      for (int64_t j = j0; j < j1; ++j) {
        if (pdw) pdw[j] = aw[j - j0];
        if (pdb) pdb[j] = ab[j - j0];
      }
    }
  });
}

}  // namespace mg
