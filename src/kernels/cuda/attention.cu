// Causal self-attention on CUDA (kernels/attention.h), plain kernels first: one thread per
// (sample, head, position), the scores recomputed where needed, every sum in a fixed order (no
// atomics): deterministic. Forward: a row's max, log-sum-exp and output. Backward: E_t, then dq
// per query row, then dk and dv per key row (each looping over the rows that attend to it).
// cuBLAS batched products or cuDNN's fused attention would be faster on long contexts.
#include "kernels/attention.h"
#include "kernels/cuda/common.cuh"

namespace mg {
namespace {

struct Dims {
  int64_t b, t, c, d;
  int heads;
  float scale;
  AttentionDropout drop;
};

// M_tj (kernels/attention.h): 1 without dropout.
__device__ inline float keep(const Dims& s, int64_t b, int64_t h, int64_t t, int64_t j) {
  return s.drop.p > 0.0f ? attention_keep(s.drop, b, h, t, j, s.heads, s.t) : 1.0f;
}

// Row r of (b, h) -> the offsets of its q, k, v in qkv and of its output row in y.
__device__ inline int64_t qkv_row(const Dims& s, int64_t b, int64_t h, int64_t t) { return (b * s.t + t) * 3 * s.c + h * s.d; }
__device__ inline int64_t y_row(const Dims& s, int64_t b, int64_t h, int64_t t) { return (b * s.t + t) * s.c + h * s.d; }

__device__ inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

__global__ void attention_forward_kernel(float* y, float* lse, const float* x, Dims s) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r >= s.b * s.heads * s.t) return;
  const int64_t t = r % s.t, h = (r / s.t) % s.heads, b = r / (s.t * s.heads);
  const float* q = x + qkv_row(s, b, h, t);
  float m = -INFINITY;
  for (int64_t j = 0; j <= t; ++j) m = fmaxf(m, dot(q, x + qkv_row(s, b, h, j) + s.c, s.d) * s.scale);
  float sum = 0;
  for (int64_t j = 0; j <= t; ++j) sum += expf(dot(q, x + qkv_row(s, b, h, j) + s.c, s.d) * s.scale - m);
  const float l = m + logf(sum);
  lse[r] = l;
  float* out = y + y_row(s, b, h, t);
  for (int64_t i = 0; i < s.d; ++i) out[i] = 0.0f;
  for (int64_t j = 0; j <= t; ++j) {
    const float* kv = x + qkv_row(s, b, h, j);
    const float p = expf(dot(q, kv + s.c, s.d) * s.scale - l) * keep(s, b, h, t, j);
    for (int64_t i = 0; i < s.d; ++i) out[i] += p * kv[2 * s.c + i];
  }
}

// E_t = sum_j p_tj dp_tj (kernels/attention.h).
__global__ void attention_e_kernel(float* e, const float* dy, const float* x, const float* lse, Dims s) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r >= s.b * s.heads * s.t) return;
  const int64_t t = r % s.t, h = (r / s.t) % s.heads, b = r / (s.t * s.heads);
  const float *q = x + qkv_row(s, b, h, t), *g = dy + y_row(s, b, h, t);
  float acc = 0;
  for (int64_t j = 0; j <= t; ++j) {
    const float* kv = x + qkv_row(s, b, h, j);
    acc += expf(dot(q, kv + s.c, s.d) * s.scale - lse[r]) * keep(s, b, h, t, j) * dot(g, kv + 2 * s.c, s.d);
  }
  e[r] = acc;
}

