// relu: y = max(x, 0);  dx = dy * (y > 0).   x, y: any shape
#include "kernels/gelu.h"
#include "kernels/relu.h"
#include "ops/op.h"

namespace mg {

namespace {

Tensor relu_fwd(const OpAttrs&, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  check_float_or_half("relu", "input", in[0]);
  Tensor y = Tensor::empty(in[0].shape(), TensorOptions{half_out(in), in[0].device()});
  MG_DISPATCH(y.device(), relu_forward, y, in[0]);
  // The values only: saving y itself would make y -> grad_fn -> saved y a reference cycle,
  // and a graph dropped without backward would never be freed.
  save(saved, {y.detach()});
  return y;
}

void relu_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  if (n.grad_masked_by_relu) {  // Note [relu mask in the consumer]: gy is dx already
    const DType dtype = n.half_kernels ? n.inputs[0].dtype : DType::f32;
    grads[0] = gy.dtype() == dtype ? std::move(gy) : gy.to(dtype);
    return;
  }
  Tensor dx = elementwise_grad(n, 0, gy);  // gy itself when nothing else holds it
  MG_DISPATCH(gy.device(), relu_backward, dx, gy, n.saved[0]);
  grads[0] = std::move(dx);
}

std::vector<OpCase> relu_cases() {
  return {{{{.shape = {3, 5, 7}}}, {}}, {{{.shape = {1}}}, {}}, {{{.shape = {3, 1007}}}, {}}};  // the last: large
}

const OpDef kRelu{"relu", OpKind::elementwise, relu_fwd, relu_bwd, flops_per_output, relu_cases, rows_apart,
                  OpPrecision::follow, /*half_kernels*/ true, CudaHalf::one_dtype};
MG_REGISTER_OP(kRelu);

}  // namespace

Tensor relu(const Tensor& x) { return apply(kRelu, {}, {x}); }

bool op_masks_by_relu(const Node& n) { return n.op != nullptr && (n.op == &kRelu || n.attrs.relu); }

Tensor activation_grad(Node& n, Tensor gy, size_t slot, FusedActivation act) {
  const Device d = gy.device();
  // Note [relu mask in the consumer]: a ReLU's gradient may come masked already.
  const bool masked = act == FusedActivation::relu && n.grad_masked_by_relu;
  Tensor g = masked || (sole_owner(gy) && gy.impl().offset == 0) ? gy : Tensor::empty(gy.shape(), TensorOptions{gy.dtype(), d});
  if (!masked && act == FusedActivation::relu) MG_DISPATCH(d, relu_backward, g, gy, n.saved.at(slot));
  if (act == FusedActivation::gelu) MG_DISPATCH(d, gelu_backward, g, gy, n.saved.at(slot));
  if (g.dtype() != n.out_dtype) g = g.to(n.out_dtype).to(g.dtype());
  if (!backward_retains_graph()) n.saved[slot] = Tensor();
  return g;
}

}  // namespace mg
