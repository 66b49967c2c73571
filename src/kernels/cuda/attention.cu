// Causal self-attention on CUDA (kernels/attention.h). Every sum in a fixed order, no atomics:
// deterministic. Two implementations:
//
// Heads of 64 (GPT-2's), in tiles (Note [attention tiles]): a block of 256 threads owns a tile of
// 64 query rows (forward, dq) or 64 key rows (dk, dv) of one (sample, head) and walks the tiles of
// 64 rows on the other side of the causal mask, each staged in shared memory; every product of
// two 64 x 64 tiles is 16 x 16 threads computing 4 x 4 outputs each.
//   forward:  per key tile j:  S = Q K_j^T / sqrt(D) (masked: j > t is -inf), a running row maximum m,
//             l = l e^(m_old - m) + rowsum(P), O = O e^(m_old - m) + (P o M) V_j; y = O / l, lse = m + log l
//   dq (and E):  E_t = sum_j p_tj M_tj (dy_t . v_j) over every key tile, then a second walk:
//             dS = P o (M o dY V_j^T - E) / sqrt(D),  dQ += dS K_j        (=, dx's q slot)
//   dk, dv:   per query tile t >= j:  dV += (P o M)^T dY_t,  dK += dS^T Q_t   (=, dx's k and v slots)
// Other head sizes, rows that are not 16-byte aligned and devices with too little shared memory
// per block take the row kernels: one thread per (sample, head, position), its own rows in
// registers, the rows' bodies in attention_math.h (checked on the CPU against the CPU kernels).
// Forward: one pass with a running maximum. Backward: E_t and dq per query row, then dk and dv
// per key row.
//
// bf16/f16 qkv (OpDef::cuda_half, Note [cuda half kernels]): cuDNN's fused attention
// (attention_cudnn.cpp) where it takes the case and mg::cuda::cudnn_attention() is on; otherwise
// the float32 kernels above on a widened copy of qkv (and dy), their y and dqkv rounded once into
// the tensors of qkv's dtype, lse float32 either way: the bits of the float32 kernels on widened
// inputs, as apply() widening them would give. The two paths share lse's meaning, so a backward
// may take the other path than its forward (cuDNN refusing only the backward graph).
#include <atomic>
#include <cstdint>
#include <initializer_list>

#include <minigrad/cuda.h>
#include "kernels/attention.h"
#include "kernels/convert.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/attention_math.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/storage.cuh"

namespace mg {
namespace {

namespace math = cuda::math;
using math::AttentionDims;

// Rows of the state a thread holds (two or three of up to 64 floats): fewer threads per block
// leave registers for them.
constexpr int kAttentionThreads = 128;

template <int kD>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_forward_kernel(float* y, float* lse, const float* x, AttentionDims s) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r < s.b * s.heads * s.t) math::attention_forward_row<kD>(y, lse, x, s, r);
}

template <int kD>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_dq_kernel(float* dx, float* e, const float* dy, const float* x, const float* lse, AttentionDims s) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r < s.b * s.heads * s.t) math::attention_dq_row<kD>(dx, e, dy, x, lse, s, r);
}

// t0: the key row of the warp's first lane (at most this row's j; below 0 when the warp began
// in the previous (b, h), and then clamped to 0).
template <int kD, bool kDk>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_dkv_kernel(float* dx, const float* dy, const float* x, const float* lse, const float* e,
                         AttentionDims s) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r >= s.b * s.heads * s.t) return;
  const int64_t t0 = r % s.t - static_cast<int64_t>(threadIdx.x % 32);
  math::attention_dkv_row<kD>(dx, dy, x, lse, e, s, r, t0, kDk);
}

// ---- tiles for heads of 64 -------------------------------------------------------------------
// Note [attention tiles]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A tile is 64 rows of one head's 64 channels in shared memory, rows kLd
// floats apart: kLd = 68 keeps the rows 16-byte aligned (float4 reads) and puts row r's float4 at
// bank 4r mod 32, so 8 lanes reading rows tx + 16 j (column-interleaved dot products) hit 32
// different banks. Thread (ty, tx) = (tid / 16, tid % 16) owns rows 4 ty .. 4 ty + 3 of the tile
// it computes and, in a 64 x 64 score tile, columns tx, tx + 16, tx + 32, tx + 48; a row's 16
// lanes are one half of a warp, so row maxima and sums are four shuffles. The blocks with the most
// tiles to walk are launched first. A masked score (j > t) has p = 0 and dS = 0, but the tile
// products still multiply those zeros by the tile's rows: as on the CPU (whose blocks are 64 rows
// too), an inf or NaN in a later position's v (forward), k (dq) or an earlier position's q or dy
// (dk, dv) reaches the other rows of its tile as 0 * inf = NaN, and no row outside it. The row
// kernels visit j <= t only.
constexpr int kTile = 64, kLd = 68, kTileThreads = 256, kTileFloats = kTile * kLd;

