// vgg_ckpt: train VGG16, or with --model ResNet-18/34/50 (torchvision layouts, 2 classes), with a
// gradient-checkpointing plan and report what it costs and saves.
//
//   build/bin/vgg_ckpt --checkpoint sqrt --width-div 8 --image-size 224 --batch-size 8 --steps 5 \
//       --json sqrt.json
//
// --checkpoint none | sqrt | segments=K | budget=SIZE (e.g. budget=120MB) | min. The plan comes from one
// measured pass (minigrad/nn/checkpoint_plan.h), with --tiles on (the default) also at 1, 2, 4, ...
// rows, so that min and budget= may run segments in tiles of the batch (Note [tiled segments]); every step prints its time and peak memory in use, and
// --json writes the plan, its predicted peak and the measured one. SGD (lr 0.001, momentum 0.9),
// cross-entropy. Data: synthetic by default (a deterministic pattern per class plus noise), or
// --data DIR with one sub-folder of JPEG/PNG images per class (minigrad/data/image_folder.h); either way a
// DataLoader (minigrad/data/loader.h) shuffles it per epoch from --seed and drops the short last batch,
// so that every step has the input shape the plan was made for.
//
// --memory-budget SIZE (or "free": what the device has) plans the whole step instead
// (minigrad/nn/train_plan.h): --batch-size is then the effective batch B, and the planner picks
// the micro-batch b, the accumulation N and the checkpoint plan of least predicted time whose
// predicted peak fits. A step then runs N micro-batches of the same B samples, in the same order,
// as the plain run (the last micro-batch B - (N-1) b), with exact accumulation. --memory-limit SIZE
// caps the device's allocator (mg::set_memory_limit) to emulate a smaller device.
//
//   build/bin/vgg_ckpt --memory-budget 200MB --width-div 8 --batch-size 32 --steps 3
//
// --model vgg16 (the default) | resnet18 | resnet34 | resnet50 (minigrad/nn/models.h): a ResNet is
// planned with its residual blocks as units (Note [residual blocks as units]); its BatchNorm
// running statistics are saved with the weights, under torchvision's names.
//
//   build/bin/vgg_ckpt --model resnet50 --width-div 4 --image-size 128 --batch-size 16 --checkpoint min
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>

#include <minigrad/data/image_folder.h>
#include <minigrad/data/loader.h>
#include <minigrad/cuda.h>
#include <minigrad/minigrad.h>
#include <minigrad/nn/checkpoint_plan.h>
#include <minigrad/nn/train_plan.h>
#include <minigrad/optim/accumulate.h>
#include <minigrad/train/trainer.h>
#include <minigrad/util/bytes.h>

#include "common/flags.h"
#include "common/plan.h"
#include "common/ranks.h"
#include "common/profile.h"
#include "common/timeline.h"
#include "common/stats.h"

namespace {

using mg::Tensor;

constexpr int64_t kNumClasses = 2;
constexpr int64_t kSyntheticSize = 64;  // samples per synthetic epoch (a larger batch: one batch)

// Sample i of the synthetic set: class i % 2; class 0 brightens towards the right, class 1
// towards the bottom, plus uniform noise drawn from (seed, i). ImageNet-normalised like files.
void synthetic_image(int64_t i, int64_t s, uint64_t seed, float* dst) {
  const int64_t label = i % kNumClasses;
  const uint64_t base = static_cast<uint64_t>(i) * 3 * s * s;
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t y = 0; y < s; ++y) {
      for (int64_t x = 0; x < s; ++x) {
        const int64_t k = (c * s + y) * s + x;
        const float ramp = static_cast<float>(label == 0 ? x : y) / static_cast<float>(std::max<int64_t>(1, s - 1));
        const float noise = mg::philox_uniform(seed, base + static_cast<uint64_t>(k));
        const float v = 0.6f * ramp + 0.4f * noise;
        dst[k] = (v - mg::data::kImageNetMean[c]) / mg::data::kImageNetStd[c];
      }
    }
  }
}

