// conv2d: cross-correlation with stride and zero padding (equal in H and W).
//   x: (N, C, H, W), w: (O, C, KH, KW), b: (O) or undefined  ->  y: (N, O, OH, OW)
//   channels last (attrs.channels_last): x (N, H, W, C), w (O, KH, KW, C)  ->  y (N, OH, OW, O)
//
// Note [channels last]
// ~~~~~~~~~~~~~~~~~~~~
// A layout is a property of a layer, not of a tensor: our tensors are dense in the order of their
// shape, so a channels-last activation is simply shaped (N, H, W, C), and conv2d, max_pool2d,
// adaptive_avg_pool2d and batch_norm take Layout::nhwc to read it so (OpAttrs::channels_last,
// which replay and tiles keep). ReLU, dropout and add do not care. A model chooses once
// (nn::make_vgg16 and make_resnet*'s `layout`): its convolutions' weights are then (O, KH, KW, C),
// cuDNN's KRSC, which its tensor-core kernels read directly; the batch comes in channels last (the
// Trainer's input, or to_channels_last); and where a model flattens a feature map into a linear
// layer (VGG's classifier), nn::Flatten takes it back to channels first, so the linear weights
// and the logits are the channels-first model's. The planner and checkpointing see ops and bytes
// as they are: nothing of theirs changes. On the CPU, the kernels run channels first between
// permutes (Note [channels last on the CPU] in src/kernels/cpu/channels_last.h): the same bits.
//
// Note [fused relu]
// ~~~~~~~~~~~~~~~~~
// conv2d_relu, and batch_norm with relu (attrs.relu), are relu(conv2d(...)) and relu(batch_norm(...))
// as one op. On CUDA the convolution is one cuDNN graph (conv_fprop, the bias, RELU_FWD;
// src/kernels/cuda/conv_cudnn.cpp) and batch_norm's forward kernel applies the ReLU as it stores:
// y is written once, where the unfused ops write it again (the ReLU; for the convolution also the
// bias first) and hold the op's output beside the ReLU's for a moment. The op keeps what the pair
// keeps (its inputs, and y for the mask); backward masks dy by y > 0 (in place when nothing else
// holds dy), lets y go, and runs the op's own backward on it. The CPU, and CUDA where cuDNN does
// not take the convolution's graph, run the op and then the ReLU kernel in place: on the CPU the
// unfused ops' bits. nn::fuse_relu makes a model's Conv2d + ReLU and BatchNorm + ReLU pairs (a
// ResNet block's too) into fused layers, keeping every parameter name.
#include "kernels/conv2d.h"
#include "ops/op.h"
#include "ops/param_grads.h"

