// Weight-style gradient rules (linear, conv2d): dw and db either land in fresh tensors or, when
// every such input has a gradient buffer already (an optimizer's), are added straight into the
// buffers (GEMM beta = 1), saving a temporary and a pass over memory.
#pragma once

#include "ops/op.h"

namespace mg {

struct ParamGrads {
  Tensor dw, db;
  bool accumulate = false;
};

// Inputs 1 (weight) and 2 (bias) of node n.
inline ParamGrads param_grads(const Node& n, std::vector<Tensor>& grads,
                              const std::vector<Tensor>& accum, Device d) {
  ParamGrads p;
  const bool want_w = wants(n, 1), want_b = wants(n, 2);
  p.accumulate = (!want_w || accum[1].defined()) && (!want_b || accum[2].defined()) && (want_w || want_b);
  if (want_w) p.dw = p.accumulate ? accum[1] : (grads[1] = empty_like_input(n, 1, d));
  if (want_b) p.db = p.accumulate ? accum[2] : (grads[2] = empty_like_input(n, 2, d));
  return p;
}

}  // namespace mg