struct Lane {
  int tid, tx, ty;
};
__device__ Lane lane() {
  const int tid = static_cast<int>(threadIdx.x);
  return {tid, tid & 15, tid >> 4};
}

// Rows r0 .. r0 + 63 of a head's slice (row r at src + r * stride, 64 floats) into `tile`; rows at
// or past `rows` are zeros.
__device__ void load_tile(float* tile, const float* src, int64_t stride, int64_t r0, int64_t rows, int tid) {
  for (int n = tid; n < kTile * 16; n += kTileThreads) {
    const int r = n >> 4, c4 = n & 15;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r0 + r < rows) v = reinterpret_cast<const float4*>(src + (r0 + r) * stride)[c4];
    reinterpret_cast<float4*>(tile + r * kLd)[c4] = v;
  }
}

// acc[i][j] = a_(4 ty + i) . b_(tx + 16 j), over the 64 channels in order.
__device__ void tile_dots(float (&acc)[4][4], const float* a, const float* b, Lane l) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
#pragma unroll 4
  for (int k = 0; k < kTile; k += 4) {
    float4 av[4], bv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) av[i] = *reinterpret_cast<const float4*>(a + (4 * l.ty + i) * kLd + k);
#pragma unroll
    for (int j = 0; j < 4; ++j) bv[j] = *reinterpret_cast<const float4*>(b + (l.tx + 16 * j) * kLd + k);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float s = acc[i][j];
        s = fmaf(av[i].x, bv[j].x, s);
        s = fmaf(av[i].y, bv[j].y, s);
        s = fmaf(av[i].z, bv[j].z, s);
        s = fmaf(av[i].w, bv[j].w, s);
        acc[i][j] = s;
      }
  }
}

// acc[i][c] += sum_r w[4 ty + i][r] m[r][4 tx + c], r over the tile's 64 rows in order: a 64 x 64
// weight tile (P, dS) times a tile of rows (V, K, dY, Q).
__device__ void tile_mul_add(float (&acc)[4][4], const float* w, const float* m, Lane l) {
#pragma unroll 2
  for (int r = 0; r < kTile; r += 4) {
    float4 wv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) wv[i] = *reinterpret_cast<const float4*>(w + (4 * l.ty + i) * kLd + r);
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const float4 mv = *reinterpret_cast<const float4*>(m + (r + rr) * kLd + 4 * l.tx);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float wi = rr == 0 ? wv[i].x : rr == 1 ? wv[i].y : rr == 2 ? wv[i].z : wv[i].w;
        acc[i][0] = fmaf(wi, mv.x, acc[i][0]);
        acc[i][1] = fmaf(wi, mv.y, acc[i][1]);
        acc[i][2] = fmaf(wi, mv.z, acc[i][2]);
        acc[i][3] = fmaf(wi, mv.w, acc[i][3]);
      }
    }
  }
}

// Over the 16 lanes of a row (a half warp), in a fixed butterfly.
__device__ float row_max(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ float row_sum(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Row r of a 64-row tile (64 floats) from acc's lane part into dst (row r at dst + r * stride),
// scaled by `mul`, for rows below `rows`.
__device__ void store_rows(float* dst, int64_t stride, int64_t r0, int64_t rows, const float (&acc)[4][4],
                           const float (&mul)[4], Lane l) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + 4 * l.ty + i;
    if (r < rows)
      reinterpret_cast<float4*>(dst + r * stride)[l.tx] =
          make_float4(acc[i][0] * mul[i], acc[i][1] * mul[i], acc[i][2] * mul[i], acc[i][3] * mul[i]);
  }
}

