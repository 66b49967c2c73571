// The op layer: every differentiable op is one OpDef entry, defined beside its public function in
// src/ops/<op>.cpp (the same base name as its kernels, src/kernels/<op>.h). An entry is the whole op
// as the rest of the library sees it:
//
//   name      "relu", in errors and the planner's tables
//   kind      what sort of op it is (the accumulator looks for kind == loss)
//   forward   argument checks, output allocation, the device kernel, and what backward needs
//   backward  the gradient rule
//   flops     forward FLOPs of a recorded node, the planner's cost model (minigrad/nn/checkpoint_plan.h)
//   cases     the inputs the op-indexed test runs it on (tests/test_ops.cpp): a finite-difference
//             check of the gradient of every input, and CUDA against CPU on a GPU
//
// Entries register themselves (MG_REGISTER_OP), so adding an op touches its kernel header, its
// two kernels and its op file, plus the public declaration in include/minigrad/ops/ops.h; the
// test picks it up from the registry. docs/architecture.md walks through it.
//
// The tape (src/core/tape.h) holds an op as `const OpDef*`; core calls this layer only through
// the hooks declared there (Note [op layer hooks]), which src/ops/apply.cpp defines.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include <minigrad/ops/ops.h>

#include "core/tape.h"
#include "kernels/dispatch.h"

