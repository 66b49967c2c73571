// batch_norm: x (N, C, ...), or (N, ..., C) channels last (attrs.channels_last; Note [channels last]
// in src/ops/conv2d.cpp), weight and bias (C) or undefined, running_mean and running_var (C).
// With batch statistics (training) it normalises by the mean and biased variance of x per channel,
// computed here; otherwise by the given (running) ones, inputs 3 and 4, which get no gradient.
//   y = (x - mean) / sqrt(var + eps) * weight + bias            (eps: attrs.scalar)
// The running statistics' update is the module's (nn::BatchNorm2d), outside the tape, so a
// checkpoint segment's replay, which re-runs this op, does not repeat it. On the CPU x may stay
// bf16 or f16 (half_kernels), the weight and bias float32 or low: the statistics stay float32.
#include "kernels/batch_norm.h"
#include "ops/op.h"
#include "ops/param_grads.h"

namespace mg {

namespace {

Tensor batch_norm_fwd(const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  const Tensor &x = in[0], &w = in[1], &b = in[2];
  check_float_or_half("batch_norm", "input", x);
  MG_CHECK(x.dim() >= 2, "batch_norm: input must be " << (a.channels_last ? "(N, ..., C) (channels last)" : "(N, C, ...)")
                                                     << ", got shape " << shape_str(x.shape()));
  const int64_t c = x.size(a.channels_last ? x.dim() - 1 : 1);
  MG_CHECK(a.scalar >= 0.0f, "batch_norm: eps must be >= 0, got " << a.scalar);
  auto check_channels = [&](const char* what, const Tensor& t) {
    if (!t.defined()) return;
    check_float_or_half("batch_norm", what, t);
    MG_CHECK(t.dim() == 1 && t.size(0) == c, "batch_norm: " << what << " has shape " << shape_str(t.shape())
                                                             << ", expected [" << c << "] for input "
                                                             << shape_str(x.shape()));
  };
  check_channels("weight", w);
  check_channels("bias", b);
  Tensor mean, var;
  if (a.batch_stats) {
    MG_CHECK(x.numel() / std::max<int64_t>(c, 1) > 1 || x.numel() == 0,
             "batch_norm: batch statistics need more than one value per channel, got input " << shape_str(x.shape()));
    mean = Tensor::empty({c}, like(x));
    var = Tensor::empty({c}, like(x));
    MG_DISPATCH(x.device(), batch_norm_stats, mean, var, x, a.channels_last);
  } else {
    MG_CHECK(in[3].defined() && in[4].defined(), "batch_norm: without batch statistics it needs running_mean and running_var");
    check_channels("running_mean", in[3]);
    check_channels("running_var", in[4]);
    MG_CHECK(!in[3].requires_grad() && !in[4].requires_grad(), "batch_norm: the running statistics get no gradient; detach them");
    // The values of this forward, whatever the module does to its buffers later; float32, as the
    // kernels read them.
    mean = in[3].dtype() == DType::f32 ? in[3].clone() : in[3].to(DType::f32);
    var = in[4].dtype() == DType::f32 ? in[4].clone() : in[4].to(DType::f32);
  }
  Tensor y = Tensor::empty(x.shape(), TensorOptions{half_out(in, OpPrecision::fp32), x.device()});
  MG_DISPATCH(x.device(), batch_norm_forward, y, x, w, b, mean, var, a.scalar, a.channels_last, a.relu);
  save(saved, {x, w, mean, var});
  if (a.relu) save(saved, {y.detach()});  // Note [fused relu] in src/ops/conv2d.cpp: its values only
  return y;
}

void batch_norm_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>& accum) {
  const Device d = gy.device();
  const Tensor &x = n.saved[0], &w = n.saved[1], &mean = n.saved[2], &var = n.saved[3];
  if (n.attrs.relu) gy = activation_grad(n, std::move(gy), 4, FusedActivation::relu);  // Note [fused relu]
  Tensor dx = wants(n, 0) ? (grads[0] = empty_like_input(n, 0, d)) : Tensor();
  ParamGrads p = param_grads(n, grads, accum, d);
  MG_DISPATCH(d, batch_norm_backward, dx, p.dw, p.db, gy, x, w, mean, var, n.attrs.scalar, n.attrs.batch_stats,
              p.accumulate, n.attrs.channels_last);
}

double batch_norm_flops(const Node& n) { return 8.0 * out_numel(n); }

std::vector<OpCase> batch_norm_cases() {
  OpAttrs train;
  train.batch_stats = true;
  train.scalar = 1e-5f;
  OpAttrs last = train;
  last.channels_last = true;
  OpAttrs relu = train;  // Note [fused relu]: a small case whose outputs lie farther than the step from zero
  relu.relu = true;
  const TestInput none{.kind = TestInput::none, .shape = {}};
  return {
      {{{.shape = {3, 5, 2, 4}}, {.shape = {4}}, {.shape = {4}}, none, none}, last},
      {{{.shape = {7, 9, 11, 5}}, {.shape = {5}}, {.shape = {5}}, none, none}, last},  // large
      {{{.shape = {4, 3}}, {.shape = {3}}, {.shape = {3}}, none, none}, relu},
      {{{.shape = {3, 4, 5, 2}}, {.shape = {4}}, {.shape = {4}}, none, none}, train},
      {{{.shape = {6, 3}}, {.shape = {3}}, none, none, none}, train},
      {{{.shape = {7, 5, 9, 11}}, {.shape = {5}}, {.shape = {5}}, none, none}, train},  // large
  };
}

// No tiles: with batch statistics every sample's output depends on the whole batch.
const OpDef kBatchNorm{"batch_norm", OpKind::normalization, batch_norm_fwd, batch_norm_bwd, batch_norm_flops,
                       batch_norm_cases, /*tile*/ nullptr, OpPrecision::fp32, /*half_kernels*/ true,
                       CudaHalf::any_dtypes};
MG_REGISTER_OP(kBatchNorm);

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool batch_stats, float eps, BatchStats* stats, Layout layout, bool relu) {
  OpAttrs a;
  a.batch_stats = batch_stats;
  a.channels_last = layout == Layout::nhwc;
  a.relu = relu;
  a.scalar = eps;
  Tensor y = apply(kBatchNorm, a, {x, weight, bias, running_mean, running_var});
  if (stats && batch_stats) {
    // The statistics the op used: its node keeps them for backward. Without a node (nothing
    // recorded) they are computed once more.
    if (y.grad_fn() && y.grad_fn()->op == &kBatchNorm && y.grad_fn()->saved.size() >= 4) {
      stats->mean = y.grad_fn()->saved[2];
      stats->var = y.grad_fn()->saved[3];
    } else {
      const int64_t c = x.size(a.channels_last ? x.dim() - 1 : 1);
      stats->mean = Tensor::empty({c}, like(x));
      stats->var = Tensor::empty({c}, like(x));
      MG_DISPATCH(x.device(), batch_norm_stats, stats->mean, stats->var, x, a.channels_last);
    }
  }
  return y;
}

}  // namespace mg
