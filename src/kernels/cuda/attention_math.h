// The per-row bodies of attention.cu's kernels (causal self-attention, kernels/attention.h): one
// thread per row r = (b, h, t).
// Plain C++ (no CUDA headers; MG_HOST_DEVICE comes from minigrad/core/rng.h): attention.cu
// calls them on the GPU, tests/test_cuda_kernel_math.cpp checks them on the CPU.
#pragma once

#include <cmath>
#include <cstdint>

#include <minigrad/core/rng.h>
#include "kernels/attention.h"

namespace mg::cuda::math {

struct AttentionDims {
  int64_t b, t, c, d;  // batch, sequence, channels (3C in qkv), channels per head
  int heads;
  float scale;  // 1 / sqrt(d)
  AttentionDropout drop;
};
// qkv: (b, t, c3 = 3C), `heads` heads.
inline AttentionDims attention_dims(int64_t b, int64_t t, int64_t c3, int heads, const AttentionDropout& drop) {
  const int64_t c = c3 / 3, d = c / heads;
  return {b, t, c, d, heads, 1.0f / std::sqrt(static_cast<float>(d)), drop};
}

// ---- cuDNN's fused attention (attention_cudnn.cpp) ----------------------------------------------
// cuDNN's SDPA graph reads q, k, v and writes y without copies: each is a 4-D strided view, dims
// [B, H, T, D], of the packed qkv (B, T, 3C) or of y (B, T, C); lse (B, H, T) is its "Stats", dims
// [B, H, T, 1]. Backward's dq, dk, dv are the same views of dqkv, dy that of y. An element
// (b, h, t, i) of a view lies at offset + b stride[0] + h stride[1] + t stride[2] + i stride[3]
// elements from the start of its tensor. tests/test_cuda_kernel_math.cpp runs the graph's math
// through these views on the CPU against the CPU kernels.
struct SdpaView {
  int64_t dim[4], stride[4], offset;
};
struct SdpaViews {
  SdpaView q, k, v, o, stats;
};
inline SdpaViews sdpa_views(const AttentionDims& s) {
  const int64_t h = s.heads, c3 = 3 * s.c;
  const auto in_qkv = [&](int64_t offset) { return SdpaView{{s.b, h, s.t, s.d}, {s.t * c3, s.d, c3, 1}, offset}; };
  return {in_qkv(0), in_qkv(s.c), in_qkv(2 * s.c), SdpaView{{s.b, h, s.t, s.d}, {s.t * s.c, s.d, s.c, 1}, 0},
          SdpaView{{s.b, h, s.t, 1}, {h * s.t, s.t, 1, 1}, 0}};
}
inline int64_t view_at(const SdpaView& v, int64_t b, int64_t h, int64_t t, int64_t i) {
  return v.offset + b * v.stride[0] + h * v.stride[1] + t * v.stride[2] + i * v.stride[3];
}
// The cases we ask cuDNN's SDPA to take (the caller also wants bf16 or f16 tensors whose data
// starts 16-byte aligned, and the switch of minigrad/cuda.h on): no dropout (cuDNN's own Philox
// stream is not our mask, Note [dropout by sample]), heads of a multiple of 8 channels up to 128
// (its flash kernels' sizes, forward and backward, on sm_80 and sm_90). The graph's support check
// has the last word.
inline bool sdpa_takes(const AttentionDims& s) {
  return s.drop.p == 0.0f && s.d % 8 == 0 && s.d >= 8 && s.d <= 128 && s.b > 0 && s.t > 0;
}

// Row r of lse (B, H, T) -> its sample, head and position.
struct AttentionRow {
  int64_t b, h, t;
};
MG_HOST_DEVICE AttentionRow attention_row(const AttentionDims& s, int64_t r) {
  return {r / (s.t * s.heads), (r / s.t) % s.heads, r % s.t};
}
// Where q of (b, h, t) starts in qkv (k at + c, v at + 2c), and its output row in y (or dy).
MG_HOST_DEVICE int64_t qkv_at(const AttentionDims& s, int64_t b, int64_t h, int64_t t) {
  return (b * s.t + t) * 3 * s.c + h * s.d;
}
MG_HOST_DEVICE int64_t y_at(const AttentionDims& s, int64_t b, int64_t h, int64_t t) {
  return (b * s.t + t) * s.c + h * s.d;
}
// M_tj: 1 without dropout.
MG_HOST_DEVICE float attention_mask(const AttentionDims& s, int64_t b, int64_t h, int64_t t, int64_t j) {
  return s.drop.p > 0.0f ? attention_keep(s.drop, b, h, t, j, s.heads, s.t) : 1.0f;
}

// A head's row of d floats that one thread reads again and again (InRow) or adds into (OutRow):
// copied into registers when d is known at compile time (kD > 0: GPT-2's 64), else used where it
// lies in memory (kD = 0: the input row, the output row as the accumulator), any d.
template <int kD>
struct InRow {
  float v[kD];
};
template <>
struct InRow<0> {
  const float* v;
};
template <int kD>
struct OutRow {
  float v[kD];
};
template <>
struct OutRow<0> {
  float* v;
};
template <int kD>
MG_HOST_DEVICE int head_size(const AttentionDims& s) {
  return kD > 0 ? kD : static_cast<int>(s.d);
}
#ifdef __CUDA_ARCH__
#define MG_UNROLL _Pragma("unroll")
#else
#define MG_UNROLL
#endif

template <int kD>
MG_HOST_DEVICE InRow<kD> in_row(const float* src, int d) {
  InRow<kD> r;
  if constexpr (kD > 0) {
    MG_UNROLL for (int i = 0; i < d; ++i) r.v[i] = src[i];
  } else {
    r.v = src;
  }
  return r;
}
// An accumulator for the output row `dst`, set to 0; store() puts it there.
template <int kD>
MG_HOST_DEVICE OutRow<kD> out_row(float* dst, int d) {
  OutRow<kD> r;
  if constexpr (kD == 0) r.v = dst;
  MG_UNROLL for (int i = 0; i < d; ++i) r.v[i] = 0.0f;
  return r;
}
template <int kD>
MG_HOST_DEVICE void store(float* dst, const OutRow<kD>& r, int d) {
  if constexpr (kD > 0) {
    MG_UNROLL for (int i = 0; i < d; ++i) dst[i] = r.v[i];
  }
}
template <int kD>
MG_HOST_DEVICE float dot(const InRow<kD>& a, const float* b, int d) {
  float acc = 0;
  MG_UNROLL for (int i = 0; i < d; ++i) acc += a.v[i] * b[i];
  return acc;
}

// The kernels below run one thread per row of (B, H, T), t fastest, so the 32 rows of a warp
// are mostly neighbours of one (b, h): where a loop reads another row (k_j, v_j; q_t, dy_t),
// all lanes read the same one at the same step, one transaction for the warp. A thread's own
// rows (q_t and its output; k_j and v_j in dk and dv) are InRows and OutRows.

// Forward of query row r, one pass over keys j <= t with a running maximum m: the sum of
// exp(s_tj - m) and of exp(s_tj - m) M_tj v_j are rescaled whenever m grows, then
// lse_t = m + log(sum) and y_t = the second sum / the first.
template <int kD>
MG_HOST_DEVICE void attention_forward_row(float* y, float* lse, const float* x, const AttentionDims& s, int64_t r) {
  const AttentionRow w = attention_row(s, r);
  const int d = head_size<kD>(s);
  const InRow<kD> q = in_row<kD>(x + qkv_at(s, w.b, w.h, w.t), d);
  float* out = y + y_at(s, w.b, w.h, w.t);
  OutRow<kD> acc = out_row<kD>(out, d);
  float m = -INFINITY, sum = 0.0f;
  for (int64_t j = 0; j <= w.t; ++j) {
    const float* kv = x + qkv_at(s, w.b, w.h, j);
    const float sc = dot(q, kv + s.c, d) * s.scale;
    if (sc > m) {  // at the first finite score, exp(-inf) = 0 rescales the empty sums
      const float k = expf(m - sc);
      sum *= k;
      MG_UNROLL for (int i = 0; i < d; ++i) acc.v[i] *= k;
      m = sc;
    }
    const float p = sc == -INFINITY ? 0.0f : expf(sc - m);  // -inf before any finite score: not -inf + inf
    sum += p;
    const float pm = p * attention_mask(s, w.b, w.h, w.t, j);
    MG_UNROLL for (int i = 0; i < d; ++i) acc.v[i] += pm * kv[2 * s.c + i];
  }
  lse[r] = m == -INFINITY ? NAN : m + logf(sum);  // no finite score: NaN, as the CPU's exp(-inf + inf)
  MG_UNROLL for (int i = 0; i < d; ++i) acc.v[i] /= sum;
  store(out, acc, d);
}

// Backward of query row r: E_t = sum_j p_tj dp_tj into e[r] (dk and dv read it), then
// dq_t = sum_j ds_tj k_j / sqrt(D) into dx's q slot.
template <int kD>
MG_HOST_DEVICE void attention_dq_row(float* dx, float* e, const float* dy, const float* x, const float* lse,
                                     const AttentionDims& s, int64_t r) {
  const AttentionRow w = attention_row(s, r);
  const int d = head_size<kD>(s);
  const InRow<kD> q = in_row<kD>(x + qkv_at(s, w.b, w.h, w.t), d), g = in_row<kD>(dy + y_at(s, w.b, w.h, w.t), d);
  const float l = lse[r];
  float et = 0;
  for (int64_t j = 0; j <= w.t; ++j) {
    const float* kv = x + qkv_at(s, w.b, w.h, j);
    et += expf(dot(q, kv + s.c, d) * s.scale - l) * attention_mask(s, w.b, w.h, w.t, j) * dot(g, kv + 2 * s.c, d);
  }
  e[r] = et;
  float* out = dx + qkv_at(s, w.b, w.h, w.t);
  OutRow<kD> dq = out_row<kD>(out, d);
  for (int64_t j = 0; j <= w.t; ++j) {
    const float* kv = x + qkv_at(s, w.b, w.h, j);
    const float p = expf(dot(q, kv + s.c, d) * s.scale - l);
    const float ds = p * (attention_mask(s, w.b, w.h, w.t, j) * dot(g, kv + 2 * s.c, d) - et) * s.scale;
    MG_UNROLL for (int i = 0; i < d; ++i) dq.v[i] += ds * kv[s.c + i];
  }
  store(out, dq, d);
}

// Backward of key row r = (b, h, j): dk_j = sum_{t >= j} ds_tj q_t / sqrt(D) and
// dv_j = sum_{t >= j} p_tj M_tj dy_t, each into its slot of dx; `want_dk` picks which (two
// kernels, so that a thread holds three rows, not four). The rows t run from t0 <= j up, those
// before j counting for nothing: a warp passes t0 = its first lane's j, so that its lanes read
// the same q_t and dy_t together. The result does not depend on t0.
template <int kD>
MG_HOST_DEVICE void attention_dkv_row(float* dx, const float* dy, const float* x, const float* lse, const float* e,
                                      const AttentionDims& s, int64_t r, int64_t t0, bool want_dk) {
  const AttentionRow w = attention_row(s, r);
  const int d = head_size<kD>(s);
  const int64_t j = w.t;
  const float* kv = x + qkv_at(s, w.b, w.h, j);
  const InRow<kD> k = in_row<kD>(kv + s.c, d), v = in_row<kD>(kv + 2 * s.c, want_dk ? d : 0);
  float* out = dx + qkv_at(s, w.b, w.h, j) + (want_dk ? s.c : 2 * s.c);
  OutRow<kD> acc = out_row<kD>(out, d);
  for (int64_t t = t0 < 0 ? 0 : t0; t < s.t; ++t) {
    if (t < j) continue;
    const int64_t rt = r - j + t;  // the row of (b, h, t)
    const float *q = x + qkv_at(s, w.b, w.h, t), *g = dy + y_at(s, w.b, w.h, t);
    const float p = expf(dot(k, q, d) * s.scale - lse[rt]), m = attention_mask(s, w.b, w.h, t, j);
    if (want_dk) {
      const float ds = p * (m * dot(v, g, d) - e[rt]) * s.scale;
      MG_UNROLL for (int i = 0; i < d; ++i) acc.v[i] += ds * q[i];
    } else {
      const float pm = p * m;
      MG_UNROLL for (int i = 0; i < d; ++i) acc.v[i] += pm * g[i];
    }
  }
  store(out, acc, d);
}

}  // namespace mg::cuda::math
