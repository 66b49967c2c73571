// Gradient accumulation done exactly: several micro-batches, one optimizer step, the same update
// as one large batch.
//
//   mg::optim::SGD sgd(model.parameters(), {.lr = 0.01f});
//   mg::optim::Accumulator acc(sgd, {.steps = 4, .clip_norm = 1.0f});
//   for (loader.start_epoch(e); loader.next(b);) {
//     auto window = acc.sample_window();  // dropout masks independent of the split (optional)
//     acc.backward(mg::cross_entropy(model(b.x), b.y, mg::Reduction::sum), b.size());
//     if (acc.ready()) acc.step();    // read losses and norm once, clip, step, zero
//   }
//   acc.flush();                      // the last, possibly shorter window
//
// or the whole loop: mg::optim::train_epoch(model, loader, acc, e).
//
// Note [accumulation normalises by samples]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each micro-batch's loss is a SUM over its samples,
// backward adds its gradient into the optimizer's buffers (minigrad/optim/optimizer.h), and the step
// multiplies by grad_scale = 1 / (samples in the window). The step therefore uses the mean
// gradient over every sample of the window, whatever the sizes of its micro-batches: N
// micro-batches of b give the update of one batch of N*b, and the short window at the end of an
// epoch gives the update of the short last batch. The usual recipe (mean loss per micro-batch,
// divided by N) weights a sample of a short micro-batch more than the others and divides a short
// window by N instead of by its length; docs/accumulation.md has the numbers.
//
// Note [clipping once per step]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Clipping: the global norm is that of the window's MEAN
// gradient, sqrt(sum over grads of sum_squares) / samples, computed once per optimizer step
// (never per micro-batch), and the clipping coefficient min(1, max_norm / (norm + 1e-6)) is
// folded into grad_scale, so clipping costs one read pass over the gradients and no write.
//
// Note [one read per step]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// On CUDA the host never waits inside a window. backward() records
// the micro-batch's loss on the device (one float64 slot of a small statistics tensor) without
// reading it; step() adds the squared gradient norm to the same tensor (one launch for every
// gradient) and reads the whole tensor back in one copy: the only host synchronisation of an
// optimizer step, needed anyway to decide whether to clip, skip or raise. Under data parallelism
// a step reads twice: the losses before the gradients' reduction (their sums over the ranks go
// with it), and the norm after it, since it is the reduced gradients' norm. A NaN or infinite loss
// is therefore found at the step, named by its micro-batch, and its window is dropped (its
// gradients are NaN by then).
//
// Note [recovering from out-of-memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A window that runs out of memory (mg::OutOfMemoryError:
// a full device, or the cap of mg::set_memory_limit) is dropped with discard() and redone from its
// first micro-batch under a plan for the memory actually there (mg::memory_capacity and the
// joint planner, minigrad/nn/train_plan.h). The optimizer has not stepped, its state is untouched,
// and dropout by sample draws the same masks whatever the new split, so the step equals the one
// planned for that memory from the start, to float rounding (vgg_ckpt and gpt_train do this; the
// tests are "joint planner: out of memory in a window ..." in tests/test_train_plan.cpp and ctest
// oom_recovery).
//
// Note [data parallel step]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// When mg::dist runs K processes (minigrad/dist/dist.h), each reads its
// shard of the epoch (Note [shards], minigrad/data/loader.h), and step() is a collective: it sums
// the window's sample count, loss and micro-batch count, then the summed gradients (last layer
// first, in buckets: Note [MPI packing] in src/dist/dist.cpp) over the K processes, once per
// optimizer step, never per micro-batch; grad_scale is 1 / (samples of the window on all ranks),
// and the clipping norm is that of the reduced gradient. K ranks x N micro-batches of b therefore
// take the step of one process with N micro-batches of K*b, and that of a batch of K*N*b (short
// windows included), to float rounding in the order of the sums. Every rank calls step() at the
// same windows, even a rank whose shard ran out a micro-batch early (it adds nothing):
// train_epoch counts the windows from the largest shard. Dropout by sample numbers the samples
// across ranks (sample_window()), so masks too are those of the single process.
//
// Note [overlapped reduction]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// On CUDA tensors (NCCL) the reduction need not wait for step(). In
// the window's last micro-batch (the N-th), backward() cuts the gradients into buckets of about
// 4 MiB (AccumulateOptions::bucket_bytes), last layer first (src/optim/grad_buckets.h), and starts each bucket's all-reduce on
// NCCL's stream as soon as backward has finished every gradient in it and every bucket before it
// was started (Note [gradient-ready hooks], minigrad/core/autograd.h). Those reductions then run
// while backward computes the earlier layers. step() reduces the header first, then starts the
// buckets not started yet (all of them on a rank whose window ended early or in flush()), and
// waits. Every rank starts the same buckets in the same order: NCCL pairs them. The sums are those
// of the step-time reduction: the buffers are summed over micro-batches first. CPU (MPI) windows
// reduce at step() (Note [arrive, then reduce]): MPI progresses only inside its calls, so nothing
// would run beside backward. AccumulateOptions::overlap = false reduces CUDA gradients at step()
// too, in one grouped call.
//
// Optimizer state (Adam's t, momentum initialisation, LR schedules) advances once per real step
// because the wrapped optimizer's step() is called once per window.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/rng.h>
#include <minigrad/core/tensor.h>
#include <minigrad/data/loader.h>
#include <minigrad/nn/module.h>
#include <minigrad/optim/optimizer.h>

