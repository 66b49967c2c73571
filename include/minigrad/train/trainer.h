// One object that trains a chain of layers on a data set (or on windows of a stream, a GPT's
// tokens): the plan (a memory budget for the joint planner, or an explicit micro-batch and
// checkpoint plan), exact accumulation, out-of-memory
// recovery, data parallelism from the launcher's environment, atomic epoch checkpoints with exact
// resume, progress and a record of the run.
//
//   auto model = mg::nn::make_resnet18(10, 8);
//   mg::optim::SGD sgd(model->parameters(), {.lr = 0.01f, .momentum = 0.9f});
//   mg::Trainer trainer(*model, data, sgd,
//                       {.batch_size = 256, .memory_budget = "2GiB", .epochs = 3, .save_dir = "runs/a"});
//   mg::FitReport r = trainer.fit();   // "micro-batch 64 x 4 (256 per step), checkpoint [0,3) ..."
//
// Note [the trainer's step]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Optimizer step k of epoch e takes the samples [k B, (k + 1) B) of the epoch's order
// (mg::data::epoch_permutation(n, seed, e), which no batch size changes; under K ranks each takes
// every K-th of them, Note [shards]) and feeds them in micro-batches of b, the last one what is left,
// through an mg::optim::Accumulator: one optimizer update per B samples, whatever b is, and the
// same update to float rounding (on the CPU the same bits: Note [accumulation normalises by
// samples]). The epoch's last, shorter window is dropped (drop_last), or trained with the samples
// left (in the same micro-batches, the last one shorter). Under an accumulation schedule a step of
// epoch e holds N(e) such batches, one after the other: N(e) B samples. Under K ranks every rank
// reads the same number of samples an epoch (n / K, the last n % K samples of the order left out),
// so that all step the same windows. Dropout draws its masks by sample (Note [dropout by sample]),
// so a split does not change them.
//
// The plan is made once, before the first step (Trainer::plan), from the model's measured costs:
//   - memory_budget set: micro_batch 0 lets the joint planner choose b, N and the checkpoint plan
//     (minigrad/nn/train_plan.h); micro_batch > 0 keeps that micro-batch and plans only its
//     checkpoint for the budget (plan_budget), which keeps BatchNorm's statistics those of b
//     samples whatever the memory;
//   - no budget: micro_batch (0: B) and the checkpoint spec as given (none, sqrt, segments=K, ...);
//     when measuring that micro-batch runs out of memory, the batch is planned jointly for what
//     the device has instead (a Replan of step -1).
// The pre-flight check measures one and two samples first and extrapolates what the micro-batch
// needs with the least memory any plan takes (an estimate: over the limit by a quarter counts as
// over; nearer, the micro-batch's own measuring decides). With tiles on and no joint planning,
// those two measurements are then the plan's tiles of one and two rows
// (MeasureOptions::tiles_measured). Under a budget, a micro-batch that cannot fit is refused at
// once (naming what it needs and the budget), instead of measuring it for minutes; without one, a micro-batch over what the device has is planned jointly for the device
// instead, and only a model of which one sample cannot fit is refused.
//
// Out of memory inside a window (a full device, or a cap of mg::set_memory_limit lowered by a
// callback): the window is dropped (Accumulator::discard), its buffers (BatchNorm's running
// statistics, which the failed try's forward had already moved) are put back as they were at its
// start, and it is planned again for what the device has now (a micro-batch fixed under a budget
// keeps its size and gets a new checkpoint plan; a plan given without a budget becomes the joint
// plan), and redone from its first sample (Note [recovering from out-of-memory]); each re-plan is
// in FitReport::replans. The copy of the buffers is made once, before planning, so every plan
// counts its bytes. Not under data parallelism: every rank would have to re-plan at the same
// window, so the error stands there.
//
// Note [prefetched micro-batches]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With TrainerOptions::prefetch on (the default on CUDA devices), a thread of the Trainer's own
// reads the epoch's micro-batches ahead of the steps (two at most waiting, Note [reading ahead]),
// into host buffers that are page-locked on a GPU, and the next micro-batch is staged on the
// device while this one computes (Note [staged batches] in src/core/staging.h): its device memory
// is taken when this micro-batch starts, before its kernels are queued; its copy is queued on the
// device's copy stream as soon as it has been read (when this micro-batch starts, or after its
// backward is queued); and the device's stream waits for that copy (an event, no host wait) only
// when the next micro-batch starts. Nothing is staged past the epoch's last step, or past
// max_steps; an epoch's first micro-batch is read when it is needed.
//   - Memory: one more micro-batch (its inputs and int64 targets) on the device through every
//     step. The plan counts it (nn::MeasureOptions::staged_batches, the memory report's "the next
//     micro-batch"), so a step's peak is the prediction with prefetch as without.
//   - Time: StepReport::data_ms is the time the step waited for its micro-batches (read ahead,
//     usually none; the first of an epoch, read then), left out of ms as before; the reading
//     itself runs beside the step, and its CPU time is in cpu_ms.
//   - Bits: the same bytes reach the same kernels; only when they are read changes.
//   - Errors: a micro-batch whose reading failed (a damaged file) throws that same error at the
//     step that takes it, after the steps before it ran (Note [reading ahead]).
//   - Windows of a stream (WindowData) are slices of memory: read when staged, on the Trainer's
//     thread, with no reading thread.
//   - Out of memory: the staged micro-batch is dropped before re-planning and the window redone
//     from its first micro-batch, read again.
// On the CPU the same path runs with plain copies (no gain: the reading thread shares the cores),
// so it is off by default there and on in the tests. **Compiled only** on CUDA (2026-11-29):
// docs/gpu-queue.md, item 13.
//
// Saving (save_dir): after each epoch, rank 0 writes "<save_dir>/epoch_<e>" as a pair (the
// training state, then the weights: mg::optim::save_checkpoint, atomic). A Trainer whose save_dir
// holds such a pair resumes after the newest one (unless TrainerOptions::resume is false): the weights, the optimizer's state, its step
// count and the default generator come back, and the epoch order depends only on (seed, epoch), so
// the run ends with the bits of one that was never interrupted.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/autocast.h>
#include <minigrad/data/dataset.h>
#include <minigrad/nn/memory_report.h>
#include <minigrad/nn/module.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/nn/train_plan.h>
#include <minigrad/optim/accumulate.h>
#include <minigrad/optim/optimizer.h>