namespace mg {

namespace {

Tensor conv2d_fwd(const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  const Tensor &x = in[0], &w = in[1], &b = in[2];
  const bool last = a.channels_last;
  check_float_or_half("conv2d", "input", x);
  check_float_or_half("conv2d", "weight", w);
  MG_CHECK(x.dim() == 4, "conv2d: input must be 4-D " << (last ? "(N, H, W, C) (channels last)" : "(N, C, H, W)")
                                                     << ", got shape " << shape_str(x.shape()));
  MG_CHECK(w.dim() == 4, "conv2d: weight must be 4-D " << (last ? "(O, KH, KW, C) (channels last)" : "(O, C, KH, KW)")
                                                      << ", got shape " << shape_str(w.shape()));
  // Dimension i of (N, C, H, W) is dimension at[i] of x, likewise of (O, C, KH, KW) in w.
  const int at[4] = {0, last ? 3 : 1, last ? 1 : 2, last ? 2 : 3};
  MG_CHECK(x.size(at[1]) == w.size(at[1]), "conv2d: input has " << x.size(at[1]) << " channels, weight expects "
                                       << w.size(at[1]) << " (input shape " << shape_str(x.shape())
                                       << ", weight shape " << shape_str(w.shape()) << ", "
                                       << layout_name(last ? Layout::nhwc : Layout::nchw) << ")");
  MG_CHECK(a.stride_h >= 1 && a.pad_h >= 0, "conv2d: stride must be >= 1 and padding >= 0, got stride "
                                                 << a.stride_h << ", padding " << a.pad_h);
  if (b.defined()) {
    check_float_or_half("conv2d", "bias", b);
    MG_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "conv2d: bias shape " << shape_str(b.shape())
                                                         << ", expected [" << w.size(0) << "]");
  }
  const int64_t kh = w.size(at[2]), kw = w.size(at[3]);
  int64_t oh = window_count(x.size(at[2]), static_cast<int>(kh), a.stride_h, a.pad_h);
  int64_t ow = window_count(x.size(at[3]), static_cast<int>(kw), a.stride_h, a.pad_h);
  MG_CHECK(oh >= 1 && ow >= 1, "conv2d: input " << shape_str(x.shape()) << " is smaller than kernel "
                                   << kh << "x" << kw << " with padding " << a.pad_h);
  const Shape ys = last ? Shape{x.size(0), oh, ow, w.size(0)} : Shape{x.size(0), w.size(0), oh, ow};
  Tensor y = Tensor::empty(ys, TensorOptions{half_out(in), x.device()});
  MG_DISPATCH(x.device(), conv2d_forward, y, x, w, b, a.stride_h, a.pad_h, last, a.relu);
  save(saved, {x, w});
  // Note [fused relu]: its values only (y itself would make y -> node -> y a cycle).
  if (a.relu) save(saved, {y.detach()});
  return y;
}

// dx = transposed convolution of dy with w (masked by x > 0 when backward asks);
// dw = correlation of x with dy;  db = sum of dy
void conv2d_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>& accum) {
  const Device d = gy.device();
  const Tensor &x = n.saved[0], &w = n.saved[1];
  if (n.attrs.relu) gy = activation_grad(n, std::move(gy), 2, FusedActivation::relu);  // Note [fused relu]
  Tensor dx = wants(n, 0) ? (grads[0] = empty_like_input(n, 0, d)) : Tensor();
  ParamGrads p = param_grads(n, grads, accum, d);
  // Note [relu mask in the consumer]: x is a ReLU's output, and dx its gradient alone.
  const bool mask_dx = dx.defined() && (n.mask_inputs_by_relu & 1u) != 0;
  MG_DISPATCH(d, conv2d_backward, dx, p.dw, p.db, gy, x, w, n.attrs.stride_h, n.attrs.pad_h, p.accumulate,
              n.attrs.channels_last, mask_dx);
}

double conv2d_flops(const Node& n) {
  const Shape& w = n.inputs[1].shape;
  return 2.0 * out_numel(n) * static_cast<double>(w.at(1) * w.at(2) * w.at(3)) + (n.attrs.relu ? out_numel(n) : 0.0);
}

