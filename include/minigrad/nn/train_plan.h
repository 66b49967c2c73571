// One memory budget, any effective batch: the micro-batch, the accumulation and the checkpoint
// plan chosen together (Note [joint plan]).
//
//   auto vgg = mg::nn::make_vgg16(10, 8);
//   mg::nn::TrainPlan p = mg::nn::plan_training(*vgg, {3, 224, 224}, 32, mg::parse_bytes("300MB"));
//   std::printf("%s\n", p.str().c_str());  // "micro-batch 8 x 4 (32 per step), checkpoint [0,6) ..."
//   // then: a DataLoader of p.micro_batch, an Accumulator of p.accumulation steps, and
//   // mg::nn::forward_with_plan(*vgg, p.checkpoint, x) for every micro-batch.
//
// Note [joint plan]
// ~~~~~~~~~~~~~~~~~~
// A user has B samples per optimizer step (the effective batch) and a budget of bytes. With
// exact accumulation (minigrad/optim/accumulate.h) any split of B into micro-batches gives the
// same update, so the split is free to choose, and so is the checkpoint plan of each micro-batch.
// The planner measures the chain (measure_chain) at a few micro-batch sizes b, by default
// b = ceil(B / 2^k) down to 1 (so that B's windows are as even as they can be); each measurement
// is one forward and backward of b samples, unit by unit, so measuring all of them costs about
// two steps of B samples and never holds more than one unit's activations. With
// MeasureOptions::timing_passes above 1 each size is timed that many times and each unit keeps
// its least time: noise (another process, a page fault) only ever adds time, and with one timing
// the choice between two nearly equal plans can follow it from run to run. For each b, the
// checkpoint plan that fits the budget with the least recomputation TIME is found by the budget
// planner's dynamic programme run on measured forward times instead of FLOPs. The step of
// N = ceil(B / b) micro-batches (the last one B - (N-1) b) is predicted to take
//   (N - 1) T(b) + T(b) * last / b + update_ms,   T(b) = sum over units of forward + backward
//                                                         + forward again in checkpointed units,
// with the unit times measured at b, or for a segment in tiles of r rows (Note [tiled segments];
// r one of the smaller micro-batches measured) at r, times b / r; its peak is the checkpoint plan's predicted peak at b (the
// last, smaller micro-batch peaks lower). Among the b whose plan fits (the budget less a small
// headroom, TrainPlanOptions::headroom), the least time per sample wins. Measuring stops at the first b whose smallest feasible peak is over the budget (a larger
// one needs more), or that runs out of memory while measured. The smallest b may be sizes the
// chain cannot train at (ChainProfile::cannot_train); no window then ends on a micro-batch
// smaller than the first b that ran.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <minigrad/nn/checkpoint_plan.h>