namespace mg {

enum class Progress : uint8_t {
  automatic,  // a live line on a terminal (stderr), plain lines per epoch otherwise
  lines,      // plain lines per epoch
  off,
};

// Whether the next micro-batch is read and copied to the device while one computes (Note
// [prefetched micro-batches]): automatic is on for CUDA devices, off on the CPU.
enum class Prefetch : uint8_t { automatic, on, off };

struct TrainerOptions {
  int64_t batch_size = 64;         // B: samples per optimizer step, over all ranks
  std::string memory_budget;       // "" (no budget), "free" (what the device has) or a size: "16GiB", "300MB"
  int64_t micro_batch = 0;         // b; 0: the planner's (with a budget) or B (without)
  std::string checkpoint = "none"; // the plan without a budget: none | sqrt | segments=K | budget=SIZE | min
  int64_t epochs = 1;
  int64_t max_steps = 0;           // stop after this many optimizer steps in all (0: the epochs decide)
  float clip_norm = 0.0f;          // max global gradient norm (0: no clipping)
  optim::NonFinite non_finite = optim::NonFinite::error;
  std::function<float(int64_t step)> lr;  // the learning rate of optimizer step `step` (from 0); empty: the optimizer's
  optim::LossFn loss;              // (logits, labels) -> the SUM over the micro-batch; default cross_entropy
  // The planner runs `loss` on the model's output (with labels of the data's first rows) to
  // measure its bytes, instead of taking it for cross_entropy on logits: for a loss that is more
  // than that, such as a GPT's head fused into it (linear_cross_entropy; gpt_train --fused-head).
  bool measure_loss = false;
  // N by epoch (0:8,4:2, minigrad/optim/accumulate.h): epoch e's optimizer step takes N(e) groups of
  // batch_size samples, each fed as the plan splits batch_size; the plan is made for batch_size.
  optim::AccumulationSchedule accumulation{1};
  bool drop_last = true;           // false: the epoch's last, shorter window is trained too (data sets)
  optim::Normalize normalize = optim::Normalize::samples;  // micro_batches: the usual, inexact recipe
  std::string save_dir;            // epoch checkpoints, and resume from the newest there
  bool resume = true;              // false: train from the start, over what save_dir holds
  nn::Metadata signature;          // saved in each training state, a resume that differs warned of; the same on every rank
  uint64_t seed = 0;               // the sample order
  bool tiles = true;               // tiled segments (Note [tiled segments])
  // The joint plan (memory_budget, no micro_batch): each micro-batch size timed this many times,
  // each unit's least time kept (MeasureOptions::timing_passes, Note [joint plan]).
  int plan_timing_passes = 1;
  // Whether plans may offload segments to the host pool (Note [offload] in minigrad/core/checkpoint.h):
  // automatic on CUDA devices, not on the CPU (where it is an emulation, for tests).
  nn::MeasureOptions::Offload offload = nn::MeasureOptions::Offload::automatic;
  // fp32 | tf32 (CUDA's TF32 products, set on for the run) | bf16 | fp16: the forward and backward
  // of every step, and the measuring, run under an AutocastGuard of it (Note [autocast] in
  // minigrad/core/autocast.h); the parameters, gradient buffers and optimizer state stay float32.
  Precision precision = Precision::fp32;
  Progress progress = Progress::automatic;
  Prefetch prefetch = Prefetch::automatic;  // Note [prefetched micro-batches]
};

struct StepReport {
  int64_t step = 0;           // optimizer steps before this one, in the whole run
  int64_t epoch = 0;
  int64_t steps_in_epoch = 0; // windows of the epoch
  optim::StepInfo info;
  double ms = 0;              // wall time of the step, reading its data left out (the redone window's, after a re-plan)
  double cpu_ms = 0;          // the process's CPU time (all threads) over the same span
  double data_ms = 0;         // wall time spent reading and copying its micro-batches (prefetched: waiting for them)
  size_t peak_in_use = 0;     // the device's peak bytes in use during the step
  size_t peak_reserved = 0;
  uint64_t system_allocs = 0; // calls to the system allocator (cudaMalloc on a GPU) during the step
};

struct EpochReport {
  int64_t epoch = 0;
  int64_t steps = 0;
  int64_t skipped_steps = 0;  // windows dropped for a non-finite loss (NonFinite::skip)
  int64_t micro_batches = 0;
  int64_t accumulation = 0;   // N of the epoch's schedule
  int64_t samples = 0;        // of all ranks
  double mean_loss = 0;       // per sample
  double seconds = 0;
  std::string saved;          // the checkpoint written after it ("" if none)
};

struct Replan {
  int64_t step = 0;           // the step that ran out of memory (from 0), or -1: while planning
  size_t memory = 0;          // what the device had then: the new plan's budget
  std::string from, to;       // the plans
  std::string cause;          // the first line of the error
};

struct TrainerCallbacks {
  // Before each optimizer step's first micro-batch, and again (redo = true) when the step is redone
  // after out of memory (a profiler restarts its step there).
  std::function<void(int64_t step, bool redo)> on_step_start;
  std::function<void(const StepReport&)> on_step;     // after each optimizer step (may lower a memory cap)
  std::function<void(const EpochReport&)> on_epoch;   // after each epoch (and its checkpoint)
};

struct FitReport {
  nn::TrainPlan plan;                  // the plan of the last step (micro_batch, accumulation, checkpoint)
  std::vector<Replan> replans;
  std::vector<EpochReport> epochs;
  std::vector<double> step_ms;         // StepReport::ms of every step
  std::vector<double> step_cpu_ms;
  // Wall ms from a step's start until its forward and backward were all issued (step()'s read of
  // the losses not yet begun), less the data reads. On a CPU nearly step_ms; on a GPU, the host's
  // time to issue the step's kernels: close to step_ms, the GPU waits for the host, and issuing
  // less (a CUDA graph) would pay (docs/gpt.md, "The cost of an op").
  std::vector<double> step_issue_ms;
  std::vector<double> step_data_ms;
  std::vector<size_t> step_peak_in_use, step_peak_reserved;
  std::vector<uint64_t> step_system_allocs;
  std::vector<double> losses;          // per step: the window's mean loss per sample
  int64_t steps = 0;                   // optimizer steps taken by this fit (resumed ones not counted)
  int64_t resumed_from_epoch = 0;      // epochs already done in save_dir when fit started
  size_t peak_in_use = 0;              // the largest step peak
  size_t peak_reserved = 0;
  Precision precision = Precision::fp32;
  bool prefetch = false;               // whether micro-batches were read ahead (Note [prefetched micro-batches])
  double median_step_ms() const;
  std::string json() const;            // all of it as one JSON object
};

class Trainer {
 public:
  // The model's parameters already on their device (model.to(dev)); `data` gives (x, y) samples of
  // one shape, y class indices. The optimizer is over model.parameters().
  Trainer(nn::Sequential& model, std::shared_ptr<const data::Dataset> data, optim::Optimizer& opt,
          TrainerOptions opts = {}, TrainerCallbacks callbacks = {});
  // Data read in windows, one per optimizer step, in order (a token stream: mg::data::TokenBatches):
  // batch_size is the rows of a window over all ranks (rows_per_window() on each), max_steps the
  // steps of an epoch (the windows start over from the first when the stream runs out), and the
  // loss is normalised by the targets' elements (a GPT's tokens).
  Trainer(nn::Sequential& model, std::shared_ptr<const data::WindowData> windows, optim::Optimizer& opt,
          TrainerOptions opts = {}, TrainerCallbacks callbacks = {});

