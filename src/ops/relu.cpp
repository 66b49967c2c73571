// relu: y = max(x, 0);  dx = dy * (y > 0).   x, y: any shape
#include "kernels/relu.h"
#include "ops/op.h"

namespace mg {

namespace {

Tensor relu_fwd(const OpAttrs&, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  check_float("relu", "input", in[0]);
  Tensor y = Tensor::empty(in[0].shape(), like(in[0]));
  MG_DISPATCH(y.device(), relu_forward, y, in[0]);
  // The values only: saving y itself would make y -> grad_fn -> saved y a reference cycle,
  // and a graph dropped without backward would never be freed.
  save(saved, {y.detach()});
  return y;
}

// An incoming gradient nothing else holds becomes the input gradient in place: one buffer and one
// pass over memory fewer (the kernel reads and writes each element at the same index).
void relu_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  const bool in_place = sole_owner(gy) && gy.impl().offset == 0 && gy.shape() == n.inputs[0].shape;
  Tensor dx = in_place ? gy : empty_like_input(n, 0, gy.device());
  MG_DISPATCH(gy.device(), relu_backward, dx, gy, n.saved[0]);
  grads[0] = std::move(dx);
}

std::vector<OpCase> relu_cases() { return {{{{.shape = {3, 5, 7}}}, {}}, {{{.shape = {1}}}, {}}}; }

const OpDef kRelu{"relu", OpKind::elementwise, relu_fwd, relu_bwd, flops_per_output, relu_cases, rows_apart};
MG_REGISTER_OP(kRelu);

}  // namespace

Tensor relu(const Tensor& x) { return apply(kRelu, {}, {x}); }

}  // namespace mg
