// dropout: y = x * mask / (1 - p);  dx = dy * mask / (1 - p). The mask is a pure function of
// (seed, offset) (Philox, minigrad/core/rng.h), regenerated in backward: nothing is saved, and replay
// under checkpointing draws the same mask (Note [checkpoint replay]). Inside a sample window the
// (seed, offset) come from the samples' positions in the window (Note [dropout by sample]).
#include <minigrad/core/rng.h>

#include "kernels/dropout.h"
#include "ops/op.h"

namespace mg {

namespace {

int64_t per_sample(const Tensor& x) { return x.dim() >= 1 && x.size(0) > 0 ? x.numel() / x.size(0) : 0; }

Tensor dropout_fwd(const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>*) {
  check_float_or_half("dropout", "input", in[0]);
  MG_CHECK(a.scalar >= 0.0f && a.scalar < 1.0f, "dropout: p must be in [0, 1), got " << a.scalar);
  Tensor y = Tensor::empty(in[0].shape(), TensorOptions{half_out(in), in[0].device()});
  MG_DISPATCH(y.device(), dropout_forward, y, in[0], a.scalar, a.seed, a.offset, per_sample(in[0]), a.sample_stride);
  return y;
}

void dropout_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  Tensor dx = elementwise_grad(n, 0, gy);  // gy itself when nothing else holds it
  MG_DISPATCH(gy.device(), dropout_backward, dx, gy, n.attrs.scalar, n.attrs.seed, n.attrs.offset, per_sample(gy),
              n.attrs.sample_stride);
  grads[0] = std::move(dx);
}

std::vector<OpCase> dropout_cases() {
  OpAttrs half, odd;
  half.scalar = 0.5f;
  half.seed = 7;
  odd.scalar = 0.3f;
  odd.seed = 11;
  odd.offset = 3;  // not a multiple of 4: the per-element path of the 4-wide kernels
  OpAttrs spread = odd;  // samples spread over the counters (a data-parallel rank's micro-batch)
  spread.sample_stride = 3 * 35 + 2;
  return {{{{.shape = {4, 33}}}, half}, {{{.shape = {3, 5, 7}}}, odd}, {{{.shape = {3, 5, 7}}}, spread},
          {{{.shape = {3, 1007}}}, odd}};  // large
}

// A tile starting `first` rows later starts that many samples later in the counters.
OpAttrs dropout_tile(const Node& n, int64_t recorded, int64_t first, int64_t) {
  const uint64_t f = static_cast<uint64_t>(shape_numel(n.out_shape) / recorded);
  OpAttrs a = n.attrs;
  a.offset += static_cast<uint64_t>(first) * (a.sample_stride != 0 ? a.sample_stride : f);
  return a;
}

const OpDef kDropout{"dropout", OpKind::elementwise, dropout_fwd, dropout_bwd, flops_per_output, dropout_cases,
                     dropout_tile, OpPrecision::follow, /*half_kernels*/ true, CudaHalf::one_dtype};
MG_REGISTER_OP(kDropout);

}  // namespace

void draw_dropout_counters(OpAttrs& a, const char* op, const Tensor& x, uint64_t per_sample_draws, Generator* gen) {
  Generator& g = gen ? *gen : default_generator();
  if (SampleWindow* w = current_sample_window()) {  // Note [dropout by sample]
    MG_CHECK(x.dim() >= 1, op << ": inside a sample window the input needs a batch dimension, got shape "
                              << shape_str(x.shape()));
    const uint64_t f = per_sample_draws;
    a.seed = sample_window_seed(g.seed(), w->key, w->calls++);
    a.offset = static_cast<uint64_t>(w->first_sample * w->sample_stride + w->sample_lane) * f;
    if (w->sample_stride > 1) a.sample_stride = static_cast<uint64_t>(w->sample_stride) * f;
  } else {
    a.seed = g.seed();
    uint64_t count = x.dim() >= 1 ? static_cast<uint64_t>(x.size(0)) * per_sample_draws : per_sample_draws;
    if (const TileRecording* t = tile_recording()) {  // the whole batch's counters (Note [tiled segments])
      count = count / static_cast<uint64_t>(t->rows) * static_cast<uint64_t>(t->batch_rows);
    }
    a.offset = g.advance(count);
  }
}

Tensor dropout(const Tensor& x, float p, Generator* gen) {
  if (p == 0.0f) return x;
  OpAttrs a;
  a.scalar = p;
  draw_dropout_counters(a, "dropout", x, x.dim() >= 1 ? static_cast<uint64_t>(per_sample(x)) : static_cast<uint64_t>(x.numel()), gen);
  return apply(kDropout, a, {x});
}

}  // namespace mg
