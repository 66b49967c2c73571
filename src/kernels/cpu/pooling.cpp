// Pooling on the CPU, (n, c) planes split over the threads (core/parallel.h).
//   x, dx: (N, C, H, W)   y, dy, idx: (N, C, OH, OW)
// max_pool2d:  y[i,j] = max of x over rows [i s - pad, i s - pad + K) and columns likewise, clipped
//              to the plane (padding is -inf, so it is never the max); idx = h * W + w of the first
//              maximum in row-major window order (PyTorch's tie rule); a NaN wins (the last one),
//              as in PyTorch.                                                            (=)
//   backward:  dx = 0, then dx[idx[i,j]] += dy[i,j]                                          (=)
// adaptive_avg_pool2d: window i spans rows [floor(i H / OH), ceil((i+1) H / OH)), columns likewise;
//              y = mean over the window.                                                     (=)
//   backward:  dx = 0, then every element of window (i,j) += dy[i,j] / window size           (=)
//              x, y, dy and dx may be bf16 or f16 (Note [half operands] in kernels/cpu/gemm.h):
//              a plane at a time widened into, or rounded from, a buffer of the piece's.
#include "kernels/pooling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/channels_last.h"
#include "kernels/cpu/eigen.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/windows.h"

namespace mg {

namespace {

// PyTorch's adaptive window bounds, in integers: [floor(i in / out), ceil((i + 1) in / out)).
int64_t window_start(int64_t i, int64_t out, int64_t in) { return (i * in) / out; }
int64_t window_end(int64_t i, int64_t out, int64_t in) { return ((i + 1) * in + out - 1) / out; }

// One plane of the 2x2, stride 2, unpadded max-pool (VGG's): the generic loop's comparisons in its
// order, (r, s), (r, s+1), (r+1, s), (r+1, s+1), so the same values, indices and NaN rule, without
// its per-window bounds.
void max_pool_2x2(const float* in, float* out, int64_t* arg, int64_t w, int64_t oh, int64_t ow) {
  for (int64_t i = 0; i < oh; ++i) {
    const float* r0 = in + 2 * i * w;
    const float* r1 = r0 + w;
    for (int64_t j = 0; j < ow; ++j) {
      const int64_t c = 2 * j;
      float best = r0[c];  // > -inf or NaN: the generic loop takes it too
      int64_t at = 2 * i * w + c;
      const float v[3] = {r0[c + 1], r1[c], r1[c + 1]};
      const int64_t where[3] = {at + 1, at + w, at + w + 1};
      for (int k = 0; k < 3; ++k) {
        if (v[k] > best || std::isnan(v[k])) best = v[k], at = where[k];
      }
      out[i * ow + j] = best;
      arg[i * ow + j] = at;
    }
  }
}

// One plane of any max-pool, a row of outputs at a time: for each row r and column q of the
// window, every output j whose window holds (r, j s - pad + q), vectorised over j. Each output
// still meets its window in row-major order, so the values, indices and NaN rule are those of one
// window at a time (that loop took 4.4 ms of a 135 ms ResNet-18 step at 32 x 32, batch 64).
// kStride: the stride where the compiler should know it (its loads vectorised), 0 for any.
// cols[q] = {j0, j1}: the outputs j whose column j s - pad + q lies in [0, w) (the same for every
// row and plane: computed once, a division each).
template <int kStride>
void max_pool_rows(const float* in, float* out, int64_t* arg, int64_t h, int64_t w, int64_t oh, int64_t ow,
                   int64_t kernel, int64_t any_stride, int64_t pad, const std::pair<int64_t, int64_t>* cols) {
  const int64_t stride = kStride ? kStride : any_stride;
  for (int64_t i = 0; i < oh; ++i) {
    const int64_t h0 = std::max<int64_t>(i * stride - pad, 0), h1 = std::min<int64_t>(i * stride - pad + kernel, h);
    float* best = out + i * ow;
    int64_t* at = arg + i * ow;
    for (int64_t j = 0; j < ow; ++j) {
      best[j] = -std::numeric_limits<float>::infinity();
      at[j] = h0 * w + std::max<int64_t>(j * stride - pad, 0);  // where an all -inf window points
    }
    for (int64_t r = h0; r < h1; ++r) {
      for (int64_t q = 0; q < kernel; ++q) {
        const int64_t j0 = cols[q].first, j1 = cols[q].second;  // no binding: clang refuses one in an omp simd loop
        const float* src = in + r * w + q - pad;
        const int64_t where = r * w + q - pad;
#pragma omp simd simdlen(8)
        for (int64_t j = j0; j < j1; ++j) {
          const float v = src[j * stride];
          const bool take = v > best[j] || std::isnan(v);
          best[j] = take ? v : best[j];
          at[j] = take ? where + j * stride : at[j];
        }
      }
    }
  }
}

}  // namespace

template <>
void max_pool2d_forward<Cpu>(Tensor& y, Tensor& idx, const Tensor& x, int kernel, int stride, int pad,
                             bool channels_last) {
  if (channels_last) {  // Note [channels last on the CPU]
    Tensor yf = cpu::channels_first_empty(y), idxf = cpu::channels_first_empty(idx);
    max_pool2d_forward<Cpu>(yf, idxf, cpu::channels_first_copy(x), kernel, stride, pad, false);
    cpu::store_channels_last(y, yf);
    return cpu::store_channels_last(idx, idxf);
  }
  const int64_t planes = x.size(0) * x.size(1), h = x.size(2), w = x.size(3);
  const int64_t oh = y.size(2), ow = y.size(3);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  int64_t* ip = idx.data<int64_t>();
  std::vector<std::pair<int64_t, int64_t>> cols(static_cast<size_t>(kernel));
  for (int64_t q = 0; q < kernel; ++q) cols[static_cast<size_t>(q)] = cpu::window_outputs(q, pad, stride, w, ow);
  const auto* cp = cols.data();
  cpu::parallel_for(planes, cpu::items_per_piece(h * w), [&](int64_t pl0, int64_t pl1) {
    for (int64_t pl = pl0; pl < pl1; ++pl) {
      const float* in = xp + pl * h * w;
      float* out = yp + pl * oh * ow;
      int64_t* arg = ip + pl * oh * ow;
      if (kernel == 2 && stride == 2 && pad == 0) {
        max_pool_2x2(in, out, arg, w, oh, ow);
        continue;
      }
      if (stride == 1) max_pool_rows<1>(in, out, arg, h, w, oh, ow, kernel, stride, pad, cp);
      else if (stride == 2) max_pool_rows<2>(in, out, arg, h, w, oh, ow, kernel, stride, pad, cp);
      else max_pool_rows<0>(in, out, arg, h, w, oh, ow, kernel, stride, pad, cp);
    }
  });
}

template <>
void max_pool2d_backward<Cpu>(Tensor& dx, const Tensor& dy, const Tensor& idx, int kernel, int stride, int pad,
                              bool channels_last) {
  if (channels_last) {  // Note [channels last on the CPU]
    Tensor dxf = cpu::channels_first_empty(dx);
    max_pool2d_backward<Cpu>(dxf, cpu::channels_first_copy(dy), cpu::channels_first_copy(idx), kernel, stride, pad,
                             false);
    return cpu::store_channels_last(dx, dxf);
  }
  const int64_t planes = dx.size(0) * dx.size(1), hw = dx.size(2) * dx.size(3);
  const int64_t ohw = dy.size(2) * dy.size(3);
  const float* gp = dy.data<float>();
  const int64_t* ip = idx.data<int64_t>();
  float* dp = dx.data<float>();
  cpu::parallel_for(planes, cpu::items_per_piece(hw), [&](int64_t pl0, int64_t pl1) {
    for (int64_t pl = pl0; pl < pl1; ++pl) {
      float* plane = dp + pl * hw;
      std::fill(plane, plane + hw, 0.0f);
      for (int64_t k = 0; k < ohw; ++k) plane[ip[pl * ohw + k]] += gp[pl * ohw + k];
    }
  });
}

template <> void adaptive_avg_pool2d_forward<Cpu>(Tensor& y, const Tensor& x, bool channels_last) {
  if (channels_last) {  // Note [channels last on the CPU]
    Tensor yf = cpu::channels_first_empty(y);
    adaptive_avg_pool2d_forward<Cpu>(yf, cpu::channels_first_copy(x), false);
    return cpu::store_channels_last(y, yf);
  }
  const int64_t planes = x.size(0) * x.size(1), h = x.size(2), w = x.size(3);
  const int64_t oh = y.size(2), ow = y.size(3);
  const int64_t grain = cpu::items_per_piece(h * w);
  const cpu::FloatRowRoom room(cpu::parallel_for_slots(planes, grain), {{&x, h * w}, {&y, oh * ow}});
  cpu::parallel_for_slot(planes, grain, [&](int64_t pl0, int64_t pl1, int slot) {
    const cpu::FloatRows xs = room.rows(slot, 0), ys = room.rows(slot, 1);
    for (int64_t pl = pl0; pl < pl1; ++pl) {
      const float* in = xs.read(pl);
      float* out = ys.write(pl);
      for (int64_t i = 0; i < oh; ++i) {
        const int64_t h0 = window_start(i, oh, h), h1 = window_end(i, oh, h);
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t w0 = window_start(j, ow, w), w1 = window_end(j, ow, w);
          float sum = 0.0f;
          for (int64_t r = h0; r < h1; ++r) {
            for (int64_t s = w0; s < w1; ++s) sum += in[r * w + s];
          }
          out[i * ow + j] = sum / static_cast<float>((h1 - h0) * (w1 - w0));
        }
      }
      ys.store(pl);
    }
  });
}