// The synthetic data set, made on demand: sample i is synthetic_image(i).
class SyntheticImages : public mg::data::Dataset {
 public:
  SyntheticImages(int64_t n, int64_t image_size, uint64_t seed) : n_(n), s_(image_size), seed_(seed) {}
  int64_t size() const override { return n_; }
  mg::Shape sample_shape() const override { return {3, s_, s_}; }

 private:
  void read(std::span<const int64_t> indices, int64_t, std::span<float> x, std::span<int64_t> y) const override {
    for (size_t k = 0; k < indices.size(); ++k) {
      synthetic_image(indices[k], s_, seed_ ^ 0xDA7Aull, x.data() + k * 3 * s_ * s_);
      y[k] = indices[k] % kNumClasses;
    }
  }

  int64_t n_, s_;
  uint64_t seed_;
};

// A data set whose read errors name the flag that gave it (a damaged image under --data).
class FlagErrors : public mg::data::Dataset {
 public:
  FlagErrors(std::shared_ptr<const mg::data::Dataset> inner, std::string flag) : inner_(std::move(inner)), flag_(std::move(flag)) {}
  int64_t size() const override { return inner_->size(); }
  mg::Shape sample_shape() const override { return inner_->sample_shape(); }

 private:
  void read(std::span<const int64_t> indices, int64_t epoch, std::span<float> x, std::span<int64_t> y) const override {
    for_flag(flag_.c_str(), [&] { inner_->read_batch(indices, epoch, x, y); });
  }
  std::shared_ptr<const mg::data::Dataset> inner_;
  std::string flag_;
};

}  // namespace