__global__ void __launch_bounds__(kTileThreads)
    attention_forward_tiled_kernel(float* y, float* lse, const float* x, AttentionDims s) {
  extern __shared__ float4 smem4[];
  float* qs = reinterpret_cast<float*>(smem4);
  float *ks = qs + kTileFloats, *vs = ks + kTileFloats, *ps = vs + kTileFloats;
  const Lane l = lane();
  const int64_t bh = blockIdx.x, b = bh / s.heads, h = bh % s.heads;
  const int64_t qt = gridDim.y - 1 - blockIdx.y, t0 = qt * kTile, c3 = 3 * s.c;
  const float* head = x + b * s.t * c3 + h * kTile;
  load_tile(qs, head, c3, t0, s.t, l.tid);
  float m[4], sum[4], o[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    sum[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c) o[i][c] = 0.0f;
  }
  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t j0 = kt * kTile;
    __syncthreads();  // the previous tile's reads of ks, vs and ps are done
    load_tile(ks, head + s.c, c3, j0, s.t, l.tid);
    load_tile(vs, head + 2 * s.c, c3, j0, s.t, l.tid);
    __syncthreads();
    float sc[4][4];
    tile_dots(sc, qs, ks, l);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t t = t0 + 4 * l.ty + i;
      float mt = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t jk = j0 + l.tx + 16 * j;
        sc[i][j] = jk <= t && t < s.t ? sc[i][j] * s.scale : -INFINITY;  // masked: p = 0
        mt = fmaxf(mt, sc[i][j]);
      }
      const float mn = fmaxf(m[i], row_max(mt));
      // At the first finite score, e^(-inf) = 0 rescales the empty sums; no finite score yet: 1.
      const float f = mn == -INFINITY ? 1.0f : expf(m[i] - mn);
      float rs = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t jk = j0 + l.tx + 16 * j;
        const float p = sc[i][j] == -INFINITY ? 0.0f : expf(sc[i][j] - mn);
        rs += p;
        ps[(4 * l.ty + i) * kLd + l.tx + 16 * j] = p != 0.0f ? p * math::attention_mask(s, b, h, t, jk) : p;
      }
      sum[i] = sum[i] * f + row_sum(rs);
      m[i] = mn;
#pragma unroll
      for (int c = 0; c < 4; ++c) o[i][c] *= f;
    }
    __syncthreads();
    tile_mul_add(o, ps, vs, l);
  }
  float inv[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    inv[i] = 1.0f / sum[i];
    const int64_t t = t0 + 4 * l.ty + i;
    // no finite score: NaN, as the CPU's exp(-inf + inf)
    if (l.tx == 0 && t < s.t) lse[bh * s.t + t] = m[i] == -INFINITY ? NAN : m[i] + logf(sum[i]);
  }
  store_rows(y + b * s.t * s.c + h * kTile, s.c, t0, s.t, o, inv, l);
}

// dq and E for a tile of 64 query rows: E over every key tile first, then dS and dq += dS K.
__global__ void __launch_bounds__(kTileThreads, 2)
    attention_dq_tiled_kernel(float* dx, float* e, const float* dy, const float* x, const float* lse, AttentionDims s) {
  extern __shared__ float4 smem4[];
  float* qs = reinterpret_cast<float*>(smem4);
  float *gs = qs + kTileFloats, *ks = gs + kTileFloats, *vs = ks + kTileFloats, *dss = vs + kTileFloats;
  const Lane l = lane();
  const int64_t bh = blockIdx.x, b = bh / s.heads, h = bh % s.heads;
  const int64_t qt = gridDim.y - 1 - blockIdx.y, t0 = qt * kTile, c3 = 3 * s.c;
  const float* head = x + b * s.t * c3 + h * kTile;
  load_tile(qs, head, c3, t0, s.t, l.tid);
  load_tile(gs, dy + b * s.t * s.c + h * kTile, s.c, t0, s.t, l.tid);
  float lr[4], et[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t t = t0 + 4 * l.ty + i;
    lr[i] = t < s.t ? lse[bh * s.t + t] : 0.0f;
    et[i] = 0.0f;
  }
  for (int pass = 0; pass < 2; ++pass) {
    float dq[4][4] = {};
    for (int64_t kt = 0; kt <= qt; ++kt) {
      const int64_t j0 = kt * kTile;
      __syncthreads();
      load_tile(ks, head + s.c, c3, j0, s.t, l.tid);
      load_tile(vs, head + 2 * s.c, c3, j0, s.t, l.tid);
      __syncthreads();
      float sc[4][4], dp[4][4];
      tile_dots(sc, qs, ks, l);
      tile_dots(dp, gs, vs, l);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t t = t0 + 4 * l.ty + i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t jk = j0 + l.tx + 16 * j;
          float v = 0.0f;
          if (jk <= t && t < s.t) {
            const float p = expf(sc[i][j] * s.scale - lr[i]), mk = math::attention_mask(s, b, h, t, jk);
            v = pass == 0 ? p * mk * dp[i][j] : p * (mk * dp[i][j] - et[i]) * s.scale;
          }
          if (pass == 0) et[i] += v;
          else dss[(4 * l.ty + i) * kLd + l.tx + 16 * j] = v;
        }
      }
      if (pass == 1) {
        __syncthreads();
        tile_mul_add(dq, dss, ks, l);
      }
    }
    if (pass == 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        et[i] = row_sum(et[i]);
        const int64_t t = t0 + 4 * l.ty + i;
        if (l.tx == 0 && t < s.t) e[bh * s.t + t] = et[i];
      }
    } else {
      const float one[4] = {1.0f, 1.0f, 1.0f, 1.0f};
      store_rows(dx + b * s.t * c3 + h * kTile, c3, t0, s.t, dq, one, l);
    }
  }
}

