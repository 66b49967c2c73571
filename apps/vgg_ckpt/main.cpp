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
#include <minigrad/util/bytes.h>

#include "common/flags.h"
#include "common/oom.h"
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
  app.add_option("--save-dir", save_dir, "write epoch_K.safetensors per epoch and final.safetensors here")->check(nonempty());
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
    const int64_t world = mg::dist::world_size(), rank = mg::dist::rank();
    if (!memory_budget.empty()) {
      MG_CHECK(batch_size % world == 0, "--batch-size " << batch_size << " with --memory-budget is the global batch, "
                                        "split over " << world << " ranks: it must be a multiple of " << world);
      batch_size /= world;
    }
    size_t limit = 0, budget = 0;
    if (!memory_limit.empty()) limit = for_flag("--memory-limit", [&] { return mg::parse_bytes(memory_limit); });
    if (!memory_budget.empty() && memory_budget != "free") {
      budget = for_flag("--memory-budget", [&] { return mg::parse_bytes(memory_budget); });
    }
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
      data = folder;
    } else {
      const int64_t n = std::max(kSyntheticSize, batch_size * world);
      data = std::make_shared<SyntheticImages>(n, image_size, seed);
      data_str = "synthetic (" + std::to_string(n) + " images)";
    }
    // No prefetch thread: a step's wall and CPU time must not include assembling the next batch.
    mg::data::DataLoader loader(data, {.batch_size = batch_size, .seed = seed, .drop_last = true, .device = dev,
                                       .prefetch = 0, .shard = rank, .num_shards = world});
    // Shards differ by a sample at most, and so (drop_last) can their numbers of batches: every
    // rank takes the smallest, so that all step together.
    const int64_t batches_per_epoch = -mg::dist::all_reduce_max(-loader.num_batches());
    const int64_t total_steps = epochs > 0 ? epochs * batches_per_epoch : (steps > 0 ? steps : 5);

    mg::manual_seed(seed);
    auto model = mg::nn::make_model(model_name, kNumClasses, width_div);
    model->to(dev);
    mg::dist::check_same_parameters(model->named_parameters());
    mg::dist::broadcast(model->parameters());  // every rank starts from rank 0's weights
    // BatchNorm's running statistics and counts: each rank updates them from its own samples;
    // after every step all take rank 0's (mg::dist::broadcast_buffers, as PyTorch's DDP), so that
    // the ranks evaluate alike and what rank 0 saves is what every rank has.
    const auto buffers = model->named_buffers();
    auto share_buffers = [&] {
      if (world > 1) mg::dist::broadcast_buffers(buffers);  // a collective, buffers or none (VGG16)
    };
    share_buffers();
    model->train();
    mg::optim::SGD opt(model->parameters(), {.lr = 0.001f, .momentum = 0.9f});

    // The plan: a checkpoint plan at the batch size, or (--memory-budget) the joint plan.
    bool joint = !memory_budget.empty();
    nlohmann::ordered_json replans = nlohmann::json::array();  // what out-of-memory recovery changed
    mg::nn::TrainPlan tp;
    mg::nn::ChainCost cost;
    mg::nn::Plan plan;
    std::string measuring_oom;  // the first line of the error that measuring ran into
    if (!joint) {
      // The spelling first: a measuring that runs out of memory replaces the plan (below).
      for_flag("--checkpoint", [&] { mg::nn::check_plan_spec(checkpoint); });
      try {
        mg::nn::MeasureOptions measure;
        if (tiles == "on") measure.tile_rows = mg::nn::tile_rows_below(batch_size);
        cost = mg::nn::measure_chain(*model, {batch_size, 3, image_size, image_size}, measure);
      } catch (const mg::OutOfMemoryError& e) {  // Note [recovering from out-of-memory]
        // Not under data parallelism: each rank would plan alone, unseen but on rank 0.
        if (mg::dist::active()) throw;
        measuring_oom = first_line(e);
        LEAD_PRINTF("measuring batch %lld: %s\n  planning jointly for what the device has instead (--batch-size is "
                    "the effective batch)\n", static_cast<long long>(batch_size), measuring_oom.c_str());
        joint = true;
      }
    }
    // The joint plan for `memory` bytes: tp, and the checkpoint plan and chain cost at its micro-batch.
    auto plan_jointly = [&](size_t memory) {
      const mg::nn::ChainProfile profile = mg::nn::profile_chain(
          *model, {3, image_size, image_size}, mg::nn::candidate_micro_batches(batch_size), memory);
      for (int64_t b : profile.cannot_train) {  // Note [joint plan]: a ResNet at 32x32 and one image
        LEAD_PRINTF("micro-batch %lld cannot train (%s): planning with larger ones\n", static_cast<long long>(b),
                    profile.cannot_train_why.c_str());
      }
      tp = mg::nn::plan_training(profile, batch_size, memory, {.tiles = tiles == "on"});
      for (size_t i = 0; i < profile.micro_batches.size(); ++i) {
        if (profile.micro_batches[i] == tp.micro_batch) cost = mg::nn::cost_with_tiles(profile, i);
      }
      if (tiles != "on") cost.tile_costs.clear();
      plan = tp.checkpoint;
    };
    if (joint) {
      if (budget == 0) budget = mg::memory_capacity(dev);
      if (memory_budget.empty()) {  // measuring ran out of memory
        replan_or_explain(measuring_oom, "measuring", budget, memory_limit, [&] { plan_jointly(budget); });
        replans.push_back({{"step", 0}, {"memory_bytes", budget}, {"from", "batch " + std::to_string(batch_size) + ", checkpoint " + checkpoint + " (measuring ran out of memory)"}, {"to", tp.str()}});
      } else {
        for_flag("--memory-budget", [&] { plan_jointly(budget); });
      }
    } else {
      plan = for_flag("--checkpoint", [&] { return mg::nn::make_plan(cost, checkpoint); });
    }
    int64_t micro_batch = joint ? tp.micro_batch : batch_size, accumulation = joint ? tp.accumulation : 1;
    const size_t floor = mg::nn::min_feasible_peak(cost);
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
    if (joint) {
      LEAD_PRINTF("memory budget %s%s: %s\n  predicted step %.1f ms (%.2f ms per sample)\n",
                  mg::format_bytes(budget).c_str(), memory_budget == "free" ? " (what the device has)" : "",
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
    if (!save_dir.empty()) {
      for_flag("--save-dir", [&] { return std::filesystem::create_directories(save_dir); });
      mg::nn::check_writable(save_dir + "/final.safetensors", "--save-dir");
      if (int n = mg::nn::remove_stale_temporaries(save_dir)) {
        LEAD_PRINTF("%s: removed %d temporary file(s) left by an interrupted save\n", save_dir.c_str(), n);
      }
    }

    std::vector<double> step_ms, step_cpu_ms;
    size_t peak_in_use = 0, peak_reserved = 0;
    float last_loss = NAN;
    // Under a joint plan: the same samples as the loader's batch of B, read micro-batch by
    // micro-batch (a batch of B read at once would hold B inputs, more than the plan has room for).
    mg::optim::Accumulator acc(opt, {.steps = accumulation});
    std::vector<int64_t> order;  // this rank's samples of the epoch (Note [shards])
    auto shard_order = [&](int64_t epoch) {
      const std::vector<int64_t> all = mg::data::epoch_permutation(data->size(), seed, epoch);
      std::vector<int64_t> mine;
      for (size_t i = static_cast<size_t>(rank); i < all.size(); i += static_cast<size_t>(world)) mine.push_back(all[i]);
      return mine;
    };
    // Note [recovering from out-of-memory] (minigrad/optim/accumulate.h): after an out-of-memory
    // error the step is planned again, jointly, for what the device has now (the plain path
    // switches to the joint one: --batch-size becomes the effective batch), and redone.
    auto replan = [&](const mg::OutOfMemoryError& e, int64_t step) {
      const size_t there = memory_for_redone_step(e, step, dev);
      const std::string before = joint ? tp.str() : "batch " + std::to_string(batch_size) + ", checkpoint " + plan.str();
      const size_t before_peak = joint ? tp.predicted_peak : plan.predicted_peak;
      replan_or_explain(first_line(e), "step " + std::to_string(step + 1), there, memory_limit,
                        [&] { plan_jointly(there); });
      micro_batch = tp.micro_batch;
      accumulation = tp.accumulation;
      acc.set_steps(accumulation);
      if (!joint) {
        joint = true;
        budget = there;
        order = shard_order(step / batches_per_epoch);
      }
      LEAD_PRINTF("  re-planned: %s, predicted peak %s (was %s, predicted peak %s)\n", tp.str().c_str(),
                  mg::format_bytes(tp.predicted_peak).c_str(), before.c_str(), mg::format_bytes(before_peak).c_str());
      replans.push_back({{"step", step + 1}, {"memory_bytes", there}, {"from", before}, {"to", tp.str()}});
    };
    if (!timeline_path.empty()) mg::dist::record_timeline(true);  // Note [reduction timeline]
    for (int64_t step = 0; step < total_steps; ++step) {
      const int64_t epoch = step / batches_per_epoch, b = step % batches_per_epoch;
      if (b == 0 && !joint) loader.start_epoch(epoch);
      if (b == 0 && joint) order = shard_order(epoch);
      mg::data::Batch batch;
      if (!joint) {
        // A damaged image under --data shows up here, when its batch is read.
        const bool more = data_dir.empty() ? loader.next(batch) : for_flag("--data", [&] { return loader.next(batch); });
        MG_CHECK(more, "vgg_ckpt: epoch " << epoch << " ended before its batch " << b);
      }

      mg::reset_peak_memory_stats(dev);
      mg::synchronize(dev);  // the batch's copy is not timed
      prof.begin(step, total_steps);
      auto t0 = std::chrono::steady_clock::now();
      std::clock_t c0 = std::clock();
      double data_ms = 0, data_cpu_ms = 0;  // reading micro-batches inside the step: not timed
      // After a re-plan the step's time and peak are the new plan's: not the failed try's, nor the
      // profiling's, nor the old plan's steps before.
      auto restart_step = [&] {
        mg::reset_peak_memory_stats(dev);
        peak_in_use = peak_reserved = 0;
        prof.restart(step, total_steps);
        t0 = std::chrono::steady_clock::now();
        c0 = std::clock();
        data_ms = data_cpu_ms = 0;
      };
      if (!joint) {
        try {
          // One micro-batch per step through the Accumulator, which sums the step over the ranks
          // under data parallelism. Dropout by sample (Note [dropout by sample]): the masks a joint
          // plan's micro-batches draw.
          Tensor loss;
          {
            const mg::SampleWindowGuard window = acc.sample_window();
            loss = mg::cross_entropy(mg::nn::forward_with_plan(*model, plan, batch.x), batch.y, mg::Reduction::sum);
          }
          acc.backward(loss, batch.size());
          const mg::optim::StepInfo info = acc.step();
          last_loss = static_cast<float>(info.loss_sum / static_cast<double>(info.samples));
        } catch (const mg::OutOfMemoryError& e) {
          acc.discard();
          batch = {};
          replan(e, step);
          restart_step();
        }
      }
      if (joint) {
        // Note [recovering from out-of-memory] (minigrad/optim/accumulate.h): a window that runs
        // out of memory is dropped and redone from its first micro-batch under a plan for what the
        // device has then; dropout by sample keeps the step the planned one.
        for (int tries = 0;; ++tries) {
          try {
            for (int64_t k = 0; k < accumulation; ++k) {
              const int64_t first = b * batch_size + k * micro_batch, n = std::min(micro_batch, (b + 1) * batch_size - first);
              const auto d0 = std::chrono::steady_clock::now();
              const std::clock_t dc0 = std::clock();
              const std::span<const int64_t> idx(order.data() + first, static_cast<size_t>(n));
              mg::data::Batch mb = data_dir.empty() ? data->get_batch(idx, epoch)
                                                    : for_flag("--data", [&] { return data->get_batch(idx, epoch); });
              const Tensor x = mb.x.to(dev), y = mb.y.to(dev);
              mb = {};
              data_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - d0).count();
              data_cpu_ms += 1000.0 * static_cast<double>(std::clock() - dc0) / CLOCKS_PER_SEC;
              Tensor loss;
              {
                const mg::SampleWindowGuard window = acc.sample_window();
                loss = mg::cross_entropy(mg::nn::forward_with_plan(*model, plan, x), y, mg::Reduction::sum);
              }
              acc.backward(loss, n);
            }
            break;
          } catch (const mg::OutOfMemoryError& e) {
            acc.discard();
            if (tries == 2) throw;  // a third plan did not fit either: the prediction is off, say so
            replan(e, step);
            restart_step();
          }
        }
        const mg::optim::StepInfo info = acc.step();
        last_loss = static_cast<float>(info.loss_sum / static_cast<double>(info.samples));
      }
      share_buffers();
      mg::synchronize(dev);  // the optimizer's update too: step() queues it after its one read
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() - data_ms;
      // Process CPU time (all threads): the work done, less sensitive than wall time to other
      // processes sharing the cores.
      const double cpu_ms = 1000.0 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC - data_cpu_ms;
      step_cpu_ms.push_back(cpu_ms);
      const mg::MemoryStats st = mg::memory_stats(dev);
      step_ms.push_back(ms);
      prof.end(step, total_steps, ms + data_ms);  // the profile's steps hold their data
      peak_in_use = std::max(peak_in_use, st.peak_in_use);
      peak_reserved = std::max(peak_reserved, st.peak_reserved);
      LEAD_PRINTF("step %lld/%lld  epoch %lld  loss %.5f  time %.1f ms (cpu %.1f ms)  peak in use %s  peak reserved %s\n",
                  static_cast<long long>(step + 1), static_cast<long long>(total_steps),
                  static_cast<long long>(epoch), last_loss, ms, cpu_ms, mg::format_bytes(st.peak_in_use).c_str(),
                  mg::format_bytes(st.peak_reserved).c_str());
      std::fflush(stdout);
      if (!save_dir.empty() && b + 1 == batches_per_epoch && lead()) {
        mg::nn::save_safetensors(save_dir + "/epoch_" + std::to_string(epoch + 1) + ".safetensors",
                                 model->state_dict(),
                                 {{"epoch", std::to_string(epoch + 1)}});
      }
    }
    write_timeline(timeline_path);
    prof.print();
    if (!save_dir.empty() && lead()) {
      mg::nn::save_safetensors(save_dir + "/final.safetensors", model->state_dict(),
                               {{"steps", std::to_string(total_steps)}});
    }
    const double med = median(step_ms);
    const double ratio = static_cast<double>(peak_in_use) / static_cast<double>(plan.predicted_peak);
    LEAD_PRINTF("median step %.1f ms; peak in use %s (predicted %s, measured/predicted %.3f); peak reserved %s\n",
                med, mg::format_bytes(peak_in_use).c_str(), mg::format_bytes(plan.predicted_peak).c_str(),
                ratio, mg::format_bytes(peak_reserved).c_str());
    if (joint) {
      LEAD_PRINTF("joint plan: step %.1f ms predicted, %.1f ms measured (median; measured/predicted %.3f); peak %s of a "
                  "budget of %s\n",
                  tp.predicted_step_ms, med, med / tp.predicted_step_ms, mg::format_bytes(peak_in_use).c_str(),
                  mg::format_bytes(budget).c_str());
    }

    if (!json_path.empty() && lead()) {
      nlohmann::ordered_json j;
      j["world_size"] = world;
      j["global_batch"] = world * batch_size;
      j["plan"] = plan.kind;
      j["micro_batch"] = micro_batch;
      j["accumulation"] = accumulation;
      if (joint) {
        j["last_micro_batch"] = tp.last_micro_batch;
        j["memory_budget_bytes"] = budget;
        j["predicted_step_ms"] = tp.predicted_step_ms;
      }
      if (limit != 0) j["memory_limit_bytes"] = limit;
      j["replans"] = replans;
      j["segments"] = nlohmann::json::array();
      for (const auto& s : plan.segments) {
        nlohmann::ordered_json seg = nlohmann::ordered_json::array({s.begin, s.end});
        if (s.tile_rows) seg.push_back(s.tile_rows);  // run in tiles of that many samples
        j["segments"].push_back(seg);
      }
      j["num_layers"] = model->size();
      j["predicted_peak_bytes"] = plan.predicted_peak;
      j["measured_peak_in_use_bytes"] = peak_in_use;
      j["peak_reserved_bytes"] = peak_reserved;
      j["min_feasible_peak_bytes"] = floor;
      j["min_feasible_peak_whole_layers_bytes"] = floor_whole;
      j["tiles"] = tiles == "on";
      j["predicted_peak_at"] = at.where;
      j["min_feasible_plan"] = mg::nn::plan_min_peak(cost).str();
      j["fixed_bytes"] = cost.fixed_bytes;
      if (plan.budget) j["budget_bytes"] = plan.budget;
      j["recompute_gflop"] = plan.recompute_flops / 1e9;
      j["median_step_ms"] = med;
      j["step_ms"] = step_ms;
      j["median_step_cpu_ms"] = median(step_cpu_ms);
      j["step_cpu_ms"] = step_cpu_ms;
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
      for (const auto& u : cost.units) {
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
