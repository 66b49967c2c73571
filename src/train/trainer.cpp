// mg::Trainer (Note [the trainer's step] in minigrad/train/trainer.h).
#include <minigrad/train/trainer.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <span>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <minigrad/cuda.h>
#include <minigrad/dist/dist.h>
#include <minigrad/minigrad.h>
#include <minigrad/nn/checkpoint_plan.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/optim/train_state.h>
#include <minigrad/util/bytes.h>

#include "train/feed.h"

namespace mg {

namespace {

std::string first_line(const std::exception& e) {
  const std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

Shape with_rows(int64_t rows, const Shape& sample) {
  Shape s{rows};
  s.insert(s.end(), sample.begin(), sample.end());
  return s;
}

std::string hms(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  }
  return buf;
}

// The TrainPlan of one micro-batch b of an effective batch B with a given checkpoint plan.
nn::TrainPlan fixed_split(int64_t batch, int64_t micro, const nn::Plan& plan, size_t budget) {
  nn::TrainPlan tp;
  tp.effective_batch = batch;
  tp.micro_batch = micro;
  tp.accumulation = (batch + micro - 1) / micro;
  tp.last_micro_batch = batch - (tp.accumulation - 1) * micro;
  tp.checkpoint = plan;
  tp.budget = budget;
  tp.predicted_peak = plan.predicted_peak;
  return tp;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double FitReport::median_step_ms() const {
  if (step_ms.empty()) return 0;
  std::vector<double> v = step_ms;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string FitReport::json() const {
  nlohmann::ordered_json j;
  j["plan"] = plan.str();
  j["precision"] = precision_name(precision);
  j["prefetch"] = prefetch;
  j["micro_batch"] = plan.micro_batch;
  j["accumulation"] = plan.accumulation;
  j["effective_batch"] = plan.effective_batch;
  j["checkpoint"] = plan.checkpoint.str();
  j["predicted_peak_bytes"] = plan.predicted_peak;
  j["peak_in_use_bytes"] = peak_in_use;
  j["steps"] = steps;
  j["resumed_from_epoch"] = resumed_from_epoch;
  j["median_step_ms"] = median_step_ms();
  j["step_ms"] = step_ms;
  j["step_issue_ms"] = step_issue_ms;
  j["step_data_ms"] = step_data_ms;
  j["step_peak_in_use_bytes"] = step_peak_in_use;
  j["step_peak_reserved_bytes"] = step_peak_reserved;
  j["step_system_allocs"] = step_system_allocs;
  j["losses"] = losses;
  j["replans"] = nlohmann::json::array();
  for (const Replan& r : replans) {
    j["replans"].push_back({{"step", r.step}, {"memory_bytes", r.memory}, {"from", r.from}, {"to", r.to}, {"cause", r.cause}});
  }
  j["epochs"] = nlohmann::json::array();
  for (const EpochReport& e : epochs) {
    j["epochs"].push_back({{"epoch", e.epoch}, {"steps", e.steps}, {"samples", e.samples}, {"mean_loss", e.mean_loss},
                           {"seconds", e.seconds}, {"saved", e.saved}});
  }
  return j.dump();
}

Trainer::Trainer(nn::Sequential& model, std::shared_ptr<const data::Dataset> data, optim::Optimizer& opt,
                 TrainerOptions opts, TrainerCallbacks callbacks)
    : model_(model), data_(std::move(data)), opt_(opt), opts_(std::move(opts)), cb_(std::move(callbacks)) {
  MG_CHECK(data_, "Trainer: no data set");
  check_options();
  MG_CHECK(data_->size() >= opts_.batch_size, "Trainer: the data set has " << data_->size()
                                                                           << " samples, fewer than one batch of "
                                                                           << opts_.batch_size);
  for (const auto& [epoch, n] : opts_.accumulation.table()) {
    MG_CHECK(!opts_.drop_last || data_->size() >= n * opts_.batch_size,
             "Trainer: the accumulation schedule's N = " << n << " from epoch " << epoch << " makes a step of "
                                                          << n * opts_.batch_size << " samples, more than the data set's "
                                                          << data_->size() << " (with drop_last no step would run)");
  }
}

Trainer::Trainer(nn::Sequential& model, std::shared_ptr<const data::WindowData> windows, optim::Optimizer& opt,
                 TrainerOptions opts, TrainerCallbacks callbacks)
    : model_(model), windows_(std::move(windows)), opt_(opt), opts_(std::move(opts)), cb_(std::move(callbacks)) {
  MG_CHECK(windows_, "Trainer: no data");
  check_options();
  MG_CHECK(windows_->rows_per_window() == rank_batch_,
           "Trainer: the data's windows hold " << windows_->rows_per_window() << " rows on each rank, the batch "
                                               << opts_.batch_size << " over " << dist::world_size() << " rank(s) "
                                               << rank_batch_);
  MG_CHECK(opts_.max_steps > 0, "Trainer: data read in windows needs max_steps (the steps of an epoch)");
  MG_CHECK(opts_.accumulation.str() == optim::AccumulationSchedule(1).str(),
           "Trainer: data read in windows takes one window a step: no accumulation schedule (got "
               << opts_.accumulation.str() << "); the plan's micro-batches split the window");
}

void Trainer::check_options() {
  const std::vector<Tensor> params = model_.parameters();
  MG_CHECK(!params.empty(), "Trainer: the model has no parameters");
  dev_ = params.front().device();
  prefetch_ = opts_.prefetch == Prefetch::on || (opts_.prefetch == Prefetch::automatic && dev_.is_cuda());
  MG_CHECK(opts_.batch_size >= 1, "Trainer: batch_size must be >= 1, got " << opts_.batch_size);
  MG_CHECK(opts_.micro_batch >= 0, "Trainer: micro_batch must be >= 0 (0: chosen), got " << opts_.micro_batch);
  MG_CHECK(opts_.epochs >= 1, "Trainer: epochs must be >= 1, got " << opts_.epochs);
  MG_CHECK(opts_.max_steps >= 0, "Trainer: max_steps must be >= 0 (0: no limit), got " << opts_.max_steps);
  MG_CHECK(opts_.plan_timing_passes >= 1, "Trainer: plan_timing_passes must be >= 1, got " << opts_.plan_timing_passes);
  const int64_t world = dist::world_size();
  MG_CHECK(opts_.batch_size % world == 0, "Trainer: batch_size " << opts_.batch_size << " is split over " << world
                                                                 << " ranks: it must be a multiple of " << world);
  rank_batch_ = opts_.batch_size / world;
  MG_CHECK(!opts_.measure_loss || opts_.loss, "Trainer: measure_loss needs the loss (TrainerOptions::loss) to measure");
  MG_CHECK(opts_.micro_batch <= rank_batch_, "Trainer: micro_batch " << opts_.micro_batch << " is larger than the "
                                                                      << rank_batch_ << " samples of a step on a rank");
  if (opts_.memory_budget.empty()) nn::check_plan_spec(opts_.checkpoint);
  if (!opts_.memory_budget.empty() && opts_.memory_budget != "free") budget_ = parse_bytes(opts_.memory_budget);
}

Tensor Trainer::example(int64_t rows) const { return windows_->window_rows(0, 0, rows).x.to(dev_); }

nn::MemoryReport Trainer::explain_memory() const {
  MG_CHECK(planned_, "Trainer::explain_memory: call plan() first");
  return nn::explain_memory(cost_, plan_.checkpoint, nn::fixed_parts(model_, &opt_), budget_ ? budget_ : memory_capacity(dev_));
}

void Trainer::add_own_measure_options(nn::MeasureOptions& mo) const {
  mo.staged_batches = prefetch_ ? 1 : 0;  // Note [prefetched micro-batches]
  mo.gradients_zero = true;  // zero_gradients() before measuring
  if (!opts_.measure_loss) return;
  mo.head = opts_.loss;
  mo.head_targets = [this](int64_t rows) {
    if (windows_) return windows_->window_rows(0, 0, rows).y.to(dev_);
    std::vector<int64_t> idx(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) idx[static_cast<size_t>(i)] = i % data_->size();
    return data_->get_batch(idx).y.to(dev_);
  };
}

nn::ChainCost Trainer::measure(int64_t rows, nn::MeasureOptions opts) {
  add_own_measure_options(opts);
  if (windows_) return nn::measure_chain(model_, example(rows), opts);
  return nn::measure_chain(model_, with_rows(rows, data_->sample_shape()), opts);
}

void Trainer::print(const std::string& line) const {
  if (opts_.progress == Progress::off || dist::rank() != 0) return;
  std::fflush(stdout);  // after what the caller printed before, in a log of both
  std::fprintf(stderr, "%s\n", line.c_str());
}

// Before measuring (MeasureOptions::gradients_zero): a window starts from zero gradients anyway.
void Trainer::zero_gradients() {
  for (const Tensor& p : model_.parameters()) {
    if (p.grad().defined()) p.grad().fill_(0.0f);
  }
}

// The plan for `memory` bytes (0: no budget): Note [the trainer's step]. The gradients are zero
// (plan() and replan() zero them; measuring leaves them as it found them).
void Trainer::plan_for(size_t memory) {
  // The loss's targets per row: a token per position for windows (a GPT's), one label otherwise.
  const int64_t targets_per_row = windows_ ? windows_->window_rows(0, 0, 1).y.numel() : 1;
  auto measure_at = [&](int64_t b) {
    nn::MeasureOptions mo;
    mo.targets_per_row = targets_per_row;
    if (opts_.tiles) {
      mo.tile_rows = nn::tile_rows_below(b);
      mo.tiles_measured = preflight_;  // one and two rows: not measured again
    }
    mo.offload = opts_.offload;
    return measure(b, mo);
  };
  if (memory == 0) {  // no budget: the split and the checkpoint spec as given
    const int64_t b = opts_.micro_batch > 0 ? opts_.micro_batch : rank_batch_;
    print("measuring the model at micro-batch " + std::to_string(b) + " for the plan '" + opts_.checkpoint + "'");
    try {
      cost_ = measure_at(b);
    } catch (const OutOfMemoryError& e) {
      if (dist::active()) throw;  // each rank would plan alone
      replan(memory_capacity(dev_), -1, "micro-batch " + std::to_string(b) + ", checkpoint " + opts_.checkpoint,
                 "measuring ran out of memory (" + first_line(e) + ")");
      return;
    }
    plan_ = fixed_split(rank_batch_, b, nn::make_plan(cost_, opts_.checkpoint), 0);
    return;
  }
  if (opts_.micro_batch > 0) {  // the micro-batch kept, its checkpoint plan fitted to the memory
    const int64_t b = opts_.micro_batch;
    print("measuring the model at micro-batch " + std::to_string(b) + " to fit " + format_bytes(memory));
    cost_ = measure_at(b);
    const size_t room = static_cast<size_t>(static_cast<double>(memory) * (1.0 - 1.0 / 64));
    plan_ = fixed_split(rank_batch_, b, nn::plan_budget(cost_, room), memory);
    return;
  }
  // The candidates, less those the pre-flight check's one sample says cannot fit, with a margin
  // (measuring them would take long and could only show that).
  std::vector<int64_t> sizes;
  for (int64_t b : nn::candidate_micro_batches(rank_batch_)) {
    if (sizes.empty() || per_sample_ <= 0 ||
        static_cast<double>(fixed1_) + per_sample_ * static_cast<double>(b) <= 1.25 * static_cast<double>(memory)) {
      sizes.push_back(b);
    }
  }
  print("measuring the model at " + std::to_string(sizes.size()) + " micro-batch sizes (" + std::to_string(sizes.front()) +
        " to " + std::to_string(sizes.back()) + ") to plan " + std::to_string(rank_batch_) + " samples a step for " +
        format_bytes(memory));
  nn::MeasureOptions mo;
  add_own_measure_options(mo);
  mo.stop_when_flat = true;
  mo.timing_passes = opts_.plan_timing_passes;
  mo.targets_per_row = targets_per_row;
  mo.offload = opts_.offload;
  if (opts_.progress != Progress::off && dist::rank() == 0 && sizes.back() >= 1024) {  // long enough to show
    mo.on_measure = [&](int64_t b) { print("  measuring micro-batch " + std::to_string(b)); };
  }
  const nn::ChainProfile profile =
      windows_ ? nn::profile_chain(model_, [&](int64_t rows) { return example(rows); }, sizes, memory, mo)
               : nn::profile_chain(model_, data_->sample_shape(), sizes, memory, mo);
  for (int64_t b : profile.cannot_train) {  // Note [joint plan]: a ResNet at 32x32 and one image
    print("micro-batch " + std::to_string(b) + " cannot train (" + profile.cannot_train_why +
          "): planning with larger ones");
  }
  nn::TrainPlanOptions po;
  po.tiles = opts_.tiles;
  plan_ = nn::plan_training(profile, rank_batch_, memory, po);
  for (size_t i = 0; i < profile.micro_batches.size(); ++i) {
    if (profile.micro_batches[i] == plan_.micro_batch) cost_ = nn::cost_with_tiles(profile, i);
  }
  if (!opts_.tiles) cost_.tile_costs.clear();
}

// Plans again for `memory` (what the device has) in place of the plan `from`, `cause` saying why:
// a Replan of step `step` (-1: before training). A micro-batch fixed under a budget keeps its size
// and gets a new checkpoint plan when one fits; otherwise the joint planner splits the batch (the
// samples of a step kept).
void Trainer::replan(size_t memory, int64_t step, const std::string& from, const std::string& cause) {
  zero_gradients();  // a redone window starts from zero ones anyway
  print(cause + "\n  planning again for what the device has, " + format_bytes(memory));
  bool planned = false;
  if (opts_.micro_batch > 0 && !opts_.memory_budget.empty()) {
    try {
      plan_for(memory);
      planned = true;
    } catch (const OutOfMemoryError&) {
      throw;
    } catch (const Error&) {
      print("  no checkpoint plan of micro-batch " + std::to_string(opts_.micro_batch) + " fits: planning the split too");
    }
  }
  if (!planned) {
    opts_.micro_batch = 0;
    try {
      plan_for(memory == 0 ? 1 : memory);
    } catch (const OutOfMemoryError&) {
      throw;
    } catch (const Error& no_plan) {
      throw Error(cause + ", and no plan fits what the device has, " + format_bytes(memory) + ": " + no_plan.what());
    }
  }
  budget_ = memory;
  print("  re-planned: " + plan_.str() + ", predicted peak " + format_bytes(plan_.predicted_peak));
  Replan r;
  r.step = step;
  r.memory = memory;
  r.from = from;
  r.to = plan_.str();
  r.cause = cause;
  replans_.push_back(r);
}

const nn::TrainPlan& Trainer::plan() {
  if (planned_) return plan_;
  // What an attempt that threw (no plan fits; out of memory under a budget) left is dropped, so
  // that calling plan() again, after a cap was raised, starts as the first call did.
  window_buffers_.clear();
  replans_.clear();
  struct DropPreflight {  // however plan() ends: a re-plan in fit() measures afresh
    std::vector<nn::ChainCost>& costs;
    ~DropPreflight() { costs.clear(); }
  } drop_preflight{preflight_};
  const AutocastGuard cast(opts_.precision);  // measured in the dtypes the steps run in
  zero_gradients();  // before measuring (MeasureOptions::gradients_zero)
  // The copy of the buffers a redone window goes back to (fit), made before anything is measured,
  // so that every plan counts it. Not under data parallelism, where out of memory is not recovered.
  if (!dist::active()) {
    for (const auto& [name, b] : model_.named_buffers()) window_buffers_.push_back(b.clone());
  }
  const size_t capacity = memory_capacity(dev_);
  const size_t given = opts_.memory_budget.empty() || opts_.memory_budget == "free" ? 0 : parse_bytes(opts_.memory_budget);
  const size_t memory = opts_.memory_budget.empty() ? 0 : (opts_.memory_budget == "free" ? capacity : given);
  budget_ = memory;  // plan_for may change it (measuring ran out of memory)
  // The pre-flight check: one sample measured, the micro-batch's least need extrapolated, so that
  // a batch that cannot fit is known in seconds, not after measuring it. Under a budget it is
  // refused; without one, a micro-batch over what the device has is planned jointly for the
  // device instead (the samples of a step kept), as when measuring it runs out of memory, unless
  // one sample cannot fit either. A chain that cannot train on one sample (BatchNorm with one
  // value per channel) skips the check.
  const int64_t b = opts_.micro_batch > 0 ? opts_.micro_batch : (memory == 0 ? rank_batch_ : 1);
  std::string over_device;  // why the given micro-batch is planned jointly instead
  const auto preflight = std::chrono::steady_clock::now();
  try {
    // The least peak of any plan at 1 and 2 samples: its growth per sample and what does not grow
    // (a one-sample peak alone holds workspaces that do not scale, and would overstate it).
    preflight_.push_back(measure(1, {}));
    const size_t floor1_bytes = nn::min_feasible_peak(preflight_.back());
    const double floor1 = static_cast<double>(floor1_bytes);
    double per_sample = floor1 - static_cast<double>(std::min(floor1_bytes, preflight_.back().fixed_bytes));
    if (rank_batch_ >= 2) {
      preflight_.push_back(measure(2, {}));
      per_sample = std::max(0.0, static_cast<double>(nn::min_feasible_peak(preflight_.back())) - floor1);
    }
    const double base = floor1 - per_sample;
    per_sample_ = per_sample;
    fixed1_ = static_cast<size_t>(std::max(0.0, base));
    auto need_at = [&](int64_t rows) { return base + per_sample * static_cast<double>(rows); };
    // An estimate: a micro-batch counts as over only when over by a quarter; nearer the limit the
    // plan is made from its own measuring (and, without a budget, a measuring that runs out of
    // memory plans jointly too).
    const double slack = 1.25;
    const bool single = dist::active();  // several ranks: no joint planning on its own
    const size_t limit = memory ? memory : capacity;
    // Under a budget: the micro-batch (1 for the joint planner). Without one: one sample, unless a
    // split is not allowed (several ranks), then the micro-batch.
    const int64_t least = memory || single ? b : 1;
    if (need_at(least) > slack * static_cast<double>(limit)) {
      MG_FAIL("Trainer: " << (memory ? "no plan fits a budget of " + format_bytes(memory) + ": "
                                     : single ? std::string()
                                              : "no plan fits what the device " + dev_.str() + " has, " +
                                                    format_bytes(capacity) + ": ")
              << "a micro-batch of " << least << " sample" << (least == 1 ? "" : "s") << " needs about "
              << format_bytes(static_cast<size_t>(need_at(least))) << " with the least memory any checkpoint plan takes ("
              << format_bytes(static_cast<size_t>(std::max(0.0, base))) << " and "
              << format_bytes(static_cast<size_t>(per_sample)) << " per sample, measured at one and two samples), and "
              << (memory ? "the memory budget is " + format_bytes(memory)
                         : "the device " + dev_.str() + " has " + format_bytes(capacity))
              << (memory == 0 ? (single ? "; give a memory budget (the joint planner splits the batch) or a "
                                          "smaller micro-batch"
                                        : "; no plan of any micro-batch fits")
                              : opts_.micro_batch > 0 ? "; a smaller micro-batch, or none (the planner chooses)" : ""));
    }
    if (memory == 0 && !single && need_at(b) > slack * static_cast<double>(capacity)) {
      over_device = "a micro-batch of " + std::to_string(b) + " samples needs about " +
                    format_bytes(static_cast<size_t>(need_at(b))) + ", the device " + dev_.str() + " has " +
                    format_bytes(capacity);
    }
  } catch (const OutOfMemoryError& e) {
    // One sample does not fit what is left: without a budget the joint planner says what any
    // plan needs (it fails too); under a budget, or several ranks, the error stands.
    if (memory != 0 || dist::active()) throw;
    over_device = "measuring one sample ran out of memory (" + first_line(e) + ")";
  } catch (const Error& e) {
    if (std::string(e.what()).rfind("Trainer:", 0) == 0) throw;
  }
  plan_times_.preflight_ms = ms_since(preflight);
  const auto measuring = std::chrono::steady_clock::now();
  if (!over_device.empty()) {
    replan(capacity, -1, "micro-batch " + std::to_string(b) + ", checkpoint " + opts_.checkpoint, over_device);
    plan_times_.measure_ms = ms_since(measuring);
    planned_ = true;
    return plan_;
  }
  plan_for(memory);
  plan_times_.measure_ms = ms_since(measuring);
  planned_ = true;
  print("plan: " + plan_.str() + (plan_.predicted_peak ? ", predicted peak " + format_bytes(plan_.predicted_peak) : ""));
  return plan_;
}

// The save folder, made and tidied after a crash (Note [a pair of files as one unit] in
// src/optim/train_state.cpp): dead writers' temporaries go, a state left without its weights gets
// them. Once, before anything is resumed from it or written to it.
void Trainer::tidy_save_dir() {
  if (tidied_ || opts_.save_dir.empty()) return;
  tidied_ = true;
  std::filesystem::create_directories(opts_.save_dir);
  if (dist::rank() == 0) {
    const optim::CheckpointRepair r = optim::repair_checkpoints(opts_.save_dir);
    if (r.temporaries_removed > 0) {
      print(opts_.save_dir + ": removed " + std::to_string(r.temporaries_removed) +
            " temporary file(s) left by an interrupted save");
    }
    for (const std::string& w : r.completed) print(w + ": written from its training state (a save was interrupted)");
  }
  if (dist::world_size() > 1) dist::barrier();
}

std::string Trainer::resume(const std::string& path) {
  plan();  // measuring after the generator came back would move it
  tidy_save_dir();  // a state the last run left alone gets its weights first
  std::string state = path;
  if (std::filesystem::is_directory(path)) {
    const std::string base = optim::latest_checkpoint(path);
    MG_CHECK(!base.empty(), path << ": the folder holds no complete epoch_K.state.safetensors + epoch_K.safetensors pair");
    state = base + ".state.safetensors";
  } else if (path.ends_with(".safetensors") && !path.ends_with(".state.safetensors")) {
    state = path.substr(0, path.size() - 12) + ".state.safetensors";  // epoch_K.safetensors: its state
  }
  const optim::TrainState st = optim::load_train_state(state, model_, opt_);
  for (const auto& [key, value] : opts_.signature) {
    const auto it = st.extra.find(key);
    if (it == st.extra.end() || it->second != value) {
      print("warning: resuming: " + key + " was \"" + (it == st.extra.end() ? "?" : it->second) + "\", now \"" + value +
            "\": the result will not match an uninterrupted run");
    }
  }
  first_epoch_ = st.epoch;
  resumed_ = true;
  if (dist::rank() == 0 && opts_.progress != Progress::off) {  // on stdout, as the apps' lines (a script finds the file there)
    std::printf("resumed from %s: %lld epoch%s done, %lld optimizer steps\n", state.c_str(),
                static_cast<long long>(st.epoch), st.epoch == 1 ? "" : "s", static_cast<long long>(st.step_count));
    std::fflush(stdout);
  }
  return state;
}

FitReport Trainer::fit() {
  using clock = std::chrono::steady_clock;
  plan();
  reset_host_peak_memory_stats();  // what offloaded segments hold, not what measuring the link took
  FitReport report;
  report.replans = replans_;
  const int64_t world = dist::world_size(), rank = dist::rank();
  const bool lead = rank == 0;

  // Saving: the folder tidied after a crash (Note [a pair of files as one unit]); resume from the
  // newest complete checkpoint pair there, unless resume() was called or resume is off.
  if (!opts_.save_dir.empty()) {
    tidy_save_dir();
    if (!resumed_ && opts_.resume && !optim::latest_checkpoint(opts_.save_dir).empty()) resume(opts_.save_dir);
  }
  report.resumed_from_epoch = first_epoch_;
  int64_t step = opt_.step_count();
  if (dist::active()) {
    std::string signature;  // every rank runs the same configuration
    for (const auto& [key, value] : opts_.signature) signature += key + "=" + value + "\n";
    if (!signature.empty()) dist::check_same("the run's signature (TrainerOptions::signature)", signature);
    dist::check_same_parameters(model_.named_parameters());
    dist::broadcast(model_.parameters());
  }
  const auto buffers = model_.named_buffers();
  model_.train();

  optim::Accumulator acc(opt_, {.steps = plan_.accumulation, .clip_norm = opts_.clip_norm,
                                .non_finite = opts_.non_finite, .normalize = opts_.normalize,
                                .loss_scaling = {.on = opts_.precision == Precision::fp16}});
  // The default loss: the sum over the micro-batch, or its mean under Normalize::micro_batches.
  const Reduction reduction = opts_.normalize == optim::Normalize::samples ? Reduction::sum : Reduction::mean;
  const optim::LossFn loss_fn = opts_.loss ? opts_.loss : [reduction](const Tensor& logits, const Tensor& y) {
    return cross_entropy(logits, y, reduction);
  };
  // This rank's samples of an epoch (Note [shards]): every K-th of the epoch's order, n / K of them
  // on every rank.
  const int64_t shard = windows_ ? 0 : data_->size() / world;
  auto shard_order = [&](int64_t epoch) {
    if (windows_) return std::vector<int64_t>();  // windows are read in order
    const std::vector<int64_t> all = data::epoch_permutation(data_->size(), opts_.seed, epoch);
    std::vector<int64_t> mine(static_cast<size_t>(shard));
    for (int64_t j = 0; j < shard; ++j) mine[static_cast<size_t>(j)] = all[static_cast<size_t>(rank + j * world)];
    return mine;
  };
  const bool tty = opts_.progress == Progress::automatic && isatty(fileno(stderr)) && lead;
  const bool show = opts_.progress != Progress::off && lead;

  // An out-of-memory error in step `at`: plan for what the device has now (Note [the trainer's step]).
  auto replan_step = [&](const OutOfMemoryError& e, int64_t at) {
    if (dist::active()) throw;  // every rank would have to re-plan at the same window
    replan(memory_capacity(dev_), at, plan_.str(),
           "step " + std::to_string(at + 1) + " ran out of memory (" + first_line(e) + ")");
    report.replans.push_back(replans_.back());
  };
  // The micro-batches of a window of `m` samples on this rank: groups of the batch (N(e) of them),
  // each split as the plan says. {first sample, rows}, from the window's start.
  auto split_window = [&](int64_t m) {
    std::vector<std::pair<int64_t, int64_t>> parts;
    for (int64_t g = 0; g < m; g += rank_batch_) {
      const int64_t group = std::min(rank_batch_, m - g);
      for (int64_t j = 0; j < group; j += plan_.micro_batch) parts.emplace_back(g + j, std::min(plan_.micro_batch, group - j));
    }
    return parts;
  };

  // Note [prefetched micro-batches]: a micro-batch's tensors (a window's shapes from its first row),
  // and how one of an epoch is read into host buffers, on the reading thread.
  std::vector<BatchStage::Spec> row_specs;  // x and y of one row
  if (!windows_) {
    row_specs = {{data_->sample_shape(), DType::f32}, {{}, DType::i64}};
  } else if (prefetch_) {
    const data::Batch one = windows_->window_rows(0, 0, 1);
    for (const Tensor& t : {one.x, one.y}) row_specs.push_back({Shape(t.shape().begin() + 1, t.shape().end()), t.dtype()});
  }
  MicroBatchFeed feed(dev_, [row_specs](int64_t rows) {
    std::vector<BatchStage::Spec> specs = row_specs;
    for (BatchStage::Spec& sp : specs) sp.shape = with_rows(rows, sp.shape);
    return specs;
  });
  auto reader_for = [&](int64_t epoch, std::shared_ptr<const std::vector<int64_t>> order) -> MicroBatchFeed::Read {
    if (windows_) {
      return [windows = windows_, row_specs](const MicroBatch& m, std::vector<HostBuffer>& host) {
        const data::Batch b = windows->window_rows(m.step, m.first, m.rows);
        for (size_t i = 0; i < host.size(); ++i) {
          const Tensor& t = i == 0 ? b.x : b.y;
          MG_CHECK(t.dtype() == row_specs[i].dtype && t.shape() == with_rows(m.rows, row_specs[i].shape),
                   "Trainer: the data's window rows came as " << shape_str(t.shape()) << " " << dtype_name(t.dtype())
                                                              << ", the first window's as "
                                                              << shape_str(with_rows(m.rows, row_specs[i].shape)) << " "
                                                              << dtype_name(row_specs[i].dtype));
          std::memcpy(host[i].data(), t.raw_data(), t.nbytes());
        }
      };
    }
    return [data = data_, epoch, order](const MicroBatch& m, std::vector<HostBuffer>& host) {
      const std::span<const int64_t> idx(order->data() + m.start + m.first, static_cast<size_t>(m.rows));
      data->read_batch(idx, epoch, {static_cast<float*>(host[0].data()), static_cast<size_t>(m.rows * data->sample_numel())},
                       {static_cast<int64_t*>(host[1].data()), static_cast<size_t>(m.rows)});
    };
  };

  if (opts_.precision == Precision::tf32) {
    cuda::set_tf32_matmul(true);
    cuda::set_tf32_conv(true);
  }
  const AutocastGuard cast(opts_.precision);  // every step's forward and backward (Note [autocast])
  synchronize(dev_);  // the planning's and the resume's work is not the first step's time
  for (int64_t epoch = first_epoch_; epoch < opts_.epochs; ++epoch) {
    if (opts_.max_steps > 0 && report.steps >= opts_.max_steps) break;
    const auto order = std::make_shared<const std::vector<int64_t>>(shard_order(epoch));
    const int64_t n_acc = windows_ ? 1 : opts_.accumulation.steps_for_epoch(epoch);
    const int64_t window_rows = n_acc * rank_batch_;  // a window's samples on this rank
    const int64_t windows = windows_ ? opts_.max_steps
                                     : (opts_.drop_last ? shard / window_rows : (shard + window_rows - 1) / window_rows);
    auto rows_of = [&](int64_t w) { return windows_ ? rank_batch_ : std::min(window_rows, shard - w * window_rows); };
    // The epoch's micro-batches from window w on, as the steps will take them, to the feed.
    auto feed_from = [&](int64_t w) {
      std::vector<MicroBatch> list;
      for (int64_t v = w; v < windows; ++v) {
        if (opts_.max_steps > 0 && report.steps + (v - w) >= opts_.max_steps) break;
        for (const auto& [first, n] : split_window(rows_of(v))) list.push_back({step + (v - w), v * window_rows, first, n});
      }
      feed.start(std::move(list), windows_ ? 0 : 2, reader_for(epoch, order));
    };
    if (prefetch_) feed_from(0);
    EpochReport er;
    er.epoch = epoch;
    er.accumulation = n_acc;
    double loss_sum = 0;
    const auto t_epoch = clock::now();
    for (int64_t w = 0; w < windows; ++w) {
      if (opts_.max_steps > 0 && report.steps >= opts_.max_steps) break;
      if (opts_.lr) opt_.set_lr(opts_.lr(step));
      reset_peak_memory_stats(dev_);  // the last step ended with a synchronisation
      if (cb_.on_step_start) cb_.on_step_start(step, false);
      auto t0 = clock::now();
      std::clock_t c0 = std::clock();
      auto last_note = t0;
      double data_ms = 0, data_cpu_ms = 0;  // reading micro-batches (or waiting for them): not the step's time
      uint64_t allocs0 = memory_stats(dev_).system_alloc_count;
      const int64_t start = w * window_rows, rows = rows_of(w);
      // A window redone after out of memory must not count its first try in BatchNorm's running
      // statistics: they are taken back to what they were at the window's start.
      for (size_t i = 0; i < window_buffers_.size(); ++i) window_buffers_[i].copy_(buffers[i].second);
      std::vector<std::pair<int64_t, int64_t>> parts;
      for (int tries = 0;; ++tries) {
        parts = split_window(rows);
        acc.set_steps(static_cast<int64_t>(parts.size()));
        try {
          for (size_t k = 0; k < parts.size(); ++k) {
            const auto [first, n] = parts[k];
            const auto d0 = clock::now();
            const std::clock_t dc0 = std::clock();
            Tensor x, y;
            if (prefetch_) {  // Note [prefetched micro-batches]
              const std::vector<Tensor> xy = feed.take(first, n);
              x = xy[0];
              y = xy[1];
            } else {
              data::Batch mb;
              if (windows_) {
                mb = windows_->window_rows(step, first, n);
              } else {
                const std::span<const int64_t> idx(order->data() + start + first, static_cast<size_t>(n));
                mb = data_->get_batch(idx, epoch);
              }
              x = dev_.is_cpu() ? mb.x : mb.x.to(dev_);
              y = dev_.is_cpu() ? mb.y : mb.y.to(dev_);
            }
            data_ms += std::chrono::duration<double, std::milli>(clock::now() - d0).count();
            data_cpu_ms += 1000.0 * static_cast<double>(std::clock() - dc0) / CLOCKS_PER_SEC;
            if (prefetch_) feed.reserve_next();  // its device memory before this one's kernels
            Tensor loss;
            {  // dropout masks by sample (row), whatever the split (Note [dropout by sample])
              const SampleWindowGuard window = acc.sample_window(first);
              loss = loss_fn(nn::forward_with_plan(model_, plan_.checkpoint, x), y);
            }
            acc.backward(loss, y.numel());  // the loss is a sum over y's elements (samples, or tokens)
            if (prefetch_) feed.pump();     // the next one's copy, beside this one's backward
            // A long step says how far it got (a batch split into many large micro-batches).
            if (show && k + 1 < parts.size() && std::chrono::duration<double>(clock::now() - last_note).count() > 5.0) {
              last_note = clock::now();
              const double secs = std::chrono::duration<double>(last_note - t0).count();
              print("  step " + std::to_string(step + 1) + ": micro-batch " + std::to_string(k + 1) + " of " +
                    std::to_string(parts.size()) + " done in " + hms(secs) + ", the step's ETA " +
                    hms(secs / static_cast<double>(k + 1) * static_cast<double>(parts.size() - k - 1)));
            }
          }
          break;
        } catch (const OutOfMemoryError& e) {
          acc.discard();
          if (prefetch_) feed.stop();  // the staged micro-batch's memory back before re-planning
          if (tries == 2) throw;  // a third plan did not fit either: the prediction is off
          {
            NoGradGuard no_grad;
            for (size_t i = 0; i < window_buffers_.size(); ++i) {
              Tensor b = buffers[i].second;
              b.copy_(window_buffers_[i]);
            }
          }
          replan_step(e, step);
          if (prefetch_) feed_from(w);  // the window again, in the new plan's micro-batches
          // The step's time and peak are the new plan's, not the failed try's nor the measuring's.
          reset_peak_memory_stats(dev_);
          if (cb_.on_step_start) cb_.on_step_start(step, true);
          t0 = clock::now();
          c0 = std::clock();
          data_ms = data_cpu_ms = 0;
          allocs0 = memory_stats(dev_).system_alloc_count;
        }
      }
      const double issue_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count() - data_ms;
      const optim::StepInfo info = acc.step();
      if (world > 1 && !buffers.empty()) dist::broadcast_buffers(buffers);
      synchronize(dev_);  // the optimizer's update too: step() queues it after its one read
      const double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count() - data_ms;
      const double cpu_ms = 1000.0 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC - data_cpu_ms;
      const MemoryStats mem = memory_stats(dev_);
      const size_t peak = mem.peak_in_use;
      const double mean = info.samples > 0 ? info.loss_sum / static_cast<double>(info.samples) : NAN;
      const uint64_t allocs = mem.system_alloc_count - allocs0;
      report.step_ms.push_back(ms);
      report.step_cpu_ms.push_back(cpu_ms);
      report.step_issue_ms.push_back(issue_ms);
      report.step_data_ms.push_back(data_ms);
      report.step_peak_in_use.push_back(peak);
      report.step_peak_reserved.push_back(mem.peak_reserved);
      report.step_system_allocs.push_back(allocs);
      report.losses.push_back(mean);
      report.peak_in_use = std::max(report.peak_in_use, peak);
      report.peak_reserved = std::max(report.peak_reserved, mem.peak_reserved);
      ++report.steps;
      ++er.steps;
      er.skipped_steps += info.skipped;
      er.micro_batches += info.micro_batches;
      er.samples += info.samples;
      loss_sum += info.loss_sum;
      if (cb_.on_step) {
        cb_.on_step({.step = step, .epoch = epoch, .steps_in_epoch = windows, .info = info, .ms = ms, .cpu_ms = cpu_ms,
                     .data_ms = data_ms, .peak_in_use = peak, .peak_reserved = mem.peak_reserved,
                     .system_allocs = allocs});
      }
      ++step;
      if (tty) {
        const double secs = std::chrono::duration<double>(clock::now() - t_epoch).count();
        const double frac = static_cast<double>(w + 1) / static_cast<double>(windows);
        const int width = 24, full = static_cast<int>(frac * width);
        std::fprintf(stderr, "\r epoch %lld/%lld [%s%s] %lld/%lld  %.0f samples/s  loss %.4f  in use %s  ETA %s   ",
                     static_cast<long long>(epoch + 1), static_cast<long long>(opts_.epochs),
                     std::string(static_cast<size_t>(full), '#').c_str(),
                     std::string(static_cast<size_t>(width - full), '.').c_str(), static_cast<long long>(w + 1),
                     static_cast<long long>(windows), static_cast<double>(er.samples) / std::max(secs, 1e-9),
                     mean, format_bytes(peak).c_str(), hms(secs / frac - secs).c_str());
        std::fflush(stderr);
      }
    }
    if (prefetch_) feed.stop();  // before the epoch's checkpoint and on_epoch (nothing is staged past it)
    er.seconds = std::chrono::duration<double>(clock::now() - t_epoch).count();
    er.mean_loss = er.samples > 0 ? loss_sum / static_cast<double>(er.samples) : NAN;
    const bool whole = er.steps == windows;  // an epoch cut short by max_steps is not saved as done
    if (!opts_.save_dir.empty() && whole) {
      const std::string base = opts_.save_dir + "/epoch_" + std::to_string(epoch + 1);
      if (lead) {
        optim::TrainState st;
        st.epoch = epoch + 1;
        st.extra = opts_.signature;
        optim::save_checkpoint(base, model_, opt_, st,
                               {{"plan", plan_.str()}, {"batch_size", std::to_string(opts_.batch_size)},
                                {"seed", std::to_string(opts_.seed)}});
      }
      if (world > 1) dist::barrier();
      er.saved = base;
    }
    if (tty) std::fprintf(stderr, "\n");
    if (show) {
      char line[256];
      std::snprintf(line, sizeof line, "epoch %lld/%lld: %lld steps, loss %.4f, %.1f s, %.0f samples/s, peak in use %s%s%s",
                    static_cast<long long>(epoch + 1), static_cast<long long>(opts_.epochs),
                    static_cast<long long>(er.steps), er.mean_loss, er.seconds,
                    static_cast<double>(er.samples) / std::max(er.seconds, 1e-9),
                    format_bytes(report.peak_in_use).c_str(), er.saved.empty() ? "" : ", saved ", er.saved.c_str());
      print(line);
    }
    report.epochs.push_back(er);
    if (cb_.on_epoch) cb_.on_epoch(er);
  }
  report.plan = plan_;
  report.precision = opts_.precision;
  report.prefetch = prefetch_;
  return report;
}

}  // namespace mg
