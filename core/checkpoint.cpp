#include "core/checkpoint.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

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
  if (!y.grad_fn()) return y;  // nothing inside needed a gradient: nothing to drop

  // Collect the sub-tape: every node reachable from y that was recorded inside the segment.
  std::unordered_set<Node*> seen{y.grad_fn().get()};
  std::vector<std::shared_ptr<Node>> stack{y.grad_fn()};
  while (!stack.empty()) {
    std::shared_ptr<Node> n = stack.back();
    stack.pop_back();
    MG_CHECK(n->op != OpKind::checkpoint, "checkpoint: nested checkpoint segments are not supported");
    seg->nodes.push_back(n);
    for (const NodeInput& in : n->inputs) {
      if (!in.fn || !seen.insert(in.fn.get()).second) continue;
      MG_CHECK(in.fn->seq >= first_seq,
               "checkpoint: the segment used a tensor computed outside it (by "
                   << op_name(in.fn->op) << ", shape " << shape_str(in.shape)
                   << ") that was not passed as an input; pass it in the inputs list");
      stack.push_back(in.fn);
    }
  }
  std::sort(seg->nodes.begin(), seg->nodes.end(),
            [](const auto& a, const auto& b) { return a->seq < b->seq; });
  for (auto& n : seg->nodes) {  // drop the activations: replay recomputes them
    n->saved.clear();
    n->saved.shrink_to_fit();
  }

  auto node = std::make_shared<Node>();
  node->op = OpKind::checkpoint;
  node->seq = next_node_seq();
  node->saved = seg->boundary;
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

void checkpoint_backward(Node& node, const Tensor& grad_out, std::vector<Tensor>& grads) {
  CheckpointSegment& seg = *node.segment;
  // Fresh leaves stand in for the boundary so that gradients w.r.t. the inputs collect there.
  std::unordered_map<const TensorImpl*, Tensor> boundary;
  std::vector<Tensor> fresh;
  for (const Tensor& b : node.saved) {
    Tensor f = b.detach();
    if (b.requires_grad()) f.requires_grad_(true);
    boundary[b.impl_ptr().get()] = f;
    fresh.push_back(f);
  }
  Tensor y;
  {
    GradEnabledScope grad_on;
    RecordingScope rec;
    std::unordered_map<const Node*, Tensor> value;
    for (const auto& n : seg.nodes) {
      std::vector<Tensor> in(n->inputs.size());
      for (size_t i = 0; i < n->inputs.size(); ++i) {
        const NodeInput& ni = n->inputs[i];
        if (ni.fn) {
          in[i] = value.at(ni.fn.get());
        } else if (ni.leaf.defined()) {
          auto it = boundary.find(ni.leaf.impl_ptr().get());
          in[i] = it != boundary.end() ? it->second : ni.leaf;
        }
      }
      Tensor out = apply(n->op, n->attrs, std::move(in));
      MG_CHECK(out.shape() == n->out_shape,
               "checkpoint replay: " << op_name(n->op) << " produced shape " << shape_str(out.shape())
                                     << " but the first pass produced " << shape_str(n->out_shape));
      value[n.get()] = std::move(out);
    }
    y = value.at(seg.nodes.back().get());
  }
  MG_CHECK(y.shape() == node.out_shape, "checkpoint replay: segment output shape "
                                            << shape_str(y.shape()) << ", first pass "
                                            << shape_str(node.out_shape));
  if (y.requires_grad()) run_backward(y, grad_out, /*retain_graph=*/false);
  for (size_t i = 0; i < fresh.size(); ++i) {
    if (node.inputs[i].requires_grad) grads[i] = fresh[i].grad();
  }
}

}  // namespace mg
