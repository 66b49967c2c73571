// Causal self-attention of packed q, k, v: qkv (B, T, 3C) -> y (B, T, C), H heads of D = C / H.
// Head h at position t reads q_t = qkv[b, t, hD : hD+D], k_t = qkv[b, t, C+hD : ...], v_t at 2C+hD:
//   s_tj = q_t . k_j / sqrt(D)  (j <= t),   lse_t = log sum_{j<=t} exp(s_tj),   p_tj = exp(s_tj - lse_t)
//   y[b, t, hD : hD+D] = sum_{j<=t} p_tj v_j                                   (=; lse (B, H, T) =)
// Backward recomputes p from q, k and lse, so no T x T matrix (and not y) is kept between the passes:
//   dp_tj = dy_t . v_j,  E_t = sum_j p_tj dp_tj (= dy_t . y_t),  ds_tj = p_tj (dp_tj - E_t)
//   dq_t = sum_j ds_tj k_j / sqrt(D),  dk_j = sum_t ds_tj q_t / sqrt(D),  dv_j = sum_t p_tj dy_t   (=)
// Every (sample, head) is computed on its own in a fixed order: deterministic, and a sample's
// rows do not depend on the rest of the batch.
//
// Dropout on the probabilities (attention dropout, `p` > 0): p'_tj = p_tj M_tj with M_tj = 0 with
// probability p, else 1 / (1 - p), and y_t = sum_j p'_tj v_j. The mask is a pure function of the
// Philox counter offset + b * per_sample + (h T + t) T + j (per_sample = sample_stride, or H T T
// when 0; Note [dropout by sample]), so backward redraws it and keeps nothing more:
//   dp_tj = M_tj dy_t . v_j,  E_t = sum_j p_tj dp_tj,  ds_tj = p_tj (dp_tj - E_t),  dv_j = sum_t p'_tj dy_t
// With p = 0 no mask is drawn: the same bits as without dropout.
//
// Storage: qkv, y, dy and dqkv float32; on CUDA also all bf16 or all f16 (Note [cuda half kernels]
// in src/kernels/cuda/storage.cuh), with lse float32 always. bf16/f16 run cuDNN's fused attention
// where it takes the case (src/kernels/cuda/attention_cudnn.cpp), else the float32 kernels on
// widened copies. cuDNN's backward reads y (for E_t = dy_t . y_t): attention_forward returns
// whether its backward wants y, and attention_backward gets y then, an undefined tensor otherwise.
#pragma once

#include <cstdint>

#include <minigrad/core/rng.h>
#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {

struct AttentionDropout {
  float p = 0.0f;
  uint64_t seed = 0, offset = 0, sample_stride = 0;
};

// M_tj of sample b, head h (of `heads`), query t, key j, in a sequence of T.
MG_HOST_DEVICE float attention_keep(const AttentionDropout& d, int64_t b, int64_t h, int64_t t, int64_t j,
                                    int64_t heads, int64_t T) {
  const uint64_t per_sample = d.sample_stride != 0 ? d.sample_stride : static_cast<uint64_t>(heads * T * T);
  const uint64_t i = d.offset + static_cast<uint64_t>(b) * per_sample + static_cast<uint64_t>((h * T + t) * T + j);
  return philox_uniform(d.seed, i) >= d.p ? 1.0f / (1.0f - d.p) : 0.0f;
}

// Returns true when attention_backward must be given y.
template <class D>
bool attention_forward(Tensor& y, Tensor& lse, const Tensor& qkv, int heads, const AttentionDropout& drop);
template <class D>
void attention_backward(Tensor& dqkv, const Tensor& dy, const Tensor& qkv, const Tensor& y, const Tensor& lse,
                        int heads, const AttentionDropout& drop);
}  // namespace mg