  // The pre-flight check and the plan, without training (fit() calls it when not called before).
  // Throws mg::Error when no plan fits, naming the least any plan needs and what the device has.
  // Zeroes the model's gradient buffers first (every window starts from zero ones anyway), so that
  // measuring keeps no copy of them (MeasureOptions::gradients_zero).
  const nn::TrainPlan& plan();

  // Resumes from a training state now (plan() first, so that measuring draws nothing after it):
  // `path` is an epoch_K.state.safetensors, the epoch_K.safetensors beside it, or a folder (its
  // newest complete pair). fit() then starts after that epoch. Returns the state's file. Throws
  // mg::Error naming what is wrong with the file; a signature that differs is only warned of.
  std::string resume(const std::string& path);

  // Trains (resuming from save_dir when it holds a checkpoint, unless resume() was called) and reports.
  FitReport fit();

  // The model's measured costs at the plan's micro-batch (with its tile sizes when tiles are on):
  // what the plan was made from, for reports (minigrad/nn/checkpoint_plan.h: min_feasible_peak,
  // explain_peak). After plan().
  const nn::ChainCost& cost() const { return cost_; }
  // Where the plan's step puts its memory, term by term (minigrad/nn/memory_report.h), against the
  // budget or, without one, what the device has. After plan().
  nn::MemoryReport explain_memory() const;
  // Re-plans so far, the measuring's included (step -1: measuring the micro-batch ran out of memory,
  // and the batch was planned jointly for what the device has).
  const std::vector<Replan>& replans() const { return replans_; }
  size_t budget() const { return budget_; }  // the memory the plan was made for (0: none)
  // Wall ms that plan() took: the pre-flight check (the model measured at one and two samples),
  // then the measuring and planning of the micro-batch (the joint planner's several sizes, the
  // tile sizes when tiles are on). A re-plan after out of memory in fit() is not counted.
  struct PlanTimes {
    double preflight_ms = 0, measure_ms = 0;
  };
  const PlanTimes& plan_times() const { return plan_times_; }

