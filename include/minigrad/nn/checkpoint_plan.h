// Checkpointing for chain models (Sequential): PyTorch's checkpoint_sequential, a forward pass
// that follows a plan, and a planner that picks the plan from a cost model of the chain.
//
//   auto vgg = mg::nn::make_vgg16(2, 8);
//   mg::nn::ChainCost cost = mg::nn::measure_chain(*vgg, {8, 3, 224, 224});   // one measured step
//   mg::nn::Plan plan = mg::nn::make_plan(cost, "budget=120MB");    // or none, sqrt, segments=4
//   std::printf("%s, predicted peak %zu bytes\n", plan.str().c_str(), plan.predicted_peak);
//   mg::Tensor logits = mg::nn::forward_with_plan(*vgg, plan, x);
//
// Note [checkpoint cost model]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The planner works on units: a layer, merged with the view layers (Flatten) in front of it, so
// that no unit's output shares storage with the next unit's. For each unit, one measured pass
// (allocator statistics, unit by unit, the kernels and thread count of the real run) gives:
//   out      bytes of its output;          extra   bytes its tape nodes keep besides input and
//   si, so   whether its nodes keep its    fwd     output (max-pool indices, ...);
//            input / its output;           bwd     peak above what was live, in forward
//   flops    forward work (from shapes).             (output, extra, workspace) and in backward
//                                                    (input gradient, workspace).
// With A_k the bytes of activation k (A_0 the input, A_k the output of unit k-1) and F the fixed
// part (parameters, gradient buffers, optimizer state, targets: whatever is in use when the
// planner runs, plus the targets), a training step under a plan goes:
//   forward   unit u runs with F + R + A_u + fwd_u live, where R is what earlier units keep:
//             A_k when a plain neighbour keeps it (so_{k-1} or si_k) or it is the input of a
//             checkpointed segment, plus extra_u of plain units. A segment runs like plain units,
//             then drops everything but its input.
//   loss      F + R + A_n + A_n: the logits and the probabilities; in the loss's backward
//             F + R + A_n: the logits' gradient in the probabilities' place (the caller keeps no
//             logits past the loss). bf16/f16 logits are kept instead of the probabilities, and
//             their gradient takes their place: F + R + A_n and rows of float32 in both.
//   backward  in reverse; earlier units still hold R. A plain unit: F + R + kept A_u, extra_u,
//             kept A_{u+1}, dA_{u+1} + bwd_u. A segment [s, e): its input stays live while the
//             segment is replayed like plain units (with the incoming gradient waiting) and
//             backpropagated unit by unit; the fresh boundary leaf takes the input gradient
//             at the end (without a copy: accumulate_grad takes a gradient nothing else holds).
// A tiled segment [s, e) in tiles of r rows (Note [tiled segments]; the chain measured at r rows
// too, ChainCost::tile_costs, A'_k and the unit costs' from there): its boundary A_s, its output
// A_e, and in backward the incoming gradient (A_e) and the input gradient (A_s) are live whole,
// beside one tile's units as above at r rows (the tile's input and incoming gradient are views,
// no bytes of their own); each tile's input gradient is copied into its rows of the whole.
// The predicted peak is the largest of these. The budget planner is a dynamic programme over the
// chain: the state after a prefix is (R, whether the last plain unit keeps its output), every
// constraint of a piece depends only on that state and the piece, and labels are pruned by
// Pareto dominance on (R, recomputed flops), so the result is the least recomputation of all
// plans whose predicted peak fits (tests/test_planner.cpp checks it against enumeration).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/nn/module.h>
#include <minigrad/util/bytes.h>

