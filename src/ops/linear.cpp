// linear: y = x w^T + b.   x: (N, K), w: (M, K), b: (M) or undefined  ->  y: (N, M)
#include "kernels/linear.h"
#include "ops/op.h"
#include "ops/param_grads.h"

namespace mg {

namespace {

Tensor linear_fwd(const OpAttrs&, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
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
  MG_DISPATCH(x.device(), linear_forward, y, x, w, b);
  save(saved, {x, w});
  return y;
}

// dx = dy w,  dw = dy^T x,  db = sum_n dy
void linear_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>& accum) {
  const Device d = gy.device();
  const Tensor &x = n.saved[0], &w = n.saved[1];
  Tensor dx = wants(n, 0) ? (grads[0] = empty_like_input(n, 0, d)) : Tensor();
  ParamGrads p = param_grads(n, grads, accum, d);
  MG_DISPATCH(d, linear_backward, dx, p.dw, p.db, gy, x, w, p.accumulate);
}

double linear_flops(const Node& n) { return 2.0 * out_numel(n) * static_cast<double>(n.inputs[0].shape.at(1)); }

std::vector<OpCase> linear_cases() {
  return {
      {{{.shape = {5, 7}}, {.shape = {3, 7}}, {.shape = {3}}}, {}},
      {{{.shape = {1, 13}}, {.shape = {6, 13}}, {.kind = TestInput::none, .shape = {}}}, {}},
      {{{.shape = {67, 129}}, {.shape = {33, 129}}, {.shape = {33}}}, {}},  // large
  };
}

const OpDef kLinear{"linear", OpKind::contraction, linear_fwd, linear_bwd, linear_flops, linear_cases,
                    /*tile: its SGEMM rounds differently for another number of rows (Note [tiled segments])*/ nullptr,
                    OpPrecision::low, /*half_kernels*/ true, CudaHalf::one_dtype};
MG_REGISTER_OP(kLinear);

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) { return apply(kLinear, {}, {x, w, b}); }

}  // namespace mg