  const TrainerOptions& options() const { return opts_; }
  Device device() const { return dev_; }

 private:
  void plan_for(size_t memory);
  void zero_gradients();
  void replan(size_t memory, int64_t step, const std::string& from, const std::string& cause);
  void print(const std::string& line) const;
  void tidy_save_dir();
  void check_options();
  nn::ChainCost measure(int64_t rows, nn::MeasureOptions opts);  // the model at `rows` rows (the staged batch counted)
  Tensor example(int64_t rows) const;  // window data: the first window's first rows, on the device
  // What every measurement of this Trainer's chain counts besides the chain: the staged next
  // micro-batch (prefetch), and with measure_loss the loss, on labels of the data's first rows,
  // as the head the planner measures (MeasureOptions::head).
  void add_own_measure_options(nn::MeasureOptions& mo) const;

  nn::Sequential& model_;
  std::shared_ptr<const data::Dataset> data_;         // samples, or
  std::shared_ptr<const data::WindowData> windows_;  // windows
  optim::Optimizer& opt_;
  TrainerOptions opts_;
  TrainerCallbacks cb_;
  Device dev_;
  int64_t rank_batch_ = 0;     // B over the ranks
  bool planned_ = false;
  nn::TrainPlan plan_;
  nn::ChainCost cost_;
  std::vector<Replan> replans_;
  size_t budget_ = 0;
  PlanTimes plan_times_;
  std::vector<nn::ChainCost> preflight_;  // the pre-flight's measurements, during plan(): the plan's tiles
  double per_sample_ = 0;  // the pre-flight check's least bytes per sample, and its fixed bytes
  size_t fixed1_ = 0;
  std::vector<Tensor> window_buffers_;  // the buffers at the window's start (Note [the trainer's step])
  bool prefetch_ = false;      // Note [prefetched micro-batches]
  bool resumed_ = false, tidied_ = false;
  int64_t first_epoch_ = 0;    // epochs done before fit(), by resume()
};

}  // namespace mg
