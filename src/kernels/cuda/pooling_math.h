// The per-element bodies of pooling.cu's kernels (kernels/pooling.h), x plane: h x w, row-major,
// pixel (hh, ww) of a plane at (hh w + ww) cs: cs is 1 in NCHW, C in NHWC (the pointers then at
// the plane's channel in its first pixel). The argmax idx = hh w + ww either way.
// Plain C++ (no CUDA headers; MG_HOST_DEVICE comes from minigrad/core/rng.h): pooling.cu
// calls them on the GPU, tests/test_cuda_kernel_math.cpp checks them on the CPU.
#pragma once

#include <cstdint>

#include <minigrad/core/rng.h>

#include "kernels/cuda/element_math.h"  // value(p, i): x and dy of any storage type

namespace mg::cuda::math {

MG_HOST_DEVICE int min_int(int a, int b) { return a < b ? a : b; }

// Max over the KxK window of output (i, j), stride s, implicit -inf padding: the first maximum
// in row-major window order wins, a NaN wins over numbers and the last NaN wins (as PyTorch's
// CPU and CUDA kernels and src/kernels/cpu/pooling.cpp). idx = hh * w + ww.
template <class X>
MG_HOST_DEVICE void max_pool_window(const X* xp, int h, int w, int k, int s, int pad, int i, int j, float* y,
                                    int64_t* idx, int64_t cs = 1) {
  float best = 0.0f;
  int64_t best_idx = -1;
  const int h0 = i * s - pad, w0 = j * s - pad;
  for (int p = 0; p < k; ++p) {
    const int hh = h0 + p;
    if (hh < 0 || hh >= h) continue;
    for (int q = 0; q < k; ++q) {
      const int ww = w0 + q;
      if (ww < 0 || ww >= w) continue;
      const float v = value(xp, (int64_t{hh} * w + ww) * cs);
      if (best_idx < 0 || v > best || v != v) {
        best = v;
        best_idx = int64_t{hh} * w + ww;
      }
    }
  }
  *y = best;
  *idx = best_idx;
}

// d x[hh, ww] of max pooling, gathered: the windows that can hold (hh, ww) are rows i with
// i s - pad <= hh < i s - pad + k (likewise columns); each whose argmax is (hh, ww) adds its dy.
// Visiting them in row-major output order adds the same values in the same order as the CPU
// kernel's scatter (src/kernels/cpu/pooling.cpp), so the result is bit-identical to it, with no
// atomics (deterministic).
template <class X>
MG_HOST_DEVICE float max_pool_grad(const X* dyp, const int64_t* idxp, int w, int oh, int ow, int k, int s, int pad,
                                   int hh, int ww, int64_t cs = 1) {
  // First window reaching row hh: i >= (hh + pad - k + 1) / s, rounded up, and >= 0.
  const int r0 = hh + pad - k + 1, c0 = ww + pad - k + 1;
  const int i0 = r0 <= 0 ? 0 : (r0 + s - 1) / s, j0 = c0 <= 0 ? 0 : (c0 + s - 1) / s;
  const int i1 = min_int((hh + pad) / s, oh - 1), j1 = min_int((ww + pad) / s, ow - 1);
  const int64_t self = int64_t{hh} * w + ww;
  float g = 0.0f;
  for (int i = i0; i <= i1; ++i)
    for (int j = j0; j <= j1; ++j)
      if (idxp[(int64_t{i} * ow + j) * cs] == self) g += value(dyp, (int64_t{i} * ow + j) * cs);
  return g;
}

// PyTorch's adaptive windows: output i of `out` covers [floor(i in / out), ceil((i+1) in / out)).
MG_HOST_DEVICE int window_start(int i, int in, int out) { return (i * in) / out; }
MG_HOST_DEVICE int window_end(int i, int in, int out) { return ((i + 1) * in + out - 1) / out; }

template <class X>
MG_HOST_DEVICE float adaptive_avg_window(const X* xp, int h, int w, int oh, int ow, int i, int j, int64_t cs = 1) {
  const int h0 = window_start(i, h, oh), h1 = window_end(i, h, oh);
  const int w0 = window_start(j, w, ow), w1 = window_end(j, w, ow);
  float sum = 0.0f;
  for (int hh = h0; hh < h1; ++hh)
    for (int ww = w0; ww < w1; ++ww) sum += value(xp, (int64_t{hh} * w + ww) * cs);
  return sum / static_cast<float>((h1 - h0) * (w1 - w0));
}

// d x[hh, ww]: the windows containing row hh are i = floor(hh OH / H), ... while they start at
// or before hh (likewise columns); each gives dy / its size.
template <class X>
MG_HOST_DEVICE float adaptive_avg_grad(const X* dyp, int h, int w, int oh, int ow, int hh, int ww, int64_t cs = 1) {
  float g = 0.0f;
  for (int i = (hh * oh) / h; i < oh && window_start(i, h, oh) <= hh; ++i) {
    if (window_end(i, h, oh) <= hh) continue;
    const int rows = window_end(i, h, oh) - window_start(i, h, oh);
    for (int j = (ww * ow) / w; j < ow && window_start(j, w, ow) <= ww; ++j) {
      if (window_end(j, w, ow) <= ww) continue;
      const int cols = window_end(j, w, ow) - window_start(j, w, ow);
      g += value(dyp, (int64_t{i} * ow + j) * cs) / static_cast<float>(rows * cols);
    }
  }
  return g;
}

}  // namespace mg::cuda::math
