#include <minigrad/optim/accumulate.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <sstream>

#include <minigrad/core/profiler.h>
#include <minigrad/dist/dist.h>

#include "core/tape.h"
#include "kernels/elementwise.h"
#include "ops/op.h"
#include "optim/grad_buckets.h"

namespace mg::optim {

namespace {
double sum_squares(const std::vector<Tensor>& grads) {
  if (grads.empty()) return 0.0;
  Tensor ss = Tensor::empty({1}, TensorOptions{DType::f64, grads[0].device()});
  MG_DISPATCH(ss.device(), sum_squares_into, grads, ss, 0);
  return ss.to_vector<double>()[0];
}
}  // namespace

double global_grad_norm(const std::vector<Tensor>& grads, double scale) {
  return std::sqrt(sum_squares(grads)) * std::abs(scale);
}

Accumulator::Accumulator(Optimizer& opt, AccumulateOptions opts) : opt_(opt), opts_(opts) {
  MG_CHECK(opts.steps >= 1, "Accumulator: steps (micro-batches per optimizer step) must be >= 1, got " << opts.steps);
  MG_CHECK(opts.clip_norm >= 0.0f && std::isfinite(opts.clip_norm),
           "Accumulator: clip_norm must be >= 0 (0 = off), got " << opts.clip_norm);
  MG_CHECK(opts.bucket_bytes >= 1, "Accumulator: bucket_bytes must be >= 1, got " << opts.bucket_bytes);
  const LossScaling& ls = opts.loss_scaling;
  MG_CHECK(!ls.on || (std::isfinite(ls.init) && ls.init > 0.0f && std::isfinite(ls.growth) && ls.growth >= 1.0f &&
                      ls.backoff > 0.0f && ls.backoff < 1.0f && ls.interval >= 1),
           "Accumulator: loss scaling needs a finite init > 0, growth >= 1, 0 < backoff < 1 and interval >= 1; got init "
               << ls.init << ", growth " << ls.growth << ", backoff " << ls.backoff << ", interval " << ls.interval);
  scale_ = ls.on ? ls.init : 1.0f;
}

namespace {

// The statistics tensor: a loss slot per micro-batch of a window, and the norm's slot. Windows
// longer than kMaxLossSlots spill their losses to the host every kMaxLossSlots micro-batches
// (one read per 1024 micro-batches), so a huge N (--accum 2^61) costs no memory.
constexpr int64_t kMaxLossSlots = 1024;
int64_t stats_slots(int64_t steps) { return std::min(steps, kMaxLossSlots) + 1; }

// The reduction of every loss op that produced `loss` through scalar ops only (a loss that is
// scale(cross_entropy(...)) or a sum of two losses is still found); the tape records it.
// Throws when one differs from what the normalisation needs: a mean-reduced loss (PyTorch's
// default) under Normalize::samples would silently step 1/b as far.
void check_loss_reduction(const Tensor& loss, Normalize normalize) {
  const Reduction want = normalize == Normalize::samples ? Reduction::sum : Reduction::mean;
  std::vector<const Node*> stack;
  if (loss.grad_fn()) stack.push_back(loss.grad_fn().get());
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (n->op && n->op->kind == OpKind::loss) {
      MG_CHECK(n->attrs.reduction == want,
               "gradient accumulation: the loss is " << n->op->name << " with "
                   << (want == Reduction::sum ? "Reduction::mean (PyTorch's default)" : "Reduction::sum")
                   << ", but "
                   << (want == Reduction::sum
                           ? "the Accumulator normalises by samples (Note [accumulation normalises by "
                             "samples]), so each micro-batch's loss must be the SUM over its samples: "
                             "pass mg::Reduction::sum (mg::cross_entropy(logits, y, mg::Reduction::sum) "
                             "or nn::CrossEntropyLoss(mg::Reduction::sum)). A mean loss would make "
                             "every step 1/(micro-batch size) as long."
                           : "Normalize::micro_batches expects the mean loss of each micro-batch: "
                             "pass mg::Reduction::mean."));
      continue;
    }
    for (const NodeInput& in : n->inputs) {
      if (in.fn && shape_numel(in.fn->out_shape) == 1) stack.push_back(in.fn.get());
    }
  }
}

}  // namespace

