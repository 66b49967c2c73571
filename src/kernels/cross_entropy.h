// Cross-entropy, fused log-softmax + negative log-likelihood.
//   logits: (N, C)   target: (N) int64 in [0, C) or ignore_index   loss: () scalar   probs: (N, C)
//   count: (1) the rows whose target is not ignore_index (as float)
//   forward:  probs = softmax(logits) per row (saved for backward)
//             loss  = sum over counted rows of -log_softmax(logits)[n, target[n]]
//                     (/ count for mean: NaN when every row is ignored, as PyTorch)          (=)
//   backward: dlogits = dloss * (probs - onehot(target)) (/ count for mean); 0 on ignored rows (=)
// The rows' losses are added in row order (deterministic). A target outside [0, C) that is not
// ignore_index throws mg::Error naming the row and value.
#pragma once

#include <cstdint>

#include <minigrad/core/autograd.h>
#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
template <class D>
void cross_entropy_forward(Tensor& loss, Tensor& probs, Tensor& count, const Tensor& logits, const Tensor& target,
                           Reduction reduction, int64_t ignore_index);
template <class D>
void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& probs, const Tensor& count,
                            const Tensor& target, Reduction reduction, int64_t ignore_index);
}  // namespace mg
