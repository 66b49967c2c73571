// pack and unpack: several tensors as one flat tensor and back (Note [segments with several
// outputs]). pack copies its inputs one after another into a 1-D tensor; its gradient is gy's
// pieces viewed with the inputs' shapes. unpack is a view of a piece of a 1-D tensor (offset,
// shape; no copy); its gradient is zeros with gy in that piece. Both are copies or views, so the
// tensor's copy_ is their kernel on either device.
//
// Note [segments with several outputs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A checkpoint node has one output. checkpoint_multi runs fn and packs its outputs into one
// tensor inside the segment, so that the segment's node is the pack (recorded and replayed like
// any op), and hands back unpack views of that one output. Backward of the views meets in the
// packed gradient, which the replayed segment takes like any other. The outputs share the packed
// tensor's storage: it lives while any of them does. Each view's gradient is as large as all the
// outputs together (zeros besides its piece), so k outputs cost k such buffers in backward: meant
// for a few outputs, such as a block's feature map and its skip connection.
#include "ops/op.h"

#include <minigrad/core/checkpoint.h>

namespace mg {

namespace {

// The piece [first, first + numel(shape)) of 1-D t, as a tensor of `shape` sharing t's storage.
Tensor piece_view(const Tensor& t, int64_t first, const Shape& shape) {
  Tensor v = t.detach();
  v.impl().shape = shape;
  v.impl().offset += static_cast<size_t>(first) * dtype_size(t.dtype());
  return v;
}

Tensor pack_fwd(const OpAttrs&, const std::vector<Tensor>& in, std::vector<Tensor>*) {
  MG_CHECK(!in.empty(), "pack: needs at least one tensor");
  int64_t total = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    MG_CHECK(in[i].defined(), "pack: tensor " << i << " is undefined");
    MG_CHECK(is_floating(in[i].dtype()) && in[i].dtype() == in[0].dtype(),
             "pack: every tensor must have the first one's float dtype " << dtype_name(in[0].dtype()) << ", tensor " << i
                                                                      << " is " << dtype_name(in[i].dtype()));
    total += in[i].numel();
  }
  Tensor out = Tensor::empty({total}, TensorOptions{in[0].dtype(), in[0].device()});
  int64_t first = 0;
  for (const Tensor& t : in) {
    piece_view(out, first, t.shape()).copy_(t);
    first += t.numel();
  }
  return out;
}

void pack_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  int64_t first = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (wants(n, i)) grads[i] = piece_view(gy, first, n.inputs[i].shape);
    first += shape_numel(n.inputs[i].shape);
  }
}

// attrs.offset: the piece's first element; attrs.shape: its shape.
Tensor unpack_fwd(const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>*) {
  const int64_t first = static_cast<int64_t>(a.offset), n = shape_numel(a.shape);
  MG_CHECK(in[0].dim() == 1 && first >= 0 && first + n <= in[0].numel(),
           "unpack: elements [" << first << ", " << first + n << ") of a tensor of shape " << shape_str(in[0].shape()));
  return piece_view(in[0], first, a.shape);
}

void unpack_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  Tensor g = Tensor::zeros(n.inputs[0].shape, TensorOptions{gy.dtype(), gy.device()});
  piece_view(g, static_cast<int64_t>(n.attrs.offset), n.attrs.shape).copy_(gy);
  grads[0] = g;
}

std::vector<OpCase> pack_cases() {
  return {{{{.shape = {3, 4}}, {.shape = {5}}, {.shape = {2, 1, 3}}}, {}},
          {{{.shape = {3, 1007}}, {.shape = {1001}}, {.shape = {2, 1, 503}}}, {}}};  // large
}

std::vector<OpCase> unpack_cases() {
  OpAttrs a;
  a.offset = 4;
  a.shape = {2, 3};
  OpAttrs large;
  large.offset = 7;
  large.shape = {3, 1003};
  return {{{{.shape = {11}}}, a}, {{{.shape = {3021}}}, large}};
}

const OpDef kPack{"pack", OpKind::view, pack_fwd, pack_bwd, no_flops, pack_cases, nullptr};
const OpDef kUnpack{"unpack", OpKind::view, unpack_fwd, unpack_bwd, no_flops, unpack_cases, nullptr};
MG_REGISTER_OP(kPack);
MG_REGISTER_OP(kUnpack);

}  // namespace

std::vector<Tensor> checkpoint_multi(const MultiSegmentFn& fn, const std::vector<Tensor>& inputs,
                                     const CheckpointOptions& opts) {
  if (!GradMode::enabled() || checkpoint_recording()) return fn(inputs);  // Note [nested segments]
  MG_CHECK(opts.tile_rows == 0, "checkpoint_multi: a segment with several outputs does not run in tiles (the outputs "
                                "are packed into one tensor without a batch dimension); use tile_rows 0");
  std::vector<Shape> shapes;
  const Tensor packed = checkpoint(
      [&](const std::vector<Tensor>& in) {
        std::vector<Tensor> outs = fn(in);
        MG_CHECK(!outs.empty(), "checkpoint_multi: the segment function returned no tensors");
        shapes.clear();
        for (const Tensor& t : outs) shapes.push_back(t.shape());
        return apply(kPack, {}, std::move(outs));
      },
      inputs);
  std::vector<Tensor> outs;
  int64_t first = 0;
  for (const Shape& s : shapes) {
    OpAttrs a;
    a.offset = static_cast<uint64_t>(first);
    a.shape = s;
    outs.push_back(apply(kUnpack, a, {packed}));
    first += shape_numel(s);
  }
  return outs;
}

}  // namespace mg
