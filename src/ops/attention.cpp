// causal_self_attention: qkv (B, T, 3C) packed as [q | k | v] (GPT-2's c_attn output), H heads
// (attrs.heads, C divisible by H)  ->  (B, T, C), each head's softmax(q k^T / sqrt(C/H)) with
// position t seeing positions <= t, times v (kernels/attention.h). Keeps qkv and one log-sum-exp
// per row, not the T x T attention matrix: backward recomputes it. With dropout on the
// probabilities (attrs.scalar = p > 0, the mask drawn as dropout's: seed, offset, sample_stride)
// backward redraws the mask. qkv and y may stay bf16 or f16: on the CPU each head is widened in
// turn (half_kernels); on CUDA (cuda_half) cuDNN's fused attention takes them where it can, and
// where it ran, backward reads y too, so the node keeps it (the next op, c_proj's linear, keeps the
// same storage anyway). lse stays float32.
#include <algorithm>

#include "kernels/attention.h"
#include "ops/op.h"

namespace mg {

namespace {

AttentionDropout drop_of(const OpAttrs& a) { return {a.scalar, a.seed, a.offset, a.sample_stride}; }

Tensor attention_fwd(const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  const Tensor& qkv = in[0];
  check_float_or_half("causal_self_attention", "qkv", qkv);
  MG_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0,
           "causal_self_attention: qkv must be (B, T, 3C), got shape " << shape_str(qkv.shape()));
  const int64_t c = qkv.size(2) / 3;
  MG_CHECK(a.scalar >= 0.0f && a.scalar < 1.0f, "causal_self_attention: dropout p must be in [0, 1), got " << a.scalar);
  MG_CHECK(a.heads >= 1 && c % a.heads == 0,
           "causal_self_attention: " << a.heads << " heads do not divide the width C = " << c << " (qkv "
                                     << shape_str(qkv.shape()) << ")");
  Tensor y = Tensor::empty({qkv.size(0), qkv.size(1), c}, TensorOptions{half_out(in), qkv.device()});
  Tensor lse = Tensor::empty({qkv.size(0), a.heads, qkv.size(1)}, like(qkv));
  const bool wants_y = MG_DISPATCH(qkv.device(), attention_forward, y, lse, qkv, a.heads, drop_of(a));
  if (wants_y) save(saved, {qkv, lse, y.detach()});  // a handle of its own: the output's will point at this node
  else save(saved, {qkv, lse});
  return y;
}

void attention_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  grads[0] = empty_like_input(n, 0, gy.device());
  const Tensor y = n.saved.size() > 2 ? n.saved[2] : Tensor();
  MG_DISPATCH(gy.device(), attention_backward, grads[0], gy, n.saved[0], y, n.saved[1], n.attrs.heads,
              drop_of(n.attrs));
}

// q k^T and p v, causal: about half of 2 B H T^2 D each.
double attention_flops(const Node& n) {
  const Shape& s = n.inputs[0].shape;
  return 2.0 * static_cast<double>(s[0]) * static_cast<double>(s[1]) * static_cast<double>(s[1]) *
         static_cast<double>(s[2] / 3);
}

std::vector<OpCase> attention_cases() {
  OpAttrs two, one, dropped;
  two.heads = 2;
  one.heads = 1;
  dropped.heads = 2;  // dropout 0.3 on the probabilities, an offset off Philox's 4-blocks
  dropped.scalar = 0.3f;
  dropped.seed = 9;
  dropped.offset = 5;
  OpAttrs three;
  three.heads = 3;
  return {{{{.shape = {2, 5, 12}}}, two}, {{{.shape = {1, 3, 6}}}, one}, {{{.shape = {2, 6, 12}}}, dropped},
          {{{.shape = {3, 129, 45}}}, three}};  // large
}

// A tile starting `first` rows later starts that many samples later in the mask's counters.
OpAttrs attention_tile(const Node& n, int64_t, int64_t first, int64_t) {
  OpAttrs a = n.attrs;
  const uint64_t t = static_cast<uint64_t>(n.out_shape.at(1));
  a.offset += static_cast<uint64_t>(first) * (a.sample_stride != 0 ? a.sample_stride : static_cast<uint64_t>(a.heads) * t * t);
  return a;
}

const OpDef kAttention{"causal_self_attention", OpKind::attention, attention_fwd, attention_bwd, attention_flops,
                       attention_cases, attention_tile, OpPrecision::low, /*half_kernels*/ true,
                       CudaHalf::one_dtype};
MG_REGISTER_OP(kAttention);

}  // namespace

Tensor causal_self_attention(const Tensor& qkv, int heads, float dropout_p, Generator* gen) {
  OpAttrs a;
  a.heads = heads;
  if (dropout_p != 0.0f) {
    MG_CHECK(dropout_p > 0.0f && dropout_p < 1.0f, "causal_self_attention: dropout p must be in [0, 1), got " << dropout_p);
    MG_CHECK(qkv.dim() == 3, "causal_self_attention: qkv must be (B, T, 3C), got shape " << shape_str(qkv.shape()));
    a.scalar = dropout_p;
    const uint64_t t = static_cast<uint64_t>(qkv.size(1));
    draw_dropout_counters(a, "causal_self_attention", qkv, static_cast<uint64_t>(std::max(heads, 1)) * t * t, gen);
  }
  return apply(kAttention, a, {qkv});
}

}  // namespace mg
