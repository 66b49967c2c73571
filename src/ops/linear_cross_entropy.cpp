// linear_cross_entropy: cross_entropy(linear(x, w), target, sum) without the logits.
//   x: (N, K), w: (V, K), target: (N) int64 in [0, V) or ignore_index  ->  scalar (sum over N)
//   loss = sum_n (logsumexp(x[n] w^T) - x[n] . w[target[n]])       over rows not ignore_index
//   dx   = (softmax(x w^T) - onehot(target)) w dloss,   dw = (softmax(x w^T) - onehot(target))^T x dloss
//
// Note [chunked classifier]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A language model's last linear makes (N, V) logits, its largest tensor (GPT-2 at B 16, T 1024:
// 16,384 x 50,257, 1.5 GiB in bf16), which cross_entropy keeps until backward (Note [loss gradient
// in place] lets the gradient take their place, not go without them). This op makes them a chunk
// of rows at a time with the same two kernels, keeps only x, w, the targets and the row count, and
// makes each chunk's logits again in backward, which then gives the chunk's rows of dx and adds
// its dw. It costs a third product (the logits twice) against the (N, V) bytes; llm.c's fused
// classifier writes the gradient over the logits but keeps them from forward to backward.
// One chunk (chunk_rows >= N) runs the kernels on the shapes of linear + cross_entropy, so it
// gives their bits; more chunks give dx's bits (Note [rows that do not depend on the batch]) and
// sum the loss and dw chunk by chunk, a different order of float32 additions. Chunks are rows [k R, (k + 1) R) whatever the thread count. Only the sum
// reduction: a mean needs the count before the chunks are added (the Trainer and the Accumulator
// take sums).
#include <algorithm>

#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "ops/op.h"
#include "ops/param_grads.h"

namespace mg {

namespace {

// chunk_rows 0: at most 32 MiB of logits a chunk, and at least four chunks, since one chunk holds
// its logits (and, in float32, its probabilities) beside dw in backward, more than linear +
// cross_entropy's peak.
constexpr size_t kChunkBytes = size_t{32} << 20;
constexpr int64_t kMinChunks = 4;

int64_t chunk_rows(const OpAttrs& a, int64_t n, int64_t v, DType logits) {
  if (a.chunk_rows > 0) return std::min(a.chunk_rows, n);
  const int64_t rows = static_cast<int64_t>(kChunkBytes / (static_cast<size_t>(v) * dtype_size(logits)));
  return std::clamp<int64_t>(std::min(rows, (n + kMinChunks - 1) / kMinChunks), 1, n);
}

// A chunk's logits: float32 on the CPU, whose products take operands and results of different
// dtypes (so bf16 inputs give the bits of the float32 kernels on widened copies, as every half
// kernel does); on CUDA the inputs' dtype, as its products take one dtype for A, B and C.
DType chunk_dtype(Device d, DType inputs) { return d.is_cuda() ? inputs : DType::f32; }

// A pass over the chunks: their buffers, made once, and each chunk's logits and loss in turn.
struct Chunks {
  Chunks(const OpAttrs& a, const Tensor& x, const Tensor& w, DType inputs) : x(x), w(w), d(x.device()) {
    const DType dt = chunk_dtype(d, inputs);
    rows = chunk_rows(a, x.size(0), w.size(0), dt);
    logits_buf = Tensor::empty({rows, w.size(0)}, TensorOptions{dt, d});
    if (dt == DType::f32) probs_buf = Tensor::empty({rows, w.size(0)}, like(x));
  }
  // Rows [first, first + r): the logits, and with `loss` cross_entropy's forward into (loss,
  // count). Returns what cross_entropy's backward reads: the probabilities (float32), or the
  // logits, which without `loss` are all that is made.
  Tensor run(int64_t first, int64_t r, const Tensor& target, int64_t ignore_index, Tensor* loss, Tensor* count) const {
    Tensor logits = rows_view(logits_buf, 0, r);
    MG_DISPATCH(d, linear_forward, logits, rows_view(x, first, r), w, Tensor());
    if (!loss) return logits;
    Tensor probs = probs_buf.defined() ? rows_view(probs_buf, 0, r) : Tensor();
    MG_DISPATCH(d, cross_entropy_forward, *loss, probs, *count, logits, rows_view(target, first, r), Reduction::sum,
                ignore_index);
    return probs.defined() ? probs : logits;
  }
  const Tensor &x, &w;
  Device d;
  int64_t rows = 0;
  Tensor logits_buf, probs_buf;
};

Tensor linear_cross_entropy_fwd(const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>* saved) {
  const Tensor &x = in[0], &w = in[1], &target = in[2];
  check_float_or_half("linear_cross_entropy", "input", x);
  check_float_or_half("linear_cross_entropy", "weight", w);
  MG_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
           "linear_cross_entropy: input (N, K) and weight (V, K) expected, got input "
               << shape_str(x.shape()) << " and weight " << shape_str(w.shape()));
  MG_CHECK(x.dtype() == w.dtype(), "linear_cross_entropy: input is " << dtype_name(x.dtype()) << " and weight "
                                                                     << dtype_name(w.dtype())
                                                                     << "; one dtype, or an AutocastGuard, expected");
  MG_CHECK(target.defined() && target.dtype() == DType::i64 && target.dim() == 1 && target.size(0) == x.size(0),
           "linear_cross_entropy: target must be int64 of shape [" << x.size(0) << "], got "
               << (target.defined() ? dtype_name(target.dtype()) + std::string(" ") + shape_str(target.shape())
                                    : std::string("undefined")));
  MG_CHECK(x.size(0) > 0, "linear_cross_entropy: empty batch");
  MG_CHECK(a.reduction == Reduction::sum,
           "linear_cross_entropy: only Reduction::sum (Note [chunked classifier]); divide the sum by the "
           "counted rows for a mean");
  const Device d = x.device();
  const int64_t n = x.size(0), v = w.size(0);
  if (d.is_cpu()) {  // here, so that a bad row is named in the batch, not in its chunk
    const int64_t* pt = target.data<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      MG_CHECK(pt[i] == a.ignore_index || (pt[i] >= 0 && pt[i] < v),
               "linear_cross_entropy: target[" << i << "] = " << pt[i] << " is not a class index in [0, " << v << ")");
    }
  }
  const Chunks chunks(a, x, w, x.dtype());
  Tensor loss = Tensor::empty({}, like(x)), count = Tensor::empty({1}, like(x));
  Tensor chunk_loss = Tensor::empty({}, like(x)), chunk_count = Tensor::empty({1}, like(x));
  for (int64_t first = 0; first < n; first += chunks.rows) {
    const bool first_chunk = first == 0;
    chunks.run(first, std::min(chunks.rows, n - first), target, a.ignore_index, first_chunk ? &loss : &chunk_loss,
               first_chunk ? &count : &chunk_count);
    if (!first_chunk) {
      MG_DISPATCH(d, add_inplace, loss, chunk_loss);
      MG_DISPATCH(d, add_inplace, count, chunk_count);
    }
  }
  save(saved, {x, w, target, count});
  return loss;
}

