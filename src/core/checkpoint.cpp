#include <minigrad/core/checkpoint.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/tape.h"

namespace mg {

namespace {
thread_local int t_recording_depth = 0;

struct RecordingScope {
  RecordingScope() { ++t_recording_depth; }
  ~RecordingScope() { --t_recording_depth; }
};

struct GradEnabledScope {
  bool prev = GradMode::enabled();
  GradEnabledScope() { GradMode::set_enabled(true); }
  ~GradEnabledScope() { GradMode::set_enabled(prev); }
};
}  // namespace

bool checkpoint_recording() { return t_recording_depth > 0; }

Tensor checkpoint(const SegmentFn& fn, const std::vector<Tensor>& inputs) {
  if (!GradMode::enabled()) return fn(inputs);
  auto seg = std::make_shared<CheckpointSegment>();
  for (const Tensor& t : inputs) {
    MG_CHECK(t.defined(), "checkpoint: an input is undefined");
    Tensor b = t.detach();
    if (t.requires_grad()) b.requires_grad_(true);
    seg->boundary.push_back(b);
  }
  const uint64_t first_seq = next_node_seq();
  Tensor y;
  {
    RecordingScope rec;
    y = fn(seg->boundary);
  }
  MG_CHECK(y.defined(), "checkpoint: the segment function returned an undefined tensor");
  for (size_t i = 0; i < inputs.size(); ++i) {  // fn returned an input untouched: keep its history
    if (y.same(seg->boundary[i])) return inputs[i];
  }
  if (!y.grad_fn()) return y;  // nothing inside needed a gradient: nothing to drop

  // Collect the sub-tape: every node reachable from y that was recorded inside the segment.
  std::unordered_set<Node*> seen{y.grad_fn().get()};
  std::vector<std::shared_ptr<Node>> stack{y.grad_fn()};
  while (!stack.empty()) {
    std::shared_ptr<Node> n = stack.back();
    stack.pop_back();
    MG_CHECK(!n->segment, "checkpoint: nested checkpoint segments are not supported");
    seg->nodes.push_back(n);
    for (const NodeInput& in : n->inputs) {
      if (!in.fn || !seen.insert(in.fn.get()).second) continue;
      MG_CHECK(in.fn->seq >= first_seq,
               "checkpoint: the segment used a tensor computed outside it (by "
                   << node_name(*in.fn) << ", shape " << shape_str(in.shape)
                   << ") that was not passed as an input; pass it in the inputs list");
      stack.push_back(in.fn);
    }
  }
  std::sort(seg->nodes.begin(), seg->nodes.end(),
            [](const auto& a, const auto& b) { return a->seq < b->seq; });
  std::unordered_map<const TensorImpl*, size_t> boundary_index;
  for (size_t i = 0; i < seg->boundary.size(); ++i) boundary_index[seg->boundary[i].impl_ptr().get()] = i;
  for (size_t k = 0; k < seg->nodes.size(); ++k) {  // drop the activations: replay recomputes them
    Node& n = *seg->nodes[k];
    n.saved.clear();
    n.saved.shrink_to_fit();
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (!n.inputs[i].leaf.defined()) continue;
      auto it = boundary_index.find(n.inputs[i].leaf.impl_ptr().get());
      if (it == boundary_index.end()) continue;
      seg->boundary_uses.push_back({k, i, it->second});
      n.inputs[i].leaf = Tensor();
    }
  }

  auto node = std::make_shared<Node>();
  node->seq = next_node_seq();
  node->saved = std::move(seg->boundary);  // released with the node's saved tensors
  seg->boundary.clear();
  node->out_shape = y.shape();
  node->out_dtype = y.dtype();
  node->out_device = y.device();
  node->inputs.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    NodeInput& ni = node->inputs[i];
    ni.requires_grad = inputs[i].requires_grad();
    ni.fn = inputs[i].grad_fn();
    ni.shape = inputs[i].shape();
    if (!ni.fn && ni.requires_grad) ni.leaf = inputs[i];
  }
  node->segment = std::move(seg);
  Tensor out = y.detach();
  out.impl().requires_grad = true;
  out.impl().grad_fn = std::move(node);
  return out;
}

void checkpoint_backward(Node& node, Tensor grad_out, std::vector<Tensor>& grads) {
  CheckpointSegment& seg = *node.segment;
  // Fresh leaves stand in for the boundary so that gradients w.r.t. the inputs collect there.
  std::vector<Tensor> fresh;
  for (const Tensor& b : node.saved) {
    Tensor f = b.detach();
    if (b.requires_grad()) f.requires_grad_(true);
    fresh.push_back(f);
  }
  std::unordered_map<const Node*, std::vector<std::pair<size_t, size_t>>> uses;  // node -> (input, boundary)
  for (const auto& u : seg.boundary_uses) uses[seg.nodes[u.node].get()].push_back({u.input, u.boundary});
  Tensor y;
  {
    GradEnabledScope grad_on;
    RecordingScope rec;
    // Each replayed value is dropped after its last reader, so replay holds no more than the
    // first pass did.
    std::unordered_map<const Node*, Tensor> value;
    std::unordered_map<const Node*, int> readers;
    for (const auto& n : seg.nodes) {
      for (const NodeInput& ni : n->inputs) {
        if (ni.fn) ++readers[ni.fn.get()];
      }
    }
    for (const auto& n : seg.nodes) {
      std::vector<Tensor> in(n->inputs.size());
      for (size_t i = 0; i < n->inputs.size(); ++i) {
        const NodeInput& ni = n->inputs[i];
        if (ni.fn) {
          in[i] = value.at(ni.fn.get());
        } else if (ni.leaf.defined()) {
          in[i] = ni.leaf;
        }
      }
      if (auto it = uses.find(n.get()); it != uses.end()) {
        for (auto [input, b] : it->second) in[input] = fresh[b];
      }
      Tensor out = apply(*n->op, n->attrs, std::move(in));
      MG_CHECK(out.shape() == n->out_shape,
               "checkpoint replay: " << node_name(*n) << " produced shape " << shape_str(out.shape())
                                     << " but the first pass produced " << shape_str(n->out_shape));
      for (const NodeInput& ni : n->inputs) {
        if (ni.fn && --readers[ni.fn.get()] == 0) value.erase(ni.fn.get());
      }
      value[n.get()] = std::move(out);
    }
    y = value.at(seg.nodes.back().get());
  }
  MG_CHECK(y.shape() == node.out_shape, "checkpoint replay: segment output shape "
                                            << shape_str(y.shape()) << ", first pass "
                                            << shape_str(node.out_shape));
  if (y.requires_grad()) {
    // Backward needs y's node, not its values (a node that does keeps them in its saved
    // tensors), so the replayed output is not held for the whole backward of the segment.
    Tensor root(std::make_shared<TensorImpl>());
    root.impl().shape = y.shape();
    root.impl().requires_grad = true;
    root.impl().grad_fn = y.grad_fn();
    y = Tensor();
    run_backward(root, std::move(grad_out), /*retain_graph=*/false);
  }
  for (size_t i = 0; i < fresh.size(); ++i) {
    if (node.inputs[i].requires_grad) grads[i] = fresh[i].grad();
  }
}

}  // namespace mg
