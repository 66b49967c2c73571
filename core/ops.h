// The differentiable ops. Each is one entry of OpKind; `apply` runs its forward through the
// device dispatch and, when gradients are wanted, records a node on the tape. Gradient rules for
// all of them live together in core/gradients.cpp.
//
//   Tensor h = mg::relu(mg::linear(x, w1, b1));            // x: (N, 784), w1: (512, 784)
//   Tensor loss = mg::cross_entropy(mg::linear(h, w2, b2), labels);   // mean over N
//   loss.backward();
#pragma once

#include <span>
#include <vector>

#include "core/tensor.h"

namespace mg {

enum class OpKind : uint8_t {
  linear,               // (x, w[, b]) -> x w^T + b
  conv2d,               // (x, w[, b]) -> cross-correlation, stride, padding
  relu,                 // (x) -> max(x, 0)
  max_pool2d,           // (x) -> max over windows
  adaptive_avg_pool2d,  // (x) -> mean over adaptive windows
  reshape,              // (x) -> view with attrs.shape
  dropout,              // (x) -> x * mask / (1 - p), mask from (seed, offset)
  cross_entropy,        // (logits, target) -> scalar loss
  add,                  // (a, b) -> a + b
  scale,                // (x) -> x * attrs.scalar
  checkpoint,           // a dropped segment of the tape (core/checkpoint.h)
};
const char* op_name(OpKind op);

enum class Reduction : uint8_t { mean, sum };

// Everything an op needs besides its input tensors. One flat struct for all ops keeps replay
// (Note [checkpoint replay]) a plain re-run of (kind, attrs, inputs).
struct OpAttrs {
  int kernel_h = 0, kernel_w = 0;
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  int out_h = 0, out_w = 0;     // adaptive_avg_pool2d
  float scalar = 0.0f;          // dropout p, scale factor
  uint64_t seed = 0, offset = 0;  // dropout's counter-based RNG position
  Reduction reduction = Reduction::mean;
  Shape shape;                  // reshape target
};

// Runs one op and records it on the tape when grad mode is on and an input requires grad.
Tensor apply(OpKind op, const OpAttrs& attrs, std::vector<Tensor> inputs);

// ---- the public op functions -------------------------------------------------------------
// x: (N, K), w: (M, K), b: (M) or undefined  ->  (N, M)
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = {});
// x: (N, C, H, W), w: (O, C, KH, KW), b: (O) or undefined  ->  (N, O, OH, OW)
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b = {}, int stride = 1,
              int padding = 0);
Tensor relu(const Tensor& x);
// stride 0 means stride = kernel, as in PyTorch.
Tensor max_pool2d(const Tensor& x, int kernel, int stride = 0, int padding = 0);
Tensor adaptive_avg_pool2d(const Tensor& x, int out_h, int out_w);
// Zeroes each element with probability p and scales the rest by 1/(1-p). The mask is drawn from
// `gen` (the default generator when null) and is a pure function of (seed, offset).
Tensor dropout(const Tensor& x, float p, Generator* gen = nullptr);
// logits: (N, C), target: (N) int64 class indices  ->  scalar (mean or sum over N)
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     Reduction reduction = Reduction::mean);
Tensor add(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, float s);

}  // namespace mg
