// matmul: a (..., M, K) @ b (..., K, N) -> (..., M, N), the leading (batch) dimensions equal in
// both, or none (kernels/matmul.h). A user's own attention is matmul, softmax, matmul;
// causal_self_attention is the fused one.
#include "kernels/matmul.h"
#include "ops/op.h"

namespace mg {

namespace {

MatmulDims matmul_dims(const Shape& a, const Shape& b) {
  const int64_t ra = static_cast<int64_t>(a.size()), rb = static_cast<int64_t>(b.size());
  MG_CHECK(ra >= 2 && ra == rb && std::equal(a.begin(), a.end() - 2, b.begin()) && a[ra - 1] == b[rb - 2],
           "matmul: expected a (..., M, K) and b (..., K, N) with the same leading dimensions, got a "
               << shape_str(a) << " and b " << shape_str(b));
  int64_t batch = 1;
  for (int64_t i = 0; i + 2 < ra; ++i) batch *= a[static_cast<size_t>(i)];
  return {batch, a[ra - 2], a[ra - 1], b[rb - 1]};
}

Tensor matmul_fwd(const OpAttrs&, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  check_float_or_half("matmul", "a", in[0]);
  check_float_or_half("matmul", "b", in[1]);
  const MatmulDims d = matmul_dims(in[0].shape(), in[1].shape());
  Shape out = in[0].shape();
  out.back() = d.n;
  Tensor y = Tensor::empty(out, TensorOptions{half_out(in), in[0].device()});
  if (d.k == 0) return y.zero_();
  MG_DISPATCH(y.device(), matmul_forward, y, in[0], in[1], d);
  save(saved, {in[0], in[1]});
  return y;
}

void matmul_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  const Device dev = gy.device();
  const MatmulDims d = matmul_dims(n.inputs[0].shape, n.inputs[1].shape);
  Tensor da = wants(n, 0) ? (grads[0] = empty_like_input(n, 0, dev)) : Tensor();
  Tensor db = wants(n, 1) ? (grads[1] = empty_like_input(n, 1, dev)) : Tensor();
  if (d.k == 0) return;  // nothing saved, nothing to fill
  if (d.m == 0 || d.n == 0) {  // empty products: zero gradients
    if (da.defined()) da.zero_();
    if (db.defined()) db.zero_();
    return;
  }
  MG_DISPATCH(dev, matmul_backward, da, db, gy, n.saved[0], n.saved[1], d);
}

double matmul_flops(const Node& n) {
  const MatmulDims d = matmul_dims(n.inputs[0].shape, n.inputs[1].shape);
  return 2.0 * static_cast<double>(d.batch) * static_cast<double>(d.m) * static_cast<double>(d.k) *
         static_cast<double>(d.n);
}

std::vector<OpCase> matmul_cases() {
  return {{{{.shape = {3, 4}}, {.shape = {4, 5}}}, {}},
          {{{.shape = {2, 3, 4}}, {.shape = {2, 4, 2}}}, {}},
          {{{.shape = {2, 2, 1, 3}}, {.shape = {2, 2, 3, 4}}}, {}},
          {{{.shape = {2, 5, 3}, .grad = false}, {.shape = {2, 3, 2}}}, {}},
          {{{.shape = {3, 45, 67}}, {.shape = {3, 67, 23}}}, {}}};  // large
}

// Tiles (Note [tiled segments]) would cut the batch of products, but a 2-D product mixes rows with
// a shared b: not tiled.
const OpDef kMatmul{"matmul", OpKind::contraction, matmul_fwd, matmul_bwd, matmul_flops, matmul_cases, nullptr,
                    OpPrecision::low, /*half_kernels*/ true, CudaHalf::one_dtype};
MG_REGISTER_OP(kMatmul);

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) { return apply(kMatmul, {}, {a, b}); }

}  // namespace mg