namespace mg::optim {

class GradBuckets;  // src/optim/grad_buckets.h

// How a window's summed gradient is turned into the step's gradient.
enum class Normalize : uint8_t {
  samples,         // loss = sum over samples; grad_scale = 1 / samples in window (exact)
  micro_batches,   // the usual recipe, kept for comparison only: loss = MEAN per micro-batch,
                   // grad_scale = 1 / N with N the configured steps (wrong for short windows)
};

// What to do when a loss or the gradient norm is NaN or infinite.
enum class NonFinite : uint8_t {
  error,  // throw mg::Error (default)
  skip,   // drop the window: zero the gradients, do not step, count it in skipped_steps()
};

// Note [loss scaling]
// ~~~~~~~~~~~~~~~~~~~~
// fp16's smallest normal is 6.1e-5, so small output gradients flush to zero; its largest is 65504.
// With scaling on, each micro-batch's backward runs on loss x S, and the step's one grad_scale
// (Note [accumulation normalises by samples]) divides S out again, after accumulation, so the
// float32 buffers hold S times the gradient and nothing else changes (accelerate#641). A window
// whose gradient norm is not finite (an overflow somewhere in it) is dropped atomically: no
// update, the weights, the optimizer's state and its step count as they were, and S is halved
// (StepInfo::skipped and overflow). After `interval` steps in a row without overflow S doubles.
// These are PyTorch's GradScaler rules; the Trainer turns them on for fp16.
struct LossScaling {
  bool on = false;
  float init = 65536.0f;
  float growth = 2.0f;
  float backoff = 0.5f;
  int64_t interval = 2000;
};

struct AccumulateOptions {
  int64_t steps = 1;        // micro-batches per optimizer step (N)
  float clip_norm = 0.0f;   // max global norm of the mean gradient; 0 = no clipping
  NonFinite non_finite = NonFinite::error;
  Normalize normalize = Normalize::samples;
  bool check_finite = true; // compute the gradient norm every step (one read pass) to catch NaN/inf
  // Under an MPI launcher (mg::dist::active()), sum each window over the ranks (Note [data parallel step]);
  // false: every process steps on its own gradients.
  bool data_parallel = true;
  // Data parallel on CUDA: start the buckets' reductions during the last micro-batch's backward
  // (Note [overlapped reduction]). The same on every rank.
  bool overlap = true;
  // Their size: consecutive gradients, last layer first, up to about this many bytes each (a
  // larger gradient is a bucket of its own). Smaller buckets start earlier in backward, larger
  // ones cost fewer calls. The same on every rank.
  int64_t bucket_bytes = int64_t{4} << 20;
  LossScaling loss_scaling;  // Note [loss scaling]
};

struct StepInfo {
  int64_t samples = 0;        // in the window (on every rank, under data parallelism)
  int64_t micro_batches = 0;  // in the window (on every rank, under data parallelism)
  double loss_sum = 0.0;      // the window's loss summed over its samples (non-finite if a loss was)
  double grad_norm = 0.0;     // global norm of the step's gradient before clipping (NaN if not computed)
  float clip_coef = 1.0f;     // 1 when not clipped
  float grad_scale = 1.0f;    // what the optimizer multiplied the summed gradients by
  bool skipped = false;       // non-finite window dropped (NonFinite::skip, or an overflow under loss scaling)
  bool overflow = false;      // loss scaling: the gradients overflowed, the window was dropped, the scale lowered
  float loss_scale = 1.0f;    // the scale this window's backward ran at (1 without loss scaling)
};

class Accumulator {
 public:
  Accumulator(Optimizer& opt, AccumulateOptions opts = {});