namespace mg {

enum class OpKind : uint8_t {
  elementwise,  // y[i] depends on x[i] only
  contraction,  // linear, conv2d: weights, GEMM-shaped
  pool,         // windows over H and W
  normalization,  // batch_norm, layer_norm: statistics over a dimension, a scale and a shift
  lookup,       // embedding: rows of a table by index
  attention,    // causal self-attention: products over the positions of a sequence
  view,         // no kernel, shares storage
  rearrange,    // permute: values copied to new places, no arithmetic (dtypes kept, as views keep them)
  loss,         // a scalar from (prediction, target), with a Reduction
};

// An op's row of the precision table (Note [autocast] in minigrad/core/autocast.h): under an
// AutocastGuard of a low dtype, `low` rounds its float32 inputs to it first (products: linear,
// matmul, conv2d, attention); `fp32` takes its inputs as they come and stores its output low
// (statistics and lookups: softmax, layer_norm, batch_norm, embedding); `follow` stores its
// output low when an input is. Every op computes in float32; a loss returns float32.
enum class OpPrecision : uint8_t { follow, low, fp32 };

// One input of a test case. `real` inputs are float32 with distinct values spaced well apart and
// away from zero (so relu's kink and max-pool's ties are never within a finite-difference step);
// `index` inputs are int64 in [0, classes); `none` is an undefined (optional) input.
struct TestInput {
  enum Kind : uint8_t { real, index, none } kind = real;
  Shape shape;
  int64_t classes = 0;
  bool grad = true;  // checked by finite differences (real inputs only)
};

struct OpCase {
  std::vector<TestInput> inputs;
  OpAttrs attrs;
};

// Which bf16/f16 inputs an op's CUDA kernels take as they are (OpDef::cuda_half): none (they get
// float32 copies), floating inputs of one low dtype (cuBLAS's and cuDNN's products take one), or
// each tensor in its own float dtype (statistics ops whose float32 parameters autocast keeps).
enum class CudaHalf : uint8_t { none, one_dtype, any_dtypes };

struct OpDef {
  const char* name;
  OpKind kind;
  // `saved` is null when nothing will be recorded; otherwise forward appends what backward needs.
  Tensor (*forward)(const OpAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>* saved);
  // Fills grads[i] = dL/d(input i) for each input that requires grad (see backward_rule in
  // src/core/tape.h for accum).
  void (*backward)(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>& accum);
  double (*flops)(const Node& n);
  std::vector<OpCase> (*cases)();
  // Tiles of a checkpoint segment (Note [tiled segments] in minigrad/core/checkpoint.h): the
  // attributes that run node n, recorded on rows [0, recorded) of a batch, on rows
  // [first, first + rows) instead. Null when the op mixes samples and cannot run in tiles.
  OpAttrs (*tile)(const Node& n, int64_t recorded, int64_t first, int64_t rows);
  OpPrecision precision = OpPrecision::follow;
  // Its CPU kernels read and write bf16 and f16 themselves (Note [half operands] in
  // kernels/cpu/gemm.h): apply() hands it the low-precision inputs as they are instead of float32
  // copies, and it makes its output and gradients in the dtypes of Note [autocast].
  bool half_kernels = false;
  // Its CUDA kernels do the same (Note [cuda half kernels] in src/kernels/cuda/storage.cuh).
  CudaHalf cuda_half = CudaHalf::none;
  // Bit i: backward adds input i's gradient into accum[i] when that is defined, whether a leaf's
  // buffer or a gradient pending for the input's producer, rounding as add_into_kernel does (Note
  // [adding into pending gradients] in src/core/autograd.cpp).
  uint8_t adds_into_pending = 0;
  // Bit i: the op keeps input i as it came at saved[i], and when backward asks
  // (Node::mask_inputs_by_relu), its rule masks input i's gradient by that input > 0, the mask of
  // the ReLU that made it (Note [relu mask in the consumer] in src/core/autograd.cpp).
  uint8_t takes_relu_mask = 0;
};

// Every registered op, in registration order.
std::span<const OpDef* const> all_ops();
const OpDef* find_op(std::string_view name);  // null when there is none

struct OpRegistrar {
  explicit OpRegistrar(const OpDef& op);
};
#define MG_REGISTER_OP(def) static const ::mg::OpRegistrar mg_register_##def(def)

// ---- helpers for forward and backward --------------------------------------------------------

inline TensorOptions like(const Tensor& t) { return TensorOptions{DType::f32, t.device()}; }

void check_float(const char* op, const char* what, const Tensor& t);
// float32, or bf16 or f16 for an op with half_kernels.
void check_float_or_half(const char* op, const char* what, const Tensor& t);

// Whether ops with half_kernels (and cuda_half) use them (on by default); off, they run on
// float32 copies as other ops do. tests/test_ops.cpp checks that both give the same bits on the CPU.
void set_half_kernels(bool on);
bool half_kernels_enabled();

// Whether rules with OpDef::adds_into_pending are handed a pending gradient (on by default); off,
// their results come back as new tensors that backward adds in. tests/test_core.cpp checks that
// both give the same bits.
void set_add_into_pending(bool on);

// Whether backward asks a ReLU's one reader to mask its gradient (OpDef::takes_relu_mask; on by
// default); off, the ReLU masks it. tests/test_ops.cpp checks that both give the same bits.
void set_relu_mask_in_consumer(bool on);

// The dtype of an op with half_kernels' output (Note [autocast]): under an AutocastGuard, where
// the half kernels run (CPU inputs, set_half_kernels on), the guard's low dtype for an op whose
// row is not `follow` (an fp32 op such as layer_norm makes it from float32 inputs too); else the
// first bf16 or f16 input's, else float32.
DType half_out(const std::vector<Tensor>& in, OpPrecision row = OpPrecision::follow);

// Note [fused residual layer_norm] (src/ops/layer_norm.cpp): two ops whose forwards one kernel runs,
// recorded as the nodes apply() would record. takes_as_is: whether apply() would hand `op` (not a
// `low` row, which makes copies) these inputs as they are (no casting, or its half kernels), and
// if so the dtype its output would have and whether its half kernels would run. record_node: records op's node for `out`, made from
// `inputs` by the op's own kernels or ones with their bits, keeping `saved`, as apply() does.
bool takes_as_is(const OpDef& op, const std::vector<Tensor>& in, DType* out, bool* half_kernels);
Tensor record_node(const OpDef& op, const OpAttrs& attrs, const std::vector<Tensor>& inputs, Tensor out,
                   std::vector<Tensor> saved, bool half_kernels);

// The dtype apply() stores the running op's output in: its own output's dtype where its kernels
// take the low dtypes as they are, a low dtype the float32 output will be rounded to otherwise. An
// op made of two steps (linear_gelu) rounds its intermediate to it, as the unfused ops would.
DType stored_dtype();

inline void save(std::vector<Tensor>* saved, std::initializer_list<Tensor> ts) {
  if (saved) saved->insert(saved->end(), ts);
}

inline bool wants(const Node& n, size_t i) { return i < n.inputs.size() && n.inputs[i].requires_grad; }

// Input i's gradient buffer: float32, or the input's own dtype where the node ran its kernels on
// bf16/f16 (Node::half_kernels).
inline Tensor empty_like_input(const Node& n, size_t i, Device d) {
  return Tensor::empty(n.inputs[i].shape, TensorOptions{n.half_kernels ? n.inputs[i].dtype : DType::f32, d});
}

// The gradient of input i of an element-wise op whose backward kernel reads and writes each
// element at the same index: the incoming gradient itself when nothing else holds it (one buffer
// and one pass over memory fewer), else a new tensor. The planner measures what this saves
// (Note [checkpoint cost model]).
inline Tensor elementwise_grad(const Node& n, size_t i, const Tensor& gy) {
  const DType dtype = n.half_kernels ? n.inputs[i].dtype : DType::f32;
  const bool reuse = sole_owner(gy) && gy.impl().offset == 0 && gy.dtype() == dtype && gy.shape() == n.inputs[i].shape;
  return reuse ? gy : empty_like_input(n, i, gy.device());
}

// Note [fused relu] (src/ops/conv2d.cpp), Note [fused gelu] (src/ops/linear.cpp): the gradient of
// a fused op's output before its activation, from gy and saved[slot] (relu: the output y, gy
// masked by y > 0; gelu: its argument), in place when nothing else holds gy, and on widened
// copies rounded to the op's stored dtype as the unfused activation's input gradient would be.
// saved[slot] then goes, as the unfused activation's would before the op's backward (unless the
// graph is retained).
enum class FusedActivation : uint8_t { relu, gelu };
Tensor activation_grad(Node& n, Tensor gy, size_t slot, FusedActivation act);

// Windows along one dimension of size `in` (conv2d, pools). 0 when the kernel does not fit: C++
// division truncates toward zero, so (in + 2p - k) / s + 1 alone would say 1 for a kernel up to
// s - 1 elements too large.
inline int64_t window_count(int64_t in, int k, int s, int p) {
  return in + 2 * p < k ? 0 : (in + 2 * p - k) / s + 1;
}

inline double out_numel(const Node& n) { return static_cast<double>(shape_numel(n.out_shape)); }
inline double flops_per_output(const Node& n) { return out_numel(n); }
inline double no_flops(const Node&) { return 0.0; }
// Sets a.seed, a.offset and a.sample_stride of a dropout mask of `per_sample_draws` draws per row
// of x's first dimension, from `gen` (the default generator when null), or from the current sample
// window (Note [dropout by sample]); `op` names the op in errors. dropout and the attention's
// dropout on its probabilities draw this way.
void draw_dropout_counters(OpAttrs& a, const char* op, const Tensor& x, uint64_t per_sample_draws, Generator* gen);

// OpDef::tile of an op whose attributes do not depend on the rows it runs on.
inline OpAttrs rows_apart(const Node& n, int64_t, int64_t, int64_t) { return n.attrs; }

}  // namespace mg
