// mnist_ga: the experiment of the gradient-accumulation tutorials, done exactly.
// MLP 784-512-512-10, CrossEntropy, SGD (or Adam); batch 64 against batch 16 with 4 accumulated
// micro-batches, which end with the same weights (Note [accumulation normalises by samples],
// minigrad/optim/accumulate.h).
//
//   mnist_ga --epochs 1 --batch-size 64 --accum 1 --save-dir runs/b64
//   mnist_ga --epochs 1 --batch-size 16 --accum 4 --compare runs/b64/epoch_1.safetensors
//   mpirun -np 2 mnist_ga --epochs 1 --batch-size 16 --accum 2   # 2 ranks: a global batch of 64
//
// Data: --data DIR (the four standard IDX names, or only t10k-* which is then split 8,000 / rest);
// without --data, ../shared/data/mnist when present, else generated data (--synthetic forces it).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include <minigrad/data/idx.h>
#include <minigrad/data/loader.h>
#include <minigrad/minigrad.h>
#include <minigrad/optim/accumulate.h>
#include <minigrad/optim/train_state.h>
#include <minigrad/util/bytes.h>

#include "common/flags.h"
#include "common/profile.h"
#include "common/oom.h"
#include "common/ranks.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct Config {
  std::string data_dir, dataset = "mnist", accum_schedule, optimizer = "sgd", device = "auto";
  std::string save_dir, resume, json_path, compare, memory_budget, memory_limit;
  int64_t epochs = 10, batch_size = 64, accum = 1, limit_train = 0, limit_test = 0;
  float lr = 1e-3f, momentum = 0.0f, clip_norm = 0.0f;
  uint64_t seed = 0;
  bool synthetic = false, divide_by_n = false, skip_non_finite = false, profile = false;
};

// The weights --compare names, checked against the model before training: every parameter
// present with its shape, as float32.
mg::nn::SafetensorsFile load_compare(const std::string& path, const mg::nn::Module& model) {
  mg::nn::SafetensorsFile f = mg::nn::load_safetensors(path);
  for (auto& [name, p] : model.named_parameters()) {
    const mg::Tensor* t = f.find(name);
    MG_CHECK(t && t->shape() == p.shape() && t->dtype() == p.dtype(),
             path << " has no tensor " << name << " of shape " << mg::shape_str(p.shape()) << " float32"
                  << (t ? " (it has " + mg::shape_str(t->shape()) + " " + mg::dtype_name(t->dtype()) + ")" : ""));
  }
  return f;
}

// The shared data folder: ../shared/data/mnist from the working folder or from the repository
// root (the binary lives in <repo>/<build>/bin).
std::string find_shared_mnist(const char* argv0) {
  std::vector<fs::path> cands = {"../shared/data/mnist", "../../shared/data/mnist", "../../../shared/data/mnist"};
  std::error_code ec;
  fs::path exe = fs::canonical("/proc/self/exe", ec);
  if (ec) exe = fs::absolute(argv0, ec);
  if (!ec) cands.push_back(exe.parent_path().parent_path().parent_path().parent_path() / "shared/data/mnist");
  for (const fs::path& p : cands) {
    if (fs::exists(p / "t10k-images-idx3-ubyte.gz") || fs::exists(p / "train-images-idx3-ubyte.gz")) {
      return fs::weakly_canonical(p).string();
    }
  }
  return "";
}

struct EvalResult {
  double loss = 0, accuracy = 0;
};

