// Batch normalisation on the CPU (kernels/batch_norm.h): one piece per channel; within a channel
// the images in order, each image's values summed in 8 fixed lanes (in double for the
// statistics), so the result does not depend on the thread count or on where the data lies.
// x, y, dy and dx may be bf16 or f16 (Note [half operands] in kernels/cpu/gemm.h), and the weight
// and bias too: an (image, channel) plane at a time is widened into, or rounded from, a buffer of
// the piece's (cpu::FloatRows), and the same calls run on float32 planes in place; the statistics
// stay float32, and dw and db are summed in float32.
#include "kernels/batch_norm.h"

#include <cmath>
#include <optional>

#include "core/parallel.h"
#include "kernels/cpu/channels_last.h"
#include "kernels/cpu/eigen.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/packet_math.h"
#include "kernels/relu.h"

namespace mg {

namespace {

struct Planes {
  int64_t n, c, s;  // x as (N, C, S)
};

Planes planes(const Tensor& x) {
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

template <> void batch_norm_stats<Cpu>(Tensor& mean, Tensor& var, const Tensor& x, bool channels_last) {
  if (channels_last) return batch_norm_stats<Cpu>(mean, var, cpu::channels_first_copy(x), false);  // Note [channels last on the CPU]
  const Planes L = planes(x);
  float* mp = mean.data<float>();
  float* vp = var.data<float>();
  const double m = static_cast<double>(L.n * L.s);
  const int64_t grain = cpu::items_per_piece(L.n * L.s);
  const cpu::FloatRowRoom room(cpu::parallel_for_slots(L.c, grain), {{&x, L.s}});
  cpu::parallel_for_slot(L.c, grain, [&](int64_t c0, int64_t c1, int slot) {
    const cpu::FloatRows xs = room.rows(slot, 0);  // plane (i, c) is row i C + c
    for (int64_t c = c0; c < c1; ++c) {
      double sum = 0;
      for (int64_t i = 0; i < L.n; ++i) sum += lanes(xs.read(i * L.c + c), L.s, [](float v, int64_t) { return static_cast<double>(v); });
      const double mu = m > 0 ? sum / m : 0.0;
      double sq = 0;
      for (int64_t i = 0; i < L.n; ++i) {
        sq += lanes(xs.read(i * L.c + c), L.s, [mu](float v, int64_t) { return (v - mu) * (v - mu); });
      }
      mp[c] = static_cast<float>(mu);
      vp[c] = m > 0 ? static_cast<float>(sq / m) : 0.0f;
    }
  });
}

template <>
void batch_norm_forward<Cpu>(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& mean,
                             const Tensor& var, float eps, bool channels_last, bool relu) {
  if (channels_last) {  // Note [channels last on the CPU]
    Tensor yf = cpu::channels_first_empty(y);
    batch_norm_forward<Cpu>(yf, cpu::channels_first_copy(x), w, b, mean, var, eps, false, relu);
    return cpu::store_channels_last(y, yf);
  }
  if (relu) {  // Note [fused relu]: the ReLU kernel in place, the unfused bits
    batch_norm_forward<Cpu>(y, x, w, b, mean, var, eps, false, false);
    return relu_forward<Cpu>(y, y);
  }
  using namespace Eigen::internal;
  const Planes L = planes(x);
  const Tensor w32 = w.defined() ? cpu::widened(w) : Tensor(), b32 = b.defined() ? cpu::widened(b) : Tensor();
  const float *mp = mean.data<float>(), *vp = var.data<float>();
  const float* wp = w.defined() ? w32.data<float>() : nullptr;
  const float* bp = b.defined() ? b32.data<float>() : nullptr;
  const int64_t grain = cpu::items_per_piece(L.s);
  const cpu::FloatRowRoom room(cpu::parallel_for_slots(L.n * L.c, grain), {{&x, L.s}, {&y, L.s}});
  cpu::parallel_for_slot(L.n * L.c, grain, [&](int64_t r0, int64_t r1, int slot) {
    const cpu::FloatRows xs = room.rows(slot, 0), ys = room.rows(slot, 1);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c = r % L.c;
      const float rs = 1.0f / std::sqrt(vp[c] + eps);
      const float scale = rs * (wp ? wp[c] : 1.0f), shift = (bp ? bp[c] : 0.0f) - mp[c] * scale;
      const cpu::Packet k = pset1<cpu::Packet>(scale), d = pset1<cpu::Packet>(shift);
      // In packets throughout: Eigen's array expression sent an unaligned head through scalar
      // code (fused or not by the compiler), so y's bits depended on where the plane lay.
      cpu::map_packets(ys.write(r), xs.read(r), L.s, [&](cpu::Packet v) { return padd(pmul(v, k), d); });
      ys.store(r);
    }
  });
}

template <>
void batch_norm_backward<Cpu>(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                              const Tensor& mean, const Tensor& var, float eps, bool batch_stats, bool accumulate,
                              bool channels_last) {
  if (channels_last) {  // Note [channels last on the CPU]
    Tensor dxf = cpu::channels_first_empty(dx);
    batch_norm_backward<Cpu>(dxf, dw, db, cpu::channels_first_copy(dy), cpu::channels_first_copy(x), w, mean, var, eps,
                             batch_stats, accumulate, false);
    if (dx.defined()) cpu::store_channels_last(dx, dxf);
    return;
  }
  const Planes L = planes(x);
  const Tensor w32 = w.defined() ? cpu::widened(w) : Tensor();
  const float *mp = mean.data<float>(), *vp = var.data<float>();
  const float* wp = w.defined() ? w32.data<float>() : nullptr;
  // dw and db in float32: the buffers themselves, or sums rounded once into a low parameter's.
  auto sums = [&](const Tensor& g) { return accumulate && g.defined() ? cpu::widened(g) : cpu::float32_sum(g); };
  Tensor dw32 = sums(dw), db32 = sums(db);
  float* dwp = dw.defined() ? dw32.data<float>() : nullptr;
  float* dbp = db.defined() ? db32.data<float>() : nullptr;
  const double m = static_cast<double>(L.n * L.s);
  const int64_t grain = cpu::items_per_piece(2 * L.n * L.s);
  const cpu::FloatRowRoom room(cpu::parallel_for_slots(L.c, grain), {{&x, L.s}, {&dy, L.s}, {&dx, L.s}});
  cpu::parallel_for_slot(L.c, grain, [&](int64_t c0, int64_t c1, int slot) {
    const cpu::FloatRows xs = room.rows(slot, 0), dys = room.rows(slot, 1);  // plane (i, c) is row i C + c
    std::optional<cpu::FloatRows> dxs;
    if (dx.defined()) dxs.emplace(room.rows(slot, 2));
    for (int64_t c = c0; c < c1; ++c) {
      const float mu = mp[c], rs = 1.0f / std::sqrt(vp[c] + eps);
      // Per image in order, each image's sum in lanes: into the buffers image by image
      // (Note [weight gradients in sample order]); the whole-batch sums for dx in double.
      float sb = accumulate && dbp ? dbp[c] : 0.0f, sw = accumulate && dwp ? dwp[c] : 0.0f;
      double tb = 0, tw = 0;
      for (int64_t i = 0; i < L.n; ++i) {
        double b_i, w_i;
        two_sums(dys.read(i * L.c + c), xs.read(i * L.c + c), L.s, mu, rs, b_i, w_i);
        sb += static_cast<float>(b_i);
        sw += static_cast<float>(w_i);
        tb += b_i;
        tw += w_i;
      }
      if (dbp) dbp[c] = sb;
      if (dwp) dwp[c] = sw;
      if (!dx.defined()) continue;
      const float k = rs * (wp ? wp[c] : 1.0f);
      const float mb = m > 0 ? static_cast<float>(tb / m) : 0.0f;
      const float mw = m > 0 ? static_cast<float>(tw / m) : 0.0f;
      for (int64_t i = 0; i < L.n; ++i) {
        const int64_t r = i * L.c + c;
        const float* g = dys.read(r);
        float* out = dxs->write(r);
        if (!batch_stats) {
          // Given statistics: dx = k dy, whatever x is (an infinite x gave 0 * inf = NaN through the
          // batch-statistics formula; PyTorch and our CUDA kernel give k dy).
          for (int64_t j = 0; j < L.s; ++j) out[j] = k * g[j];
        } else {
          const float* xi = xs.read(r);
          for (int64_t j = 0; j < L.s; ++j) {
            const float xhat = (xi[j] - mu) * rs;
            out[j] = k * (g[j] - mb - xhat * mw);
          }
        }
        dxs->store(r);
      }
    }
  });
  cpu::store_sum(dw, dw32);
  cpu::store_sum(db, db32);
}

}  // namespace mg