namespace mg::nn {

// A checkpointed range of layers [begin, end) of a Sequential, run whole or in tiles of
// tile_rows samples (Note [tiled segments] in minigrad/core/checkpoint.h; 0: whole), or
// offloaded: its activations kept in the host pool instead of recomputed (Note [offload]).
struct Segment {
  size_t begin = 0, end = 0;
  int64_t tile_rows = 0;
  bool offload = false;
  bool operator==(const Segment&) const = default;
};

struct Plan {
  std::string kind;               // "none", "segments=4", "sqrt", "budget=120MB"
  std::vector<Segment> segments;  // checkpointed layer ranges, increasing and disjoint
  size_t predicted_peak = 0;      // bytes in use at the peak of a training step (the cost model)
  double recompute_flops = 0;     // forward work done again in backward
  size_t budget = 0;              // budget= plans only
  size_t predicted_host_peak = 0; // bytes its offloaded segments hold in the host pool at once
  double offload_ms = 0;          // the link's time for them that compute does not hide
  // "[0,6) [6,12)", "[0,3)/2 [3,12)" (tiles of 2), "[0,6)@host" (offloaded), or "no checkpointing"
  std::string str() const;
};

// Runs seq's layers; every segment of the plan runs under mg::checkpoint, the rest normally.
Tensor forward_with_plan(Sequential& seq, const std::vector<Segment>& segments, const Tensor& x);
inline Tensor forward_with_plan(Sequential& seq, const Plan& plan, const Tensor& x) {
  return forward_with_plan(seq, plan.segments, x);
}

// torch.utils.checkpoint.checkpoint_sequential's split of n layers into `segments` pieces:
// size n / segments each, the first segments - 1 checkpointed, the last (with the remainder)
// run normally.
std::vector<Segment> pytorch_segments(size_t num_layers, int64_t segments);
Tensor checkpoint_sequential(Sequential& seq, int64_t segments, const Tensor& x);

// ---- cost model (Note [checkpoint cost model]) ------------------------------------------------

// Note [replay peak]
// ~~~~~~~~~~~~~~~~~~
// A replayed segment runs its recorded nodes again (replay in src/core/checkpoint.cpp), dropping
// each value after its last reader. A module's own forward may hold a value longer: a Bottleneck
// keeps its branch's output in a local until the add. So a unit can peak lower in a replay than
// in its first pass: ResNet-50/8's Bottleneck(32, 16, stride=2, downsample) by 32 KiB at batch 8,
// and plans whose peak was such a replay were predicted 16 to 32 KiB above what the step used
// (tests/test_memory_report.cpp). measure_chain runs each unit once more as a checkpointed
// segment and measures its replay (replay_peak); the model takes it for the replays in backward
// (of whole segments, and of each tile of a tiled one), and fwd_peak everywhere else (a tiled
// segment's first pass runs its later tiles without recording: less still, fwd_peak bounds it).
struct UnitCost {
  size_t begin = 0, end = 0;  // layers [begin, end)
  std::string name;
  size_t out_bytes = 0;
  size_t extra_bytes = 0;
  // Of extra_bytes, what something besides the tape holds (a module's cached position ids, say):
  // it stays on the device when the unit's segment is replayed or offloaded.
  size_t extra_held_bytes = 0;
  // Inputs without history its nodes take (position ids made in its forward, say), which a
  // checkpointed segment keeps from its first pass to its backward for the replay: leaf_bytes of
  // them also kept by a plain step (a node saves them: in extra_bytes, but not held outside the
  // tape), leaf_only_bytes of them a plain step frees at once (in no other count).
  size_t leaf_bytes = 0, leaf_only_bytes = 0;
  bool saves_input = false, saves_output = false;
  size_t fwd_peak = 0, bwd_peak = 0;
  // The forward's peak above what was live when a replayed segment runs it (Note [replay peak]);
  // 0: not measured, fwd_peak stands for it.
  size_t replay_peak = 0;
  double flops = 0;
  double forward_ms = 0;   // measured: the unit's forward, and its backward from its output's
  double backward_ms = 0;  // gradient (the joint planner's time model, minigrad/nn/train_plan.h)
  bool tiles = false;      // every op of the unit can run in tiles (Note [tiled segments])
  // The unit calls mg::checkpoint itself: the budget planner puts it in no segment of its own
  // (Note [nested segments] in minigrad/core/checkpoint.h).
  bool checkpoints_inside = false;
};

struct ChainCost {
  size_t fixed_bytes = 0;  // F
  size_t input_bytes = 0;  // A_0
  size_t head_bytes = 0;   // the loss's extra beside the logits (A_n for cross-entropy: the probabilities)
  // ... and beside the logits' gradient in the loss's backward (Note [loss gradient in place] in
  // src/ops/cross_entropy.cpp: the gradient takes the probabilities' or the low logits' place).
  size_t head_backward_bytes = 0;
  // The head's bytes were measured by running the loss (MeasureOptions::head), not modelled as
  // cross_entropy's: head_bytes and head_backward_bytes are then everything the loss's forward and
  // backward add beside the chain's output, which the loss holds until its backward, and whose
  // gradient that backward makes.
  bool head_measured = false;
  bool input_requires_grad = false;
  size_t num_layers = 0;
  std::vector<UnitCost> units;
  // The same chain measured at fewer rows (increasing): the tile sizes a plan may use for segments
  // (Note [tiled segments]). Only their units are read.
  std::vector<ChainCost> tile_costs;
  int64_t rows = 0;  // the batch this chain was measured at
  // The host link for offloaded segments (Note [offload] in minigrad/core/checkpoint.h): bytes
  // per millisecond to the host pool and back, measured by measure_chain (MeasureOptions::offload).
  // 0: plans offload nothing.
  double to_host_bytes_per_ms = 0, from_host_bytes_per_ms = 0;
  size_t host_limit = 0;  // the host pool's cap (mg::set_host_memory_limit) when measured; 0: none
  // The copies run beside compute (CUDA's copy stream), hidden where there is compute to hide
  // behind (Note [offload schedule]); on the CPU the thread that runs the model makes them.
  bool copies_overlap = false;
  // Parts of fixed_bytes the measuring knows: the int64 targets of the loss, under autocast the
  // parameters' low-precision copies (Note [autocast]), and the next micro-batch's inputs and
  // targets on the device while this one computes (MeasureOptions::staged_batches).
  size_t target_bytes = 0, weight_copy_bytes = 0, staged_bytes = 0;
  size_t activation_bytes(size_t k) const { return k == 0 ? input_bytes : units.at(k - 1).out_bytes; }
  const ChainCost* tile_cost(int64_t tile_rows) const;  // null when not measured at tile_rows
};

struct MeasureOptions {
  // Bytes in use besides the model's own tensors during a step; by default what is in use when
  // measure_chain is called (parameters, gradient buffers, optimizer state) plus int64 targets.
  bool fixed_from_allocator = true;
  size_t fixed_bytes = 0;  // used when fixed_from_allocator is false; added to it otherwise
  bool cross_entropy_head = true;
  // The loss, to run on the chain's output instead of modelling cross_entropy on it (a GPT whose
  // loss is its head too: linear_cross_entropy): measure_chain runs head(out, head_targets(rows))
  // and its backward once and reads the bytes they add from the allocator (ChainCost::
  // head_measured). The targets are made first: they count in the fixed part, as cross_entropy's.
  std::function<Tensor(const Tensor& out, const Tensor& targets)> head;
  std::function<Tensor(int64_t rows)> head_targets;
  // The loss's int64 targets per row, counted in the fixed part with the head: a class per sample,
  // or a GPT's token per position (T per row).
  int64_t targets_per_row = 1;
  // Batches of the input (x's shape and dtype) and its int64 targets held on the device beside the
  // step's own, counted in the fixed part: mg::Trainer's next micro-batch, copied while this one
  // computes (Note [prefetched micro-batches] in minigrad/train/trainer.h).
  int64_t staged_batches = 0;
  // Also measure the chain at these numbers of rows (those below the batch), for tiled segments.
  std::vector<int64_t> tile_rows;
  // The same chain already measured at some of those rows (mg::Trainer's pre-flight check measures
  // one and two samples): taken as they are instead of measuring them again. Only a tile's units
  // are read (ChainCost::tile_costs), so what options they were measured under does not matter.
  std::vector<ChainCost> tiles_measured;
  // The caller's gradient buffers are all zero (mg::Trainer zeroes them before it measures):
  // measure_chain zeroes them again afterwards instead of keeping a copy in host memory and writing
  // it back (VGG16's: 0.55 GB each way, on a GPU over the bus, for every measurement). On the CPU
  // a buffer that is not zero is an mg::Error; there, buffers whose bits are all zero are found
  // and zeroed again without this.
  bool gradients_zero = false;
  // Whether plans may offload segments (Note [offload] in minigrad/core/checkpoint.h): on, the
  // host link's rate is measured (ChainCost::to_host_bytes_per_ms). automatic: on CUDA devices
  // only; on a CPU the host pool is the same memory, so offloading there is an emulation (the
  // tests' and --offload's), not a saving.
  enum class Offload { automatic, on, off };
  Offload offload = Offload::automatic;
  // profile_chain (minigrad/nn/train_plan.h) calls this before measuring each micro-batch size
  // (progress: measuring a large one can take a while).
  std::function<void(int64_t rows)> on_measure;
  // profile_chain: stop after a micro-batch of at least 64 rows whose forward and backward take,
  // per sample, more than 97% of the best smaller size's (larger ones would only be slower to
  // measure and hold more; mg::Trainer sets it, so that a batch of a million samples is planned in
  // seconds).
  bool stop_when_flat = false;
  // profile_chain: time each micro-batch size this many times and keep each unit's least forward
  // and backward time (Note [joint plan] in minigrad/nn/train_plan.h: a timing's noise only adds).
  int timing_passes = 1;
};

// 1, 2, 4, ... below `rows`: the tile sizes measure_chain is asked for by the apps.
std::vector<int64_t> tile_rows_below(int64_t rows);

// One measured pass through seq (in its current train/eval mode, on x's device): the cost of
// every unit. Parameter gradients, buffers and the generators dropout draws from (the default
// one and the chain's own: Module::generators) are left as they were; the device's peak
// statistics are reset at the end.
ChainCost measure_chain(Sequential& seq, const Tensor& x, const MeasureOptions& opts = {});
ChainCost measure_chain(Sequential& seq, const Shape& input_shape, const MeasureOptions& opts = {});

// The cost model's peak and recomputation for checkpointed layer ranges (which must start and
// end on unit boundaries).
size_t predict_peak(const ChainCost& cost, const std::vector<Segment>& segments);
double recompute_flops(const ChainCost& cost, const std::vector<Segment>& segments);
// Offload: whether plans may use it (the chain has a host link and measured times), the host
// pool's predicted peak (every offloaded segment's bytes: they are all there at the end of
// forward), and the link's milliseconds a step that compute does not hide (all of them unless
// ChainCost::copies_overlap).
bool offload_offered(const ChainCost& cost);
size_t predict_host_peak(const ChainCost& cost, const std::vector<Segment>& segments);
double offload_ms(const ChainCost& cost, const std::vector<Segment>& segments);

// The predicted peak and the moment it happens at.
struct PeakBreakdown {
  size_t peak = 0;
  size_t unit = 0;             // the unit running at the peak
  std::string phase;           // forward, backward, replay, loss, ...
  size_t kept_by_earlier = 0;  // R at that moment: bytes earlier units keep
  // R by what keeps it: plain units, the boundaries of replayed (and tiled) segments, the
  // boundaries and saved outputs of offloaded ones.
  size_t kept_plain = 0, kept_replayed = 0, kept_offloaded = 0;
  std::string where;           // all of it in words
};
PeakBreakdown explain_peak(const ChainCost& cost, const std::vector<Segment>& segments);

// What a plan does with each unit's activations: kept on the device from its forward to its
// backward, dropped and recomputed, or offloaded to the host pool. A segment's boundary (its input,
// kept on the device) is counted for the segment's first unit.
struct UnitMemory {
  std::string choice;     // keep | recompute | offload | tiles of R
  size_t kept = 0;        // device bytes it keeps through the step (by the cost model)
  size_t dropped = 0;     // bytes a plain run would keep that replay recomputes
  size_t offloaded = 0;   // bytes it moves to the host pool
};
std::vector<UnitMemory> unit_memory(const ChainCost& cost, const std::vector<Segment>& segments);

// Plans. `spec` is none | sqrt | segments=K | budget=SIZE | min, or the segments themselves as
// Plan::str() prints them ("[0,3)@host [3,6)/4 [8,12)", kind "given"). sqrt is segments=K with
// K = round(sqrt(number of layers)), as Chen et al. (2016) and PyTorch's split.
Plan plan_none(const ChainCost& cost);
Plan plan_segments(const ChainCost& cost, int64_t segments);  // PyTorch's split, snapped to units
Plan plan_sqrt(const ChainCost& cost);
Plan plan_budget(const ChainCost& cost, size_t budget);  // throws below min_feasible_peak
Plan plan_min_peak(const ChainCost& cost);               // the lowest predicted peak of any plan
size_t min_feasible_peak(const ChainCost& cost);
Plan make_plan(const ChainCost& cost, const std::string& spec);
// Throws mg::Error, as make_plan would, unless `spec` is a plan's spelling with a valid value; it
// needs no costs, so an app checks --checkpoint before it measures.
void check_plan_spec(const std::string& spec);

// budget=SIZE is read, and plans report sizes, with <minigrad/util/bytes.h>; its two functions
// keep their old names here, where they were declared before they had a header of their own.
using mg::format_bytes;
using mg::parse_bytes;

}  // namespace mg::nn