__global__ void attention_dq_kernel(float* dx, const float* dy, const float* x, const float* lse, const float* e, Dims s) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r >= s.b * s.heads * s.t) return;
  const int64_t t = r % s.t, h = (r / s.t) % s.heads, b = r / (s.t * s.heads);
  const float *q = x + qkv_row(s, b, h, t), *g = dy + y_row(s, b, h, t);
  float* dq = dx + qkv_row(s, b, h, t);
  for (int64_t i = 0; i < s.d; ++i) dq[i] = 0.0f;
  for (int64_t j = 0; j <= t; ++j) {
    const float* kv = x + qkv_row(s, b, h, j);
    const float p = expf(dot(q, kv + s.c, s.d) * s.scale - lse[r]);
    const float ds = p * (keep(s, b, h, t, j) * dot(g, kv + 2 * s.c, s.d) - e[r]) * s.scale;
    for (int64_t i = 0; i < s.d; ++i) dq[i] += ds * kv[s.c + i];
  }
}

__global__ void attention_dkv_kernel(float* dx, const float* dy, const float* x, const float* lse, const float* e, Dims s) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r >= s.b * s.heads * s.t) return;
  const int64_t j = r % s.t, h = (r / s.t) % s.heads, b = r / (s.t * s.heads);
  const float* kv = x + qkv_row(s, b, h, j);
  float* dkv = dx + qkv_row(s, b, h, j);
  for (int64_t i = 0; i < s.d; ++i) dkv[s.c + i] = dkv[2 * s.c + i] = 0.0f;
  for (int64_t t = j; t < s.t; ++t) {
    const int64_t rt = r - j + t;  // (b, h, t)
    const float *q = x + qkv_row(s, b, h, t), *g = dy + y_row(s, b, h, t);
    const float p = expf(dot(q, kv + s.c, s.d) * s.scale - lse[rt]), m = keep(s, b, h, t, j);
    const float ds = p * (m * dot(g, kv + 2 * s.c, s.d) - e[rt]) * s.scale;
    for (int64_t i = 0; i < s.d; ++i) {
      dkv[s.c + i] += ds * q[i];
      dkv[2 * s.c + i] += p * m * g[i];
    }
  }
}

Dims dims(const Tensor& qkv, int heads, const AttentionDropout& drop) {
  const int64_t c = qkv.size(2) / 3;
  return {qkv.size(0), qkv.size(1), c, c / heads, heads, 1.0f / sqrtf(static_cast<float>(c / heads)), drop};
}

}  // namespace

template <>
void attention_forward<Cuda>(Tensor& y, Tensor& lse, const Tensor& qkv, int heads, const AttentionDropout& drop) {
  const Dims s = dims(qkv, heads, drop);
  const int64_t rows = s.b * heads * s.t;
  if (rows == 0) return;
  cuda::DeviceGuard guard(cuda::device_of(y));
  attention_forward_kernel<<<cuda::grid_for(rows), cuda::kThreads>>>(y.data<float>(), lse.data<float>(),
                                                                      qkv.data<float>(), s);
  MG_CUDA_CHECK_LAUNCH();
}

template <>
void attention_backward<Cuda>(Tensor& dqkv, const Tensor& dy, const Tensor& qkv, const Tensor& lse, int heads,
                              const AttentionDropout& drop) {
  const Dims s = dims(qkv, heads, drop);
  const int64_t rows = s.b * heads * s.t;
  if (rows == 0) return;
  const int dev = cuda::device_of(dqkv);
  cuda::DeviceGuard guard(dev);
  cuda::Workspace e(dev, static_cast<size_t>(rows) * sizeof(float));
  float* pe = static_cast<float*>(e.get());
  attention_e_kernel<<<cuda::grid_for(rows), cuda::kThreads>>>(pe, dy.data<float>(), qkv.data<float>(),
                                                                lse.data<float>(), s);
  MG_CUDA_CHECK_LAUNCH();
  attention_dq_kernel<<<cuda::grid_for(rows), cuda::kThreads>>>(dqkv.data<float>(), dy.data<float>(),
                                                                 qkv.data<float>(), lse.data<float>(), pe, s);
  MG_CUDA_CHECK_LAUNCH();
  attention_dkv_kernel<<<cuda::grid_for(rows), cuda::kThreads>>>(dqkv.data<float>(), dy.data<float>(),
                                                                  qkv.data<float>(), lse.data<float>(), pe, s);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg
