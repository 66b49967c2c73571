// Running an op: apply() and the op registry, and the hooks core calls (Note [op layer hooks] in
// src/core/tape.h).
#include <atomic>
#include <string_view>

#include <minigrad/core/autocast.h>
#include <minigrad/core/profiler.h>
#include <minigrad/cuda.h>  // cudnn_dgrad_fusion
#include "kernels/convert.h"
#include "kernels/elementwise.h"
#include "ops/op.h"

namespace mg {

namespace {
std::vector<const OpDef*>& registry() {
  static std::vector<const OpDef*> ops;
  return ops;
}

// The inputs' one device (the CPU when none is defined).
Device common_device(const char* op, const std::vector<Tensor>& in) {
  const Tensor* first = nullptr;
  for (const Tensor& t : in) {
    if (!t.defined()) continue;
    if (!first) first = &t;
    MG_CHECK(t.device() == first->device(), op << ": inputs on different devices ("
                                                << first->device().str() << " and "
                                                << t.device().str() << ")");
  }
  return first ? first->device() : Device::cpu();
}
}  // namespace

OpRegistrar::OpRegistrar(const OpDef& op) {
  MG_CHECK(find_op(op.name) == nullptr, "op '" << op.name << "' registered twice");
  registry().push_back(&op);
}

std::span<const OpDef* const> all_ops() { return registry(); }

const OpDef* find_op(std::string_view name) {
  for (const OpDef* op : registry()) {
    if (name == op->name) return op;
  }
  return nullptr;
}

namespace {
std::atomic<bool> g_half_kernels{true};
bool low(DType t) { return t == DType::bf16 || t == DType::f16; }
}  // namespace

void check_float(const char* op, const char* what, const Tensor& t) {
  MG_CHECK(t.defined(), op << ": " << what << " is undefined");
  MG_CHECK(t.dtype() == DType::f32,
           op << ": " << what << " must be float32, got " << dtype_name(t.dtype()));
}

void check_float_or_half(const char* op, const char* what, const Tensor& t) {
  MG_CHECK(t.defined(), op << ": " << what << " is undefined");
  MG_CHECK(t.dtype() == DType::f32 || low(t.dtype()),
           op << ": " << what << " must be float32, bfloat16 or float16, got " << dtype_name(t.dtype()));
}

void set_half_kernels(bool on) { g_half_kernels = on; }
bool half_kernels_enabled() { return g_half_kernels; }

namespace {
// An op's half kernels run on this thread (apply() chose them): half_out's guard rule applies.
thread_local bool t_half_kernels_running = false;
// The dtype apply() stores the running op's output in (stored_dtype).
thread_local DType t_stored = DType::f32;

DType first_low(const std::vector<Tensor>& in) {
  for (const Tensor& t : in) {
    if (t.defined() && low(t.dtype())) return t.dtype();
  }
  return DType::f32;
}

// The dtype an op's half kernels give its output: the guard's for a row that is not `follow` (an
// fp32 op makes it from float32 inputs too), else the first low input's.
DType kernel_out(const std::vector<Tensor>& in, OpPrecision row, DType cast) {
  return row != OpPrecision::follow && cast != DType::f32 ? cast : first_low(in);
}

// Ops that move values without arithmetic: they take and give any dtype as it comes.
bool moves_only(const OpDef& op) { return op.kind == OpKind::view || op.kind == OpKind::rearrange; }
}  // namespace

DType stored_dtype() { return t_stored; }

DType half_out(const std::vector<Tensor>& in, OpPrecision row) {
  // Where the half kernels run (plan_casting); elsewhere the inputs come widened and apply() rounds.
  return t_half_kernels_running ? kernel_out(in, row, autocast_dtype()) : first_low(in);
}

// ---- hooks ------------------------------------------------------------------------------------

const char* op_name(const OpDef& op) { return op.name; }

namespace {

// Note [autocast] (minigrad/core/autocast.h): what an op's inputs become before its float32 kernels
// run, and the dtype of its output. `cast` is the autocast dtype (f32: off).
struct Casting {
  bool active = false;              // some input or the output is not float32
  bool half_kernels = false;        // the op's kernels take `stored` as it is (OpDef::half_kernels)
  DType out = DType::f32;           // the output's dtype
  std::vector<Tensor> stored;       // input i as saved and differentiated: rounded where the table says
  std::vector<Tensor> wide;         // input i as the kernel reads it: float32
};

// Whether an op's CUDA kernels take these inputs as they are (OpDef::cuda_half).
bool cuda_takes(CudaHalf kind, const std::vector<Tensor>& in) {
  if (kind != CudaHalf::one_dtype) return kind == CudaHalf::any_dtypes;
  const DType first = first_low(in);  // every floating input of one dtype, bf16 or f16
  for (const Tensor& t : in) {
    if (t.defined() && is_floating(t.dtype()) && t.dtype() != first) return false;
  }
  return low(first);
}

// Says for its lifetime whether an op's half kernels run (half_out); an op run inside another's
// forward says so for itself.
class HalfKernelsRunning {
 public:
  explicit HalfKernelsRunning(bool on) : prev_(t_half_kernels_running) { t_half_kernels_running = on; }
  ~HalfKernelsRunning() { t_half_kernels_running = prev_; }
  HalfKernelsRunning(const HalfKernelsRunning&) = delete;
  HalfKernelsRunning& operator=(const HalfKernelsRunning&) = delete;