// Note [one read per step] (minigrad/optim/accumulate.h).
void Accumulator::record_loss(const Tensor& loss, int64_t samples) {
  MG_CHECK(loss.defined() && loss.numel() == 1 && loss.dtype() == DType::f32,
           "gradient accumulation: the loss must be a float32 scalar, got "
               << (loss.defined() ? shape_str(loss.shape()) + " " + dtype_name(loss.dtype()) : "an undefined tensor"));
  MG_CHECK(samples > 0, "gradient accumulation: a micro-batch of " << samples << " samples");
  check_loss_reduction(loss, opts_.normalize);
  if (pending_micro_batches_ == 0 && stats_.defined() &&
      (stats_.device() != loss.device() || stats_.numel() != stats_slots(opts_.steps))) {
    stats_ = Tensor();  // a new window on another device, or N changed
  }
  MG_CHECK(!stats_.defined() || stats_.device() == loss.device(),
           "gradient accumulation: a loss on " << loss.device().str() << " in a window whose losses are on "
                                               << stats_.device().str());
  if (!stats_.defined()) {
    stats_ = Tensor::empty({stats_slots(opts_.steps)}, TensorOptions{DType::f64, loss.device()});
  } else if (recorded_ == stats_.numel() - 1) {
    spill_losses();  // the slots are full (more micro-batches than N, or than kMaxLossSlots)
  }
  MG_DISPATCH(stats_.device(), store_scalar, stats_, recorded_, loss);
  ++recorded_;
  window_samples_.push_back(samples);
}

void Accumulator::spill_losses() {
  const std::vector<double> v = stats_.to_vector<double>();
  spilled_losses_.insert(spilled_losses_.end(), v.begin(), v.begin() + recorded_);
  recorded_ = 0;
}

void Accumulator::backward(const Tensor& loss, int64_t samples) {
  MG_CHECK(!started_in_backward_, "Accumulator::backward: a micro-batch after the window's last ("
                                      << opts_.steps << "), whose gradients are already being reduced over the ranks "
                                         "(Note [overlapped reduction]); call step() first");
  record_loss(loss, samples);
  if (bucketed() && pending_micro_batches_ + 1 == opts_.steps) {  // Note [overlapped reduction]
    const std::vector<Tensor> grads = opt_.grads();  // the buffers backward adds into
    GradBuckets& b = buckets();
    b.reset();
    const auto launch = [&](size_t i) { start_bucket(grads, i); };
    dist::timeline_mark("backward begins");  // Note [reduction timeline] (minigrad/dist/dist.h)
    try {
      const GradReadyHook hook([&](const Tensor& p) { b.ready(p, launch); });
      backward_scaled(loss);
    } catch (...) {
      // Buckets already started still read and write their gradients on NCCL's stream: wait for
      // them (their own error, if any, gives way to this one), so that discard() can zero them.
      try {
        dist::all_reduce_wait();
      } catch (const std::exception&) {
      }
      b.reset();
      throw;
    }
    dist::timeline_mark("backward ends");
    b.launch_rest(launch);  // parameters this backward did not reach
    started_in_backward_ = true;
  } else {
    backward_scaled(loss);
  }
  pending_samples_ += samples;
  ++pending_micro_batches_;
}

// loss.backward(), on loss x scale under loss scaling (Note [loss scaling]).
void Accumulator::backward_scaled(const Tensor& loss) {
  if (!opts_.loss_scaling.on) {
    loss.backward();
    return;
  }
  scale(loss, scale_).backward();
}

bool Accumulator::bucketed() const {
  return opts_.overlap && data_parallel() && !opt_.params().empty() && opt_.params()[0].is_cuda();
}

GradBuckets& Accumulator::buckets() {
  if (!buckets_) buckets_ = std::make_shared<GradBuckets>(opt_.params(), static_cast<size_t>(opts_.bucket_bytes));
  return *buckets_;
}

void Accumulator::start_bucket(const std::vector<Tensor>& grads, size_t i) {
  std::vector<Tensor> bucket;
  for (size_t k : buckets().bucket(i)) bucket.push_back(grads[k]);
  dist::all_reduce_start(bucket);
}

