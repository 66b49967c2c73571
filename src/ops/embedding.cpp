// embedding: idx (any shape, int64 in [0, V)), weight (V, C)  ->  (idx's shape..., C), the rows
// of weight named by idx: torch.nn.functional.embedding(idx, weight). The gradient goes to the
// weight only, summed per row in position order (kernels/embedding.h). On the CPU the table may be
// float32 (autocast keeps it so) or bf16/f16 and the output bf16/f16 (half_kernels): rows are
// copied or rounded, and the gradient is summed in float32 into its buffer.
#include "kernels/embedding.h"
#include "ops/op.h"
#include "ops/param_grads.h"

namespace mg {

namespace {

Tensor embedding_fwd(const OpAttrs&, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  const Tensor &idx = in[0], &w = in[1];
  MG_CHECK(idx.defined() && idx.dtype() == DType::i64,
           "embedding: indices must be int64, got " << (idx.defined() ? dtype_name(idx.dtype()) : "undefined"));
  MG_CHECK(!idx.requires_grad(), "embedding: indices get no gradient");
  check_float_or_half("embedding", "weight", w);
  MG_CHECK(w.dim() == 2, "embedding: weight must be (V, C), got shape " << shape_str(w.shape()));
  Shape out = idx.shape();
  out.push_back(w.size(1));
  Tensor y = Tensor::empty(out, TensorOptions{half_out(in, OpPrecision::fp32), w.device()});
  MG_DISPATCH(w.device(), embedding_forward, y, idx, w);
  save(saved, {idx});
  return y;
}

void embedding_bwd(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>& accum) {
  if (!wants(n, 1)) return;
  const bool accumulate = accum[1].defined();
  Tensor dw = accumulate ? accum[1] : (grads[1] = empty_like_input(n, 1, gy.device()));
  MG_DISPATCH(gy.device(), embedding_backward, dw, gy, n.saved[0], accumulate);
}

std::vector<OpCase> embedding_cases() {
  return {{{{.kind = TestInput::index, .shape = {2, 5}, .classes = 4}, {.shape = {4, 3}}}, {}},
          {{{.kind = TestInput::index, .shape = {3, 337}, .classes = 51}, {.shape = {51, 61}}}, {}}};  // large
}

const OpDef kEmbedding{"embedding", OpKind::lookup, embedding_fwd, embedding_bwd, no_flops, embedding_cases,
                       rows_apart, OpPrecision::fp32, /*half_kernels*/ true,
                       CudaHalf::any_dtypes};
MG_REGISTER_OP(kEmbedding);

}  // namespace

Tensor embedding(const Tensor& idx, const Tensor& weight) { return apply(kEmbedding, {}, {idx, weight}); }

}  // namespace mg
