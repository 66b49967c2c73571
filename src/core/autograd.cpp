#include "core/tape.h"

#include <algorithm>
#include <atomic>
#include <unordered_map>
#include <unordered_set>


namespace mg {

namespace {
thread_local bool t_grad_enabled = true;
std::atomic<uint64_t> g_next_seq{1};
thread_local const GradReadyHook::Fn* t_ready_hook = nullptr;
thread_local int t_backward_depth = 0;  // > 1: a checkpoint segment's backward inside another
thread_local bool t_retain_graph = false;
std::atomic<uint64_t> g_relu_masks_in_consumer{0};
thread_local const std::vector<const TensorImpl*>* t_relu_leaves = nullptr;  // ReluBoundaryScope

struct DepthScope {
  bool prev_retain = t_retain_graph;
  explicit DepthScope(bool retain) {
    ++t_backward_depth;
    t_retain_graph = retain;
  }
  ~DepthScope() {
    --t_backward_depth;
    t_retain_graph = prev_retain;
  }
};

// Note [gradient-ready hooks]: for each position in `order`, the leaves whose last gradient
// contribution it adds (a segment node adds to every leaf its sub-tape uses). Within one
// position, leaves come in the order the node lists them (a sub-tape's nodes last first): the
// report depends on the graph only.
std::vector<std::vector<Tensor>> leaves_finished(const std::vector<Node*>& order) {
  struct Use {
    Tensor leaf;
    size_t pos = 0, rank = 0;  // rank: the order of the leaf's last listing
  };
  std::unordered_map<const TensorImpl*, Use> last;
  size_t listed = 0;
  auto note = [&](const NodeInput& in, size_t pos) {
    if (in.fn || !in.requires_grad || !in.leaf.defined()) return;
    Use& u = last[in.leaf.impl_ptr().get()];
    u.leaf = in.leaf;
    u.pos = pos;  // `order` runs backward: a later position is a later use in backward
    u.rank = listed++;
  };
  for (size_t pos = 0; pos < order.size(); ++pos) {
    for (const NodeInput& in : order[pos]->inputs) note(in, pos);
    if (order[pos]->segment) {  // its sub-tape in backward's order too (nodes are in forward order)
      const auto& nodes = order[pos]->segment->nodes;
      for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
        for (const NodeInput& in : (*it)->inputs) note(in, pos);
      }
    }
  }
  std::vector<std::vector<Use>> by_pos(order.size());
  for (auto& [key, u] : last) by_pos[u.pos].push_back(std::move(u));
  std::vector<std::vector<Tensor>> out(order.size());
  for (size_t pos = 0; pos < order.size(); ++pos) {
    std::sort(by_pos[pos].begin(), by_pos[pos].end(), [](const Use& a, const Use& b) { return a.rank < b.rank; });
    for (Use& u : by_pos[pos]) out[pos].push_back(std::move(u.leaf));
  }
  return out;
}
}  // namespace

GradReadyHook::GradReadyHook(Fn fn) : fn_(std::move(fn)), previous_(t_ready_hook) { t_ready_hook = &fn_; }
GradReadyHook::~GradReadyHook() { t_ready_hook = previous_; }
const GradReadyHook::Fn* GradReadyHook::current() { return t_ready_hook; }

bool GradMode::enabled() { return t_grad_enabled; }
void GradMode::set_enabled(bool on) { t_grad_enabled = on; }
const char* node_name(const Node& n) { return n.segment ? "checkpoint" : op_name(*n.op); }

bool backward_retains_graph() { return t_retain_graph; }

uint64_t next_node_seq() { return g_next_seq.fetch_add(1, std::memory_order_relaxed); }

bool sole_owner(const Tensor& t) {
  return t.impl_ptr().use_count() == 1 && t.impl().storage.use_count() == 1 && !t.impl().grad_fn;
}

void accumulate_grad(const Tensor& leaf, const Tensor& g) {
  MG_CHECK(g.shape() == leaf.shape(), "gradient of shape " << shape_str(g.shape())
                                          << " for a leaf of shape " << shape_str(leaf.shape()));
  Tensor cur = leaf.grad();
  if (!cur.defined()) {
    // The incoming gradient may alias another (add's backward hands the same tensor to both
    // inputs; a view's backward hands on its incoming gradient's storage), so the leaf gets its
    // own copy, which later accumulation may modify in place. A gradient nothing else refers to
    // (one handle, its storage not shared) is taken as it is: no second tensor of its size.
    leaf.set_grad(sole_owner(g) ? g.detach() : g.clone());
    return;
  }
  add_into_kernel(cur, g);
}

// Note [adding into pending gradients]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A node's output read twice (a residual stream: the next block's layer_norm and the residual
// add) gets two gradients, which backward sums: the first waits in `pending`, and the second used
// to come from its rule as a new tensor, then be added in (add_into_kernel) and freed. A rule that
// says so (OpDef::adds_into_pending) is handed the waiting gradient as accum[i] instead, when
// nothing else holds it and it has the input's dtype and shape, and adds its result straight into
// it: one gradient-sized buffer and two passes over memory fewer. llm.c's layernorm_backward adds
// into dresidual the same way. The rule adds as add_into_kernel would (its result rounded to the
// buffer's dtype, then added in float32 and rounded), so the bits do not change; test_autograd
// checks them and the buffer saved.
//
// Note [relu mask in the consumer]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A ReLU's backward masks its output's gradient by y > 0. When that gradient comes from one op
// alone, and that op keeps y as its own input (conv2d keeps x for dW), the op can apply the mask
// as it makes the gradient: on CUDA, under set_cudnn_dgrad_fusion, cuDNN's data gradient with
// RELU_BWD as one graph (dgrad + dReLU), one pass over the gradient and one launch fewer; else
// the ReLU's kernel in place on the data gradient. Backward counts, for each ReLU output
// (relu_source: the output of a node with op_masks_by_relu, i.e. relu and conv2d and batch_norm
// with the ReLU fused; in a checkpoint segment's backward also a leaf standing for a boundary
// tensor that such a node outside made, ReluBoundaryScope), the inputs of this backward's nodes
// that read it. A reader whose rule takes the mask (rule_takes_relu_mask: OpDef::takes_relu_mask,
// the input kept as it came) is asked to mask (Node::mask_inputs_by_relu) where it is the only
// one, and the ReLU's rule is told that its gradient comes masked (Node::grad_masked_by_relu)
// when every reader masked, and skips its own. The mask is y > 0 (a select) wherever it is
// applied, and applying it to a part of a sum the ReLU masks again changes no bit: the bits do
// not change (test_ops checks them, with the move on and off), except that cuDNN's graph sums the
// data gradient in its own order. Where that graph may run (relu_mask_every_reader), every
// reader that can mask does, so that a conv2d's choice does not depend on how many readers a
// checkpoint plan leaves in one backward; the boundary leaves serve the same end.
uint64_t relu_masks_in_consumer() { return g_relu_masks_in_consumer.load(); }

ReluBoundaryScope::ReluBoundaryScope(std::vector<const TensorImpl*> leaves) : leaves_(std::move(leaves)), prev_(t_relu_leaves) {
  t_relu_leaves = &leaves_;
}
ReluBoundaryScope::~ReluBoundaryScope() { t_relu_leaves = prev_; }

namespace {
// Note [relu mask in the consumer]: the ReLU whose output an input is (its node, or the leaf of a
// segment's boundary that a ReLU outside made), or null.
const void* relu_source(const NodeInput& in) {
  if (in.fn) return op_masks_by_relu(*in.fn) ? in.fn.get() : nullptr;
  if (t_relu_leaves == nullptr || !in.leaf.defined()) return nullptr;
  const TensorImpl* impl = in.leaf.impl_ptr().get();
  for (const TensorImpl* l : *t_relu_leaves)
    if (l == impl) return impl;
  return nullptr;
}
}  // namespace