std::vector<OpCase> conv2d_cases() {
  OpAttrs plain, pad1, stride2, stride2_pad1;
  pad1.pad_h = pad1.pad_w = 1;
  stride2.stride_h = stride2.stride_w = 2;
  stride2_pad1.stride_h = stride2_pad1.stride_w = 2;
  stride2_pad1.pad_h = stride2_pad1.pad_w = 1;
  OpAttrs last_pad1 = pad1, last_stride2_pad1 = stride2_pad1;  // channels last
  last_pad1.channels_last = last_stride2_pad1.channels_last = true;
  OpAttrs relu_stride2 = stride2, relu_last_stride2 = last_stride2_pad1;  // Note [fused relu]
  relu_stride2.relu = relu_last_stride2.relu = true;
  return {
      {{{.shape = {2, 3, 5, 7}}, {.shape = {4, 3, 3, 3}}, {.shape = {4}}}, pad1},
      {{{.shape = {1, 2, 7, 6}}, {.shape = {3, 2, 2, 3}}, {.kind = TestInput::none, .shape = {}}}, stride2},
      {{{.shape = {2, 3, 7, 5}}, {.shape = {4, 3, 3, 3}}, {.shape = {4}}}, plain},
      {{{.shape = {2, 3, 7, 5}}, {.shape = {4, 3, 3, 3}}, {.shape = {4}}}, stride2},
      {{{.shape = {2, 3, 7, 5}}, {.shape = {4, 3, 3, 3}}, {.kind = TestInput::none, .shape = {}}}, stride2_pad1},
      {{{.shape = {2, 3, 7, 5}}, {.shape = {4, 3, 3, 2}}, {.shape = {4}}}, stride2_pad1},
      {{{.shape = {2, 3, 7, 5}}, {.shape = {4, 3, 1, 1}}, {.shape = {4}}}, plain},
      {{{.shape = {3, 3, 31, 33}}, {.shape = {5, 3, 3, 3}}, {.shape = {5}}}, pad1},  // large
      {{{.shape = {2, 5, 7, 3}}, {.shape = {4, 3, 3, 3}}, {.shape = {4}}}, last_pad1},
      {{{.shape = {2, 7, 5, 3}}, {.shape = {4, 3, 2, 3}}, {.kind = TestInput::none, .shape = {}}}, last_stride2_pad1},
      {{{.shape = {3, 31, 33, 3}}, {.shape = {5, 3, 3, 3}}, {.shape = {5}}}, last_pad1},  // large
      // The fused ReLU: small cases whose outputs lie farther than the step from zero (a difference
      // across the kink is no derivative, and a convolution's outputs are sums, not the inputs
      // the harness spaces apart); test_layout checks conv2d_relu against relu(conv2d) bit for bit.
      {{{.shape = {1, 2, 7, 6}}, {.shape = {3, 2, 2, 3}}, {.shape = {3}}}, relu_stride2},
      {{{.shape = {2, 7, 5, 3}}, {.shape = {4, 3, 2, 3}}, {.kind = TestInput::none, .shape = {}}}, relu_last_stride2},
      // At most 4 output pixels an image: products over the batch (Note [small images as products
      // over the batch] in kernels/cpu/conv2d.cpp), 2 x 2 and 2 x 1 under a 3 x 2 kernel. (Last:
      // a case's inputs follow from its index, and the ReLU cases' were chosen away from the kink.)
      {{{.shape = {2, 3, 2, 2}}, {.shape = {4, 3, 3, 3}}, {.shape = {4}}}, pad1},
      {{{.shape = {2, 3, 3, 1}}, {.shape = {4, 3, 3, 2}}, {.kind = TestInput::none, .shape = {}}}, stride2_pad1},
      {{{.shape = {2, 2, 2, 3}}, {.shape = {4, 3, 3, 3}}, {.shape = {4}}}, last_pad1},
  };
}

const OpDef kConv2d{"conv2d", OpKind::contraction, conv2d_fwd, conv2d_bwd, conv2d_flops, conv2d_cases, rows_apart,
                    OpPrecision::low, /*half_kernels*/ true, CudaHalf::one_dtype, /*adds_into_pending*/ 0,
                    /*takes_relu_mask*/ 0b001};
MG_REGISTER_OP(kConv2d);

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, int stride, int padding, Layout layout) {
  OpAttrs a;
  a.channels_last = layout == Layout::nhwc;
  a.stride_h = a.stride_w = stride;
  a.pad_h = a.pad_w = padding;
  return apply(kConv2d, a, {x, w, b});
}

Tensor conv2d_relu(const Tensor& x, const Tensor& w, const Tensor& b, int stride, int padding, Layout layout) {
  OpAttrs a;
  a.channels_last = layout == Layout::nhwc;
  a.relu = true;
  a.stride_h = a.stride_w = stride;
  a.pad_h = a.pad_w = padding;
  return apply(kConv2d, a, {x, w, b});
}

const char* layout_name(Layout layout) { return layout == Layout::nhwc ? "nhwc" : "nchw"; }

}  // namespace mg
