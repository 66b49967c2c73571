// Element-wise arithmetic.   all tensors: any shape, equal shapes
//   add:    y = a + b;   da = dy, db = dy
//   mul:    y = a * b;   da = dy * b, db = dy * a   (saves a and b)
//   scale:  y = s * x;   dx = s * dy
#include "kernels/elementwise.h"
#include "ops/op.h"

namespace mg {

namespace {

Tensor add_fwd(const OpAttrs&, const std::vector<Tensor>& in, std::vector<Tensor>*) {
  check_float_or_half("add", "a", in[0]);
  check_float_or_half("add", "b", in[1]);
  MG_CHECK(in[0].shape() == in[1].shape(), "add: shapes differ: " << shape_str(in[0].shape())
                                                << " and " << shape_str(in[1].shape()));
  Tensor y = Tensor::empty(in[0].shape(), TensorOptions{half_out(in), in[0].device()});
  MG_DISPATCH(y.device(), add_forward, y, in[0], in[1]);
  return y;
}

// Both inputs get dy itself (the engine copies before accumulating into a leaf).
void add_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  if (wants(n, 0)) grads[0] = gy;
  if (wants(n, 1)) grads[1] = gy;
}

std::vector<OpCase> add_cases() {
  return {{{{.shape = {3, 5, 7}}, {.shape = {3, 5, 7}}}, {}},
          {{{.shape = {3, 1007}}, {.shape = {3, 1007}}}, {}}};  // large
}

const OpDef kAdd{"add", OpKind::elementwise, add_fwd, add_bwd, flops_per_output, add_cases, rows_apart,
                 OpPrecision::follow, /*half_kernels*/ true, CudaHalf::one_dtype};
MG_REGISTER_OP(kAdd);

Tensor mul_fwd(const OpAttrs&, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  check_float_or_half("mul", "a", in[0]);
  check_float_or_half("mul", "b", in[1]);
  MG_CHECK(in[0].shape() == in[1].shape(), "mul: shapes differ: " << shape_str(in[0].shape())
                                                << " and " << shape_str(in[1].shape()));
  Tensor y = Tensor::empty(in[0].shape(), TensorOptions{half_out(in), in[0].device()});
  MG_DISPATCH(y.device(), mul_forward, y, in[0], in[1]);
  save(saved, {in[0], in[1]});
  return y;
}

void mul_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  const Device d = gy.device();
  if (wants(n, 0)) {
    grads[0] = empty_like_input(n, 0, d);
    MG_DISPATCH(d, mul_forward, grads[0], gy, n.saved[1]);
  }
  if (wants(n, 1)) {
    grads[1] = empty_like_input(n, 1, d);
    MG_DISPATCH(d, mul_forward, grads[1], gy, n.saved[0]);
  }
}

std::vector<OpCase> mul_cases() {
  return {{{{.shape = {3, 5, 7}}, {.shape = {3, 5, 7}}}, {}},
          {{{.shape = {2, 9}}, {.shape = {2, 9}, .grad = false}}, {}},
          {{{.shape = {3, 1007}}, {.shape = {3, 1007}}}, {}}};  // large
}

const OpDef kMul{"mul", OpKind::elementwise, mul_fwd, mul_bwd, flops_per_output, mul_cases, rows_apart,
                 OpPrecision::follow, /*half_kernels*/ true, CudaHalf::one_dtype};
MG_REGISTER_OP(kMul);

Tensor scale_fwd(const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>*) {
  check_float_or_half("scale", "input", in[0]);
  Tensor y = Tensor::empty(in[0].shape(), TensorOptions{half_out(in), in[0].device()});
  MG_DISPATCH(y.device(), scale_forward, y, in[0], a.scalar);
  return y;
}

void scale_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  Tensor dx = elementwise_grad(n, 0, gy);  // gy itself when nothing else holds it
  MG_DISPATCH(gy.device(), scale_forward, dx, gy, n.attrs.scalar);
  grads[0] = std::move(dx);
}

std::vector<OpCase> scale_cases() {
  OpAttrs a;
  a.scalar = -2.5f;
  return {{{{.shape = {2, 9}}}, a}, {{{.shape = {3, 1007}}}, a}};  // the second: large
}

const OpDef kScale{"scale", OpKind::elementwise, scale_fwd, scale_bwd, flops_per_output, scale_cases, rows_apart,
                   OpPrecision::follow, /*half_kernels*/ true, CudaHalf::one_dtype};
MG_REGISTER_OP(kScale);

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return apply(kAdd, {}, {a, b}); }

Tensor mul(const Tensor& a, const Tensor& b) { return apply(kMul, {}, {a, b}); }

Tensor scale(const Tensor& x, float s) {
  OpAttrs a;
  a.scalar = s;
  return apply(kScale, a, {x});
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator*(const Tensor& a, float s) { return scale(a, s); }
Tensor operator*(float s, const Tensor& a) { return scale(a, s); }

}  // namespace mg
