// Forward of every op: argument checks, output allocation, the device kernel, and what the
// backward rule (core/gradients.cpp) will need saved.
#include "core/ops.h"

#include "core/autograd.h"
#include "core/checkpoint.h"
#include "core/rng.h"
#include "kernels/conv2d.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/pooling.h"
#include "kernels/relu.h"

namespace mg {

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::linear: return "linear";
    case OpKind::conv2d: return "conv2d";
    case OpKind::relu: return "relu";
    case OpKind::max_pool2d: return "max_pool2d";
    case OpKind::adaptive_avg_pool2d: return "adaptive_avg_pool2d";
    case OpKind::reshape: return "reshape";
    case OpKind::dropout: return "dropout";
    case OpKind::cross_entropy: return "cross_entropy";
    case OpKind::add: return "add";
    case OpKind::scale: return "scale";
    case OpKind::checkpoint: return "checkpoint";
  }
  return "?";
}

namespace {

TensorOptions like(const Tensor& t) { return TensorOptions{DType::f32, t.device()}; }

void check_float(const char* op, const char* what, const Tensor& t) {
  MG_CHECK(t.defined(), op << ": " << what << " is undefined");
  MG_CHECK(t.dtype() == DType::f32,
           op << ": " << what << " must be float32, got " << dtype_name(t.dtype()));
}

void check_same_device(const char* op, const std::vector<Tensor>& in) {
  for (const Tensor& t : in) {
    if (!t.defined()) continue;
    MG_CHECK(t.device() == in[0].device(), op << ": inputs on different devices ("
                                              << in[0].device().str() << " and "
                                              << t.device().str() << ")");
  }
}

// 0 when the kernel does not fit: C++ division truncates toward zero, so (in + 2p - k) / s + 1
// alone would say 1 for a kernel up to s - 1 elements too large.
int64_t pool_out(int64_t in, int k, int s, int p) { return in + 2 * p < k ? 0 : (in + 2 * p - k) / s + 1; }

// Runs the forward kernel of `op`; appends to `saved` what backward needs when it is non-null.
Tensor forward(OpKind op, const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  const char* name = op_name(op);
  check_same_device(name, in);
  auto save = [&](std::initializer_list<Tensor> ts) {
    if (saved) saved->insert(saved->end(), ts);
  };
  switch (op) {
    case OpKind::linear: {
      const Tensor &x = in[0], &w = in[1], &b = in[2];
      check_float(name, "input", x);
      check_float(name, "weight", w);
      MG_CHECK(x.dim() == 2, "linear: input must be 2-D (N, in_features), got shape " << shape_str(x.shape()));
      MG_CHECK(w.dim() == 2, "linear: weight must be 2-D (out_features, in_features), got shape "
                                 << shape_str(w.shape()));
      MG_CHECK(x.size(1) == w.size(1), "linear: input has " << x.size(1) << " features, weight expects "
                                           << w.size(1) << " (input shape " << shape_str(x.shape())
                                           << ", weight shape " << shape_str(w.shape()) << ")");
      if (b.defined()) {
        check_float(name, "bias", b);
        MG_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "linear: bias shape " << shape_str(b.shape())
                                                             << ", expected [" << w.size(0) << "]");
      }
      Tensor y = Tensor::empty({x.size(0), w.size(0)}, like(x));
      MG_DISPATCH(x.device(), linear_forward, y, x, w, b);
      save({x, w});
      return y;
    }
    case OpKind::conv2d: {
      const Tensor &x = in[0], &w = in[1], &b = in[2];
      check_float(name, "input", x);
      check_float(name, "weight", w);
      MG_CHECK(x.dim() == 4, "conv2d: input must be 4-D (N, C, H, W), got shape " << shape_str(x.shape()));
      MG_CHECK(w.dim() == 4, "conv2d: weight must be 4-D (O, C, KH, KW), got shape " << shape_str(w.shape()));
      MG_CHECK(x.size(1) == w.size(1), "conv2d: input has " << x.size(1) << " channels, weight expects "
                                           << w.size(1) << " (input shape " << shape_str(x.shape())
                                           << ", weight shape " << shape_str(w.shape()) << ")");
      MG_CHECK(a.stride_h >= 1 && a.pad_h >= 0, "conv2d: stride must be >= 1 and padding >= 0, got stride "
                                                     << a.stride_h << ", padding " << a.pad_h);
      if (b.defined()) {
        check_float(name, "bias", b);
        MG_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "conv2d: bias shape " << shape_str(b.shape())
                                                             << ", expected [" << w.size(0) << "]");
      }
      int64_t oh = pool_out(x.size(2), static_cast<int>(w.size(2)), a.stride_h, a.pad_h);
      int64_t ow = pool_out(x.size(3), static_cast<int>(w.size(3)), a.stride_h, a.pad_h);
      MG_CHECK(oh >= 1 && ow >= 1, "conv2d: input " << shape_str(x.shape()) << " is smaller than kernel "
                                       << w.size(2) << "x" << w.size(3) << " with padding " << a.pad_h);
      Tensor y = Tensor::empty({x.size(0), w.size(0), oh, ow}, like(x));
      MG_DISPATCH(x.device(), conv2d_forward, y, x, w, b, a.stride_h, a.pad_h);
      save({x, w});
      return y;
    }
    case OpKind::relu: {
      check_float(name, "input", in[0]);
      Tensor y = Tensor::empty(in[0].shape(), like(in[0]));
      MG_DISPATCH(y.device(), relu_forward, y, in[0]);
      // The values only: saving y itself would make y -> grad_fn -> saved y a reference cycle,
      // and a graph dropped without backward would never be freed.
      save({y.detach()});
      return y;
    }
    case OpKind::max_pool2d: {
      const Tensor& x = in[0];
      check_float(name, "input", x);
      MG_CHECK(x.dim() == 4, "max_pool2d: input must be 4-D (N, C, H, W), got shape " << shape_str(x.shape()));
      MG_CHECK(a.kernel_h >= 1 && a.stride_h >= 1 && a.pad_h >= 0 && 2 * a.pad_h <= a.kernel_h,
               "max_pool2d: need kernel >= 1, stride >= 1, 0 <= padding <= kernel/2; got kernel "
                   << a.kernel_h << ", stride " << a.stride_h << ", padding " << a.pad_h);
      int64_t oh = pool_out(x.size(2), a.kernel_h, a.stride_h, a.pad_h);
      int64_t ow = pool_out(x.size(3), a.kernel_h, a.stride_h, a.pad_h);
      MG_CHECK(oh >= 1 && ow >= 1, "max_pool2d: input " << shape_str(x.shape()) << " is smaller than kernel "
                                       << a.kernel_h);
      Tensor y = Tensor::empty({x.size(0), x.size(1), oh, ow}, like(x));
      Tensor idx = Tensor::empty(y.shape(), TensorOptions{DType::i64, x.device()});
      MG_DISPATCH(x.device(), max_pool2d_forward, y, idx, x, a.kernel_h, a.stride_h, a.pad_h);
      save({idx});
      return y;
    }
    case OpKind::adaptive_avg_pool2d: {
      const Tensor& x = in[0];
      check_float(name, "input", x);
      MG_CHECK(x.dim() == 4, "adaptive_avg_pool2d: input must be 4-D (N, C, H, W), got shape "
                                 << shape_str(x.shape()));
      MG_CHECK(a.out_h >= 1 && a.out_w >= 1, "adaptive_avg_pool2d: output size must be positive, got "
                                                 << a.out_h << "x" << a.out_w);
      Tensor y = Tensor::empty({x.size(0), x.size(1), a.out_h, a.out_w}, like(x));
      MG_DISPATCH(x.device(), adaptive_avg_pool2d_forward, y, x);
      return y;  // backward needs only the input's shape, kept on the node
    }
    case OpKind::reshape: {
      // A view: same storage, new shape. Backward reshapes the gradient back.
      Tensor y = in[0].detach();
      y.impl().shape = a.shape;
      return y;
    }
    case OpKind::dropout: {
      check_float(name, "input", in[0]);
      MG_CHECK(a.scalar >= 0.0f && a.scalar < 1.0f, "dropout: p must be in [0, 1), got " << a.scalar);
      Tensor y = Tensor::empty(in[0].shape(), like(in[0]));
      MG_DISPATCH(y.device(), dropout_forward, y, in[0], a.scalar, a.seed, a.offset);
      return y;  // the mask is regenerated from (seed, offset): nothing saved
    }
    case OpKind::cross_entropy: {
      const Tensor &logits = in[0], &target = in[1];
      check_float(name, "logits", logits);
      MG_CHECK(logits.dim() == 2, "cross_entropy: logits must be 2-D (N, C), got shape "
                                      << shape_str(logits.shape()));
      MG_CHECK(target.defined() && target.dtype() == DType::i64,
               "cross_entropy: target must be int64 class indices, got "
                   << (target.defined() ? dtype_name(target.dtype()) : "undefined"));
      MG_CHECK(target.dim() == 1 && target.size(0) == logits.size(0),
               "cross_entropy: target shape " << shape_str(target.shape()) << ", expected ["
                                             << logits.size(0) << "] for logits "
                                             << shape_str(logits.shape()));
      MG_CHECK(logits.size(0) > 0, "cross_entropy: empty batch");
      Tensor loss = Tensor::empty({}, like(logits));
      Tensor probs = Tensor::empty(logits.shape(), like(logits));
      MG_DISPATCH(logits.device(), cross_entropy_forward, loss, probs, logits, target, a.reduction);
      save({probs, target});
      return loss;
    }
    case OpKind::add: {
      check_float(name, "a", in[0]);
      check_float(name, "b", in[1]);
      MG_CHECK(in[0].shape() == in[1].shape(), "add: shapes differ: " << shape_str(in[0].shape())
                                                    << " and " << shape_str(in[1].shape()));
      Tensor y = Tensor::empty(in[0].shape(), like(in[0]));
      MG_DISPATCH(y.device(), add_forward, y, in[0], in[1]);
      return y;
    }
    case OpKind::scale: {
      check_float(name, "input", in[0]);
      Tensor y = Tensor::empty(in[0].shape(), like(in[0]));
      MG_DISPATCH(y.device(), scale_forward, y, in[0], a.scalar);
      return y;
    }
    case OpKind::checkpoint:
      MG_FAIL("checkpoint nodes are created by mg::checkpoint, not by apply");
  }
  MG_FAIL("unknown op " << static_cast<int>(op));
}

}  // namespace

