// cross_entropy: loss = reduce_n (logsumexp(logits[n]) - logits[n, target[n]]) over the rows whose
// target is not attrs.ignore_index, reduce = mean (over those rows) or sum;
// dlogits = dloss * (softmax - onehot(target)) (/ count for mean, 0 on ignored rows); no gradient
// for target.   logits: (N, C) float32, target: (N) int64 in [0, C) or ignore_index  ->  scalar
#include "kernels/cross_entropy.h"
#include "ops/op.h"

namespace mg {

namespace {

Tensor cross_entropy_fwd(const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  const Tensor &logits = in[0], &target = in[1];
  check_float_or_half("cross_entropy", "logits", logits);
  MG_CHECK(logits.dim() == 2, "cross_entropy: logits must be 2-D (N, C), got shape "
                                  << shape_str(logits.shape()));
  MG_CHECK(target.defined() && target.dtype() == DType::i64,
           "cross_entropy: target must be int64 class indices, got "
               << (target.defined() ? dtype_name(target.dtype()) : "undefined"));
  MG_CHECK(target.dim() == 1 && target.size(0) == logits.size(0),
           "cross_entropy: target shape " << shape_str(target.shape()) << ", expected ["
                                         << logits.size(0) << "] for logits "
                                         << shape_str(logits.shape()));
  MG_CHECK(logits.size(0) > 0, "cross_entropy: empty batch");
  // bf16/f16 logits (half_kernels, CPU and CUDA): no float32 probabilities are kept; backward makes them again
  // from the logits, which it keeps instead (half the bytes, the same bits).
  const bool half = logits.dtype() != DType::f32;
  Tensor loss = Tensor::empty({}, like(logits));
  Tensor probs = half ? Tensor() : Tensor::empty(logits.shape(), like(logits));
  Tensor count = Tensor::empty({1}, like(logits));
  MG_DISPATCH(logits.device(), cross_entropy_forward, loss, probs, count, logits, target, a.reduction, a.ignore_index);
  save(saved, {half ? logits : probs, target, count});
  return loss;
}

// Note [loss gradient in place]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The logits' gradient takes the place of what forward kept (the float32 probabilities, or the
// bf16/f16 logits themselves) when nothing else holds it and no second backward will read it: the
// kernels read a row before they write it. So a language model's largest tensor is not held twice
// in the loss's backward (llm.c's fused classifier does the same with its logits). A caller that
// keeps the logits, or retain_graph, gets a gradient of its own.
void cross_entropy_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>&) {
  const Tensor& kept = n.saved[0];
  const DType dtype = n.half_kernels ? n.inputs[0].dtype : DType::f32;
  const bool in_place = !backward_retains_graph() && kept.impl_ptr().use_count() == 1 &&
                        kept.impl().storage.use_count() == 1 && kept.impl().offset == 0 && kept.dtype() == dtype &&
                        kept.shape() == n.inputs[0].shape;
  grads[0] = in_place ? kept.detach() : empty_like_input(n, 0, gy.device());
  MG_DISPATCH(gy.device(), cross_entropy_backward, grads[0], gy, n.saved[0], n.saved[2], n.saved[1], n.attrs.reduction,
              n.attrs.ignore_index);
}

double cross_entropy_flops(const Node& n) { return static_cast<double>(shape_numel(n.inputs[0].shape)); }

std::vector<OpCase> cross_entropy_cases() {
  OpAttrs mean, sum;
  sum.reduction = Reduction::sum;
  return {
      {{{.shape = {5, 7}}, {.kind = TestInput::index, .shape = {5}, .classes = 7, .grad = false}}, mean},
      {{{.shape = {3, 40}}, {.kind = TestInput::index, .shape = {3}, .classes = 40, .grad = false}}, sum},
      {{{.shape = {37, 101}}, {.kind = TestInput::index, .shape = {37}, .classes = 101, .grad = false}}, mean},  // large
  };
}

const OpDef kCrossEntropy{"cross_entropy", OpKind::loss, cross_entropy_fwd, cross_entropy_bwd,
                          cross_entropy_flops, cross_entropy_cases, /*tile: sums over samples*/ nullptr,
                          OpPrecision::follow, /*half_kernels*/ true, CudaHalf::one_dtype};
MG_REGISTER_OP(kCrossEntropy);

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction, int64_t ignore_index) {
  OpAttrs a;
  a.reduction = reduction;
  a.ignore_index = ignore_index;
  return apply(kCrossEntropy, a, {logits, target});
}

}  // namespace mg