int main(int argc, char** argv) {
  // Under mpirun every rank runs this; mg::dist reduces each step's gradients over them.
  const auto session = start_session("vgg_ckpt", &argc, &argv);
  CLI::App app{"Train VGG16 or a ResNet with a gradient-checkpointing plan; report memory and time."};
  std::string checkpoint = "none", device_str = "cpu", save_dir, json_path, timeline_path, data_dir, model_name = "vgg16";
  int64_t batch_size = 8, steps = 0, epochs = 0, width_div = 1, image_size = 224;
  uint64_t seed = 0;
  app.add_option("--model", model_name, "vgg16 | resnet18 | resnet34 | resnet50 (torchvision layouts)")
      ->check(CLI::IsMember({"vgg16", "resnet18", "resnet34", "resnet50"}))
      ->capture_default_str();
  app.add_option("--checkpoint", checkpoint, "none | sqrt | segments=K | budget=SIZE")->check(nonempty())->capture_default_str();
  app.add_option("--batch-size", batch_size, "images per step")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  auto* steps_opt = app.add_option("--steps", steps, "number of steps")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  auto* epochs_opt = app.add_option("--epochs", epochs, "number of epochs")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  steps_opt->excludes(epochs_opt);
  app.add_option("--device", device_str, "cpu or cuda[:i]")->check(nonempty())->capture_default_str();
  app.add_option("--seed", seed, "seed of weights, data order, flips and dropout")->check(unsigned64())->capture_default_str();
  app.add_option("--save-dir", save_dir, "write epoch_K.safetensors (and its training state) per epoch and "
                 "final.safetensors here")->check(nonempty());
  bool resume = false;
  app.add_flag("--resume", resume, "continue after the newest epoch saved in --save-dir (the same bits as a run "
               "never stopped)")->needs("--save-dir");
  StepProfile prof;
  app.add_flag("--profile", prof.on, "after training, the time of every op by pass (forward, backward, replay) over "
               "the steps after the first (minigrad/core/profiler.h)");
  app.add_option("--json", json_path, "write a JSON summary here")->check(nonempty());
  app.add_option("--timeline", timeline_path, "write where each CUDA reduction ran against backward, a trace for "
                 "chrome://tracing (data parallel on CUDA; bench/timeline.py summarises it)")->check(nonempty());
  app.add_option("--width-div", width_div, "divide channels and hidden sizes by K")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{64}));
  app.add_option("--image-size", image_size, "square input size")->capture_default_str()->check(CLI::Range(32, 4096));
  app.add_option("--data", data_dir, "class sub-folders of JPEG/PNG images (default: synthetic)")->check(nonempty());
  std::string tf32 = "conv";
  bool cudnn_benchmark = false, cudnn_nondeterministic = false;
  app.add_option("--tf32", tf32, "CUDA TF32: on (matmuls and convolutions) | off (strict FP32) | conv (convolutions only, the default as in PyTorch)")
      ->check(CLI::IsMember({"on", "off", "conv"}))->capture_default_str();
  app.add_flag("--cudnn-benchmark", cudnn_benchmark, "CUDA: time cuDNN's algorithms once per shape (torch.backends.cudnn.benchmark)");
  app.add_flag("--cudnn-nondeterministic", cudnn_nondeterministic,
               "CUDA: admit cuDNN's non-deterministic algorithms (atomics), as PyTorch does by default; checkpointed "
               "gradients then equal plain ones only to rounding (Note [deterministic convolutions])");
  std::string memory_budget, memory_limit, tiles = "on";
  auto* budget_opt = app.add_option("--memory-budget", memory_budget,
                                    "plan micro-batch, accumulation and checkpointing for this many bytes (e.g. 200MB, or "
                                    "'free': what the device has); --batch-size is then the effective batch")
                         ->check(nonempty());
  app.get_option("--checkpoint")->excludes(budget_opt);
  app.add_option("--tiles", tiles, "on: plans may run checkpointed segments in tiles of the batch (min, budget=, "
                 "--memory-budget) | off: whole layers only")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--memory-limit", memory_limit, "cap the device's allocator at this many bytes (mg::set_memory_limit)")
      ->check(nonempty());
  CLI11_PARSE(app, argc, argv);
  mg::cuda::set_tf32_matmul(tf32 == "on");
  mg::cuda::set_tf32_conv(tf32 != "off");
  mg::cuda::set_cudnn_benchmark(cudnn_benchmark);
  mg::cuda::set_cudnn_deterministic(!cudnn_nondeterministic);

  try {
    // Under data parallelism "cuda" means each rank's own GPU on its machine.
    const mg::Device dev = mg::dist::device_for_rank(for_flag("--device", [&] { return mg::Device::parse(device_str); }),
                                                     device_str.find(':') != std::string::npos);
    // Data parallelism: each rank reads its shard (every K-th sample of each epoch's order) and
    // --batch-size samples per step (with --memory-budget: the global batch, split over the ranks).
    const int64_t world = mg::dist::world_size();
    const bool joint = !memory_budget.empty();
    if (joint) {
      MG_CHECK(batch_size % world == 0, "--batch-size " << batch_size << " with --memory-budget is the global batch, "
                                        "split over " << world << " ranks: it must be a multiple of " << world);
      batch_size /= world;
    }
    size_t limit = 0;
    if (!memory_limit.empty()) limit = for_flag("--memory-limit", [&] { return mg::parse_bytes(memory_limit); });
    if (joint && memory_budget != "free") for_flag("--memory-budget", [&] { return mg::parse_bytes(memory_budget); });
    if (!joint) for_flag("--checkpoint", [&] { mg::nn::check_plan_spec(checkpoint); });
    if (limit != 0) mg::set_memory_limit(dev, limit);
    if (!json_path.empty()) mg::nn::check_writable(json_path, "--json");
    check_timeline_flag(timeline_path, dev);
    std::shared_ptr<const mg::data::Dataset> data;
    std::string data_str;
    if (!data_dir.empty()) {
      auto folder = for_flag("--data", [&] {
        return std::make_shared<mg::data::ImageFolder>(
            data_dir, mg::data::ImageFolderOptions{.image_size = image_size, .random_flip = true, .seed = seed});
      });
      MG_CHECK(folder->num_classes() == kNumClasses,
               "--data: expected " << kNumClasses << " class folders, found " << folder->num_classes());
      MG_CHECK(folder->size() >= batch_size * world, "--data: " << folder->size() << " images, fewer than one batch of "
                                                        << batch_size * world << "; use a smaller --batch-size");
      data_str = data_dir + " (" + std::to_string(folder->size()) + " images)";
      data = std::make_shared<FlagErrors>(folder, "--data");  // a damaged image shows up when its batch is read
    } else {
      const int64_t n = std::max(kSyntheticSize, batch_size * world);
      data = std::make_shared<SyntheticImages>(n, image_size, seed);
      data_str = "synthetic (" + std::to_string(n) + " images)";
    }
    const int64_t batches_per_epoch = data->size() / (batch_size * world);  // the short last batch dropped
    const int64_t total_steps = epochs > 0 ? epochs * batches_per_epoch : (steps > 0 ? steps : 5);

    mg::manual_seed(seed);
    auto model = mg::nn::make_model(model_name, kNumClasses, width_div);
    model->to(dev);
    mg::optim::SGD opt(model->parameters(), {.lr = 0.001f, .momentum = 0.9f});
    if (!save_dir.empty()) {
      for_flag("--save-dir", [&] { return std::filesystem::create_directories(save_dir); });
      mg::nn::check_writable(save_dir + "/final.safetensors", "--save-dir");
    }
    // Note [the trainer's step] (minigrad/train/trainer.h): the plan (--checkpoint at the batch, or
    // the joint plan of --memory-budget), exact accumulation, out-of-memory recovery, BatchNorm's
    // buffers shared over the ranks, the epoch checkpoints.
    std::vector<double> step_ms;
    float last_loss = NAN;
    mg::TrainerCallbacks cb;
    cb.on_step_start = [&](int64_t step, bool redo) {
      redo ? prof.restart(step, total_steps) : prof.begin(step, total_steps);
    };
    cb.on_step = [&](const mg::StepReport& r) {
      last_loss = static_cast<float>(r.info.loss_sum / static_cast<double>(r.info.samples));
      prof.end(r.step, total_steps, r.ms + r.data_ms);  // the profile's steps hold their data
      LEAD_PRINTF("step %lld/%lld  epoch %lld  loss %.5f  time %.1f ms (cpu %.1f ms)  peak in use %s  peak reserved %s\n",
                  static_cast<long long>(r.step + 1), static_cast<long long>(total_steps),
                  static_cast<long long>(r.epoch), last_loss, r.ms, r.cpu_ms, mg::format_bytes(r.peak_in_use).c_str(),
                  mg::format_bytes(r.peak_reserved).c_str());
      std::fflush(stdout);
    };
    mg::Trainer trainer(*model, data, opt,
                               {.batch_size = batch_size * world, .memory_budget = memory_budget,
                                .checkpoint = checkpoint, .epochs = (total_steps + batches_per_epoch - 1) / batches_per_epoch,
                                .max_steps = total_steps, .save_dir = save_dir, .resume = resume, .seed = seed,
                                .tiles = tiles == "on"},
                               cb);
    const mg::nn::TrainPlan& tp = plan_naming_flags(trainer, joint, memory_limit);
    const mg::nn::Plan& plan = tp.checkpoint;
    const mg::nn::ChainCost& cost = trainer.cost();
    const size_t floor = mg::nn::min_feasible_peak(cost), budget = trainer.budget();
    mg::nn::ChainCost whole_layers = cost;  // the floor without tiles, for comparison
    whole_layers.tile_costs.clear();
    const size_t floor_whole = mg::nn::min_feasible_peak(whole_layers);
    LEAD_PRINTF("%s width/%lld, %lldx%lld, batch %lld, %lld params, %zu layers, device %s\n",
                model_name.c_str(), static_cast<long long>(width_div), static_cast<long long>(image_size),
                static_cast<long long>(image_size), static_cast<long long>(batch_size),
                static_cast<long long>(model->parameter_count()), model->size(), dev.str().c_str());
    LEAD_PRINTF("data: %s\n", data_str.c_str());
    if (mg::dist::active()) {  // a world of one too (Note [a world of one])
      LEAD_PRINTF("data parallel: %lld ranks (%s) x %lld samples = a global batch of %lld per optimizer step\n",
                  static_cast<long long>(world), mg::dist::backend_name(dev).c_str(), static_cast<long long>(batch_size),
                  static_cast<long long>(world * batch_size));
    }
    if (budget) {
      LEAD_PRINTF("memory budget %s%s: %s\n  predicted step %.1f ms (%.2f ms per sample)\n",
                  mg::format_bytes(budget).c_str(), memory_budget == "free" || !joint ? " (what the device has)" : "",
                  tp.str().c_str(), tp.predicted_step_ms, tp.ms_per_sample());
    }
    LEAD_PRINTF("plan %s: %s\n  predicted peak %s, recompute %.3g GFLOP; smallest feasible peak %s%s; fixed %s\n",
                plan.kind.c_str(), plan.str().c_str(), mg::format_bytes(plan.predicted_peak).c_str(),
                plan.recompute_flops / 1e9, mg::format_bytes(floor).c_str(),
                floor < floor_whole ? (" (" + mg::format_bytes(floor_whole) + " in whole layers)").c_str() : "",
                mg::format_bytes(cost.fixed_bytes).c_str());
    if (limit != 0) LEAD_PRINTF("memory limit %s (mg::set_memory_limit)\n", mg::format_bytes(limit).c_str());
    const mg::nn::PeakBreakdown at = mg::nn::explain_peak(cost, plan.segments);
    LEAD_PRINTF("  peak at %s\n", at.where.c_str());

    if (!timeline_path.empty()) mg::dist::record_timeline(true);  // Note [reduction timeline]
    const mg::FitReport r = trainer.fit();
    write_timeline(timeline_path);
    prof.print();
    if (!save_dir.empty() && lead()) {
      mg::nn::save_safetensors(save_dir + "/final.safetensors", model->state_dict(),
                               {{"steps", std::to_string(total_steps)}});
    }
    const mg::nn::TrainPlan& last = r.plan;  // after any re-plan
    const double med = r.median_step_ms();
    const double ratio = static_cast<double>(r.peak_in_use) / static_cast<double>(last.predicted_peak);
    LEAD_PRINTF("median step %.1f ms; peak in use %s (predicted %s, measured/predicted %.3f); peak reserved %s\n",
                med, mg::format_bytes(r.peak_in_use).c_str(), mg::format_bytes(last.predicted_peak).c_str(),
                ratio, mg::format_bytes(r.peak_reserved).c_str());
    if (last.predicted_step_ms > 0) {
      LEAD_PRINTF("joint plan: step %.1f ms predicted, %.1f ms measured (median; measured/predicted %.3f); peak %s of a "
                  "budget of %s\n",
                  last.predicted_step_ms, med, med / last.predicted_step_ms, mg::format_bytes(r.peak_in_use).c_str(),
                  mg::format_bytes(trainer.budget()).c_str());
    }

    if (!json_path.empty() && lead()) {
      const mg::nn::ChainCost& c = trainer.cost();
      nlohmann::ordered_json j;
      j["world_size"] = world;
      j["global_batch"] = world * batch_size;
      j["plan"] = last.checkpoint.kind;
      j["micro_batch"] = last.micro_batch;
      j["accumulation"] = last.accumulation;
      if (trainer.budget()) {
        j["last_micro_batch"] = last.last_micro_batch;
        j["memory_budget_bytes"] = trainer.budget();
        j["predicted_step_ms"] = last.predicted_step_ms;
      }
      if (limit != 0) j["memory_limit_bytes"] = limit;
      j["replans"] = nlohmann::json::array();
      for (const mg::Replan& p : r.replans) {
        j["replans"].push_back({{"step", p.step + 1}, {"memory_bytes", p.memory}, {"from", p.from}, {"to", p.to}});
      }
      j["segments"] = nlohmann::json::array();
      for (const auto& s : last.checkpoint.segments) {
        nlohmann::ordered_json seg = nlohmann::ordered_json::array({s.begin, s.end});
        if (s.tile_rows) seg.push_back(s.tile_rows);  // run in tiles of that many samples
        j["segments"].push_back(seg);
      }
      j["num_layers"] = model->size();
      j["predicted_peak_bytes"] = last.predicted_peak;
      j["measured_peak_in_use_bytes"] = r.peak_in_use;
      j["peak_reserved_bytes"] = r.peak_reserved;
      j["min_feasible_peak_bytes"] = mg::nn::min_feasible_peak(c);
      mg::nn::ChainCost whole = c;
      whole.tile_costs.clear();
      j["min_feasible_peak_whole_layers_bytes"] = mg::nn::min_feasible_peak(whole);
      j["tiles"] = tiles == "on";
      j["predicted_peak_at"] = mg::nn::explain_peak(c, last.checkpoint.segments).where;
      j["min_feasible_plan"] = mg::nn::plan_min_peak(c).str();
      j["fixed_bytes"] = c.fixed_bytes;
      if (last.checkpoint.budget) j["budget_bytes"] = last.checkpoint.budget;
      j["recompute_gflop"] = last.checkpoint.recompute_flops / 1e9;
      j["median_step_ms"] = med;
      j["step_ms"] = r.step_ms;
      j["median_step_cpu_ms"] = median(r.step_cpu_ms);
      j["step_cpu_ms"] = r.step_cpu_ms;
      j["final_loss"] = last_loss;
      j["steps"] = total_steps;
      j["batch_size"] = batch_size;
      j["model"] = model_name;
      j["width_div"] = width_div;
      j["image_size"] = image_size;
      j["device"] = dev.str();
      j["tf32"] = tf32;
      j["cudnn_benchmark"] = cudnn_benchmark;
      j["cudnn_deterministic"] = !cudnn_nondeterministic;
      j["seed"] = seed;
      j["units"] = nlohmann::json::array();
      for (const auto& u : c.units) {
        j["units"].push_back({{"layers", {u.begin, u.end}}, {"name", u.name}, {"out_bytes", u.out_bytes},
                              {"extra_bytes", u.extra_bytes}, {"saves_input", u.saves_input},
                              {"saves_output", u.saves_output}, {"fwd_peak", u.fwd_peak},
                              {"bwd_peak", u.bwd_peak}, {"gflop", u.flops / 1e9}, {"forward_ms", u.forward_ms}, {"backward_ms", u.backward_ms}});
      }
      if (prof.on) j["profile"] = prof.json();
      mg::nn::write_file_atomic(json_path, j.dump(2) + "\n");
    }
    return 0;
  } catch (const mg::OutOfMemoryError& e) {
    std::fprintf(stderr, "vgg_ckpt: %s%s%s\n", rank_prefix().c_str(),
                 memory_limit.empty() ? "" : ("under --memory-limit " + memory_limit + ": ").c_str(), e.what());
    if (mg::dist::world_size() > 1) mg::dist::abort_all(1);  // Note [collectives never hang]
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vgg_ckpt: %s%s\n", rank_prefix().c_str(), e.what());
    if (mg::dist::world_size() > 1) mg::dist::abort_all(1);
    return 1;
  }
}
