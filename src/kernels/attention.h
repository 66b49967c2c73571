// Causal self-attention of packed q, k, v: qkv (B, T, 3C) -> y (B, T, C), H heads of D = C / H.
// Head h at position t reads q_t = qkv[b, t, hD : hD+D], k_t = qkv[b, t, C+hD : ...], v_t at 2C+hD:
//   s_tj = q_t . k_j / sqrt(D)  (j <= t),   lse_t = log sum_{j<=t} exp(s_tj),   p_tj = exp(s_tj - lse_t)
//   y[b, t, hD : hD+D] = sum_{j<=t} p_tj v_j                                   (=; lse (B, H, T) =)
// Backward recomputes p from q, k and lse, so no T x T matrix (and not y) is kept between the passes:
//   dp_tj = dy_t . v_j,  E_t = sum_j p_tj dp_tj (= dy_t . y_t),  ds_tj = p_tj (dp_tj - E_t)
//   dq_t = sum_j ds_tj k_j / sqrt(D),  dk_j = sum_t ds_tj q_t / sqrt(D),  dv_j = sum_t p_tj dy_t   (=)
// Every (sample, head) is computed on its own in a fixed order: deterministic, and a sample's
// rows do not depend on the rest of the batch.
#pragma once

#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
template <class D> void attention_forward(Tensor& y, Tensor& lse, const Tensor& qkv, int heads);
template <class D>
void attention_backward(Tensor& dqkv, const Tensor& dy, const Tensor& qkv, const Tensor& lse, int heads);
}  // namespace mg
