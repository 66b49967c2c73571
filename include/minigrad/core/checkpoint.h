// Gradient checkpointing, native to the tape.
//
//   // y = block(x), but block's activations are freed after the forward pass and
//   // recomputed when backward reaches them.
//   mg::Tensor y = mg::checkpoint([&](const std::vector<mg::Tensor>& in) { return block.forward(in[0]); }, {x});
//
// Note [checkpoint replay]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
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
//
// Note [tiled segments]
// ~~~~~~~~~~~~~~~~~~~~~~
// A segment's backward holds, at its peak, a few of its activations at the whole batch: the
// floor that no choice of segments goes below (docs/checkpointing.md). With tile_rows = r, the
// segment runs on rows [0, r), [r, 2r), ... of its inputs (dim 0, the batch) one tile at a time,
// in forward and in backward, so only its input, its output, their gradients and one tile's
// activations are ever live. The math does not change:
//   - the first tile is recorded (fn runs once, on rows [0, r)); the others replay its nodes, each
//     op's attributes moved to the tile's rows (OpDef::tile: dropout's counters start that many
//     samples later, a reshape's batch dimension follows); an op that mixes samples (a loss) is
//     refused, as is a node whose output does not keep the batch first, and linear: its SGEMM
//     (Eigen's) takes other code paths, with other rounding, for another number of rows;
//   - every kernel computes a sample's rows the same way whatever else is in the batch, and the
//     weight gradients are added into the optimizer's buffers one sample at a time in sample
//     order (Note [sums in sample order], Note [weight gradients in sample order]), so on the CPU
//     the parameters' gradients have the same bits for any tile size (tests/test_checkpoint.cpp);
//   - tiles run in row order; each tile's input gradient is copied into its rows of the whole.
//
// Note [nested segments]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A segment that calls mg::checkpoint inside (a block that checkpoints itself, within a range a
// plan checkpoints) runs the inner call as part of the outer segment: its ops are recorded on the
// outer sub-tape like any others, dropped with them after the forward, and replayed with them in
// the outer segment's backward. The result is the same bits as without either checkpoint; the
// memory is the outer segment's (the inner one's savings do not apply while the outer one is
// replayed, and its tile_rows is not used). The checkpoint planner keeps a unit that checkpoints
// itself out of its segments (UnitCost::checkpoints_inside in minigrad/nn/checkpoint_plan.h), so
// the plans it makes are predicted right.
//
// Note [offload]
// ~~~~~~~~~~~~~~~
// An offloaded segment (CheckpointOptions::offload) records its sub-tape as a checkpointed one
// does, and keeps the boundary on the device the same way, but keeps what its nodes saved: when
// the function returns, each storage that only those saved tensors hold is copied to the host pool
// (mg::host_memory_stats in minigrad/core/memory.h) and its device copy freed. Storages held by
// something else stay where they are: parameters, cached low-precision weights, the boundary, and
// the segment's output (a layer that saves its output keeps it on the device, as a plain one
// would). When backward reaches the segment, the storages come back to the devices they left,
// and backward runs through the recorded nodes themselves, with fresh leaves for the boundary as
// in a replay: the nodes, their order and their kernels are those of a run without the segment,
// so the gradients have the same bits. Nothing is recomputed; the cost is two copies of the
// offloaded bytes. On the CPU the host pool is ordinary memory apart from the CPU allocator: an
// emulation in which the "device" is the capped CPU allocator, for tests of the bytes and the
// math. With CUDA it is page-locked, and the copies run on a copy stream of the device's own
// (src/kernels/cuda/offload.cu), beside the kernels.
//
// Note [offload schedule]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// When the copies happen and when their memory goes, the same on every device, so that the
// checkpoint cost model (minigrad/nn/checkpoint_plan.h) predicts the peak on the CPU emulation
// and on a GPU alike:
//   - to the host: queued when the segment's forward ends; the device copies stay allocated
//     through the next unit's forward (forward_with_plan marks the end of each unit), so that on
//     a GPU the copy runs beside that unit's kernels; then the host waits for the copy (done by
//     then, if the link kept up) and frees them. A backward starting frees any still waiting.
//   - back: the last offloaded segment's activations start coming back when backward reaches the
//     chain's output (forward_with_plan's result: after the loss's backward, the largest moment
//     of a GPT's step); each offloaded segment, when backward reaches it, waits for its own, then
//     starts bringing
//     back the offloaded segment before it, so that its copy runs beside this segment's backward
//     and that of the units between the two. Device memory for a fetch is taken when it starts.
// mg::checkpoint(..., {.offload = true}) called outside forward_with_plan keeps the device copies
// until the next offloaded segment ends or backward starts, and its first fetch starts with the
// backward.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg {

using SegmentFn = std::function<Tensor(const std::vector<Tensor>&)>;

struct CheckpointOptions {
  // Rows of the batch (the inputs' first dimension, equal for all of them) per tile
  // (Note [tiled segments]); 0, or at least the batch, runs the segment whole.
  int64_t tile_rows = 0;
  // Keep the activations instead of recomputing them, in the host pool between forward and
  // backward (Note [offload]). Not with tiles.
  bool offload = false;
};

// Runs fn(inputs) as a checkpoint segment (see the Notes). With grad mode off, it is just fn.
// Several outputs: mg::checkpoint_multi (minigrad/ops/ops.h).
Tensor checkpoint(const SegmentFn& fn, const std::vector<Tensor>& inputs, const CheckpointOptions& opts = {});

}  // namespace mg
