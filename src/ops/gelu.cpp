// gelu (tanh form, as GPT-2): y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).   x, y: any shape
#include "kernels/gelu.h"
#include "ops/op.h"

namespace mg {

namespace {

Tensor gelu_fwd(const OpAttrs&, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  check_float_or_half("gelu", "input", in[0]);
  Tensor y = Tensor::empty(in[0].shape(), TensorOptions{half_out(in), in[0].device()});
  MG_DISPATCH(y.device(), gelu_forward, y, in[0]);
  save(saved, {in[0]});
  return y;
}

void gelu_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  Tensor dx = elementwise_grad(n, 0, gy);  // gy itself when nothing else holds it
  MG_DISPATCH(gy.device(), gelu_backward, dx, gy, n.saved[0]);
  grads[0] = std::move(dx);
}

double gelu_flops(const Node& n) { return 10.0 * out_numel(n); }

std::vector<OpCase> gelu_cases() {
  return {{{{.shape = {3, 5, 7}}}, {}}, {{{.shape = {3, 1007}}}, {}}};  // the second: large
}

const OpDef kGelu{"gelu", OpKind::elementwise, gelu_fwd, gelu_bwd, gelu_flops, gelu_cases, rows_apart,
                  OpPrecision::follow, /*half_kernels*/ true, CudaHalf::one_dtype};
MG_REGISTER_OP(kGelu);

}  // namespace

Tensor gelu(const Tensor& x) { return apply(kGelu, {}, {x}); }

}  // namespace mg