// batch: 1000, or under --memory-budget the planned micro-batch (without gradients it peaks lower
// than a training step of the same size).
EvalResult evaluate(mg::nn::Module& model, const mg::data::Dataset& test, mg::Device dev, int64_t batch = 1000) {
  mg::NoGradGuard ng;
  model.eval();
  mg::data::DataLoader loader(test, {.batch_size = batch, .shuffle = false, .device = dev});
  loader.start_epoch(0);
  mg::data::Batch b;
  double loss = 0;
  int64_t correct = 0;
  while (loader.next(b)) {
    mg::Tensor logits = model.forward(b.x);
    loss += mg::cross_entropy(logits, b.y, mg::Reduction::sum).item();
    auto l = logits.to_vector<float>();
    auto y = b.y.to_vector<int64_t>();
    const int64_t c = logits.size(1);
    for (size_t i = 0; i < y.size(); ++i) {
      const float* row = l.data() + i * c;
      correct += std::max_element(row, row + c) - row == y[i];
    }
  }
  model.train();
  return {loss / test.size(), 100.0 * correct / test.size()};
}

// evaluate, in batches halved until they fit the device (under --memory-limit, say): evaluation
// keeps no state, so a batch that ran out of memory is simply run again smaller.
EvalResult evaluate_fitting(mg::nn::Module& model, const mg::data::Dataset& test, mg::Device dev, int64_t& batch) {
  for (;;) {
    try {
      return evaluate(model, test, dev, batch);
    } catch (const mg::OutOfMemoryError&) {
      if (batch == 1) throw;
      batch = (batch + 1) / 2;
    }
  }
}

std::unique_ptr<mg::optim::Optimizer> make_optimizer(const Config& c, const mg::nn::Module& m) {
  if (c.optimizer == "sgd") {
    return std::make_unique<mg::optim::SGD>(m.parameters(), mg::optim::SGDOptions{.lr = c.lr, .momentum = c.momentum});
  }
  return std::make_unique<mg::optim::Adam>(m.parameters(), mg::optim::AdamOptions{.lr = c.lr});
}

// What must agree between a saved run and its resumption for the result to be bit-identical.
mg::nn::Metadata run_signature(const Config& c, const std::string& data_desc, const std::string& sched) {
  char lr[32], mom[32], clip[32];
  std::snprintf(lr, sizeof lr, "%.9g", c.lr);
  std::snprintf(mom, sizeof mom, "%.9g", c.momentum);
  std::snprintf(clip, sizeof clip, "%.9g", c.clip_norm);
  return {{"config.data", data_desc},       {"config.optimizer", c.optimizer},
          {"config.lr", lr},                {"config.momentum", mom},
          {"config.clip_norm", clip},       {"config.batch_size", std::to_string(c.batch_size)},
          {"config.accum_schedule", sched}, {"config.seed", std::to_string(c.seed)},
          {"config.normalize", c.divide_by_n ? "micro_batches" : "samples"},
          {"config.world_size", std::to_string(mg::dist::world_size())}};
}

void progress(int64_t done, int64_t total, double loss, int64_t epoch) {
  const int width = 30;
  const int fill = static_cast<int>(width * done / std::max<int64_t>(total, 1));
  std::printf("\r  epoch %lld [%.*s%*s] %lld/%lld loss %.4f", static_cast<long long>(epoch), fill,
              "==============================", width - fill, "", static_cast<long long>(done),
              static_cast<long long>(total), loss);
  std::fflush(stdout);
}

// The MLP through a checkpoint plan, as train_epoch's model (a joint plan may checkpoint).
class Planned : public mg::nn::Module {
 public:
  Planned(mg::nn::Sequential& seq, std::vector<mg::nn::Segment> plan) : seq_(seq), plan_(std::move(plan)) {}
  mg::Tensor forward(const mg::Tensor& x) override {
    seq_.train(is_training());
    return mg::nn::forward_with_plan(seq_, plan_, x);
  }
  std::string name() const override { return seq_.name(); }
  void set_plan(std::vector<mg::nn::Segment> plan) { plan_ = std::move(plan); }

 private:
  mg::nn::Sequential& seq_;
  std::vector<mg::nn::Segment> plan_;
};