void Accumulator::add_micro_batch(int64_t samples, const Tensor& loss) {
  MG_CHECK(!started_in_backward_, "Accumulator::add_micro_batch: a micro-batch after the window's last ("
                                      << opts_.steps << "), whose gradients are already being reduced; call step() first");
  record_loss(loss, samples);
  pending_samples_ += samples;
  ++pending_micro_batches_;
}

void Accumulator::drop_window() {
  // A window dropped after its last backward (discard() before step()): its buckets may still be
  // in flight, writing the gradients zeroed below. After step()'s wait this returns at once.
  if (started_in_backward_) dist::all_reduce_wait();
  started_in_backward_ = false;
  opt_.zero_grad();
  pending_samples_ = 0;
  pending_micro_batches_ = 0;
  recorded_ = 0;
  spilled_losses_.clear();
  window_samples_.clear();
}

bool Accumulator::data_parallel() const { return opts_.data_parallel && dist::active(); }

SampleWindowGuard Accumulator::sample_window() const { return sample_window(pending_samples_); }

SampleWindowGuard Accumulator::sample_window(int64_t first_row) const {
  MG_CHECK(first_row >= 0, "Accumulator::sample_window: first_row must be >= 0, got " << first_row);
  const uint64_t key = static_cast<uint64_t>(opt_.step_count());
  if (!data_parallel()) return SampleWindowGuard(key, first_row);
  return SampleWindowGuard(key, first_row, dist::world_size(), dist::rank());  // Note [data parallel step]
}

StepInfo Accumulator::step() { return step_window(false); }

StepInfo Accumulator::step_window(bool flushing) {
  const bool dp = data_parallel();
  MG_CHECK(pending_micro_batches_ > 0 || dp, "Accumulator::step: no micro-batch since the last step");
  StepInfo info;
  info.samples = pending_samples_;
  info.micro_batches = pending_micro_batches_;
  // The step's one read: the window's losses and, when needed, the squared gradient norm (under
  // data parallelism the norm is that of the reduced gradients, read after the reduction).
  const bool want_norm = opts_.clip_norm > 0.0f || opts_.check_finite || opts_.loss_scaling.on;
  info.loss_scale = scale_;
  const std::vector<Tensor> grads = opt_.grads();
  const int64_t norm_slot = stats_.defined() ? stats_.numel() - 1 : 0;
  if (want_norm && !dp) MG_DISPATCH(stats_.device(), sum_squares_into, grads, stats_, norm_slot);
  const std::vector<double> read = stats_.defined() && (recorded_ > 0 || !dp) ? stats_.to_vector<double>()
                                                                                : std::vector<double>{};
  std::vector<double> losses = std::move(spilled_losses_);
  losses.insert(losses.end(), read.begin(), read.begin() + recorded_);
  int64_t bad = -1;
  for (size_t i = 0; i < losses.size(); ++i) {
    // With Normalize::micro_batches each loss is a mean: weight it by its samples.
    const double w = opts_.normalize == Normalize::samples ? 1.0 : static_cast<double>(window_samples_[i]);
    info.loss_sum += losses[i] * w;
    if (bad < 0 && !std::isfinite(losses[i])) bad = static_cast<int64_t>(i);
  }
  double norm_sq = want_norm && !dp ? read[norm_slot] : 0.0;
  bool bad_elsewhere = false;
  if (dp) {  // Note [data parallel step]
    if (!reduce_over_ranks(info, grads, bad >= 0, flushing, bad_elsewhere)) {
      drop_window();
      return info;
    }
    if (want_norm) norm_sq = sum_squares(grads);
  }
  // Note [accumulation normalises by samples] (minigrad/optim/accumulate.h).
  const double base = opts_.normalize == Normalize::samples
                          ? 1.0 / static_cast<double>(info.samples)
                          : 1.0 / static_cast<double>(opts_.steps * (dp ? dist::world_size() : 1));
  info.grad_norm = want_norm ? std::sqrt(norm_sq) * base / scale_ : std::numeric_limits<double>::quiet_NaN();
  if (drop_non_finite(info, losses, bad, bad_elsewhere, want_norm)) return info;
  if (opts_.clip_norm > 0.0f && info.grad_norm > opts_.clip_norm) {
    info.clip_coef = static_cast<float>(opts_.clip_norm / (info.grad_norm + 1e-6));  // torch's clip_grad_norm_
  }
  info.grad_scale = static_cast<float>(base * info.clip_coef / scale_);
  opt_.step(info.grad_scale);
  ++steps_taken_;
  if (opts_.loss_scaling.on && ++good_steps_ == opts_.loss_scaling.interval) {
    scale_ *= opts_.loss_scaling.growth;
    good_steps_ = 0;
  }
  drop_window();
  last_ = info;
  return info;
}

