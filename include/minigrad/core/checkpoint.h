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

#include <minigrad/core/tensor.h>

namespace mg {

using SegmentFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs fn(inputs) as a checkpoint segment (see the Note). With grad mode off, it is just fn.
Tensor checkpoint(const SegmentFn& fn, const std::vector<Tensor>& inputs);

}  // namespace mg
