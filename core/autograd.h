// The reverse-mode tape. Every recorded op is a Node: its kind and attributes, where each input
// came from, the tensors its backward needs (`saved`) and the metadata of its one output.
// Nodes are owned through the outputs' grad_fn, so a graph nobody can reach frees itself.
//
// Order: each node gets an increasing sequence number when recorded; a node's inputs always
// have smaller numbers, so backward visits the reachable nodes in decreasing order, which is
// both a topological order and the exact reverse of the forward pass. Checkpoint replay relies
// on that (Note [checkpoint replay]).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/ops.h"
#include "core/tensor.h"

namespace mg {

struct CheckpointSegment;

struct NodeInput {
  std::shared_ptr<Node> fn;  // producer, or null when the input had no history
  Tensor leaf;       // the input itself when it has no producer and is needed (grad or replay)
  bool requires_grad = false;
  Shape shape;       // the input's shape, for rules that need only that and for replay checks
};

struct Node {
  OpKind op;
  OpAttrs attrs;
  uint64_t seq = 0;
  std::vector<NodeInput> inputs;
  std::vector<Tensor> saved;  // what backward needs; released after use
  Shape out_shape;
  DType out_dtype = DType::f32;
  Device out_device;
  bool released = false;      // saved tensors were freed by a backward without retain_graph
  std::shared_ptr<CheckpointSegment> segment;  // op == checkpoint only
};

// Gradient mode: ops record nothing while a NoGradGuard is alive (per thread).
class GradMode {
 public:
  static bool enabled();
  static void set_enabled(bool on);
};

class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

uint64_t next_node_seq();

// Runs backward from `root` with incoming gradient `grad` (same shape as root). `grad` is taken
// by value and, like every gradient in flight, dropped as soon as its node's rule has run.
void run_backward(const Tensor& root, Tensor grad, bool retain_graph);

// Adds `g` into the leaf's gradient: `grad += g` through the add-in-place kernel, or a copy of
// `g` when the leaf has no gradient yet.
void accumulate_grad(const Tensor& leaf, const Tensor& g);

// Backward of one node: fills grads[i] for each input i with requires_grad. When accum[i] is
// defined (the leaf's existing gradient buffer), a rule may add its result straight into it and
// leave grads[i] undefined, saving a temporary and a pass over memory. Defined in gradients.cpp.
// grad_out is owned by the rule, so that one may release it early (the checkpoint rule hands it
// to the backward of its replayed segment, which frees it after the segment's last op).
void backward_rule(Node& node, Tensor grad_out, std::vector<Tensor>& grads,
                   const std::vector<Tensor>& accum);

}  // namespace mg