bool Accumulator::reduce_over_ranks(StepInfo& info, const std::vector<Tensor>& grads, bool bad_here, bool flushing,
                                    bool& bad_elsewhere) {
  const std::vector<double> sums = dist::all_reduce(std::vector<double>{
      static_cast<double>(info.samples), static_cast<double>(info.micro_batches), info.loss_sum, bad_here ? 1.0 : 0.0});
  info.samples = static_cast<int64_t>(sums[0]);
  info.micro_batches = static_cast<int64_t>(sums[1]);
  info.loss_sum = sums[2];
  bad_elsewhere = !bad_here && sums[3] > 0;
  if (info.samples == 0 && flushing) return false;
  MG_CHECK(info.samples > 0, "Accumulator::step: no micro-batch since the last step on any of the "
                                 << dist::world_size() << " ranks");
  // The gradients' reduction; on CUDA, the device's wait for it (the host's small reduction of
  // the window's counts above is not timed: device events would not see it).
  const profiler::Scope timed("dist.reduce", grads[0].device());
  if (bucketed()) {  // Note [overlapped reduction]: backward started them all, or none
    if (!started_in_backward_) {
      dist::timeline_mark("step starts the buckets");
      buckets().reset();
      buckets().launch_rest([&](size_t i) { start_bucket(grads, i); });
    }
    dist::all_reduce_wait();
    dist::timeline_mark("reductions waited");
  } else {
    std::vector<Tensor> last_layer_first(grads.rbegin(), grads.rend());  // Note [MPI packing]
    dist::all_reduce(last_layer_first);
  }
  return true;
}

bool Accumulator::drop_non_finite(StepInfo& info, const std::vector<double>& losses, int64_t bad, bool bad_elsewhere,
                                  bool want_norm) {
  if (opts_.loss_scaling.on && bad < 0 && !bad_elsewhere && !std::isfinite(info.grad_norm)) {
    // Note [loss scaling]: an overflow, not a bad window: dropped, and the scale lowered.
    drop_window();
    info.skipped = info.overflow = true;
    ++skipped_steps_;
    scale_ *= opts_.loss_scaling.backoff;
    good_steps_ = 0;
    last_ = info;
    return true;
  }
  if (bad < 0 && !bad_elsewhere && (!want_norm || std::isfinite(info.grad_norm))) return false;
  std::ostringstream what;
  if (bad >= 0) {
    what << "loss is " << losses[bad] << " at micro-batch " << bad + 1 << " of " << losses.size();
    if (data_parallel()) what << " on rank " << dist::rank();
  } else if (bad_elsewhere) {
    what << "a loss is " << info.loss_sum << " on another rank";
  } else {
    what << "the gradient norm is " << info.grad_norm;
  }
  const int64_t step_number = opt_.step_count() + 1;
  drop_window();
  MG_CHECK(opts_.non_finite == NonFinite::skip,
           "gradient accumulation: " << what.str() << " in the window of optimizer step " << step_number << " ("
           << info.samples << " samples in " << info.micro_batches << " micro-batches); the window was dropped. "
           "---> HINT: lower the learning rate, enable clipping, or check the data; NonFinite::skip drops such "
           "windows and goes on");
  info.skipped = true;
  ++skipped_steps_;
  last_ = info;
  return true;
}

bool Accumulator::flush(StepInfo* info) {
  if (pending_micro_batches_ == 0 && !data_parallel()) return false;
  StepInfo s = step_window(true);
  if (s.samples == 0) return false;  // nothing pending on any rank
  if (info) *info = s;
  return true;
}

void Accumulator::set_steps(int64_t n) {
  MG_CHECK(n >= 1, "Accumulator::set_steps: steps must be >= 1, got " << n);
  MG_CHECK(pending_micro_batches_ == 0 || n == opts_.steps,
           "Accumulator::set_steps(" << n << "): " << pending_micro_batches_
                                     << " micro-batches are pending; call flush() first");
  opts_.steps = n;
}

}  // namespace mg::optim