// dk and dv for a tile of 64 key rows, over the query tiles at and after it. The score tiles are
// transposed here: rows are keys, columns queries.
__global__ void __launch_bounds__(kTileThreads)
    attention_dkv_tiled_kernel(float* dx, const float* dy, const float* x, const float* lse, const float* e,
                               AttentionDims s) {
  extern __shared__ float4 smem4[];
  float* ks = reinterpret_cast<float*>(smem4);
  float *vs = ks + kTileFloats, *qs = vs + kTileFloats, *gs = qs + kTileFloats, *ps = gs + kTileFloats,
        *dss = ps + kTileFloats, *ls = dss + kTileFloats, *es = ls + kTile;
  const Lane l = lane();
  const int64_t bh = blockIdx.x, b = bh / s.heads, h = bh % s.heads;
  const int64_t kt = blockIdx.y, j0 = kt * kTile, c3 = 3 * s.c, tiles = gridDim.y;
  const float* head = x + b * s.t * c3 + h * kTile;
  const float* ghead = dy + b * s.t * s.c + h * kTile;
  load_tile(ks, head + s.c, c3, j0, s.t, l.tid);
  load_tile(vs, head + 2 * s.c, c3, j0, s.t, l.tid);
  float dk[4][4] = {}, dv[4][4] = {};
  for (int64_t qt = kt; qt < tiles; ++qt) {
    const int64_t t0 = qt * kTile;
    __syncthreads();
    load_tile(qs, head, c3, t0, s.t, l.tid);
    load_tile(gs, ghead, s.c, t0, s.t, l.tid);
    if (l.tid < kTile) {
      const int64_t t = t0 + l.tid;
      ls[l.tid] = t < s.t ? lse[bh * s.t + t] : 0.0f;
      es[l.tid] = t < s.t ? e[bh * s.t + t] : 0.0f;
    }
    __syncthreads();
    float sc[4][4], dp[4][4];
    tile_dots(sc, ks, qs, l);
    tile_dots(dp, vs, gs, l);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t jk = j0 + 4 * l.ty + i;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int tc = l.tx + 16 * j;
        const int64_t t = t0 + tc;
        float pm = 0.0f, ds = 0.0f;
        if (jk <= t && t < s.t) {
          const float p = expf(sc[i][j] * s.scale - ls[tc]), mk = math::attention_mask(s, b, h, t, jk);
          pm = p * mk;
          ds = p * (mk * dp[i][j] - es[tc]) * s.scale;
        }
        ps[(4 * l.ty + i) * kLd + tc] = pm;
        dss[(4 * l.ty + i) * kLd + tc] = ds;
      }
    }
    __syncthreads();
    tile_mul_add(dv, ps, gs, l);
    tile_mul_add(dk, dss, qs, l);
  }
  const float one[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  store_rows(dx + b * s.t * c3 + h * kTile + s.c, c3, j0, s.t, dk, one, l);
  store_rows(dx + b * s.t * c3 + h * kTile + 2 * s.c, c3, j0, s.t, dv, one, l);
}