 private:
  bool prev_;
};

Casting plan_casting(const OpDef& op, const std::vector<Tensor>& in, DType cast, Device device) {
  Casting c;
  DType seen = DType::f32;  // a low dtype among the inputs
  for (const Tensor& t : in) {
    if (t.defined() && low(t.dtype())) seen = t.dtype();
  }
  const DType run = cast != DType::f32 ? cast : seen;
  if (run == DType::f32 || moves_only(op)) return c;  // views and permutes keep the dtype they are given
  c.active = true;
  c.stored = in;
  for (Tensor& t : c.stored) {
    if (!t.defined() || t.dtype() != DType::f32 || op.precision != OpPrecision::low || cast == DType::f32) continue;
    // A parameter's copy is made once per optimizer step; an activation's each time.
    t = t.is_leaf() && t.requires_grad() ? autocast_param(t, cast) : t.detach().to(cast);
  }
  bool any_low = false;
  for (const Tensor& t : c.stored) any_low |= t.defined() && low(t.dtype());
  if (op.kind == OpKind::loss) c.out = DType::f32;
  else if (op.precision != OpPrecision::follow && cast != DType::f32) c.out = cast;
  else c.out = any_low ? run : DType::f32;
  // Kernels that read bf16/f16 themselves take the inputs as they are, when the output's dtype is
  // the one they give it (kernel_out; Note [half operands] in kernels/cpu/gemm.h; a loss's output
  // is float32 whatever its inputs). CUDA's take one low dtype for all their floating inputs, or each tensor
  // in its own (OpDef::cuda_half; Note [cuda half kernels] in kernels/cuda/storage.cuh).
  const bool kernels = device.is_cpu() ? op.half_kernels : cuda_takes(op.cuda_half, c.stored);
  c.half_kernels = kernels && half_kernels_enabled() &&
                   (op.kind == OpKind::loss || kernel_out(c.stored, op.precision, cast) == c.out);
  if (c.half_kernels) return c;
  c.wide.resize(c.stored.size());
  for (size_t i = 0; i < c.stored.size(); ++i) {
    const Tensor& t = c.stored[i];
    c.wide[i] = t.defined() && low(t.dtype()) ? t.to(DType::f32) : t;
  }
  return c;
}

// What forward saved, in the dtypes backward gets them in: a widened input as its rounded original.
void save_rounded_inputs(std::vector<Tensor>& saved, const Casting& c) {
  for (Tensor& t : saved) {
    for (size_t i = 0; t.defined() && i < c.wide.size(); ++i) {
      if (c.wide[i].defined() && t.impl_ptr() == c.wide[i].impl_ptr()) {
        t = c.stored[i];
        break;
      }
    }
  }
}

}  // namespace

Tensor apply(const OpDef& op, const OpAttrs& attrs, std::vector<Tensor> inputs) {
  bool needs_grad = false;
  for (const Tensor& t : inputs) needs_grad |= t.defined() && t.requires_grad();
  const bool record = needs_grad && GradMode::enabled();
  const Device device = common_device(op.name, inputs);
  const DType cast = autocast_dtype();
  Casting c = plan_casting(op, inputs, cast, device);
  std::vector<Tensor> saved;
  Tensor out;
  {
    const profiler::Scope timed(op.name, device, forward_pass());
    const HalfKernelsRunning running(c.half_kernels);
    const DType outer_stored = t_stored;
    t_stored = c.active ? c.out : DType::f32;
    struct Restore {
      DType v;
      ~Restore() { t_stored = v; }
    } restore{outer_stored};
    if (!c.active) {
      out = op.forward(attrs, inputs, record ? &saved : nullptr);
    } else if (c.half_kernels) {
      out = op.forward(attrs, c.stored, record ? &saved : nullptr);
    } else {
      Tensor wide_out = op.forward(attrs, c.wide, record ? &saved : nullptr);
      if (record) save_rounded_inputs(saved, c);
      // The widened inputs go before the output is rounded: the op's transient bytes are its
      // float32 kernel's, no more.
      c.wide.clear();
      out = c.out == DType::f32 ? wide_out : wide_out.to(c.out);
      if (record && c.out != DType::f32) {
        // An op saves its output as a handle of its own on the output's storage (the output's
        // handle will point at this node): the handle now goes to the rounded output's storage.
        for (Tensor& t : saved) {
          if (t.defined() && t.shares_storage(wide_out)) t = out.detach();
        }
      }
    }
  }
  if (!record) return out;
  return record_node(op, attrs, inputs, std::move(out), std::move(saved), c.half_kernels);
}

bool takes_as_is(const OpDef& op, const std::vector<Tensor>& in, DType* out, bool* half_kernels) {
  MG_CHECK(op.precision != OpPrecision::low, "takes_as_is: " << op.name << " rounds its inputs under autocast");
  const Casting c = plan_casting(op, in, autocast_dtype(), common_device(op.name, in));
  if (c.active && !c.half_kernels) return false;
  *out = c.active ? c.out : DType::f32;
  *half_kernels = c.half_kernels;
  return true;
}

Tensor record_node(const OpDef& op, const OpAttrs& attrs, const std::vector<Tensor>& inputs, Tensor out,
                   std::vector<Tensor> saved, bool half_kernels) {
  auto node = std::make_shared<Node>();
  node->op = &op;
  node->attrs = attrs;
  node->seq = next_node_seq();
  node->saved = std::move(saved);
  node->out_shape = out.shape();
  node->out_dtype = out.dtype();
  node->cast = autocast_dtype();
  node->half_kernels = half_kernels;
  node->out_device = out.device();
  // Inputs without history are kept when a gradient goes to them, and inside a checkpoint
  // segment, whose replay re-runs the op on them (Note [checkpoint replay]).
  const bool keep_all = checkpoint_recording();
  node->inputs.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    NodeInput& ni = node->inputs[i];
    if (!t.defined()) continue;
    ni.requires_grad = t.requires_grad();
    ni.shape = t.shape();
    ni.dtype = t.dtype();
    ni.fn = t.grad_fn();
    if (!ni.fn && (ni.requires_grad || keep_all)) ni.leaf = t;
    if (!ni.fn && !ni.requires_grad && t.impl().storage) {
      ni.leaf_storage = t.impl().storage;
      ni.leaf_nbytes = t.impl().storage->nbytes();
    }
  }
  out.impl().requires_grad = true;
  out.impl().grad_fn = std::move(node);
  return out;
}

