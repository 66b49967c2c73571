// Pooling over H and W.   x: (N, C, H, W), or (N, H, W, C) channels last (Note [channels last] in
// src/ops/conv2d.cpp; attrs.channels_last)
//   max_pool2d:          y = max over each window (padding never wins); dx[argmax] += dy
//   adaptive_avg_pool2d: y = mean over PyTorch's adaptive windows; each input element gets
//                        dy / window size from every window containing it
#include "kernels/cpu/half_rows.h"
#include "kernels/pooling.h"
#include "ops/op.h"

namespace mg {

namespace {

// body(first image, its chunk of x widened to float32) over the batch, in chunks sized by the
// float32 copies of x and of `out` (kernels/cpu/half_rows.h).
template <class Body> void each_chunk(const Tensor& x, const Tensor& out, Body&& body) {
  const int64_t n = x.size(0), per_image = n == 0 ? 0 : 4 * (x.numel() + 2 * out.numel()) / n;
  const int64_t chunk = cpu::half_chunk_rows(n, per_image);
  for (int64_t n0 = 0; n0 < n; n0 += chunk) body(n0, cpu::widen_rows(x, n0, std::min(chunk, n - n0)));
}

// x's (N, C, H, W) as its layout places them, and the shape of an output of oh x ow planes.
struct Image {
  int64_t n, c, h, w;
  bool last;
  Shape with(int64_t rows, int64_t oh, int64_t ow) const { return last ? Shape{rows, oh, ow, c} : Shape{rows, c, oh, ow}; }
};
Image image(const char* op, const Tensor& x, bool last) {
  MG_CHECK(x.dim() == 4, op << ": input must be 4-D " << (last ? "(N, H, W, C) (channels last)" : "(N, C, H, W)")
                            << ", got shape " << shape_str(x.shape()));
  return last ? Image{x.size(0), x.size(3), x.size(1), x.size(2), true} : Image{x.size(0), x.size(1), x.size(2), x.size(3), false};
}
Tensor max_pool2d_fwd(const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  const Tensor& x = in[0];
  check_float_or_half("max_pool2d", "input", x);
  const Image im = image("max_pool2d", x, a.channels_last);
  MG_CHECK(a.kernel_h >= 1 && a.stride_h >= 1 && a.pad_h >= 0 && 2 * a.pad_h <= a.kernel_h,
           "max_pool2d: need kernel >= 1, stride >= 1, 0 <= padding <= kernel/2; got kernel "
               << a.kernel_h << ", stride " << a.stride_h << ", padding " << a.pad_h);
  int64_t oh = window_count(im.h, a.kernel_h, a.stride_h, a.pad_h);
  int64_t ow = window_count(im.w, a.kernel_h, a.stride_h, a.pad_h);
  MG_CHECK(oh >= 1 && ow >= 1, "max_pool2d: input " << shape_str(x.shape()) << " is smaller than kernel "
                                   << a.kernel_h);
  if (cpu::is_half(x.dtype()) && x.device().is_cpu()) {
    // bf16/f16 on the CPU (OpDef::half_kernels): the float32 kernels on chunks of images widened in
    // turn. What backward keeps is the input (a ReLU before the pool keeps it anyway), not int64
    // argmaxes four times its bytes: backward finds them again, the same ones.
    Tensor y = Tensor::empty(im.with(im.n, oh, ow), TensorOptions{x.dtype(), x.device()});
    each_chunk(x, y, [&](int64_t n0, const Tensor& x32) {
      Tensor y32 = Tensor::empty(im.with(x32.size(0), oh, ow));
      Tensor idx = Tensor::empty(y32.shape(), TensorOptions{DType::i64});
      max_pool2d_forward<Cpu>(y32, idx, x32, a.kernel_h, a.stride_h, a.pad_h, im.last);
      cpu::store_rows(y, n0, y32);
    });
    save(saved, {x});
    return y;
  }
  // float32, or bf16/f16 on CUDA (OpDef::cuda_half): the argmaxes are kept.
  Tensor y = Tensor::empty(im.with(im.n, oh, ow), TensorOptions{x.dtype(), x.device()});
  Tensor idx = Tensor::empty(y.shape(), TensorOptions{DType::i64, x.device()});
  MG_DISPATCH(x.device(), max_pool2d_forward, y, idx, x, a.kernel_h, a.stride_h, a.pad_h, im.last);
  save(saved, {idx});  // the argmax of each window, not the values
  return y;
}

void max_pool2d_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  grads[0] = empty_like_input(n, 0, gy.device());
  const OpAttrs& a = n.attrs;
  if (n.saved[0].dtype() != DType::i64) {  // the half input (see forward): the argmaxes again, by chunk
    const Tensor& x = n.saved[0];
    each_chunk(x, gy, [&](int64_t n0, const Tensor& x32) {
      const int64_t rows = x32.size(0);
      Tensor y32 = Tensor::empty({rows, gy.size(1), gy.size(2), gy.size(3)});
      Tensor idx = Tensor::empty(y32.shape(), TensorOptions{DType::i64});
      max_pool2d_forward<Cpu>(y32, idx, x32, a.kernel_h, a.stride_h, a.pad_h, a.channels_last);
      y32 = Tensor();
      const Tensor dy32 = cpu::widen_rows(gy, n0, rows);
      Tensor dx32 = Tensor::empty(x32.shape());
      max_pool2d_backward<Cpu>(dx32, dy32, idx, a.kernel_h, a.stride_h, a.pad_h, a.channels_last);
      cpu::store_rows(grads[0], n0, dx32);
    });
    return;
  }
  MG_DISPATCH(gy.device(), max_pool2d_backward, grads[0], gy, n.saved[0], a.kernel_h, a.stride_h, a.pad_h,
              a.channels_last);
}

double max_pool2d_flops(const Node& n) { return out_numel(n) * n.attrs.kernel_h * n.attrs.kernel_w; }

std::vector<OpCase> max_pool2d_cases() {
  OpAttrs k2, k3s2p1;
  k2.kernel_h = k2.kernel_w = 2;
  k2.stride_h = k2.stride_w = 2;
  k3s2p1.kernel_h = k3s2p1.kernel_w = 3;
  k3s2p1.stride_h = k3s2p1.stride_w = 2;
  k3s2p1.pad_h = k3s2p1.pad_w = 1;
  OpAttrs k3s1p1, k2s1;  // overlapping windows: an input can be the max of several
  k3s1p1.kernel_h = k3s1p1.kernel_w = 3;
  k3s1p1.stride_h = k3s1p1.stride_w = 1;
  k3s1p1.pad_h = k3s1p1.pad_w = 1;
  k2s1.kernel_h = k2s1.kernel_w = 2;
  k2s1.stride_h = k2s1.stride_w = 1;
  OpAttrs last_k2 = k2, last_k3s2p1 = k3s2p1, last_k3s1p1 = k3s1p1;  // channels last
  last_k2.channels_last = last_k3s2p1.channels_last = last_k3s1p1.channels_last = true;
  return {{{{.shape = {2, 3, 5, 7}}}, k2},           {{{.shape = {1, 2, 7, 6}}}, k3s2p1},
          {{{.shape = {2, 3, 7, 5}}}, k3s1p1},       {{{.shape = {2, 3, 7, 5}}}, k2s1},
          {{{.shape = {3, 3, 31, 33}}}, k3s2p1},     {{{.shape = {2, 5, 7, 3}}}, last_k2},
          {{{.shape = {2, 7, 5, 3}}}, last_k3s1p1},  {{{.shape = {3, 31, 33, 3}}}, last_k3s2p1}};
}

const OpDef kMaxPool2d{"max_pool2d", OpKind::pool, max_pool2d_fwd, max_pool2d_bwd, max_pool2d_flops,
                       max_pool2d_cases, rows_apart, OpPrecision::follow, /*half_kernels*/ true,
                       CudaHalf::one_dtype};
MG_REGISTER_OP(kMaxPool2d);

Tensor adaptive_avg_pool2d_fwd(const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>*) {
  const Tensor& x = in[0];
  check_float_or_half("adaptive_avg_pool2d", "input", x);
  const Image im = image("adaptive_avg_pool2d", x, a.channels_last);
  MG_CHECK(a.out_h >= 1 && a.out_w >= 1, "adaptive_avg_pool2d: output size must be positive, got "
                                             << a.out_h << "x" << a.out_w);
  Tensor y = Tensor::empty(im.with(im.n, a.out_h, a.out_w), TensorOptions{half_out(in), x.device()});
  MG_DISPATCH(x.device(), adaptive_avg_pool2d_forward, y, x, im.last);
  return y;  // backward needs only the input's shape, kept on the node
}

void adaptive_avg_pool2d_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  grads[0] = empty_like_input(n, 0, gy.device());
  MG_DISPATCH(gy.device(), adaptive_avg_pool2d_backward, grads[0], gy, n.attrs.channels_last);
}

