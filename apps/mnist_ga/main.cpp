// mnist_ga: the experiment of the gradient-accumulation tutorials, done exactly.
// MLP 784-512-512-10, CrossEntropy, SGD (or Adam); batch 64 against batch 16 with 4 accumulated
// micro-batches, which end with the same weights (Note [accumulation normalises by samples],
// minigrad/optim/accumulate.h). Training runs through mg::Trainer (minigrad/train/trainer.h), with
// the epoch's last, shorter window kept; the test set is evaluated after every epoch.
//
//   mnist_ga --epochs 1 --batch-size 64 --accum 1 --save-dir runs/b64
//   mnist_ga --epochs 1 --batch-size 16 --accum 4 --compare runs/b64/epoch_1.safetensors
//   mpirun -np 2 mnist_ga --epochs 1 --batch-size 16 --accum 2   # 2 ranks: a global batch of 64
//
// Data (mnist.h): --data DIR, else ../shared/data/mnist when present, else generated data.
#include <CLI/CLI.hpp>

#include <cfloat>
#include <cstdio>

#include <minigrad/minigrad.h>

#include "common/run.h"
#include "mnist_ga/mnist.h"

int main(int argc, char** argv) {
  const auto session = start_session("mnist_ga", &argc, &argv);  // under mpirun: one rank of the run
  CLI::App app{"MLP 784-512-512-10 on MNIST with exact gradient accumulation (libminigrad)"};
  RunFlags f{.device = "auto"};
  mnist::DataFlags d;
  std::string accum_schedule, optimizer = "sgd", resume, compare;
  int64_t epochs = 10, batch_size = 64, accum = 1;
  float lr = 1e-3f, momentum = 0.0f, clip_norm = 0.0f;
  bool divide_by_n = false, skip_non_finite = false;
  auto* data = app.add_option("--data", d.dir, "folder with the MNIST/FashionMNIST IDX files (default: ../shared/data/mnist if present, else generated data)")->check(nonempty());
  app.add_option("--dataset", d.dataset, "mnist or fashion (sets the normalisation)")->check(CLI::IsMember({"mnist", "fashion"}))->capture_default_str();
  app.add_flag("--synthetic", d.synthetic, "use generated MNIST-like data even when real data is present")->excludes(data);
  app.add_option("--limit-train", d.limit_train, "use the first N training samples (0: all)")->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--limit-test", d.limit_test, "use the first N test samples (0: all)")->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--epochs", epochs, "epochs to train (in total, counting resumed ones)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->capture_default_str();
  app.add_option("--batch-size", batch_size, "micro-batch size")->check(CLI::Range(int64_t{1}, int64_t{1} << 24))->capture_default_str();
  auto* accum_opt = app.add_option("--accum", accum, "micro-batches per optimizer step (N)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->capture_default_str();
  auto* sched_opt = app.add_option("--accum-schedule", accum_schedule, "N by epoch, e.g. \"0:8,4:2\" (epochs counted from 0)")->check(nonempty())->excludes(accum_opt);
  app.add_option("--lr", lr, "learning rate")->check(finite_in(0, FLT_MAX, "[0, 3.4e38]"))->capture_default_str();
  app.add_option("--momentum", momentum, "SGD momentum")->check(finite_in(0, 1, "[0, 1]"))->capture_default_str();
  app.add_option("--optimizer", optimizer, "sgd or adam")->check(CLI::IsMember({"sgd", "adam"}))->capture_default_str();
  app.add_option("--clip-norm", clip_norm, "clip the global norm of each step's mean gradient (0: off)")->check(finite_in(0, FLT_MAX, "[0, 3.4e38]"))->capture_default_str();
  app.add_option("--resume", resume, "continue from an epoch_K.state.safetensors (or epoch_K.safetensors beside it), or from the newest complete epoch in a --save-dir folder")->check(nonempty());
  app.add_option("--compare", compare, "after training, print the largest weight difference to this .safetensors")->check(nonempty());
  app.add_flag("--divide-by-n", divide_by_n, "the usual recipe, for comparison: mean loss per micro-batch / N (inexact on short windows)");
  app.add_flag("--skip-non-finite", skip_non_finite, "drop a window with a NaN/inf loss or gradient instead of stopping");
  add_run_flags(app, f, "the effective batch");
  app.get_option("--memory-budget")->excludes(accum_opt)->excludes(sched_opt);
  CLI11_PARSE(app, argc, argv);
  return run_main("mnist_ga", f, [&] {
    const mg::optim::AccumulationSchedule sched = accum_schedule.empty() ? mg::optim::AccumulationSchedule(accum)
        : for_flag("--accum-schedule", [&] { return mg::optim::AccumulationSchedule::parse(accum_schedule); });
    const RunSetup run = setup_run(f, "epoch_1.safetensors");
    f.phases.mark("device");
    const int64_t world = mg::dist::world_size();
    const bool joint = !f.memory_budget.empty();
    const mg::data::Splits splits = mnist::load(d, f.seed, argv[0]);
    LEAD_PRINTF("data: %s; using %lld train, %lld test\n", splits.description.c_str(),
                static_cast<long long>(splits.train.size()), static_cast<long long>(splits.test.size()));
    f.phases.mark("data");

    mg::manual_seed(f.seed);
    auto model = mg::nn::make_mlp({784, 512, 512, 10});
    model->to(run.dev);
    std::unique_ptr<mg::optim::Optimizer> opt;
    if (optimizer == "sgd") opt = std::make_unique<mg::optim::SGD>(model->parameters(), mg::optim::SGDOptions{.lr = lr, .momentum = momentum});
    else opt = std::make_unique<mg::optim::Adam>(model->parameters(), mg::optim::AdamOptions{.lr = lr});
    // --compare's file is checked against the model now, not after training.
    const mg::nn::SafetensorsFile compare_file =
        compare.empty() ? mg::nn::SafetensorsFile{} : for_flag("--compare", [&] { return mnist::load_compare(compare, *model); });
    f.phases.mark("model");

    // A step: N micro-batches of --batch-size on every rank; under --memory-budget --batch-size is
    // the global batch, split as the joint planner chooses. What must agree for an exact resume:
    const mg::nn::Metadata signature = {
        {"config.data", splits.description + " limit " + std::to_string(splits.train.size())},
        {"config.optimizer", optimizer}, {"config.lr", exact_str(lr)}, {"config.momentum", exact_str(momentum)},
        {"config.clip_norm", exact_str(clip_norm)}, {"config.batch_size", std::to_string(batch_size)},
        {"config.accum_schedule", sched.str()}, {"config.seed", std::to_string(f.seed)},
        {"config.normalize", divide_by_n ? "micro_batches" : "samples"}, {"config.world_size", std::to_string(world)}};

    auto train = std::make_shared<mg::data::IdxDataset>(splits.train);
    int64_t total_steps = 0;  // of the run from epoch 0, the short last window of each epoch counted (--profile)
    for (int64_t e = 0; e < epochs; ++e) {
      const int64_t window = joint ? batch_size / world : batch_size * sched.steps_for_epoch(e);
      total_steps += (train->size() / world + window - 1) / window;
    }
    int64_t eval_batch = 1000;
    nlohmann::ordered_json epochs_json = nlohmann::json::array();
    mnist::EvalResult last{};
    mg::TrainerCallbacks cb;
    cb.on_step_start = [&](int64_t step, bool redo) { redo ? f.prof.restart(step, total_steps) : f.prof.begin(step, total_steps); };
    cb.on_step = [&](const mg::StepReport& r) { f.prof.end(r.step, total_steps, r.ms + r.data_ms); };
    cb.on_epoch = [&](const mg::EpochReport& e) {  // the weights are the same on every rank: rank 0 evaluates
      if (lead()) last = mnist::evaluate(*model, splits.test, run.dev, eval_batch);
      const double sps = static_cast<double>(e.samples) / std::max(e.seconds, 1e-9);
      LEAD_PRINTF("Epoch %lld/%lld: train loss %.6f | test loss %.6f, accuracy %.2f%% | %.0f samples/s, %lld optimizer steps (N=%lld)%s\n",
                  static_cast<long long>(e.epoch + 1), static_cast<long long>(epochs), e.mean_loss, last.loss, last.accuracy,
                  sps, static_cast<long long>(e.steps - e.skipped_steps), static_cast<long long>((e.micro_batches + e.steps - 1) / e.steps),
                  e.skipped_steps ? (", " + std::to_string(e.skipped_steps) + " skipped (non-finite)").c_str() : "");
      std::fflush(stdout);
      epochs_json.push_back({{"epoch", e.epoch + 1}, {"train_loss", e.mean_loss}, {"test_loss", last.loss},
                             {"test_accuracy", last.accuracy}, {"samples_per_s", sps},
                             {"optimizer_steps", e.steps - e.skipped_steps}, {"skipped_steps", e.skipped_steps},
                             {"accum_steps", e.accumulation}, {"micro_batches", e.micro_batches}, {"seconds", e.seconds}});
    };
    mg::Trainer trainer(*model, train, *opt,
                        {.batch_size = joint ? batch_size : world * batch_size, .memory_budget = f.memory_budget,
                         .checkpoint = f.checkpoint, .epochs = epochs, .clip_norm = clip_norm,
                         .non_finite = skip_non_finite ? mg::optim::NonFinite::skip : mg::optim::NonFinite::error,
                         .accumulation = joint ? mg::optim::AccumulationSchedule(1) : sched, .drop_last = false,
                         .normalize = divide_by_n ? mg::optim::Normalize::micro_batches : mg::optim::Normalize::samples,
                         .save_dir = f.save_dir, .resume = false, .signature = signature, .seed = f.seed,
                         .tiles = f.tiles == "on", .plan_timing_passes = f.plan_timings, .offload = offload_mode(f),
                         .precision = mg::parse_precision(f.precision), .prefetch = prefetch_mode(f)},
                        cb);
    const mg::nn::TrainPlan& tp = print_plan(trainer, f);
    f.phases.mark("plan");
    if (joint) eval_batch = tp.micro_batch;  // without gradients it peaks lower than a step of the same size
    if (mg::dist::active()) {  // a world of one too (Note [a world of one])
      LEAD_PRINTF("data parallel: %lld ranks (%s), a global batch of %lld per optimizer step\n", static_cast<long long>(world),
                  mg::dist::backend_name(run.dev).c_str(), static_cast<long long>(world * tp.effective_batch * sched.steps_for_epoch(0)));
    }
    LEAD_PRINTF("model: MLP 784-512-512-10 (%lld parameters) on %s; %s lr %g%s; micro-batch %lld, accumulation %s%s%s\n",
                static_cast<long long>(model->parameter_count()), run.dev.str().c_str(), optimizer.c_str(), lr,
                optimizer == "sgd" ? (" momentum " + std::to_string(momentum)).c_str() : "", static_cast<long long>(tp.micro_batch),
                joint ? std::to_string(tp.accumulation).c_str() : sched.str().c_str(),
                clip_norm > 0 ? (", clip-norm " + std::to_string(clip_norm)).c_str() : "",
                divide_by_n ? ", DIVIDING BY N (the usual, inexact recipe)" : "");
    if (!resume.empty()) for_flag("--resume", [&] { return trainer.resume(resume); });
    const mg::FitReport r = trainer.fit();
    f.phases.mark("train");  // the evaluations after each epoch, and the checkpoints, in it
    if (r.resumed_from_epoch >= epochs) {
      last = mnist::evaluate(*model, splits.test, run.dev, eval_batch);
      LEAD_PRINTF("nothing to train (%lld epochs done, --epochs %lld): test loss %.6f, accuracy %.2f%%\n",
                  static_cast<long long>(r.resumed_from_epoch), static_cast<long long>(epochs), last.loss, last.accuracy);
    }
    f.prof.print();
    LEAD_PRINTF("peak memory in use on %s: %s; optimizer steps in total: %lld\n", run.dev.str().c_str(),
                mg::format_bytes(r.peak_in_use).c_str(), static_cast<long long>(opt->step_count()));
    double compare_diff = -1;
    if (!compare.empty()) {
      compare_diff = mnist::max_abs_diff(*model, compare_file);
      LEAD_PRINTF("max |w - w(%s)| = %.3g over all %lld parameters\n", compare.c_str(), compare_diff,
                  static_cast<long long>(model->parameter_count()));
    }
    if (lead()) f.phases.print();
    if (!f.json_path.empty() && lead()) {
      nlohmann::ordered_json j = plan_json(trainer, r, f);
      j["global_batch"] = world * tp.effective_batch * sched.steps_for_epoch(0);
      j["data"] = splits.description;
      j["train_samples"] = splits.train.size();
      j["test_samples"] = splits.test.size();
      j["optimizer"] = optimizer;
      j["lr"] = lr;
      j["momentum"] = momentum;
      j["accum_schedule"] = sched.str();
      j["clip_norm"] = clip_norm;
      j["normalize"] = divide_by_n ? "micro_batches" : "samples";
      j["epochs"] = epochs_json;
      j["final_test_accuracy"] = last.accuracy;
      j["total_optimizer_steps"] = opt->step_count();
      if (compare_diff >= 0) j["compare_max_abs_diff"] = compare_diff;
      mg::write_file_atomic(f.json_path, j.dump(2) + "\n");
    }
    return 0;
  });
}