// The schedule with every N multiplied by `factor` (micro-batches `factor` times smaller, the same
// effective batches); epochs before the first key had N = 1.
mg::optim::AccumulationSchedule scale_schedule(const mg::optim::AccumulationSchedule& s, int64_t factor) {
  std::string spec;
  if (s.table().empty() || s.table().begin()->first != 0) spec = "0:" + std::to_string(factor);
  for (const auto& [epoch, n] : s.table()) spec += (spec.empty() ? "" : ",") + std::to_string(epoch) + ":" + std::to_string(n * factor);
  return mg::optim::AccumulationSchedule::parse(spec);
}

int run(Config c, const char* argv0) {
  const int64_t world = mg::dist::world_size();
  mg::optim::AccumulationSchedule sched =
      c.accum_schedule.empty() ? mg::optim::AccumulationSchedule(c.accum)
                               : for_flag("--accum-schedule", [&] { return mg::optim::AccumulationSchedule::parse(c.accum_schedule); });
  // ---- device ----
  mg::Device dev = c.device == "auto" ? (mg::cuda_available() ? mg::Device::cuda() : mg::Device::cpu())
                                      : for_flag("--device", [&] { return mg::Device::parse(c.device); });
  // Under data parallelism "cuda" (or auto) means each rank's own GPU on its machine.
  dev = mg::dist::device_for_rank(dev, c.device.find(':') != std::string::npos);
  if (dev.is_cuda()) MG_CHECK(mg::cuda_available(), "--device cuda: no CUDA device (or a build without CUDA); use --device cpu");
  size_t limit = 0, budget = 0;
  if (!c.memory_limit.empty()) limit = for_flag("--memory-limit", [&] { return mg::parse_bytes(c.memory_limit); });
  if (!c.memory_budget.empty() && c.memory_budget != "free") {
    budget = for_flag("--memory-budget", [&] { return mg::parse_bytes(c.memory_budget); });
  }
  if (limit != 0) mg::set_memory_limit(dev, limit);

  // ---- data ----
  const mg::data::Normalization norm = c.dataset == "fashion" ? mg::data::Normalization{0.2860f, 0.3530f}
                                                              : mg::data::Normalization{0.1307f, 0.3081f};
  mg::data::Splits splits;
  std::string dir = c.data_dir;
  if (dir.empty() && !c.synthetic && c.dataset == "mnist") dir = find_shared_mnist(argv0);
  if (!dir.empty() && !c.synthetic) {
    splits = c.data_dir.empty() ? mg::data::load_mnist_auto(dir, norm)
                                : for_flag("--data", [&] { return mg::data::load_mnist_auto(dir, norm); });
    splits.description = c.dataset + " from " + splits.description;
  } else {
    const int64_t n_train = c.limit_train > 0 ? c.limit_train : 8000;
    const int64_t n_test = c.limit_test > 0 ? c.limit_test : 2000;
    mg::data::IdxDataset all = mg::data::make_synthetic(n_train + n_test, c.seed + 1000, norm);
    splits.train = all.slice(0, n_train);
    splits.test = all.slice(n_train, n_train + n_test);
    splits.description = std::string("GENERATED synthetic MNIST-like data (") +
                         (c.synthetic ? "--synthetic" : c.dataset == "fashion" ? "no --data for fashion" : "no real data found") +
                         "): " + std::to_string(n_train) + " train, " + std::to_string(n_test) + " test";
  }
  const mg::data::IdxDataset train = splits.train.limit(c.limit_train);
  const mg::data::IdxDataset test = splits.test.limit(c.limit_test);
  LEAD_PRINTF("data: %s; using %lld train, %lld test\n", splits.description.c_str(),
              static_cast<long long>(train.size()), static_cast<long long>(test.size()));

  // ---- model, optimizer, accumulation ----
  mg::manual_seed(c.seed);
  auto model = mg::nn::make_mlp({784, 512, 512, 10});
  model->to(dev);
  auto opt = make_optimizer(c, *model);
  // --memory-budget: --batch-size is the effective batch; the joint planner picks the micro-batch
  // (one that divides it, so that every window holds the same samples as the batch would), N and
  // the checkpoint plan (minigrad/nn/train_plan.h).
  mg::nn::TrainPlan tp;
  // Under data parallelism --batch-size with --memory-budget is the global batch: each rank plans
  // for its part, with the budget per rank.
  MG_CHECK(c.memory_budget.empty() || c.batch_size % world == 0,
           "--batch-size " << c.batch_size << " with --memory-budget is the global batch, split over " << world
                           << " ranks: it must be a multiple of " << world);
  const int64_t effective_batch = c.batch_size / (c.memory_budget.empty() ? 1 : world);
  if (!c.memory_budget.empty()) {
    if (budget == 0) budget = mg::memory_capacity(dev);
    std::vector<int64_t> divisors;
    for (int64_t b : mg::nn::candidate_micro_batches(effective_batch)) {
      if (effective_batch % b == 0) divisors.push_back(b);
    }
    model->train();
    tp = for_flag("--memory-budget", [&] {
      return mg::nn::plan_training(*model, train.sample_shape(), effective_batch, budget, {.micro_batches = divisors});
    });
    c.batch_size = tp.micro_batch;
    sched = mg::optim::AccumulationSchedule(tp.accumulation);
    LEAD_PRINTF("memory budget %s%s: %s\n  predicted peak %s, predicted step %.2f ms (%.4f ms per sample)\n",
                mg::format_bytes(budget).c_str(), c.memory_budget == "free" ? " (what the device has)" : "",
                tp.str().c_str(), mg::format_bytes(tp.predicted_peak).c_str(), tp.predicted_step_ms, tp.ms_per_sample());
  }
  if (limit != 0) LEAD_PRINTF("memory limit %s (mg::set_memory_limit)\n", mg::format_bytes(limit).c_str());
  Planned planned(*model, tp.checkpoint.segments);
  int64_t eval_batch = c.memory_budget.empty() ? 1000 : tp.micro_batch;
  // --compare's file is checked against the model now, not after training.
  const mg::nn::SafetensorsFile compare_file =
      c.compare.empty() ? mg::nn::SafetensorsFile{} : for_flag("--compare", [&] { return load_compare(c.compare, *model); });
  mg::optim::Accumulator acc(*opt, {.steps = sched.steps_for_epoch(0),
                                    .clip_norm = c.clip_norm,
                                    .non_finite = c.skip_non_finite ? mg::optim::NonFinite::skip : mg::optim::NonFinite::error,
                                    .normalize = c.divide_by_n ? mg::optim::Normalize::micro_batches : mg::optim::Normalize::samples});
  // Every rank starts from rank 0's weights, with the same model and configuration (checked).
  mg::dist::check_same_parameters(model->named_parameters());
  mg::dist::broadcast(model->parameters());
  mg::data::DataLoader loader(train, {.batch_size = c.batch_size, .seed = c.seed, .device = dev,
                                      .shard = mg::dist::rank(), .num_shards = world});
  const mg::nn::Metadata signature = run_signature(c, splits.description + " limit " + std::to_string(train.size()), sched.str());
  {
    std::string all;
    for (auto& [k, v] : signature) all += k + "=" + v + "\n";
    mg::dist::check_same("configuration (flags and data)", all);
  }
  if (mg::dist::active()) {  // a world of one too (Note [a world of one])
    LEAD_PRINTF("data parallel: %lld ranks (%s) x %lld micro-batches x %lld samples = a global batch of %lld per optimizer step\n",
                static_cast<long long>(world), mg::dist::backend_name(dev).c_str(),
                static_cast<long long>(sched.steps_for_epoch(0)), static_cast<long long>(c.batch_size),
                static_cast<long long>(world * sched.steps_for_epoch(0) * c.batch_size));
  }

  LEAD_PRINTF("model: MLP 784-512-512-10 (%lld parameters) on %s; %s lr %g%s; batch %lld, accumulation %s%s%s\n",
              static_cast<long long>(model->parameter_count()), dev.str().c_str(), c.optimizer.c_str(), c.lr,
              c.optimizer == "sgd" ? (" momentum " + std::to_string(c.momentum)).c_str() : "",
              static_cast<long long>(c.batch_size), sched.str().c_str(),
              c.clip_norm > 0 ? (", clip-norm " + std::to_string(c.clip_norm)).c_str() : "",
              c.divide_by_n ? ", DIVIDING BY N (the usual, inexact recipe)" : "");

  // A folder written before by --save-dir is first tidied after a crash (Note [a pair of files as
  // one unit], src/optim/train_state.cpp): dead writers' temporaries go, a state left without its
  // weights gets them.
  if (!c.save_dir.empty()) {
    for_flag("--save-dir", [&] { return fs::create_directories(c.save_dir); });
    mg::nn::check_writable((fs::path(c.save_dir) / "epoch_1.safetensors").string(), "--save-dir");
    const mg::optim::CheckpointRepair r =
        for_flag("--save-dir", [&] { return mg::optim::repair_checkpoints(c.save_dir); });
    if (r.temporaries_removed > 0) {
      LEAD_PRINTF("%s: removed %d temporary file(s) left by an interrupted save\n", c.save_dir.c_str(), r.temporaries_removed);
    }
    for (const std::string& w : r.completed) LEAD_PRINTF("%s: written from its training state (a save was interrupted)\n", w.c_str());
  }
  int64_t start_epoch = 0;
  if (!c.resume.empty()) {
    std::string path = c.resume;
    if (fs::is_directory(path)) {
      const std::string base = for_flag("--resume", [&] { return mg::optim::latest_checkpoint(path); });
      MG_CHECK(!base.empty(), "--resume " << path << ": the folder holds no complete epoch_K.state.safetensors + epoch_K.safetensors pair");
      path = base + ".state.safetensors";
    } else if (path.size() > 12 && path.substr(path.size() - 12) == ".safetensors" &&
               path.find(".state.safetensors") == std::string::npos) {
      path = path.substr(0, path.size() - 12) + ".state.safetensors";  // epoch_K.safetensors -> its state
    }
    mg::optim::TrainState st = for_flag("--resume", [&] { return mg::optim::load_train_state(path, *model, *opt); });
    for (auto& [k, v] : signature) {
      auto it = st.extra.find(k);
      if (it == st.extra.end() || it->second != v) {
        LEAD_PRINTF("warning: --resume: %s was \"%s\", now \"%s\": the result will not match an uninterrupted run\n",
                    k.c_str(), it == st.extra.end() ? "?" : it->second.c_str(), v.c_str());
      }
    }
    start_epoch = st.epoch;
    LEAD_PRINTF("resumed from %s: %lld epochs done, %lld optimizer steps\n", path.c_str(),
                static_cast<long long>(st.epoch), static_cast<long long>(opt->step_count()));
  }

  // ---- train ----
  mg::reset_peak_memory_stats(dev);
  json epochs_json = json::array();
  json replans = json::array();  // what out-of-memory recovery changed
  const bool tty = isatty(fileno(stdout)) && lead();
  EvalResult last{};
  // --profile: the optimizer steps after the run's first (or the only one), evaluation left out
  // (apps/common/profile.h).
  StepProfile prof{c.profile};
  int64_t run_steps = 0;
  for (int64_t e = start_epoch; e < c.epochs; ++e) {
    const int64_t n = sched.steps_for_epoch(e);
    run_steps += (loader.num_batches() + n - 1) / n;
  }
  if (run_steps == 1) prof.window_start(dev, /*only_step=*/true);
  for (int64_t e = start_epoch; e < c.epochs; ++e) {
    acc.set_steps(sched.steps_for_epoch(e));
    mg::optim::TrainCallbacks cb;
    int64_t seen = 0, seen_samples = 0;
    double loss_sum = 0;
    if (tty || prof.on) {
      // Per optimizer step: the losses come back once per step (Note [one read per step]).
      cb.on_step = [&](const mg::optim::StepInfo& info) {
        if (prof.in_window) ++prof.window_steps;
        else if (!prof.started) prof.window_start(dev);  // the run's first step is done
        if (!tty) return;
        seen += info.micro_batches;
        seen_samples += info.samples;
        loss_sum += info.loss_sum;
        progress(seen, loader.num_batches() * world, loss_sum / seen_samples, e + 1);
      };
    }
    // Out of memory inside a window (a full device, or --memory-limit): Note [recovering from
    // out-of-memory]. Re-plan jointly for what the device has, in micro-batches that divide the
    // current one (so that every epoch's effective batch stays), and redo the window.
    if (!mg::dist::active()) {  // not under data parallelism, even of one rank (train_epoch refuses it)
      cb.on_out_of_memory = [&](const mg::OutOfMemoryError& err, int64_t b) {
        std::vector<int64_t> smaller;
        for (int64_t d = 1; d < b; ++d) {
          if (b % d == 0) smaller.push_back(d);
        }
        if (smaller.empty()) return b;  // nothing smaller to try: the error stands
        const size_t there = mg::memory_capacity(dev);
        const int64_t window = b * acc.steps();
        const mg::nn::TrainPlan next = mg::nn::plan_training(*model, train.sample_shape(), window, there, {.micro_batches = smaller});
        planned.set_plan(next.checkpoint.segments);
        sched = scale_schedule(sched, b / next.micro_batch);
        c.batch_size = next.micro_batch;
        eval_batch = std::min(eval_batch, next.micro_batch);
        const std::string what = first_line(err);
        LEAD_PRINTF("%sout of memory at micro-batch %lld (%s)\n  re-planned for %s: %s; predicted peak %s; the window is "
                    "redone from its first sample\n",
                    tty ? "\r" : "", static_cast<long long>(b), what.c_str(), mg::format_bytes(there).c_str(), next.str().c_str(),
                    mg::format_bytes(next.predicted_peak).c_str());
        replans.push_back({{"epoch", e + 1}, {"step", opt->step_count()}, {"memory_bytes", there},
                           {"from_micro_batch", b}, {"to", next.str()}, {"predicted_peak_bytes", next.predicted_peak}});
        prof.window_restart();  // the failed try and the planner's runs are not the steps' work
        return next.micro_batch;
      };
    }
    if (prof.started) prof.window_start(dev);
    mg::optim::EpochStats st = mg::optim::train_epoch(planned, loader, acc, e, {}, cb);
    prof.window_end();
    if (tty) LEAD_PRINTF("\r%*s\r", 80, "");
    if (lead()) last = evaluate_fitting(*model, test, dev, eval_batch);  // the weights are the same on every rank
    const double sps = st.samples / std::max(st.seconds, 1e-9);
    LEAD_PRINTF("Epoch %lld/%lld: train loss %.6f | test loss %.6f, accuracy %.2f%% | %.0f samples/s, %lld optimizer steps (N=%lld)%s\n",
                static_cast<long long>(e + 1), static_cast<long long>(c.epochs), st.mean_loss(), last.loss,
                last.accuracy, sps, static_cast<long long>(st.optimizer_steps),
                static_cast<long long>(acc.steps()),
                st.skipped_steps ? (", " + std::to_string(st.skipped_steps) + " skipped (non-finite)").c_str() : "");
    std::fflush(stdout);
    epochs_json.push_back({{"epoch", e + 1}, {"train_loss", st.mean_loss()}, {"test_loss", last.loss},
                           {"test_accuracy", last.accuracy}, {"samples_per_s", sps},
                           {"optimizer_steps", st.optimizer_steps}, {"skipped_steps", st.skipped_steps},
                           {"accum_steps", acc.steps()}, {"seconds", st.seconds}});
    if (!c.save_dir.empty() && lead()) {
      const std::string base = (fs::path(c.save_dir) / ("epoch_" + std::to_string(e + 1))).string();
      mg::optim::save_checkpoint(base, *model, *opt, {.epoch = e + 1, .extra = signature},
                                 {{"epoch", std::to_string(e + 1)}, {"model", "mlp 784-512-512-10"}});
    }
  }
  if (start_epoch >= c.epochs) {
    last = evaluate(*model, test, dev, eval_batch);
    LEAD_PRINTF("nothing to train (%lld epochs done, --epochs %lld): test loss %.6f, accuracy %.2f%%\n",
                static_cast<long long>(start_epoch), static_cast<long long>(c.epochs), last.loss, last.accuracy);
  }
  prof.print();
  const mg::MemoryStats mem = mg::memory_stats(dev);
  LEAD_PRINTF("peak memory in use on %s: %s; optimizer steps in total: %lld\n", dev.str().c_str(),
              mg::format_bytes(mem.peak_in_use).c_str(), static_cast<long long>(opt->step_count()));

  // ---- compare with saved weights (the exactness demonstration) ----
  double compare_diff = -1;
  if (!c.compare.empty()) {
    for (auto& [name, p] : model->named_parameters()) {
      auto a = p.to_vector<float>(), b = compare_file.find(name)->to_vector<float>();
      for (size_t i = 0; i < a.size(); ++i) compare_diff = std::max(compare_diff, static_cast<double>(std::abs(a[i] - b[i])));
    }
    LEAD_PRINTF("max |w - w(%s)| = %.3g over all %lld parameters\n", c.compare.c_str(), compare_diff,
                static_cast<long long>(model->parameter_count()));
  }

  if (!c.json_path.empty() && lead()) {
    json j = {{"device", dev.str()},
              {"world_size", world},
              {"global_batch", world * c.batch_size * sched.steps_for_epoch(0)},
              {"data", splits.description},
              {"train_samples", train.size()},
              {"test_samples", test.size()},
              {"optimizer", c.optimizer},
              {"lr", c.lr},
              {"momentum", c.momentum},
              {"batch_size", c.batch_size},
              {"accum_schedule", sched.str()},
              {"effective_batch_epoch0", c.batch_size * sched.steps_for_epoch(0)},
              {"micro_batch", c.batch_size},
              {"accumulation", sched.steps_for_epoch(0)},
              {"clip_norm", c.clip_norm},
              {"normalize", c.divide_by_n ? "micro_batches" : "samples"},
              {"seed", c.seed},
              {"resumed_from_epoch", start_epoch},
              {"epochs", epochs_json},
              {"final_test_accuracy", last.accuracy},
              {"total_optimizer_steps", opt->step_count()},
              {"peak_memory_in_use_bytes", mem.peak_in_use},
              {"peak_memory_reserved_bytes", mem.peak_reserved}};
    if (compare_diff >= 0) j["compare_max_abs_diff"] = compare_diff;
    if (!c.memory_budget.empty()) {
      j["memory_budget_bytes"] = budget;
      j["plan"] = tp.checkpoint.str();
      j["predicted_peak_bytes"] = tp.predicted_peak;
      j["predicted_step_ms"] = tp.predicted_step_ms;
    }
    if (limit != 0) j["memory_limit_bytes"] = limit;
    j["replans"] = replans;
    if (prof.on) j["profile"] = prof.json();
    mg::nn::write_file_atomic(c.json_path, j.dump(2) + "\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Under mpirun every rank runs this; mg::dist reduces each step's gradients over them.
  const auto session = start_session("mnist_ga", &argc, &argv);
  CLI::App app{"MLP 784-512-512-10 on MNIST with exact gradient accumulation (libminigrad)"};
  Config c;
  auto* data = app.add_option("--data", c.data_dir, "folder with the MNIST/FashionMNIST IDX files (default: ../shared/data/mnist if present, else generated data)")->check(nonempty());
  app.add_option("--dataset", c.dataset, "mnist or fashion (sets the normalisation)")->check(CLI::IsMember({"mnist", "fashion"}))->capture_default_str();
  app.add_flag("--synthetic", c.synthetic, "use generated MNIST-like data even when real data is present")->excludes(data);
  app.add_option("--epochs", c.epochs, "epochs to train (in total, counting resumed ones)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->capture_default_str();
  app.add_option("--batch-size", c.batch_size, "micro-batch size")->check(CLI::Range(int64_t{1}, int64_t{1} << 24))->capture_default_str();
  auto* accum = app.add_option("--accum", c.accum, "micro-batches per optimizer step (N)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->capture_default_str();
  app.add_option("--accum-schedule", c.accum_schedule, "N by epoch, e.g. \"0:8,4:2\" (epochs counted from 0)")->check(nonempty())->excludes(accum);
  app.add_option("--lr", c.lr, "learning rate")->check(finite_in(0, FLT_MAX, "[0, 3.4e38]"))->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum")->check(finite_in(0, 1, "[0, 1]"))->capture_default_str();
  app.add_option("--optimizer", c.optimizer, "sgd or adam")->check(CLI::IsMember({"sgd", "adam"}))->capture_default_str();
  app.add_option("--clip-norm", c.clip_norm, "clip the global norm of each step's mean gradient (0: off)")->check(finite_in(0, FLT_MAX, "[0, 3.4e38]"))->capture_default_str();
  app.add_option("--device", c.device, "auto, cpu or cuda[:i]")->check(nonempty())->capture_default_str();
  app.add_option("--seed", c.seed, "seed of the weights and of the sample order")->check(unsigned64())->capture_default_str();
  app.add_option("--limit-train", c.limit_train, "use the first N training samples (0: all)")->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--limit-test", c.limit_test, "use the first N test samples (0: all)")->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--save-dir", c.save_dir, "write epoch_K.safetensors and epoch_K.state.safetensors after each epoch")->check(nonempty());
  app.add_option("--resume", c.resume, "continue from an epoch_K.state.safetensors (or epoch_K.safetensors beside it), or from the newest complete epoch in a --save-dir folder")->check(nonempty());
  app.add_option("--json", c.json_path, "write a JSON summary here")->check(nonempty());
  app.add_option("--compare", c.compare, "after training, print the largest weight difference to this .safetensors")->check(nonempty());
  auto* budget_opt = app.add_option("--memory-budget", c.memory_budget,
                                    "plan micro-batch, accumulation and checkpointing for this many bytes (e.g. 4MB, or "
                                    "'free': what the device has); --batch-size is then the effective batch")
                         ->check(nonempty());
  budget_opt->excludes(accum);
  budget_opt->excludes(app.get_option("--accum-schedule"));
  app.add_option("--memory-limit", c.memory_limit, "cap the device's allocator at this many bytes (mg::set_memory_limit)")
      ->check(nonempty());
  app.add_flag("--divide-by-n", c.divide_by_n, "the usual recipe, for comparison: mean loss per micro-batch / N (inexact on short windows)");
  app.add_flag("--skip-non-finite", c.skip_non_finite, "drop a window with a NaN/inf loss or gradient instead of stopping");
  app.add_flag("--profile", c.profile, "after training, the time of every op by pass (forward, backward, replay) over the "
               "optimizer steps after the first, evaluation left out (minigrad/core/profiler.h)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!c.json_path.empty()) mg::nn::check_writable(c.json_path, "--json");
    return run(c, argv[0]);
  } catch (const mg::OutOfMemoryError& e) {
    std::fprintf(stderr, "mnist_ga: %serror: %s%s\n", rank_prefix().c_str(),
                 c.memory_limit.empty() ? "" : ("under --memory-limit " + c.memory_limit + ": ").c_str(), e.what());
    if (mg::dist::world_size() > 1) mg::dist::abort_all(1);  // Note [collectives never hang]
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mnist_ga: %serror: %s\n", rank_prefix().c_str(), e.what());
    if (mg::dist::world_size() > 1) mg::dist::abort_all(1);
    return 1;
  }
}