constexpr size_t kForwardSmem = 4 * kTileFloats * sizeof(float);
constexpr size_t kDqSmem = 5 * kTileFloats * sizeof(float);
constexpr size_t kDkvSmem = (6 * kTileFloats + 2 * kTile) * sizeof(float);

// Each device's answer to "do the tiles' shared memory fit a block?", asked once, when it also
// raises the kernels' dynamic shared memory limit: 0 not asked yet, 1 yes, -1 no (sm_86 and sm_89
// allow 99 KiB per block, under dk and dv's 103 KiB: those devices take the row kernels).
std::atomic<int> tiles_fit[cuda::kMaxDevices];

bool device_fits_tiles(int dev) {
  int fit = tiles_fit[dev].load(std::memory_order_acquire);
  if (fit == 0) {
    int optin = 0;
    MG_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    fit = static_cast<size_t>(optin) >= kDkvSmem ? 1 : -1;
    if (fit == 1) {
      MG_CUDA_CHECK(cudaFuncSetAttribute(attention_forward_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kForwardSmem)));
      MG_CUDA_CHECK(cudaFuncSetAttribute(attention_dq_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kDqSmem)));
      MG_CUDA_CHECK(cudaFuncSetAttribute(attention_dkv_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kDkvSmem)));
    }
    tiles_fit[dev].store(fit, std::memory_order_release);
  }
  return fit == 1;
}

// The tiles need heads of 64, rows whose float4s are aligned (qkv's and dy's rows start at
// multiples of 4 floats, C = 64 H, so the data pointers decide), and the device's shared memory.
// Anything else takes the row kernels.
int64_t tiles_of(const AttentionDims& s) { return (s.t + kTile - 1) / kTile; }