Tensor apply(OpKind op, const OpAttrs& attrs, std::vector<Tensor> inputs) {
  bool needs_grad = false;
  for (const Tensor& t : inputs) needs_grad |= t.defined() && t.requires_grad();
  const bool record = needs_grad && GradMode::enabled();
  std::vector<Tensor> saved;
  Tensor out = forward(op, attrs, inputs, record ? &saved : nullptr);
  if (!record) return out;

  auto node = std::make_shared<Node>();
  node->op = op;
  node->attrs = attrs;
  node->seq = next_node_seq();
  node->saved = std::move(saved);
  node->out_shape = out.shape();
  node->out_dtype = out.dtype();
  node->out_device = out.device();
  // Inputs without history are kept when a gradient goes to them, and inside a checkpoint
  // segment, whose replay re-runs the op on them (Note [checkpoint replay]).
  const bool keep_all = checkpoint_recording();
  node->inputs.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    NodeInput& ni = node->inputs[i];
    if (!t.defined()) continue;
    ni.requires_grad = t.requires_grad();
    ni.shape = t.shape();
    ni.fn = t.grad_fn();
    if (!ni.fn && (ni.requires_grad || keep_all)) ni.leaf = t;
  }
  out.impl().requires_grad = true;
  out.impl().grad_fn = std::move(node);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  return apply(OpKind::linear, {}, {x, w, b});
}

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, int stride, int padding) {
  OpAttrs a;
  a.stride_h = a.stride_w = stride;
  a.pad_h = a.pad_w = padding;
  return apply(OpKind::conv2d, a, {x, w, b});
}