void backward_rule(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>& accum) {
  const profiler::Scope timed(n.op->name, gy.defined() ? gy.device() : n.out_device, "backward");
  bool active = gy.defined() && low(gy.dtype());
  for (const Tensor& t : n.saved) active |= t.defined() && low(t.dtype());
  for (const NodeInput& in : n.inputs) active |= low(in.dtype);
  if (!active) {
    n.op->backward(n, std::move(gy), grads, accum);
    return;
  }
  // A gradient is summed in place only into a float32 buffer (a parameter's), or by a rule that
  // rounds as add_into_kernel does (OpDef::adds_into_pending); others come back.
  std::vector<Tensor> acc = accum;
  for (size_t i = 0; i < acc.size(); ++i) {
    if (acc[i].defined() && acc[i].dtype() != DType::f32 && !rule_adds_into_pending(n, i)) acc[i] = Tensor();
  }
  if (n.half_kernels || moves_only(*n.op)) {
    // Kernels that take the low dtypes as they are (OpDef::half_kernels), and views and permutes, which move
    // no values: the gradient as it comes.
    if (n.half_kernels && gy.defined() && gy.dtype() != n.out_dtype) gy = gy.to(n.out_dtype);
    n.op->backward(n, std::move(gy), grads, acc);
  } else {
    // Note [autocast]: the rule runs in float32 on widened copies; a gradient goes to its input
    // in that input's dtype, and a float32 buffer (a parameter's) takes its sum in place.
    std::vector<Tensor> rounded = n.saved;
    for (Tensor& t : n.saved) {
      if (t.defined() && low(t.dtype())) t = t.to(DType::f32);
    }
    Tensor wide_gy = low(gy.dtype()) ? gy.to(DType::f32) : gy;
    gy = Tensor();  // the caller's was moved in: the low one goes now
    n.op->backward(n, std::move(wide_gy), grads, acc);
    n.saved = std::move(rounded);
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined() && grads[i].dtype() != n.inputs[i].dtype) grads[i] = grads[i].to(n.inputs[i].dtype);
  }
}