bool tiled(const AttentionDims& s, int dev, std::initializer_list<const float*> ptrs) {
  if (s.d != kTile || s.b * s.heads > 2147483647 || tiles_of(s) > 65535) return false;
  for (const float* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return device_fits_tiles(dev);
}

dim3 tile_grid(const AttentionDims& s) {
  return dim3(static_cast<unsigned>(s.b * s.heads), static_cast<unsigned>(tiles_of(s)));
}

AttentionDims dims(const Tensor& qkv, int heads, const AttentionDropout& drop) {
  return math::attention_dims(qkv.size(0), qkv.size(1), qkv.size(2), heads, drop);
}

unsigned blocks_for(int64_t rows) {
  MG_CHECK(rows <= int64_t{kAttentionThreads} * 2147483647, "causal_self_attention on CUDA: " << rows
                                                                  << " rows exceed the grid limit");
  return static_cast<unsigned>((rows + kAttentionThreads - 1) / kAttentionThreads);
}

template <int kD>
void forward(Tensor& y, Tensor& lse, const Tensor& qkv, const AttentionDims& s, int64_t rows, cudaStream_t stream) {
  attention_forward_kernel<kD><<<blocks_for(rows), kAttentionThreads, 0, stream>>>(y.data<float>(), lse.data<float>(),
                                                                                    qkv.data<float>(), s);
  MG_CUDA_CHECK_LAUNCH();
}

template <int kD>
void backward(Tensor& dqkv, const Tensor& dy, const Tensor& qkv, const Tensor& lse, const AttentionDims& s,
              int64_t rows, float* e, cudaStream_t stream) {
  const unsigned blocks = blocks_for(rows);
  attention_dq_kernel<kD><<<blocks, kAttentionThreads, 0, stream>>>(
      dqkv.data<float>(), e, dy.data<float>(), qkv.data<float>(), lse.data<float>(), s);
  MG_CUDA_CHECK_LAUNCH();
  attention_dkv_kernel<kD, true><<<blocks, kAttentionThreads, 0, stream>>>(dqkv.data<float>(), dy.data<float>(),
                                                                            qkv.data<float>(), lse.data<float>(), e, s);
  MG_CUDA_CHECK_LAUNCH();
  attention_dkv_kernel<kD, false><<<blocks, kAttentionThreads, 0, stream>>>(
      dqkv.data<float>(), dy.data<float>(), qkv.data<float>(), lse.data<float>(), e, s);
  MG_CUDA_CHECK_LAUNCH();
}

// The float32 kernels: the tiles where they fit, else the row kernels.
void forward_f32(Tensor& y, Tensor& lse, const Tensor& qkv, int heads, const AttentionDropout& drop) {
  const AttentionDims s = dims(qkv, heads, drop);
  const int64_t rows = s.b * heads * s.t;
  if (rows == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  if (tiled(s, dev, {y.data<float>(), qkv.data<float>()})) {
    attention_forward_tiled_kernel<<<tile_grid(s), kTileThreads, kForwardSmem, stream>>>(
        y.data<float>(), lse.data<float>(), qkv.data<float>(), s);
    MG_CUDA_CHECK_LAUNCH();
  } else if (s.d == 64) forward<64>(y, lse, qkv, s, rows, stream);
  else forward<0>(y, lse, qkv, s, rows, stream);
}

void backward_f32(Tensor& dqkv, const Tensor& dy, const Tensor& qkv, const Tensor& lse, int heads,
                  const AttentionDropout& drop) {
  const AttentionDims s = dims(qkv, heads, drop);
  const int64_t rows = s.b * heads * s.t;
  if (rows == 0) return;
  const int dev = cuda::device_of(dqkv);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::Workspace e(dev, static_cast<size_t>(rows) * sizeof(float));
  float* ep = static_cast<float*>(e.get());
  if (tiled(s, dev, {dqkv.data<float>(), dy.data<float>(), qkv.data<float>()})) {
    attention_dq_tiled_kernel<<<tile_grid(s), kTileThreads, kDqSmem, stream>>>(
        dqkv.data<float>(), ep, dy.data<float>(), qkv.data<float>(), lse.data<float>(), s);
    MG_CUDA_CHECK_LAUNCH();
    attention_dkv_tiled_kernel<<<tile_grid(s), kTileThreads, kDkvSmem, stream>>>(
        dqkv.data<float>(), dy.data<float>(), qkv.data<float>(), lse.data<float>(), ep, s);
    MG_CUDA_CHECK_LAUNCH();
  } else if (s.d == 64) backward<64>(dqkv, dy, qkv, lse, s, rows, ep, stream);
  else backward<0>(dqkv, dy, qkv, lse, s, rows, ep, stream);
}

}  // namespace

template <>
bool attention_forward<Cuda>(Tensor& y, Tensor& lse, const Tensor& qkv, int heads, const AttentionDropout& drop) {
  const DType dt = cuda::check_same_dtype("causal_self_attention", {&y, &qkv});
  MG_CHECK(lse.dtype() == DType::f32, "causal_self_attention on CUDA: lse must be float32, got " << dtype_name(lse.dtype()));
  if (dt == DType::f32) {
    forward_f32(y, lse, qkv, heads, drop);
    return false;
  }
  if (y.numel() == 0) return false;
  if (drop.p == 0.0f && cuda::cudnn_attention() && cuda::sdpa_forward(y, lse, qkv, heads)) return true;
  const Tensor wide = qkv.to(DType::f32);
  Tensor wy = Tensor::empty(y.shape(), TensorOptions{DType::f32, y.device()});
  forward_f32(wy, lse, wide, heads, drop);
  convert<Cuda>(y, wy);
  return false;
}

template <>
void attention_backward<Cuda>(Tensor& dqkv, const Tensor& dy, const Tensor& qkv, const Tensor& y, const Tensor& lse,
                              int heads, const AttentionDropout& drop) {
  const DType dt = cuda::check_same_dtype("causal_self_attention", {&dqkv, &dy, &qkv, &y});
  MG_CHECK(lse.dtype() == DType::f32, "causal_self_attention on CUDA: lse must be float32, got " << dtype_name(lse.dtype()));
  if (dt == DType::f32) {
    backward_f32(dqkv, dy, qkv, lse, heads, drop);
    return;
  }
  if (dqkv.numel() == 0) return;
  if (y.defined() && drop.p == 0.0f && cuda::cudnn_attention() && cuda::sdpa_backward(dqkv, dy, qkv, y, lse, heads))
    return;
  const Tensor wide = qkv.to(DType::f32), wdy = dy.to(DType::f32);
  Tensor wdx = Tensor::empty(dqkv.shape(), TensorOptions{DType::f32, dqkv.device()});
  backward_f32(wdx, wdy, wide, lse, heads, drop);
  convert<Cuda>(dqkv, wdx);
}

}  // namespace mg