  // Backpropagates `loss` of a micro-batch of `samples` samples into the optimizer's gradient
  // buffers. With Normalize::samples the loss must be the SUM over the micro-batch
  // (Reduction::sum). The loss is recorded on its device, not read (Note [one read per step]);
  // step() checks it and reports it in StepInfo::loss_sum.
  void backward(const Tensor& loss, int64_t samples);
  // For callers that ran backward themselves: records a micro-batch of `samples` samples whose
  // gradients are already in the buffers, and its scalar loss (as backward() does).
  void add_micro_batch(int64_t samples, const Tensor& loss);

  // Dropout by sample (Note [dropout by sample] in minigrad/core/rng.h): hold the returned guard
  // while the next micro-batch's forward runs, and its dropout masks are those its samples get in
  // the optimizer step's effective batch, whatever the split (train_epoch does this):
  //   { auto window = acc.sample_window(); loss = mg::cross_entropy(model(x), y, mg::Reduction::sum); }
  //   acc.backward(loss, x.size(0));
  // Under data parallelism the samples are numbered as in the single process's window.
  SampleWindowGuard sample_window() const;
  // The same for callers whose backward() counts something else than the batch's rows (a GPT's
  // tokens): first_row is the micro-batch's first row within this rank's window.
  SampleWindowGuard sample_window(int64_t first_row) const;

  // True when the window holds `steps` micro-batches (or more, after set_steps lowered N).
  bool ready() const { return pending_micro_batches_ > 0 && pending_micro_batches_ >= opts_.steps; }
  // Reads the window's losses and gradient norm (one copy), clips, steps the optimizer once with
  // the window's grad_scale, zeroes the buffers. Throws when nothing is pending, and on a
  // non-finite loss or norm under NonFinite::error (the window is dropped first). Under data
  // parallelism a collective (Note [data parallel step]): a rank with nothing pending takes part.
  StepInfo step();
  // Whether step() reduces over processes: data_parallel and mg::dist::active() (started by an MPI
  // launcher, `mpirun -np 1` too, where the reduction runs over one rank; or a world of one on
  // request, Note [a world of one] in minigrad/dist/dist.h).
  bool data_parallel() const;
  // Steps if anything is pending (end of data). Returns whether it stepped (or skipped). Under
  // data parallelism a collective on every rank, stepping when any rank has something pending.
  bool flush(StepInfo* info = nullptr);

  // Drops the pending window: zeroes the gradient buffers and forgets its micro-batches and
  // losses, without stepping. After an mg::OutOfMemoryError inside a window (its graph is
  // released as the exception unwinds), discard, re-plan for less memory, and redo the window
  // from its first micro-batch: no sample is lost or counted twice, and with dropout by sample the
  // step is the one an uninterrupted run takes (Note [recovering from out-of-memory]).
  void discard() { drop_window(); }

  // Changes N between windows (a schedule); throws if micro-batches are pending.
  void set_steps(int64_t n);
  int64_t steps() const { return opts_.steps; }
  const AccumulateOptions& options() const { return opts_; }
  Optimizer& optimizer() { return opt_; }

  int64_t pending_samples() const { return pending_samples_; }
  int64_t pending_micro_batches() const { return pending_micro_batches_; }
  int64_t steps_taken() const { return steps_taken_; }  // real optimizer steps by this wrapper
  int64_t skipped_steps() const { return skipped_steps_; }
  const StepInfo& last_step() const { return last_; }
  float loss_scale() const { return scale_; }  // the next window's (Note [loss scaling])