namespace mg::nn {

// The chain measured at several micro-batch sizes: what plan_training works from.
struct ChainProfile {
  std::vector<int64_t> micro_batches;  // increasing
  std::vector<ChainCost> costs;        // costs[i]: measure_chain at micro_batches[i]
  std::string stopped;                 // why measuring stopped before the last candidate, or ""
  // The smallest candidate, when the chain cannot train at it (an mg::Error other than out of
  // memory: a BatchNorm left with one value per channel, as ResNet's last stage at 32x32 and one
  // image), and its error. Plans avoid micro-batches smaller than the first measured size, the
  // window's last one included.
  std::vector<int64_t> cannot_train;
  std::string cannot_train_why;
};

// A training step: b samples at a time, N micro-batches, one checkpoint plan.
struct TrainPlan {
  int64_t effective_batch = 0;   // B: samples per optimizer step
  int64_t micro_batch = 0;       // b
  int64_t accumulation = 0;      // N = ceil(B / b)
  int64_t last_micro_batch = 0;  // B - (N - 1) b, the window's last micro-batch (b when b divides B)
  Plan checkpoint;               // the checkpoint plan at micro-batch b
  size_t budget = 0;             // as given; plans were made for budget * (1 - headroom)
  size_t predicted_peak = 0;     // bytes in use at the step's peak
  double predicted_step_ms = 0;  // the whole optimizer step (Note [joint plan])
  double ms_per_sample() const { return effective_batch > 0 ? predicted_step_ms / effective_batch : 0; }
  std::string str() const;       // "micro-batch 8 x 4 (32 per step), checkpoint [0,6) [6,12)"
};

struct TrainPlanOptions {
  // Candidate micro-batch sizes; empty: candidate_micro_batches(B).
  std::vector<int64_t> micro_batches;
  // Time of one optimizer update (zeroing included), added to every step's prediction. It is the
  // same for every plan, so it does not change the choice; 0 leaves it out of predicted_step_ms.
  double update_ms = 0;
  // The fraction of the budget left free: plans are made for budget * (1 - headroom). The cost
  // model leaves out allocations of bytes to kilobytes (the loss, the accumulator's statistics:
  // measured peaks came out slightly above the prediction; BENCHMARKS.md, "Figures behind the
  // design notes"), and a caching allocator rounds blocks up.
  double headroom = 1.0 / 64;
  // Tiled segments (Note [tiled segments]), in tiles of the smaller micro-batches measured.
  bool tiles = true;
  MeasureOptions measure;
};

// ceil(B / 2^k) for k = 0, 1, ... down to 1, increasing: 32 -> 1 2 4 8 16 32; 100 -> 1 2 4 7 13
// 25 50 100.
std::vector<int64_t> candidate_micro_batches(int64_t effective_batch);

// Measures seq (in its current mode, on its parameters' device) at each micro-batch size of
// `micro_batches` (increasing), from the smallest, and stops before the first one that cannot
// fit `budget` (0: measure all). The smallest size may fail with mg::Error (the chain cannot
// train at it: ChainProfile::cannot_train); an error at any other size is thrown (the first
// one, if the smallest failed too).
// Parameter gradients, buffers and generators are left as they were (as measure_chain's).
ChainProfile profile_chain(Sequential& seq, const Shape& sample_shape, const std::vector<int64_t>& micro_batches,
                           size_t budget = 0, const MeasureOptions& opts = {});
// The same for a chain whose input is not a float tensor of one sample shape (a GPT's int64
// tokens): make_input(b) returns the input of b samples, on the parameters' device.
using InputMaker = std::function<Tensor(int64_t rows)>;
ChainProfile profile_chain(Sequential& seq, const InputMaker& make_input, const std::vector<int64_t>& micro_batches,
                           size_t budget = 0, const MeasureOptions& opts = {});

// The plan of least predicted time per sample among those whose predicted peak fits the budget
// less its headroom (Note [joint plan]); opts.micro_batches and opts.measure are not used here.
// Throws mg::Error when none fits, naming the least any measured plan needs.
TrainPlan plan_training(const ChainProfile& profile, int64_t effective_batch, size_t budget,
                        const TrainPlanOptions& opts = {});

// Profiles and plans in one call. budget 0: what the device has (mg::memory_capacity).
TrainPlan plan_training(Sequential& seq, const Shape& sample_shape, int64_t effective_batch, size_t budget,
                        const TrainPlanOptions& opts = {});

// profile.costs[i] with the smaller micro-batches measured as its tile sizes (ChainCost::tile_costs):
// what the plans at micro-batch profile.micro_batches[i] are made and explained from.
ChainCost cost_with_tiles(const ChainProfile& profile, size_t i);

// The predicted step time of micro-batch b (profile.micro_batches[i]) with checkpointed layer
// ranges `segments`, for an effective batch B (Note [joint plan]).
double predict_step_ms(const ChainProfile& profile, size_t i, const std::vector<Segment>& segments,
                       int64_t effective_batch, double update_ms = 0);

}  // namespace mg::nn
