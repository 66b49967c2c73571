// Causal self-attention on CUDA (kernels/attention.h), plain kernels first: one thread per
// (sample, head, position), the scores recomputed where needed, every sum in a fixed order (no
// atomics): deterministic. Forward: a row's max, log-sum-exp and output. Backward: E_t, then dq
// per query row, then dk and dv per key row (each looping over the rows that attend to it).
// cuBLAS batched products or cuDNN's fused attention would be faster on long contexts.
#include "kernels/attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_math.h"

namespace mg {
namespace {

using cuda::math::AttentionDims;

// One thread per row of (B, H, T); the rows' bodies are in kernel_math.h, checked on the CPU.
__global__ void attention_forward_kernel(float* y, float* lse, const float* x, AttentionDims s) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r < s.b * s.heads * s.t) cuda::math::attention_forward_row(y, lse, x, s, r);
}

__global__ void attention_e_kernel(float* e, const float* dy, const float* x, const float* lse, AttentionDims s) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r < s.b * s.heads * s.t) e[r] = cuda::math::attention_e_row(dy, x, lse, s, r);
}

__global__ void attention_dq_kernel(float* dx, const float* dy, const float* x, const float* lse, const float* e,
                                    AttentionDims s) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r < s.b * s.heads * s.t) cuda::math::attention_dq_row(dx, dy, x, lse, e, s, r);
}

__global__ void attention_dkv_kernel(float* dx, const float* dy, const float* x, const float* lse, const float* e,
                                     AttentionDims s) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r < s.b * s.heads * s.t) cuda::math::attention_dkv_row(dx, dy, x, lse, e, s, r);
}

AttentionDims dims(const Tensor& qkv, int heads, const AttentionDropout& drop) {
  return cuda::math::attention_dims(qkv.size(0), qkv.size(1), qkv.size(2), heads, drop);
}

}  // namespace

template <>
void attention_forward<Cuda>(Tensor& y, Tensor& lse, const Tensor& qkv, int heads, const AttentionDropout& drop) {
  const AttentionDims s = dims(qkv, heads, drop);
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
  const AttentionDims s = dims(qkv, heads, drop);
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
