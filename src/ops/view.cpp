// reshape: a view with a new shape (same storage, no kernel); the gradient is dy viewed with the
// input's shape. Tensor::reshape and Tensor::flatten (include/minigrad/core/tensor.h) are this op.
#include <algorithm>

#include "ops/op.h"

namespace mg {

namespace {

Tensor reshape_fwd(const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>*) {
  Tensor y = in[0].detach();
  y.impl().shape = a.shape;
  return y;
}

void reshape_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  Tensor g = gy.detach();
  g.impl().shape = n.inputs[0].shape;
  grads[0] = g;
}

std::vector<OpCase> reshape_cases() {
  OpAttrs a;
  a.shape = {7, 15};
  OpAttrs large;
  large.shape = {1007, 3};
  return {{{{.shape = {3, 5, 7}}}, a}, {{{.shape = {3, 1007}}}, large}};
}

// A tile's view keeps every dimension but the batch's, which must stay first.
OpAttrs reshape_tile(const Node& n, int64_t recorded, int64_t, int64_t rows) {
  MG_CHECK(!n.attrs.shape.empty() && n.attrs.shape[0] == recorded && !n.inputs[0].shape.empty() &&
               n.inputs[0].shape[0] == recorded,
           "checkpoint tiles: a reshape from " << shape_str(n.inputs[0].shape) << " to " << shape_str(n.attrs.shape)
               << " moves the batch dimension (" << recorded << " rows in the tile recorded); tiles need it first");
  OpAttrs a = n.attrs;
  a.shape[0] = rows;
  return a;
}

const OpDef kReshape{"reshape", OpKind::view, reshape_fwd, reshape_bwd, no_flops, reshape_cases, reshape_tile};
MG_REGISTER_OP(kReshape);

}  // namespace

Tensor Tensor::reshape(const Shape& new_shape) const {
  Shape s = new_shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      MG_CHECK(infer < 0, "reshape: more than one -1 in " << shape_str(new_shape));
      infer = static_cast<int64_t>(i);
    } else {
      MG_CHECK(s[i] >= 0, "reshape: negative size in " << shape_str(new_shape));
      known *= s[i];
    }
  }
  if (infer >= 0) {
    MG_CHECK(known > 0 && numel() % known == 0,
             "reshape: cannot view shape " << shape_str(shape()) << " as " << shape_str(new_shape));
    s[infer] = numel() / known;
  }
  MG_CHECK(shape_numel(s) == numel(), "reshape: cannot view shape " << shape_str(shape()) << " ("
                                          << numel() << " elements) as " << shape_str(new_shape));
  OpAttrs a;
  a.shape = s;
  return apply(kReshape, a, {*this});
}

Tensor Tensor::flatten(int64_t start_dim) const {
  MG_CHECK(start_dim >= 0 && start_dim < std::max<int64_t>(dim(), 1),
           "flatten: start_dim " << start_dim << " out of range for shape " << shape_str(shape()));
  Shape s(shape().begin(), shape().begin() + start_dim);
  s.push_back(-1);
  return reshape(s);
}

}  // namespace mg