void run_backward(const Tensor& root, Tensor grad, bool retain_graph) {
  const DepthScope depth(retain_graph);
  if (t_backward_depth == 1) offload_backward_starts();  // Note [offload schedule]
  const GradReadyHook::Fn* hook = t_backward_depth == 1 ? t_ready_hook : nullptr;
  if (root.is_leaf()) {
    accumulate_grad(root, grad);
    if (hook && root.requires_grad()) (*hook)(root);
    return;
  }
  // Every node reachable through inputs that require grad, in decreasing sequence order: a
  // topological order, and the exact reverse of the forward pass (see minigrad/core/autograd.h).
  std::vector<Node*> order;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack{root.grad_fn().get()};
  seen.insert(stack.back());
  std::unordered_map<const void*, int> relu_readers;  // by relu_source: Note [relu mask in the consumer]
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    order.push_back(n);
    for (const NodeInput& in : n->inputs) {
      if (!in.requires_grad) continue;
      if (const void* src = relu_source(in)) ++relu_readers[src];
      if (in.fn && seen.insert(in.fn.get()).second) stack.push_back(in.fn.get());
    }
  }
  std::sort(order.begin(), order.end(), [](Node* a, Node* b) { return a->seq > b->seq; });

  // Note [gradient-ready hooks]: the leaves each position finishes.
  const std::vector<std::vector<Tensor>> finishes = hook ? leaves_finished(order) : std::vector<std::vector<Tensor>>{};
  auto finish = [&](size_t pos) {
    if (!hook) return;
    for (const Tensor& leaf : finishes[pos]) (*hook)(leaf);
  };

  std::unordered_map<Node*, Tensor> pending;  // gradient w.r.t. each node's output
  std::unordered_map<const void*, int> masked;  // relu_source: how many of its readers masked
  pending[root.grad_fn().get()] = std::move(grad);
  std::vector<Tensor> grads, accum;
  for (size_t pos = 0; pos < order.size(); ++pos) {
    Node* n = order[pos];
    auto it = pending.find(n);
    if (it == pending.end()) {
      finish(pos);
      continue;
    }
    Tensor g = std::move(it->second);
    pending.erase(it);
    if (t_backward_depth == 1) offload_node_reached(n);  // Note [offload schedule]
    MG_CHECK(!n->released,
             "backward through the graph a second time: the tensors saved by "
                 << node_name(*n)
                 << " were freed by the first backward. Pass retain_graph=true to the first "
                    "backward if you need to backpropagate twice.");
    grads.assign(n->inputs.size(), Tensor());
    accum.assign(n->inputs.size(), Tensor());
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      const NodeInput& in = n->inputs[i];
      if (!in.requires_grad) continue;
      // Note [adding into pending gradients]: a rule that adds into what it is handed takes a
      // leaf's buffer, as a gradient pending for a node's output, only where that gives a separate
      // gradient's bits (the input's dtype) and it is not the incoming gradient's storage.
      const bool adds = !n->segment && op_adds_into_pending(*n, i);
      if (!in.fn) {
        Tensor buf = in.leaf.grad();
        if (!adds || (buf.defined() && rule_adds_into_pending(*n, i) && buf.dtype() == in.dtype && !buf.shares_storage(g)))
          accum[i] = std::move(buf);
      } else if (adds && rule_adds_into_pending(*n, i)) {
        const auto slot = pending.find(in.fn.get());
        if (slot != pending.end() && sole_owner(slot->second) && slot->second.dtype() == in.dtype &&
            slot->second.shape() == in.shape)
          accum[i] = slot->second;
      }
    }
    // Note [relu mask in the consumer]: the one reader of a ReLU's output masks its gradient.
    // Its gradient comes masked when every reader masked its part.
    if (const auto done = masked.find(n); done != masked.end()) {
      n->grad_masked_by_relu = done->second == relu_readers[n];
      masked.erase(done);
    } else {
      n->grad_masked_by_relu = false;
    }
    n->mask_inputs_by_relu = 0;
    const bool every_reader = relu_mask_every_reader();
    for (size_t i = 0; i < n->inputs.size() && i < 8 && !n->segment; ++i) {
      const NodeInput& in = n->inputs[i];
      const void* src = in.requires_grad ? relu_source(in) : nullptr;
      if (src == nullptr || !rule_takes_relu_mask(*n, i)) continue;
      if (every_reader || relu_readers[src] == 1) n->mask_inputs_by_relu |= uint8_t(1u << i);
    }
    if (n->segment) checkpoint_backward(*n, std::move(g), grads);
    else backward_rule(*n, std::move(g), grads, accum);
    g = Tensor();
    for (size_t i = 0; i < n->inputs.size() && n->mask_inputs_by_relu != 0; ++i) {
      if ((n->mask_inputs_by_relu >> i & 1u) == 0 || !grads[i].defined()) continue;
      if (n->inputs[i].fn) ++masked[n->inputs[i].fn.get()];
      ++g_relu_masks_in_consumer;
    }
    n->mask_inputs_by_relu = 0;
    n->grad_masked_by_relu = false;
    if (!retain_graph && !n->saved.empty()) {
      n->saved.clear();
      n->saved.shrink_to_fit();
      n->released = true;
    }
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      const NodeInput& in = n->inputs[i];
      if (!in.requires_grad || !grads[i].defined()) continue;
      if (!in.fn) {
        accumulate_grad(in.leaf, grads[i]);
      } else {
        Tensor& slot = pending[in.fn.get()];
        if (!slot.defined()) {
          slot = std::move(grads[i]);
        } else if (sole_owner(slot)) {
          add_into_kernel(slot, grads[i]);  // the same bits as add_kernel's new tensor, without it
        } else {
          slot = add_kernel(slot, grads[i]);
        }
      }
      grads[i] = Tensor();
    }
    finish(pos);
  }
}

}  // namespace mg
