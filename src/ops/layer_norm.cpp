// layer_norm: x (..., C) normalised over its last dimension, weight and bias (C) or undefined:
//   y = (x - mean) / sqrt(var + eps) * weight + bias      (biased variance; eps: attrs.scalar)
// as torch.nn.functional.layer_norm(x, (C,), weight, bias, eps). Rows are samples' positions,
// so it runs in tiles. On the CPU x may stay bf16 or f16 (half_kernels) with a float32 weight and
// bias (autocast keeps them so): mean and rstd stay float32, the weight's and bias's gradients go
// into float32 buffers.
#include <minigrad/core/profiler.h>

#include "kernels/layer_norm.h"
#include "ops/op.h"
#include "ops/param_grads.h"

namespace mg {

namespace {

Tensor layer_norm_fwd(const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  const Tensor &x = in[0], &w = in[1], &b = in[2];
  check_float_or_half("layer_norm", "input", x);
  MG_CHECK(x.dim() >= 1 && x.size(x.dim() - 1) > 0, "layer_norm: input must have a last dimension > 0, got shape "
                                                         << shape_str(x.shape()));
  const int64_t c = x.size(x.dim() - 1);
  MG_CHECK(a.scalar >= 0.0f, "layer_norm: eps must be >= 0, got " << a.scalar);
  for (auto [what, t] : {std::pair{"weight", &w}, std::pair{"bias", &b}}) {
    if (!t->defined()) continue;
    check_float_or_half("layer_norm", what, *t);
    MG_CHECK(t->dim() == 1 && t->size(0) == c, "layer_norm: " << what << " has shape " << shape_str(t->shape())
                                                              << ", expected [" << c << "] for input "
                                                              << shape_str(x.shape()));
  }
  Tensor y = Tensor::empty(x.shape(), TensorOptions{half_out(in, OpPrecision::fp32), x.device()});
  Tensor mean = Tensor::empty({x.numel() / c}, like(x)), rstd = Tensor::empty({x.numel() / c}, like(x));
  MG_DISPATCH(x.device(), layer_norm_forward, y, mean, rstd, x, w, b, a.scalar);
  save(saved, {x, w, mean, rstd});
  return y;
}

void layer_norm_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>& accum) {
  const Device d = gy.device();
  // dx goes onto the gradient already waiting for x, where backward hands one over (a residual
  // stream's: Note [adding into pending gradients]).
  const bool add_dx = wants(n, 0) && accum[0].defined();
  Tensor dx = !wants(n, 0) ? Tensor() : add_dx ? accum[0] : (grads[0] = empty_like_input(n, 0, d));
  ParamGrads p = param_grads(n, grads, accum, d);
  MG_DISPATCH(d, layer_norm_backward, dx, p.dw, p.db, gy, n.saved[0], n.saved[1], n.saved[2], n.saved[3],
              p.accumulate, add_dx);
}

double layer_norm_flops(const Node& n) { return 8.0 * out_numel(n); }

std::vector<OpCase> layer_norm_cases() {
  OpAttrs a;
  a.scalar = 1e-5f;
  const TestInput none{.kind = TestInput::none, .shape = {}};
  // No rows: the weight's and bias's gradients are 0 (on CUDA they were left unwritten until
  // 2026-11-24).
  return {{{{.shape = {2, 3, 8}}, {.shape = {8}}, {.shape = {8}}}, a},
          {{{.shape = {5, 70}}, none, none}, a},
          {{{.shape = {0, 8}}, {.shape = {8}}, {.shape = {8}}}, a},
          {{{.shape = {3, 1007}}, {.shape = {1007}}, {.shape = {1007}}}, a}};  // large
}

const OpDef kLayerNorm{"layer_norm", OpKind::normalization, layer_norm_fwd, layer_norm_bwd, layer_norm_flops,
                       layer_norm_cases, rows_apart, OpPrecision::fp32, /*half_kernels*/ true,
                       CudaHalf::any_dtypes, /*adds_into_pending*/ 0b001};
MG_REGISTER_OP(kLayerNorm);

// Whether a, b, w and bias are what add and layer_norm take without an error (else they run
// apart, to give it).
bool fusable(const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& bias, float eps) {
  auto floating = [](const Tensor& t) {
    return t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16;
  };
  if (!a.defined() || !b.defined() || !floating(a) || !floating(b) || a.shape() != b.shape() || a.dim() < 1 ||
      a.device() != b.device() || !(eps >= 0.0f))
    return false;
  const int64_t c = a.size(a.dim() - 1);
  for (const Tensor* t : {&w, &bias}) {
    if (t->defined() && (!floating(*t) || t->dim() != 1 || t->size(0) != c || t->device() != a.device())) return false;
  }
  return c > 0;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  OpAttrs a;
  a.scalar = eps;
  return apply(kLayerNorm, a, {x, weight, bias});
}

// Note [fused residual layer_norm]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A transformer block's residual add and the layer_norm after it: s = a + b, y = layer_norm(s).
// On CUDA one kernel makes both (llm.c's fused_residual_forward): it reads a and b and writes s
// and y, where add then layer_norm read s once more: one pass over (B T, C) saved of the pair's
// five, and a launch. The tape records the two nodes add and layer_norm record, so backward,
// replay (which runs the two kernels: the same bits), tiles and the planner see the unfused graph.
// Backward's half of the fusion is layer_norm adding its input's gradient into the residual
// stream's (Note [adding into pending gradients] in src/core/autograd.cpp). Where apply() would
// convert an input first (on CUDA, a and b of two dtypes), or an argument is wrong, the two ops
// run apart (and give their errors).
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& a, const Tensor& b, const Tensor& weight, const Tensor& bias,
                                         float eps) {
  static const OpDef& add_op = *find_op("add");
  auto apart = [&] {
    Tensor s = add(a, b);
    Tensor y = layer_norm(s, weight, bias, eps);
    return std::pair{std::move(s), std::move(y)};
  };
  DType s_dtype = DType::f32, y_dtype = DType::f32;
  bool half_s = false, half_y = false;
  if (!fusable(a, b, weight, bias, eps) || !takes_as_is(add_op, {a, b}, &s_dtype, &half_s)) return apart();
  const Device d = a.device();
  Tensor s = Tensor::empty(a.shape(), TensorOptions{s_dtype, d});
  if (!takes_as_is(kLayerNorm, {s, weight, bias}, &y_dtype, &half_y)) return apart();
  const int64_t rows = a.numel() / a.size(a.dim() - 1);
  Tensor y = Tensor::empty(a.shape(), TensorOptions{y_dtype, d});
  Tensor mean = Tensor::empty({rows}, like(a)), rstd = Tensor::empty({rows}, like(a));
  {
    const profiler::Scope timed("add+layer_norm", d, forward_pass());
    MG_DISPATCH(d, add_layer_norm_forward, s, y, mean, rstd, a, b, weight, bias, eps);
  }
  if (!GradMode::enabled()) return {s, y};
  if (a.requires_grad() || b.requires_grad()) s = record_node(add_op, {}, {a, b}, s, {}, half_s);
  if (s.requires_grad() || (weight.defined() && weight.requires_grad()) || (bias.defined() && bias.requires_grad())) {
    OpAttrs attrs;
    attrs.scalar = eps;
    y = record_node(kLayerNorm, attrs, {s, weight, bias}, y, {s, weight, mean, rstd}, half_y);
  }
  return {s, y};
}

}  // namespace mg
