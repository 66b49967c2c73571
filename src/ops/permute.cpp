// permute: x with its dimensions reordered, copied: y.shape[i] = x.shape[dims[i]] (attrs.dims).
// The gradient is dy permuted back (the inverse order). Values move and are never rounded, so,
// like a view, it keeps the dtype it is given (OpKind::rearrange). to_channels_last and
// to_channels_first are the two permutations between (N, C, H, W) and (N, H, W, C).
#include "kernels/permute.h"
#include "ops/op.h"

namespace mg {

namespace {

Shape permuted(const Shape& s, const Shape& dims) {
  Shape out(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) out[i] = s[static_cast<size_t>(dims[i])];
  return out;
}

Shape inverse(const Shape& dims) {
  Shape inv(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inv[static_cast<size_t>(dims[i])] = static_cast<int64_t>(i);
  return inv;
}

Tensor permute_fwd(const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>*) {
  const Tensor& x = in[0];
  const int64_t r = x.dim();
  MG_CHECK(static_cast<int64_t>(a.dims.size()) == r, "permute: dims " << shape_str(a.dims) << " name "
                                                       << a.dims.size() << " dimensions, input " << shape_str(x.shape())
                                                       << " has " << r);
  MG_CHECK(r >= 1 && r <= kMaxPermuteRank, "permute: input of rank " << r << ", expected 1 to " << kMaxPermuteRank);
  std::vector<bool> seen(static_cast<size_t>(r), false);
  for (int64_t d : a.dims) {
    MG_CHECK(d >= 0 && d < r && !seen[static_cast<size_t>(d)],
             "permute: dims " << shape_str(a.dims) << " must hold each of 0 .. " << r - 1 << " once");
    seen[static_cast<size_t>(d)] = true;
  }
  Tensor y = Tensor::empty(permuted(x.shape(), a.dims), TensorOptions{x.dtype(), x.device()});
  MG_DISPATCH(x.device(), permute_forward, y, x, a.dims);
  return y;  // backward needs only the order
}

void permute_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  const Shape inv = inverse(n.attrs.dims);
  Tensor dx = Tensor::empty(n.inputs[0].shape, TensorOptions{gy.dtype(), gy.device()});
  MG_DISPATCH(gy.device(), permute_forward, dx, gy, inv);
  grads[0] = std::move(dx);
}

std::vector<OpCase> permute_cases() {
  OpAttrs last, first, mixed, swap;
  last.dims = {0, 2, 3, 1};
  first.dims = {0, 3, 1, 2};
  mixed.dims = {2, 0, 1};
  swap.dims = {1, 0};
  return {{{{.shape = {2, 3, 5, 7}}}, last},
          {{{.shape = {2, 5, 7, 3}}}, first},
          {{{.shape = {3, 4, 5}}}, mixed},
          {{{.shape = {5, 7}}}, swap},
          {{{.shape = {3, 31, 33, 5}}}, first}};  // large
}

// A tile keeps the batch where it is: first.
OpAttrs permute_tile(const Node& n, int64_t, int64_t, int64_t) {
  MG_CHECK(!n.attrs.dims.empty() && n.attrs.dims[0] == 0,
           "checkpoint tiles: permute " << shape_str(n.attrs.dims) << " moves the batch dimension; tiles need it first");
  return n.attrs;
}

const OpDef kPermute{"permute", OpKind::rearrange, permute_fwd, permute_bwd, no_flops, permute_cases, permute_tile,
                     OpPrecision::follow, /*half_kernels*/ true, CudaHalf::any_dtypes};
MG_REGISTER_OP(kPermute);

}  // namespace

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  OpAttrs a;
  a.dims = Shape(dims.begin(), dims.end());
  return apply(kPermute, a, {x});
}

Tensor to_channels_last(const Tensor& x) {
  MG_CHECK(x.dim() == 4, "to_channels_last: expected (N, C, H, W), got shape " << shape_str(x.shape()));
  return permute(x, {0, 2, 3, 1});
}

Tensor to_channels_first(const Tensor& x) {
  MG_CHECK(x.dim() == 4, "to_channels_first: expected (N, H, W, C), got shape " << shape_str(x.shape()));
  return permute(x, {0, 3, 1, 2});
}

}  // namespace mg
