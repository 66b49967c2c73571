// Gradient checkpointing, native to the tape.
//
//   // y = block(x), but block's activations are freed after the forward pass and
//   // recomputed when backward reaches them.
//   Tensor y = mg::checkpoint([&](const std::vector<Tensor>& in) { return block.forward(in[0]); }, {x});
//
// Note [checkpoint replay]
// ------------------------
// The segment runs once normally, recording its ops as nodes (a sub-tape) rooted at detached
// copies of its inputs (the boundary). When the function returns, every tensor the sub-tape
// saved is released; only the boundary tensors are kept, as the saved tensors of one
// `checkpoint` node that takes the segment's place in the outer tape. When backward reaches that
// node, the sub-tape is replayed: each recorded (op, attrs) runs again, in recording order, on
// the replayed values of its inputs, recording a fresh sub-tape; backward runs through it and is
// released again. Replay re-runs recorded ops, not the user's function, so:
//   - it is exact: the same kernels on the same values; dropout's (seed, offset) is part of the
//     op's attrs, so the mask is the one of the first pass, and nothing of it is stored;
//   - side effects of the function (a norm layer's running statistics, counters, prints) are
//     not repeated: they were never on the tape;
//   - each replayed output is checked against the shape recorded in the first pass.
// Gradients of parameters used inside land in their .grad as without checkpointing, and in the
// same order, since replayed nodes keep the relative order of the first pass.
#pragma once

#include <functional>
#include <vector>

#include "core/autograd.h"

namespace mg {

using SegmentFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs fn(inputs) as a checkpoint segment (see the Note). With grad mode off, it is just fn.
Tensor checkpoint(const SegmentFn& fn, const std::vector<Tensor>& inputs);

struct CheckpointSegment {
  std::vector<std::shared_ptr<Node>> nodes;  // the sub-tape, in recording order
  std::vector<Tensor> boundary;  // detached inputs while recording; then the checkpoint node's saved
  // Where the sub-tape read a boundary tensor: (node index, input index, boundary index). The
  // nodes do not keep those tensors themselves, so releasing the checkpoint node's saved
  // boundary frees it even while the outer graph is still alive.
  struct BoundaryUse {
    size_t node, input, boundary;
  };
  std::vector<BoundaryUse> boundary_uses;
};

// True while a segment's forward pass records (ops then keep inputs that have no history).
bool checkpoint_recording();

// The gradient rule of a checkpoint node (called from core/gradients.cpp).
// grad_out goes on to the replayed segment's backward, which frees it after the segment's last op.
void checkpoint_backward(Node& node, Tensor grad_out, std::vector<Tensor>& grads);

}  // namespace mg