Tensor relu(const Tensor& x) { return apply(OpKind::relu, {}, {x}); }

Tensor max_pool2d(const Tensor& x, int kernel, int stride, int padding) {
  OpAttrs a;
  a.kernel_h = a.kernel_w = kernel;
  a.stride_h = a.stride_w = stride == 0 ? kernel : stride;
  a.pad_h = a.pad_w = padding;
  return apply(OpKind::max_pool2d, a, {x});
}

Tensor adaptive_avg_pool2d(const Tensor& x, int out_h, int out_w) {
  OpAttrs a;
  a.out_h = out_h;
  a.out_w = out_w;
  return apply(OpKind::adaptive_avg_pool2d, a, {x});
}

Tensor dropout(const Tensor& x, float p, Generator* gen) {
  if (p == 0.0f) return x;
  Generator& g = gen ? *gen : default_generator();
  OpAttrs a;
  a.scalar = p;
  a.seed = g.seed();
  a.offset = g.advance(static_cast<uint64_t>(x.numel()));
  return apply(OpKind::dropout, a, {x});
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction) {
  OpAttrs a;
  a.reduction = reduction;
  return apply(OpKind::cross_entropy, a, {logits, target});
}

Tensor add(const Tensor& a, const Tensor& b) { return apply(OpKind::add, {}, {a, b}); }

Tensor scale(const Tensor& x, float s) {
  OpAttrs a;
  a.scalar = s;
  return apply(OpKind::scale, a, {x});
}

}  // namespace mg
