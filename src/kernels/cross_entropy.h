// Cross-entropy, fused log-softmax + negative log-likelihood.
//   logits: (N, C)   target: (N) int64 in [0, C)   loss: () scalar   probs: (N, C)
//   forward:  probs = softmax(logits) per row (saved for backward)
//             loss  = sum_n -log_softmax(logits)[n, target[n]]  (/ N for mean)         (=)
//   backward: dlogits = dloss * (probs - onehot(target))  (/ N for mean)                (=)
// A target outside [0, C) throws mg::Error naming the row and value.
#pragma once

#include <minigrad/core/autograd.h>
#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
template <class D>
void cross_entropy_forward(Tensor& loss, Tensor& probs, const Tensor& logits, const Tensor& target,
                           Reduction reduction);
template <class D>
void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& probs,
                            const Tensor& target, Reduction reduction);
}  // namespace mg
