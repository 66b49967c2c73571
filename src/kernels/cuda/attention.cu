// Causal self-attention on CUDA (kernels/attention.h): one thread per (sample, head, position),
// the scores recomputed where needed, every sum in a fixed order (no atomics): deterministic.
// Forward: one pass with a running maximum. Backward: E_t and dq per query row, then dk and dv
// per key row (two kernels, each looping over the rows that attend to it). A thread holds its
// own rows in registers for GPT-2's head size 64 and reads them where they lie for other sizes;
// the rows' bodies are in kernel_math.h, checked on the CPU against the CPU kernels.
#include "kernels/attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_math.h"

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

AttentionDims dims(const Tensor& qkv, int heads, const AttentionDropout& drop) {
  return math::attention_dims(qkv.size(0), qkv.size(1), qkv.size(2), heads, drop);
}

unsigned blocks_for(int64_t rows) {
  MG_CHECK(rows <= int64_t{kAttentionThreads} * 2147483647, "causal_self_attention on CUDA: " << rows
                                                                  << " rows exceed the grid limit");
  return static_cast<unsigned>((rows + kAttentionThreads - 1) / kAttentionThreads);
}

template <int kD>
void forward(Tensor& y, Tensor& lse, const Tensor& qkv, const AttentionDims& s, int64_t rows) {
  attention_forward_kernel<kD><<<blocks_for(rows), kAttentionThreads>>>(y.data<float>(), lse.data<float>(),
                                                                         qkv.data<float>(), s);
  MG_CUDA_CHECK_LAUNCH();
}

template <int kD>
void backward(Tensor& dqkv, const Tensor& dy, const Tensor& qkv, const Tensor& lse, const AttentionDims& s,
              int64_t rows, float* e) {
  const unsigned blocks = blocks_for(rows);
  attention_dq_kernel<kD><<<blocks, kAttentionThreads>>>(dqkv.data<float>(), e, dy.data<float>(), qkv.data<float>(),
                                                          lse.data<float>(), s);
  MG_CUDA_CHECK_LAUNCH();
  attention_dkv_kernel<kD, true><<<blocks, kAttentionThreads>>>(dqkv.data<float>(), dy.data<float>(),
                                                                 qkv.data<float>(), lse.data<float>(), e, s);
  MG_CUDA_CHECK_LAUNCH();
  attention_dkv_kernel<kD, false><<<blocks, kAttentionThreads>>>(dqkv.data<float>(), dy.data<float>(),
                                                                  qkv.data<float>(), lse.data<float>(), e, s);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <>
void attention_forward<Cuda>(Tensor& y, Tensor& lse, const Tensor& qkv, int heads, const AttentionDropout& drop) {
  const AttentionDims s = dims(qkv, heads, drop);
  const int64_t rows = s.b * heads * s.t;
  if (rows == 0) return;
  cuda::DeviceGuard guard(cuda::device_of(y));
  if (s.d == 64) forward<64>(y, lse, qkv, s, rows);
  else forward<0>(y, lse, qkv, s, rows);
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
  if (s.d == 64) backward<64>(dqkv, dy, qkv, lse, s, rows, static_cast<float*>(e.get()));
  else backward<0>(dqkv, dy, qkv, lse, s, rows, static_cast<float*>(e.get()));
}

}  // namespace mg
