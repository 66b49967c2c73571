// linear: y = x w^T + b.   x: (N, K), w: (M, K), b: (M) or undefined  ->  y: (N, M)
//
// Note [fused gelu]
// ~~~~~~~~~~~~~~~~~
// linear_gelu (attrs.gelu) is gelu(linear(...)) as one op, a GPT's c_fc and its GELU: on CUDA one
// cuBLASLt product whose epilogue (GELU_AUX_BIAS) writes both y = gelu(x w^T + b) and its argument
// pre, so the GELU costs no pass of its own over the (N, 4C) activations. It keeps x, w and pre,
// as linear and gelu together keep them (y, the next layer's input, is kept by that layer).
// Backward takes dy through gelu's derivative at pre (in place when nothing else holds dy), lets
// pre go, and runs linear's backward. The CPU, and CUDA where cuBLASLt does not take the epilogue,
// run linear into pre and gelu into y: on the CPU the unfused ops' bits. GPT-2's MLP uses it with
// GPTConfig::fused_gelu (gpt_train --fused-gelu on).
#include "kernels/gelu.h"
#include "kernels/linear.h"
#include "ops/op.h"
#include "ops/param_grads.h"

namespace mg {

namespace {

Tensor linear_fwd(const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  const Tensor &x = in[0], &w = in[1], &b = in[2];
  check_float_or_half("linear", "input", x);
  check_float_or_half("linear", "weight", w);
  MG_CHECK(x.dim() == 2, "linear: input must be 2-D (N, in_features), got shape " << shape_str(x.shape()));
  MG_CHECK(w.dim() == 2, "linear: weight must be 2-D (out_features, in_features), got shape "
                             << shape_str(w.shape()));
  MG_CHECK(x.size(1) == w.size(1), "linear: input has " << x.size(1) << " features, weight expects "
                                       << w.size(1) << " (input shape " << shape_str(x.shape())
                                       << ", weight shape " << shape_str(w.shape()) << ")");
  if (b.defined()) {
    check_float_or_half("linear", "bias", b);
    MG_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "linear: bias shape " << shape_str(b.shape())
                                                         << ", expected [" << w.size(0) << "]");
  }
  Tensor y = Tensor::empty({x.size(0), w.size(0)}, TensorOptions{half_out(in), x.device()});
  if (a.gelu && stored_dtype() != y.dtype()) {
    // Note [fused gelu] on widened copies of low inputs: pre rounded to the stored dtype, as the
    // unfused linear's output would be, before the GELU.
    Tensor pre = Tensor::empty(y.shape(), TensorOptions{y.dtype(), y.device()});
    MG_DISPATCH(x.device(), linear_forward, pre, x, w, b);
    pre = pre.to(stored_dtype());
    MG_DISPATCH(x.device(), gelu_forward, y, pre.to(DType::f32));
    save(saved, {x, w, pre});
    return y;
  }
  if (a.gelu) {  // Note [fused gelu]
    Tensor pre = Tensor::empty(y.shape(), TensorOptions{y.dtype(), y.device()});
    MG_DISPATCH(x.device(), linear_gelu_forward, y, pre, x, w, b);
    save(saved, {x, w, pre});
    return y;
  }
  MG_DISPATCH(x.device(), linear_forward, y, x, w, b);
  save(saved, {x, w});
  return y;
}

// dx = dy w,  dw = dy^T x,  db = sum_n dy
void linear_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>& accum) {
  const Device d = gy.device();
  const Tensor &x = n.saved[0], &w = n.saved[1];
  if (n.attrs.gelu) gy = activation_grad(n, std::move(gy), 2, FusedActivation::gelu);  // Note [fused gelu]
  Tensor dx = wants(n, 0) ? (grads[0] = empty_like_input(n, 0, d)) : Tensor();
  ParamGrads p = param_grads(n, grads, accum, d);
  MG_DISPATCH(d, linear_backward, dx, p.dw, p.db, gy, x, w, p.accumulate);
}

double linear_flops(const Node& n) {
  return 2.0 * out_numel(n) * static_cast<double>(n.inputs[0].shape.at(1)) + (n.attrs.gelu ? 10.0 * out_numel(n) : 0.0);
}

std::vector<OpCase> linear_cases() {
  OpAttrs gelu;  // Note [fused gelu]
  gelu.gelu = true;
  return {
      {{{.shape = {5, 7}}, {.shape = {3, 7}}, {.shape = {3}}}, {}},
      {{{.shape = {1, 13}}, {.shape = {6, 13}}, {.kind = TestInput::none, .shape = {}}}, {}},
      {{{.shape = {67, 129}}, {.shape = {33, 129}}, {.shape = {33}}}, {}},  // large
      {{{.shape = {5, 7}}, {.shape = {3, 7}}, {.shape = {3}}}, gelu},
      {{{.shape = {3, 11}}, {.shape = {4, 11}}, {.kind = TestInput::none, .shape = {}}}, gelu},
      {{{.shape = {67, 129}}, {.shape = {33, 129}}, {.shape = {33}}}, gelu},  // large
  };
}

const OpDef kLinear{"linear", OpKind::contraction, linear_fwd, linear_bwd, linear_flops, linear_cases,
                    /*tile: its SGEMM rounds differently for another number of rows (Note [tiled segments])*/ nullptr,
                    OpPrecision::low, /*half_kernels*/ true, CudaHalf::one_dtype};
MG_REGISTER_OP(kLinear);

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) { return apply(kLinear, {}, {x, w, b}); }

Tensor linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b) {
  OpAttrs a;
  a.gelu = true;
  return apply(kLinear, a, {x, w, b});
}

}  // namespace mg
