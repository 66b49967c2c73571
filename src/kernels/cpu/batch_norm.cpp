// Batch normalisation on the CPU (kernels/batch_norm.h): one piece per channel; within a channel
// the images in order, each image's values summed in 8 fixed lanes (in double for the
// statistics), so the result does not depend on the thread count or on where the data lies.
#include "kernels/batch_norm.h"

#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"

namespace mg {

namespace {

struct Layout {
  int64_t n, c, s;  // x as (N, C, S)
};

Layout layout(const Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1);
  return {n, c, n * c > 0 ? x.numel() / (n * c) : 0};
}

// sum over p[0, len) of f(p[i]) in 8 double lanes, then the lanes in order.
template <class F> double lanes(const float* p, int64_t len, F f) {
  double lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += f(p[i + l], i + l);
  }
  for (int l = 0; i < len; ++i, ++l) lane[l] += f(p[i], i);
  double s = 0;
  for (double v : lane) s += v;
  return s;
}

// The sums of g and of g * xhat over [0, len) (xhat = (x - mu) rs), in one pass over g and x:
// each sum in its 8 lanes exactly as lanes() adds it, so the bits are those of two lanes() calls.
// The product is a statement of its own, as it was in lanes()'s lambda: clang fuses a multiply
// and an add into one FMA only within a statement (GCC fuses across them either way).
void two_sums(const float* g, const float* x, int64_t len, float mu, float rs, double& sum_g, double& sum_gx) {
  double lb[8] = {}, lw[8] = {};
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
#pragma omp simd  // one lane per element: GCC left this loop scalar without it
    for (int l = 0; l < 8; ++l) {
      const double v = g[i + l], p = v * static_cast<double>((x[i + l] - mu) * rs);
      lb[l] += v;
      lw[l] += p;
    }
  }
  for (int l = 0; i < len; ++i, ++l) {
    const double v = g[i], p = v * static_cast<double>((x[i] - mu) * rs);
    lb[l] += v;
    lw[l] += p;
  }
  sum_g = 0;
  sum_gx = 0;
  for (int l = 0; l < 8; ++l) {
    sum_g += lb[l];
    sum_gx += lw[l];
  }
}

}  // namespace

template <> void batch_norm_stats<Cpu>(Tensor& mean, Tensor& var, const Tensor& x) {
  const Layout L = layout(x);
  const float* xp = x.data<float>();
  float* mp = mean.data<float>();
  float* vp = var.data<float>();
  const double m = static_cast<double>(L.n * L.s);
  cpu::parallel_for(L.c, cpu::items_per_piece(L.n * L.s), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double sum = 0;
      for (int64_t i = 0; i < L.n; ++i) sum += lanes(xp + (i * L.c + c) * L.s, L.s, [](float v, int64_t) { return static_cast<double>(v); });
      const double mu = m > 0 ? sum / m : 0.0;
      double sq = 0;
      for (int64_t i = 0; i < L.n; ++i) {
        sq += lanes(xp + (i * L.c + c) * L.s, L.s, [mu](float v, int64_t) { return (v - mu) * (v - mu); });
      }
      mp[c] = static_cast<float>(mu);
      vp[c] = m > 0 ? static_cast<float>(sq / m) : 0.0f;
    }
  });
}

template <>
void batch_norm_forward<Cpu>(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& mean,
                             const Tensor& var, float eps) {
  const Layout L = layout(x);
  const float *xp = x.data<float>(), *mp = mean.data<float>(), *vp = var.data<float>();
  const float* wp = w.defined() ? w.data<float>() : nullptr;
  const float* bp = b.defined() ? b.data<float>() : nullptr;
  float* yp = y.data<float>();
  cpu::parallel_for(L.n * L.c, cpu::items_per_piece(L.s), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c = r % L.c;
      const float rs = 1.0f / std::sqrt(vp[c] + eps);
      const float scale = rs * (wp ? wp[c] : 1.0f), shift = (bp ? bp[c] : 0.0f) - mp[c] * scale;
      cpu::ArrMap(yp + r * L.s, L.s) = cpu::ConstArrMap(xp + r * L.s, L.s) * scale + shift;
    }
  });
}

template <>
void batch_norm_backward<Cpu>(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                              const Tensor& mean, const Tensor& var, float eps, bool batch_stats, bool accumulate) {
  const Layout L = layout(x);
  const float *xp = x.data<float>(), *dyp = dy.data<float>(), *mp = mean.data<float>(), *vp = var.data<float>();
  const float* wp = w.defined() ? w.data<float>() : nullptr;
  float* dxp = dx.defined() ? dx.data<float>() : nullptr;
  float* dwp = dw.defined() ? dw.data<float>() : nullptr;
  float* dbp = db.defined() ? db.data<float>() : nullptr;
  const double m = static_cast<double>(L.n * L.s);
  cpu::parallel_for(L.c, cpu::items_per_piece(2 * L.n * L.s), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const float mu = mp[c], rs = 1.0f / std::sqrt(vp[c] + eps);
      // Per image in order, each image's sum in lanes: into the buffers image by image
      // (Note [weight gradients in sample order]); the whole-batch sums for dx in double.
      float sb = accumulate && dbp ? dbp[c] : 0.0f, sw = accumulate && dwp ? dwp[c] : 0.0f;
      double tb = 0, tw = 0;
      for (int64_t i = 0; i < L.n; ++i) {
        const float* g = dyp + (i * L.c + c) * L.s;
        const float* xi = xp + (i * L.c + c) * L.s;
        double b_i, w_i;
        two_sums(g, xi, L.s, mu, rs, b_i, w_i);
        sb += static_cast<float>(b_i);
        sw += static_cast<float>(w_i);
        tb += b_i;
        tw += w_i;
      }
      if (dbp) dbp[c] = sb;
      if (dwp) dwp[c] = sw;
      if (!dxp) continue;
      const float k = rs * (wp ? wp[c] : 1.0f);
      if (!batch_stats) {
        // Given statistics: dx = k dy, whatever x is (an infinite x gave 0 * inf = NaN through the
        // batch-statistics formula; PyTorch and our CUDA kernel give k dy).
        for (int64_t i = 0; i < L.n; ++i) {
          const int64_t off = (i * L.c + c) * L.s;
          for (int64_t j = 0; j < L.s; ++j) dxp[off + j] = k * dyp[off + j];
        }
        continue;
      }
      const float mb = m > 0 ? static_cast<float>(tb / m) : 0.0f;
      const float mw = m > 0 ? static_cast<float>(tw / m) : 0.0f;
      for (int64_t i = 0; i < L.n; ++i) {
        const int64_t off = (i * L.c + c) * L.s;
        for (int64_t j = 0; j < L.s; ++j) {
          const float xhat = (xp[off + j] - mu) * rs;
          dxp[off + j] = k * (dyp[off + j] - mb - xhat * mw);
        }
      }
    }
  });
}

}  // namespace mg