 private:
  void backward_scaled(const Tensor& loss);
  StepInfo step_window(bool flushing);
  // Note [data parallel step]: sums the window's counts, loss and non-finite flag over the ranks
  // into `info`, then reduces the gradients. False (nothing reduced) when flushing and no rank
  // has a sample.
  bool reduce_over_ranks(StepInfo& info, const std::vector<Tensor>& grads, bool bad_here, bool flushing,
                         bool& bad_elsewhere);
  // Drops the window when a loss (micro-batch `bad`, or on another rank) or the gradient norm is
  // not finite: an overflow under loss scaling lowers the scale; otherwise NonFinite decides
  // between throwing and skipping. Returns whether it dropped the window.
  bool drop_non_finite(StepInfo& info, const std::vector<double>& losses, int64_t bad, bool bad_elsewhere,
                       bool want_norm);
  void record_loss(const Tensor& loss, int64_t samples);
  void spill_losses();
  void drop_window();
  bool bucketed() const;  // Note [overlapped reduction]: CUDA data parallelism through buckets
  GradBuckets& buckets();
  void start_bucket(const std::vector<Tensor>& grads, size_t i);  // dist::all_reduce_start of bucket i
  Optimizer& opt_;
  AccumulateOptions opts_;
  int64_t pending_samples_ = 0, pending_micro_batches_ = 0;
  // Note [one read per step]: float64 [capacity + 1] on the loss's device; slots [0, recorded_)
  // hold this window's losses not yet read, the last slot the squared gradient norm.
  Tensor stats_;
  int64_t recorded_ = 0;
  std::vector<double> spilled_losses_;   // read early because the window outgrew stats_
  std::vector<int64_t> window_samples_;  // samples of each micro-batch of the window
  int64_t steps_taken_ = 0, skipped_steps_ = 0;
  StepInfo last_;
  float scale_ = 1.0f;        // Note [loss scaling]
  int64_t good_steps_ = 0;    // steps since the scale last changed
  std::shared_ptr<GradBuckets> buckets_;  // made at the first bucketed window
  bool started_in_backward_ = false;      // this window's buckets were started by backward()
};

// sqrt(sum of squares) over all of `grads`, in double, times `scale` (one device read).
double global_grad_norm(const std::vector<Tensor>& grads, double scale = 1.0);

// N by epoch, Lightning's accumulate_grad_batches={0: 8, 4: 2}, parsed from "0:8,4:2": from
// epoch 0 N = 8, from epoch 4 N = 2. Epochs before the first key use N = 1. A single number
// "4" means 4 from epoch 0.
class AccumulationSchedule {
 public:
  AccumulationSchedule(int64_t fixed = 1);
  static AccumulationSchedule parse(const std::string& spec);
  int64_t steps_for_epoch(int64_t epoch) const;
  const std::map<int64_t, int64_t>& table() const { return table_; }
  std::string str() const;  // "0:8,4:2"

 private:
  std::map<int64_t, int64_t> table_;
};

// Linear LR scaling (Goyal et al. 2017): lr for an effective batch, given one tuned at base_batch.
float scale_lr_linear(float base_lr, int64_t base_batch, int64_t effective_batch);

// ---- the training-loop helper ----------------------------------------------------------------
// Returns the loss to backpropagate for (logits, labels); with Normalize::samples it must be the
// sum over the micro-batch (the default is cross_entropy with Reduction::sum).
using LossFn = std::function<Tensor(const Tensor& logits, const Tensor& labels)>;

struct EpochStats {  // under data parallelism, of all ranks together
  double loss_sum = 0.0;       // summed per-sample training loss
  int64_t samples = 0;
  int64_t micro_batches = 0;
  int64_t optimizer_steps = 0;  // real steps (skipped windows not counted)
  int64_t skipped_steps = 0;
  double seconds = 0.0;
  double mean_loss() const { return samples > 0 ? loss_sum / static_cast<double>(samples) : 0.0; }
};

struct TrainCallbacks {
  std::function<void(const data::Batch&)> on_micro_batch;  // after its backward
  // After each optimizer step (an LR schedule, progress: StepInfo has the window's loss).
  std::function<void(const StepInfo&)> on_step;
  // Recovery from out-of-memory (opt-in; Note [recovering from out-of-memory]): when a
  // micro-batch's forward or backward throws mg::OutOfMemoryError, train_epoch drops the window
  // (the model's buffers, BatchNorm's running statistics, go back to the window's start: its
  // failed try had moved them) and calls this with the error and the micro-batch size. It re-plans (the model's checkpoint
  // plan, say) and returns the new micro-batch size, which must divide the window's samples;
  // train_epoch then redoes the window from its first sample in micro-batches of that size, and
  // keeps them for the rest of the epoch and after (the loader's batch size and the accumulator's
  // N change). Returning the old size, or throwing, ends the epoch with the error. Not under data
  // parallelism.
  std::function<int64_t(const OutOfMemoryError&, int64_t micro_batch)> on_out_of_memory;
};

// One epoch: loader.start_epoch(epoch), a forward/backward per micro-batch, a step per window,
// a flush at the end. The model is put in training mode. Under data parallelism the loader must
// read this rank's shard, every rank steps at the same windows (Note [data parallel step]), and
// after each step every rank takes rank 0's buffers (BatchNorm's running statistics:
// mg::dist::broadcast_buffers), so that the ranks evaluate alike.
EpochStats train_epoch(nn::Module& model, data::DataLoader& loader, Accumulator& acc, int64_t epoch,
                       const LossFn& loss_fn = {}, const TrainCallbacks& callbacks = {});

}  // namespace mg::optim
