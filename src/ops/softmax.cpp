// softmax over the last dimension (kernels/softmax.h).   x, y: any shape with at least one dimension
#include "kernels/softmax.h"
#include "ops/op.h"

namespace mg {

namespace {

Tensor softmax_fwd(const OpAttrs&, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  const Tensor& x = in[0];
  check_float_or_half("softmax", "input", x);
  MG_CHECK(x.dim() >= 1, "softmax: expected at least one dimension, got a scalar");
  Tensor y = Tensor::empty(x.shape(), TensorOptions{half_out(in, OpPrecision::fp32), x.device()});
  const int64_t cols = x.size(-1), rows = cols > 0 ? x.numel() / cols : 0;
  if (rows > 0) MG_DISPATCH(y.device(), softmax_forward, y, x, rows, cols);
  save(saved, {y.detach()});  // a handle of its own: the output's will point at this node
  return y;
}

void softmax_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  grads[0] = empty_like_input(n, 0, gy.device());
  const int64_t cols = n.out_shape.back(), rows = cols > 0 ? shape_numel(n.out_shape) / cols : 0;
  if (rows > 0) MG_DISPATCH(gy.device(), softmax_backward, grads[0], gy, n.saved[0], rows, cols);
}

double softmax_flops(const Node& n) { return 5.0 * out_numel(n); }

std::vector<OpCase> softmax_cases() {
  return {{{{.shape = {3, 5, 7}}}, {}}, {{{.shape = {4, 1}}}, {}}, {{{.shape = {3, 1007}}}, {}}};  // the last: large
}

// Rows are independent: a tile of samples is rows of its own (when the last dimension is not the batch's).
const OpDef kSoftmax{"softmax", OpKind::normalization, softmax_fwd, softmax_bwd, softmax_flops, softmax_cases,
                     rows_apart, OpPrecision::fp32, /*half_kernels*/ true,
                       CudaHalf::any_dtypes};
MG_REGISTER_OP(kSoftmax);

}  // namespace

Tensor softmax(const Tensor& x) { return apply(kSoftmax, {}, {x}); }

}  // namespace mg