template <> void adaptive_avg_pool2d_backward<Cpu>(Tensor& dx, const Tensor& dy, bool channels_last) {
  if (channels_last) {  // Note [channels last on the CPU]
    Tensor dxf = cpu::channels_first_empty(dx);
    adaptive_avg_pool2d_backward<Cpu>(dxf, cpu::channels_first_copy(dy), false);
    return cpu::store_channels_last(dx, dxf);
  }
  const int64_t planes = dx.size(0) * dx.size(1), h = dx.size(2), w = dx.size(3);
  const int64_t oh = dy.size(2), ow = dy.size(3);
  const int64_t grain = cpu::items_per_piece(h * w);
  const cpu::FloatRowRoom room(cpu::parallel_for_slots(planes, grain), {{&dy, oh * ow}, {&dx, h * w}});
  cpu::parallel_for_slot(planes, grain, [&](int64_t pl0, int64_t pl1, int slot) {
    const cpu::FloatRows dys = room.rows(slot, 0), dxs = room.rows(slot, 1);
    for (int64_t pl = pl0; pl < pl1; ++pl) {
      const float* g = dys.read(pl);
      float* plane = dxs.write(pl);
      std::fill(plane, plane + h * w, 0.0f);
      for (int64_t i = 0; i < oh; ++i) {
        const int64_t h0 = window_start(i, oh, h), h1 = window_end(i, oh, h);
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t w0 = window_start(j, ow, w), w1 = window_end(j, ow, w);
          const float share = g[i * ow + j] / static_cast<float>((h1 - h0) * (w1 - w0));
          for (int64_t r = h0; r < h1; ++r) {
            for (int64_t s = w0; s < w1; ++s) plane[r * w + s] += share;
          }
        }
      }
      dxs.store(pl);
    }
  });
}

}  // namespace mg
