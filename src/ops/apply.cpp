// Running an op: apply() and the op registry, and the hooks core calls (Note [op layer hooks] in
// src/core/tape.h).
#include <string_view>

#include <minigrad/core/profiler.h>
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

void check_float(const char* op, const char* what, const Tensor& t) {
  MG_CHECK(t.defined(), op << ": " << what << " is undefined");
  MG_CHECK(t.dtype() == DType::f32,
           op << ": " << what << " must be float32, got " << dtype_name(t.dtype()));
}

// ---- hooks ------------------------------------------------------------------------------------

const char* op_name(const OpDef& op) { return op.name; }

Tensor apply(const OpDef& op, const OpAttrs& attrs, std::vector<Tensor> inputs) {
  bool needs_grad = false;
  for (const Tensor& t : inputs) needs_grad |= t.defined() && t.requires_grad();
  const bool record = needs_grad && GradMode::enabled();
  const Device device = common_device(op.name, inputs);
  std::vector<Tensor> saved;
  Tensor out;
  {
    const profiler::Scope timed(op.name, device, forward_pass());
    out = op.forward(attrs, inputs, record ? &saved : nullptr);
  }
  if (!record) return out;

  auto node = std::make_shared<Node>();
  node->op = &op;
  node->attrs = attrs;
  node->seq = next_node_seq();
  node->saved = std::move(saved);
  node->out_shape = out.shape();
  node->out_dtype = out.dtype();
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
    ni.fn = t.grad_fn();
    if (!ni.fn && (ni.requires_grad || keep_all)) ni.leaf = t;
  }
  out.impl().requires_grad = true;
  out.impl().grad_fn = std::move(node);
  return out;
}

void backward_rule(Node& n, Tensor gy, std::vector<Tensor>& grads, const std::vector<Tensor>& accum) {
  const profiler::Scope timed(n.op->name, gy.defined() ? gy.device() : n.out_device, "backward");
  n.op->backward(n, std::move(gy), grads, accum);
}

bool op_tiles(const OpDef& op) { return op.tile != nullptr; }

OpAttrs tile_attrs(const Node& n, int64_t recorded, int64_t first, int64_t rows) {
  return n.op->tile(n, recorded, first, rows);
}

void fill_kernel(Tensor& t, float value) { MG_DISPATCH(t.device(), fill, t, value); }

void copy_kernel(Tensor& dst, const Tensor& src) { MG_DISPATCH(Device::cuda(), copy_bytes, dst, src); }

void convert_kernel(Tensor& dst, const Tensor& src) { MG_DISPATCH(dst.device(), convert, dst, src); }

void add_into_kernel(Tensor& acc, const Tensor& g) { MG_DISPATCH(acc.device(), add_inplace, acc, g); }

Tensor add_kernel(const Tensor& a, const Tensor& b) {
  Tensor sum = Tensor::empty(a.shape(), like(a));
  MG_DISPATCH(sum.device(), add_forward, sum, a, b);
  return sum;
}

}  // namespace mg