double adaptive_avg_pool2d_flops(const Node& n) { return static_cast<double>(shape_numel(n.inputs[0].shape)); }

std::vector<OpCase> adaptive_avg_pool2d_cases() {
  OpAttrs to3x2, to1x1;
  to3x2.out_h = 3;
  to3x2.out_w = 2;
  to1x1.out_h = to1x1.out_w = 1;
  OpAttrs to5x4;
  to5x4.out_h = 5;
  to5x4.out_w = 4;
  OpAttrs to7x7, to4x5;  // upsampling, and windows of uneven sizes
  to7x7.out_h = to7x7.out_w = 7;
  to4x5.out_h = 4;
  to4x5.out_w = 5;
  OpAttrs last_to3x2 = to3x2, last_to7x7 = to7x7, last_to5x4 = to5x4;  // channels last
  last_to3x2.channels_last = last_to7x7.channels_last = last_to5x4.channels_last = true;
  return {{{{.shape = {2, 3, 7, 5}}}, to3x2}, {{{.shape = {1, 2, 3, 3}}}, to1x1},       {{{.shape = {2, 3, 5, 5}}}, to7x7},
          {{{.shape = {1, 2, 6, 9}}}, to4x5}, {{{.shape = {3, 3, 31, 33}}}, to5x4},     {{{.shape = {2, 7, 5, 3}}}, last_to3x2},
          {{{.shape = {2, 5, 5, 3}}}, last_to7x7}, {{{.shape = {3, 31, 33, 3}}}, last_to5x4}};
}

const OpDef kAdaptiveAvgPool2d{"adaptive_avg_pool2d", OpKind::pool, adaptive_avg_pool2d_fwd,
                               adaptive_avg_pool2d_bwd, adaptive_avg_pool2d_flops,
                               adaptive_avg_pool2d_cases, rows_apart, OpPrecision::follow, /*half_kernels*/ true,
                               CudaHalf::one_dtype};
MG_REGISTER_OP(kAdaptiveAvgPool2d);

}  // namespace

Tensor max_pool2d(const Tensor& x, int kernel, int stride, int padding, Layout layout) {
  OpAttrs a;
  a.channels_last = layout == Layout::nhwc;
  a.kernel_h = a.kernel_w = kernel;
  a.stride_h = a.stride_w = stride == 0 ? kernel : stride;
  a.pad_h = a.pad_w = padding;
  return apply(kMaxPool2d, a, {x});
}

Tensor adaptive_avg_pool2d(const Tensor& x, int out_h, int out_w, Layout layout) {
  OpAttrs a;
  a.channels_last = layout == Layout::nhwc;
  a.out_h = out_h;
  a.out_w = out_w;
  return apply(kAdaptiveAvgPool2d, a, {x});
}

}  // namespace mg
