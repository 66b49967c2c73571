// The per-element bodies of the CUDA kernels whose index arithmetic or formulas are easy to get
// wrong, as __host__ __device__ functions: the kernels in pooling.cu, dropout.cu, optim.cu,
// attention.cu, layer_norm.cu and embedding.cu call them on the GPU, and tests/test_cuda_kernel_math.cpp checks them on the CPU against the
// CPU kernels and naive references, so they are verified on machines without a GPU too.
// Plain C++ (no CUDA headers): MG_HOST_DEVICE comes from minigrad/core/rng.h.
#pragma once

#include <cmath>
#include <cstdint>

#include <minigrad/core/rng.h>
#include "kernels/attention.h"
#include "kernels/optim.h"

namespace mg::cuda::math {

// ---- pooling (x plane: h x w, row-major) -----------------------------------------------------

MG_HOST_DEVICE int min_int(int a, int b) { return a < b ? a : b; }

// Max over the KxK window of output (i, j), stride s, implicit -inf padding: the first maximum
// in row-major window order wins, a NaN wins over numbers and the last NaN wins (as PyTorch's
// CPU and CUDA kernels and src/kernels/cpu/pooling.cpp). idx = hh * w + ww.
MG_HOST_DEVICE void max_pool_window(const float* xp, int h, int w, int k, int s, int pad, int i, int j,
                                    float* y, int64_t* idx) {
  float best = 0.0f;
  int64_t best_idx = -1;
  const int h0 = i * s - pad, w0 = j * s - pad;
  for (int p = 0; p < k; ++p) {
    const int hh = h0 + p;
    if (hh < 0 || hh >= h) continue;
    for (int q = 0; q < k; ++q) {
      const int ww = w0 + q;
      if (ww < 0 || ww >= w) continue;
      const float v = xp[hh * w + ww];
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
MG_HOST_DEVICE float max_pool_grad(const float* dyp, const int64_t* idxp, int w, int oh, int ow, int k, int s,
                                   int pad, int hh, int ww) {
  // First window reaching row hh: i >= (hh + pad - k + 1) / s, rounded up, and >= 0.
  const int r0 = hh + pad - k + 1, c0 = ww + pad - k + 1;
  const int i0 = r0 <= 0 ? 0 : (r0 + s - 1) / s, j0 = c0 <= 0 ? 0 : (c0 + s - 1) / s;
  const int i1 = min_int((hh + pad) / s, oh - 1), j1 = min_int((ww + pad) / s, ow - 1);
  const int64_t self = int64_t{hh} * w + ww;
  float g = 0.0f;
  for (int i = i0; i <= i1; ++i)
    for (int j = j0; j <= j1; ++j)
      if (idxp[int64_t{i} * ow + j] == self) g += dyp[int64_t{i} * ow + j];
  return g;
}

// PyTorch's adaptive windows: output i of `out` covers [floor(i in / out), ceil((i+1) in / out)).
MG_HOST_DEVICE int window_start(int i, int in, int out) { return (i * in) / out; }
MG_HOST_DEVICE int window_end(int i, int in, int out) { return ((i + 1) * in + out - 1) / out; }

MG_HOST_DEVICE float adaptive_avg_window(const float* xp, int h, int w, int oh, int ow, int i, int j) {
  const int h0 = window_start(i, h, oh), h1 = window_end(i, h, oh);
  const int w0 = window_start(j, w, ow), w1 = window_end(j, w, ow);
  float sum = 0.0f;
  for (int hh = h0; hh < h1; ++hh)
    for (int ww = w0; ww < w1; ++ww) sum += xp[hh * w + ww];
  return sum / static_cast<float>((h1 - h0) * (w1 - w0));
}

// d x[hh, ww]: the windows containing row hh are i = floor(hh OH / H), ... while they start at
// or before hh (likewise columns); each gives dy / its size.
MG_HOST_DEVICE float adaptive_avg_grad(const float* dyp, int h, int w, int oh, int ow, int hh, int ww) {
  float g = 0.0f;
  for (int i = (hh * oh) / h; i < oh && window_start(i, h, oh) <= hh; ++i) {
    if (window_end(i, h, oh) <= hh) continue;
    const int rows = window_end(i, h, oh) - window_start(i, h, oh);
    for (int j = (ww * ow) / w; j < ow && window_start(j, w, ow) <= ww; ++j) {
      if (window_end(j, w, ow) <= ww) continue;
      const int cols = window_end(j, w, ow) - window_start(j, w, ow);
      g += dyp[i * ow + j] / static_cast<float>(rows * cols);
    }
  }
  return g;
}

// ---- linear through a column-major GEMM ----------------------------------------------------------

// cuBLAS is column-major: a row-major (R, C) matrix is its column-major transpose (C, R). These
// say which GEMM computes each product of linear (src/kernels/cuda/linear.cu), with
// x: (N, K), w: (M, K), y and dy: (N, M), all row-major:
//   C (m x n, column-major, leading dim ldc) = op(A) op(B),  op = transpose when trans_*.
enum class GemmOperand : uint8_t { x, w, dy, ones };  // ones: a vector of N ones (the bias gradient)
struct GemmCall {
  bool trans_a, trans_b;
  int64_t m, n, k;
  GemmOperand a;
  int64_t lda;
  GemmOperand b;
  int64_t ldb, ldc;
};
// y^T (M, N) = w x^T:   A = w as (K, M) transposed, B = x as (K, N).
inline GemmCall linear_forward_gemm(int64_t n, int64_t k, int64_t m) {
  return {true, false, m, n, k, GemmOperand::w, k, GemmOperand::x, k, m};
}
// dx^T (K, N) = w^T dy^T:  A = w as (K, M), B = dy as (M, N).
inline GemmCall linear_dx_gemm(int64_t n, int64_t k, int64_t m) {
  return {false, false, k, n, m, GemmOperand::w, k, GemmOperand::dy, m, k};
}
// dw^T (K, M) = x^T dy:  A = x as (K, N), B = dy as (M, N) transposed.
inline GemmCall linear_dw_gemm(int64_t n, int64_t k, int64_t m) {
  return {false, true, k, m, n, GemmOperand::x, k, GemmOperand::dy, m, k};
}
// db (M, 1) = dy^T 1:  A = dy as (M, N), B = the ones (N, 1).
inline GemmCall linear_db_gemm(int64_t n, int64_t m) {
  return {false, false, m, 1, n, GemmOperand::dy, m, GemmOperand::ones, n, m};
}

// ---- matmul (kernels/matmul.h), one product of a batch: a (M, K) = x, b (K, N) = w -------------

// y^T (N, M) = b^T a^T:  A = b as (N, K), B = a as (K, M).
inline GemmCall matmul_forward_gemm(int64_t m, int64_t k, int64_t n) {
  return {false, false, n, m, k, GemmOperand::w, n, GemmOperand::x, k, n};
}
// da^T (K, M) = b dy^T:  A = b as (N, K) transposed, B = dy as (N, M).
inline GemmCall matmul_da_gemm(int64_t m, int64_t k, int64_t n) {
  return {true, false, k, m, n, GemmOperand::w, n, GemmOperand::dy, n, k};
}
// db^T (N, K) = dy^T a:  A = dy as (N, M), B = a as (K, M) transposed.
inline GemmCall matmul_db_gemm(int64_t m, int64_t k, int64_t n) {
  return {false, true, n, k, m, GemmOperand::dy, n, GemmOperand::x, k, n};
}

// ---- dropout ----------------------------------------------------------------------------------

// Elements first .. first+3 (those below n): one Philox block serves all four when the offset
// is block-aligned (as Generator::advance makes it); otherwise each draws on its own.
MG_HOST_DEVICE void dropout4(float* out, const float* in, int64_t first, int64_t n, float p, float keep_scale,
                             uint64_t seed, uint64_t offset) {
  if ((offset & 3) == 0) {
    const Philox4 r = philox4x32(seed, (offset + static_cast<uint64_t>(first)) >> 2);
    for (int k = 0; k < 4 && first + k < n; ++k) {
      const float u = static_cast<float>(r.v[k] >> 8) * (1.0f / 16777216.0f);  // = philox_uniform
      out[first + k] = u >= p ? in[first + k] * keep_scale : 0.0f;
    }
  } else {
    for (int k = 0; k < 4 && first + k < n; ++k) {
      const float u = philox_uniform(seed, offset + static_cast<uint64_t>(first + k));
      out[first + k] = u >= p ? in[first + k] * keep_scale : 0.0f;
    }
  }
}

// ---- causal self-attention (kernels/attention.h): one thread per row r = (b, h, t) --------------

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

// ---- layer normalisation's dw and db (kernels/layer_norm.h) ------------------------------------

// A block owns kLnCols columns, a lane each. Its kLnWarps warps copy a tile of kLnTileRows rows of
// dy and xhat into shared memory, then warp 0 adds the tile's rows in order onto its columns'
// sums: the CPU kernel's order of additions (each column's rows in order), so dw and db of
// micro-batches accumulated in order equal the big batch's, with the loads of eight warps in
// flight where one thread per column had its own.
constexpr int kLnCols = 32, kLnWarps = 8, kLnTileRows = 128;

// Row rr of the tile whose first row is r0, column j0 + lane: dy and xhat, 0 outside the matrix.
MG_HOST_DEVICE void layer_norm_tile_load(float* tile_g, float* tile_h, const float* dy, const float* x,
                                         const float* mean, const float* rstd, int64_t m, int64_t c, int64_t r0,
                                         int64_t j0, int rr, int lane) {
  const int64_t r = r0 + rr, j = j0 + lane;
  const bool inside = r < m && j < c;
  tile_g[rr * kLnCols + lane] = inside ? dy[r * c + j] : 0.0f;
  tile_h[rr * kLnCols + lane] = inside ? (x[r * c + j] - mean[r]) * rstd[r] : 0.0f;
}

// The lane's column adds the tile's first `rows` rows in order: dw += dy xhat, db += dy.
MG_HOST_DEVICE void layer_norm_tile_add(float* aw, float* ab, const float* tile_g, const float* tile_h, int rows,
                                        int lane) {
  for (int rr = 0; rr < rows; ++rr) {
    const float g = tile_g[rr * kLnCols + lane];
    *aw += g * tile_h[rr * kLnCols + lane];
    *ab += g;
  }
}

// ---- embedding's backward (kernels/embedding.h): embedding_buckets' CSR, made on the device ----
// Position p's sort key is its row, or `rows` for an index outside [0, rows) (the error flag has
// it): sorted stably, the keys put each row's positions together in increasing order, and the
// out-of-range ones after every row. offset[r], the number of keys below r, is where row r's
// positions start; offset[rows] ends the last row's.

MG_HOST_DEVICE uint64_t embedding_key(int64_t index, int64_t rows) {
  return static_cast<uint64_t>(index >= 0 && index < rows ? index : rows);
}

// The radix sort's end bit: every key (at most rows) is below 2^bits.
MG_HOST_DEVICE int embedding_key_bits(int64_t rows) {
  int bits = 1;
  while (bits < 64 && (uint64_t{1} << bits) <= static_cast<uint64_t>(rows)) ++bits;
  return bits;
}

// The first k with sorted[k] >= r (n when none): offset[r] for r in [0, rows].
MG_HOST_DEVICE int64_t embedding_offset(const uint64_t* sorted, int64_t n, int64_t r) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] < static_cast<uint64_t>(r)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// dw[r, j]: row r's positions' dy[p, j] added in order onto acc (the buffer, or 0).
MG_HOST_DEVICE float embedding_grad(float acc, const float* dy, const int64_t* offset, const int64_t* pos, int64_t r,
                                    int64_t j, int64_t c) {
  for (int64_t k = offset[r]; k < offset[r + 1]; ++k) acc += dy[pos[k] * c + j];
  return acc;
}

// ---- fused optimizers (src/kernels/optim.h has the formulas) --------------------------------------

// The tensor that block b of a multi-tensor launch works on: the last t with first_block[t] <= b.
MG_HOST_DEVICE int tensor_of_block(const int64_t* first_block, int count, int64_t b) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_block[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// buf is null when momentum == 0.
MG_HOST_DEVICE void sgd_element(float* p, float g, float* buf, const SgdHyper& h) {
  float d = h.grad_scale * g;
  if (h.weight_decay != 0.0f) d += h.weight_decay * *p;
  if (h.momentum != 0.0f) {
    *buf = h.first_step ? d : h.momentum * *buf + (1.0f - h.dampening) * d;
    d = h.nesterov ? d + h.momentum * *buf : *buf;
  }
  *p -= h.lr * d;
}

// step_size = lr / (1 - b1^t) and bias_c2_sqrt = sqrt(1 - b2^t), computed once per step.
MG_HOST_DEVICE void adam_element(float* p, float g, float* m, float* v, const AdamHyper& h, float step_size,
                                 float bias_c2_sqrt) {
  float d = h.grad_scale * g;
  if (h.weight_decay != 0.0f) {
    if (h.decoupled) *p *= 1.0f - h.lr * h.weight_decay;
    else d += h.weight_decay * *p;
  }
  *m += (d - *m) * (1.0f - h.beta1);  // torch: exp_avg.lerp_(grad, 1 - beta1)
  *v = h.beta2 * *v + (1.0f - h.beta2) * d * d;
  const float denom = std::sqrt(*v) / bias_c2_sqrt + h.eps;
  *p -= step_size * (*m / denom);
}

}  // namespace mg::cuda::math