void linear_cross_entropy_bwd(Node& nd, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>& accum) {
  const Device d = gy.device();
  const Tensor &x = nd.saved[0], &w = nd.saved[1], &target = nd.saved[2], &count = nd.saved[3];
  const int64_t n = x.size(0);
  const Chunks chunks(nd.attrs, x, w, nd.half_kernels ? nd.inputs[0].dtype : DType::f32);
  Tensor dx = wants(nd, 0) ? (grads[0] = empty_like_input(nd, 0, d)) : Tensor();
  // dw: the optimizer's buffer (added into), or this node's own. Chunks after the first add to
  // it, in float32 (a bf16 gradient is summed in a float32 one and rounded once at the end).
  const bool want_w = wants(nd, 1);
  const bool accumulate = want_w && accum[1].defined();
  Tensor dw = !want_w ? Tensor() : accumulate ? accum[1] : (grads[1] = empty_like_input(nd, 1, d));
  Tensor dw_sum =
      dw.defined() && dw.dtype() != DType::f32 && chunks.rows < n ? Tensor::empty(dw.shape(), like(dw)) : dw;
  Tensor chunk_loss = Tensor::empty({}, like(x)), chunk_count = Tensor::empty({1}, like(x));
  const bool probs = chunks.probs_buf.defined();
  Tensor no_db;
  for (int64_t first = 0; first < n; first += chunks.rows) {
    const int64_t r = std::min(chunks.rows, n - first);
    // float32: the probabilities again, and the gradient over them; bf16/f16: over the logits
    // (Note [loss gradient in place]).
    Tensor kept = chunks.run(first, r, target, nd.attrs.ignore_index, probs ? &chunk_loss : nullptr, &chunk_count);
    const Tensor tr = rows_view(target, first, r);
    MG_DISPATCH(d, cross_entropy_backward, kept, gy, kept, count, tr, Reduction::sum, nd.attrs.ignore_index);
    Tensor dxr = dx.defined() ? rows_view(dx, first, r) : Tensor();
    MG_DISPATCH(d, linear_backward, dxr, dw_sum, no_db, kept, rows_view(x, first, r), w, accumulate || first > 0);
  }
  if (dw_sum.defined() && dw_sum.impl_ptr() != dw.impl_ptr()) dw.copy_(dw_sum);
}

double linear_cross_entropy_flops(const Node& n) {
  const double rows = static_cast<double>(n.inputs[0].shape.at(0)), k = static_cast<double>(n.inputs[0].shape.at(1));
  const double v = static_cast<double>(n.inputs[1].shape.at(0));
  return 2.0 * rows * k * v + rows * v;
}

std::vector<OpCase> linear_cross_entropy_cases() {
  OpAttrs whole, chunked;
  whole.reduction = chunked.reduction = Reduction::sum;
  chunked.chunk_rows = 8;
  const TestInput no_grad_target = {.kind = TestInput::index, .shape = {5}, .classes = 7, .grad = false};
  return {
      {{{.shape = {5, 4}}, {.shape = {7, 4}}, no_grad_target}, whole},
      {{{.shape = {41, 51}}, {.shape = {101, 51}}, {.kind = TestInput::index, .shape = {41}, .classes = 101, .grad = false}},
       chunked},  // large: six chunks, the last of one row
  };
}

const OpDef kLinearCrossEntropy{"linear_cross_entropy", OpKind::loss, linear_cross_entropy_fwd,
                                linear_cross_entropy_bwd, linear_cross_entropy_flops, linear_cross_entropy_cases,
                                /*tile: sums over samples*/ nullptr, OpPrecision::low, /*half_kernels*/ true,
                                CudaHalf::one_dtype};
MG_REGISTER_OP(kLinearCrossEntropy);

}  // namespace

Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& target, int64_t ignore_index,
                            int64_t chunk_rows) {
  MG_CHECK(chunk_rows >= 0, "linear_cross_entropy: chunk_rows must be >= 0 (0: at most 32 MiB of logits and at least four chunks), got "
                                << chunk_rows);
  OpAttrs a;
  a.reduction = Reduction::sum;
  a.ignore_index = ignore_index;
  a.chunk_rows = chunk_rows;
  return apply(kLinearCrossEntropy, a, {x, w, target});
}

}  // namespace mg