namespace {
std::atomic<bool> g_add_into_pending{true};
std::atomic<bool> g_relu_mask_in_consumer{true};
}  // namespace

void set_relu_mask_in_consumer(bool on) { g_relu_mask_in_consumer = on; }

// Where cuDNN's dgrad + dReLU graph may run, a conv2d must take it or not by the forward graph
// alone: every reader masks, whatever the readers a checkpoint plan leaves in one backward.
bool relu_mask_every_reader() { return g_relu_mask_in_consumer && cuda::cudnn_dgrad_fusion(); }

bool rule_takes_relu_mask(const Node& n, size_t i) {
  if (!g_relu_mask_in_consumer || !n.op || i >= 8 || (n.op->takes_relu_mask >> i & 1u) == 0) return false;
  // The input as it came (not a converted copy, whose rounding could zero a small value).
  return i < n.saved.size() && n.saved[i].defined() && n.saved[i].dtype() == n.inputs[i].dtype &&
         n.saved[i].shape() == n.inputs[i].shape;
}

void set_add_into_pending(bool on) { g_add_into_pending = on; }

bool op_adds_into_pending(const Node& n, size_t i) {
  return n.op && i < 8 && (n.op->adds_into_pending >> i & 1u) != 0;
}

bool rule_adds_into_pending(const Node& n, size_t i) { return g_add_into_pending && op_adds_into_pending(n, i); }

bool op_tiles(const OpDef& op) { return op.tile != nullptr; }

OpAttrs tile_attrs(const Node& n, int64_t recorded, int64_t first, int64_t rows) {
  return n.op->tile(n, recorded, first, rows);
}

void fill_kernel(Tensor& t, float value) { MG_DISPATCH(t.device(), fill, t, value); }

void copy_kernel(Tensor& dst, const Tensor& src) { MG_DISPATCH(Device::cuda(), copy_bytes, dst, src); }

void convert_kernel(Tensor& dst, const Tensor& src) { MG_DISPATCH(dst.device(), convert, dst, src); }

// Gradient sums (a leaf's, a node's output used twice) in float32, stored in the sum's dtype. The
// kernels widen and round themselves (Note [cuda half kernels]; on the CPU add_forward's blocks,
// which may write over their first input), except CUDA's add_forward, which takes one dtype.
void add_into_kernel(Tensor& acc, const Tensor& g) {
  if (acc.device().is_cuda()) {
    MG_DISPATCH(acc.device(), add_inplace, acc, g);
    return;
  }
  MG_DISPATCH(acc.device(), add_forward, acc, acc, g);
}

Tensor add_kernel(const Tensor& a, const Tensor& b) {
  if (a.device().is_cuda() && a.dtype() != b.dtype()) {
    const Tensor wa = a.to(DType::f32), wb = b.to(DType::f32);
    Tensor sum = Tensor::empty(a.shape(), TensorOptions{DType::f32, a.device()});
    MG_DISPATCH(sum.device(), add_forward, sum, wa, wb);
    return sum.to(a.dtype());
  }
  Tensor sum = Tensor::empty(a.shape(), TensorOptions{a.dtype(), a.device()});
  MG_DISPATCH(sum.device(), add_forward, sum, a, b);
  return sum;
}

}  // namespace mg
