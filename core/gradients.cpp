// Every gradient rule of the library, in one place, so the calculus can be audited in one
// sitting. A rule receives the node (its attrs and saved tensors), dL/d(output), and fills
// grads[i] = dL/d(input i) for each input that requires grad. Where accum[i] is defined (the
// leaf's gradient buffer) a rule may add into it directly and leave grads[i] undefined.
#include "core/autograd.h"
#include "core/checkpoint.h"
#include "kernels/conv2d.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/pooling.h"
#include "kernels/relu.h"

namespace mg {

namespace {

bool wants(const Node& n, size_t i) { return i < n.inputs.size() && n.inputs[i].requires_grad; }

Tensor empty_like_input(const Node& n, size_t i, Device d) {
  return Tensor::empty(n.inputs[i].shape, TensorOptions{DType::f32, d});
}

// Weight-style rules (linear, conv2d): dw and db either land in fresh tensors or, when every
// such input has a gradient buffer already, are added straight into the buffers.
struct ParamGrads {
  Tensor dw, db;
  bool accumulate = false;
};

ParamGrads param_grads(const Node& n, std::vector<Tensor>& grads, const std::vector<Tensor>& accum,
                       Device d) {
  ParamGrads p;
  const bool want_w = wants(n, 1), want_b = wants(n, 2);
  p.accumulate = (!want_w || accum[1].defined()) && (!want_b || accum[2].defined()) && (want_w || want_b);
  if (want_w) p.dw = p.accumulate ? accum[1] : (grads[1] = empty_like_input(n, 1, d));
  if (want_b) p.db = p.accumulate ? accum[2] : (grads[2] = empty_like_input(n, 2, d));
  return p;
}

}  // namespace

void backward_rule(Node& n, Tensor gy, std::vector<Tensor>& grads,
                   const std::vector<Tensor>& accum) {
  const Device d = gy.device();
  switch (n.op) {
    case OpKind::linear: {
      // y = x w^T + b:  dx = dy w,  dw = dy^T x,  db = sum_n dy
      const Tensor &x = n.saved[0], &w = n.saved[1];
      Tensor dx = wants(n, 0) ? (grads[0] = empty_like_input(n, 0, d)) : Tensor();
      ParamGrads p = param_grads(n, grads, accum, d);
      MG_DISPATCH(d, linear_backward, dx, p.dw, p.db, gy, x, w, p.accumulate);
      return;
    }
    case OpKind::conv2d: {
      // dx = transposed convolution of dy with w; dw = correlation of x with dy; db = sum dy
      const Tensor &x = n.saved[0], &w = n.saved[1];
      Tensor dx = wants(n, 0) ? (grads[0] = empty_like_input(n, 0, d)) : Tensor();
      ParamGrads p = param_grads(n, grads, accum, d);
      MG_DISPATCH(d, conv2d_backward, dx, p.dw, p.db, gy, x, w, n.attrs.stride_h, n.attrs.pad_h,
                  p.accumulate);
      return;
    }
    case OpKind::relu: {
      // y = max(x, 0):  dx = dy * (y > 0)
      grads[0] = empty_like_input(n, 0, d);
      MG_DISPATCH(d, relu_backward, grads[0], gy, n.saved[0]);
      return;
    }
    case OpKind::max_pool2d: {
      // dx[argmax of each window] += dy
      grads[0] = empty_like_input(n, 0, d);
      MG_DISPATCH(d, max_pool2d_backward, grads[0], gy, n.saved[0], n.attrs.kernel_h, n.attrs.stride_h,
                  n.attrs.pad_h);
      return;
    }
    case OpKind::adaptive_avg_pool2d: {
      // each input element gets dy / window size from every window that contains it
      grads[0] = empty_like_input(n, 0, d);
      MG_DISPATCH(d, adaptive_avg_pool2d_backward, grads[0], gy);
      return;
    }
    case OpKind::reshape: {
      // a view: the gradient is dy viewed with the input's shape
      Tensor g = gy.detach();
      g.impl().shape = n.inputs[0].shape;
      grads[0] = g;
      return;
    }
    case OpKind::dropout: {
      // dx = dy * mask / (1 - p), mask regenerated from (seed, offset)
      grads[0] = empty_like_input(n, 0, d);
      MG_DISPATCH(d, dropout_backward, grads[0], gy, n.attrs.scalar, n.attrs.seed, n.attrs.offset);
      return;
    }
    case OpKind::cross_entropy: {
      // dlogits = dloss * (softmax - onehot(target)) (/ N for mean); no gradient for target
      grads[0] = empty_like_input(n, 0, d);
      MG_DISPATCH(d, cross_entropy_backward, grads[0], gy, n.saved[0], n.saved[1], n.attrs.reduction);
      return;
    }
    case OpKind::add: {
      // y = a + b:  da = dy, db = dy (the engine copies before accumulating into a leaf)
      if (wants(n, 0)) grads[0] = gy;
      if (wants(n, 1)) grads[1] = gy;
      return;
    }
    case OpKind::scale: {
      // y = s x:  dx = s dy
      grads[0] = empty_like_input(n, 0, d);
      MG_DISPATCH(d, scale_forward, grads[0], gy, n.attrs.scalar);
      return;
    }
    case OpKind::checkpoint: {
      // replay the dropped segment, then backpropagate through the fresh sub-tape
      checkpoint_backward(n, std::move(gy), grads);
      return;
    }
  }
  MG_FAIL("no gradient rule for op " << op_name(n.op));
}

}  // namespace mg
