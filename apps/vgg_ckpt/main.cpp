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
// cross-entropy. Data (images.h): synthetic by default (a deterministic pattern per class plus
// noise), or --data DIR with one sub-folder of JPEG/PNG images per class; either way mg::Trainer
// shuffles it per epoch from --seed and drops the short last batch,
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
//
// On CUDA, --conv-algos prints what cuDNN ran for each convolution of the step (algorithm,
// workspace, math, how it was chosen, what the workspace limit passed over) and puts every choice
// in --json; --conv-workspace-limit SIZE changes that limit (default 1 GiB). With the JSON's
// per-step cudaMalloc counts and peaks, what scripts/gpu_verify.sh's cliff stage reads (issue 36).
//
// --layout nhwc builds the model channels last (Note [channels last] in src/ops/conv2d.cpp): the
// images are transposed to (H, W, C) on the host as they are read (mg::data::ChannelsLast), and
// cuDNN gets NHWC convolutions. The same parameter names and, on the CPU, the same bits.
//
//   build/bin/vgg_ckpt --device cuda --layout nhwc --precision bf16 --batch-size 64 --steps 10
//
// --fuse-relu fuses each ReLU into the Conv2d or BatchNorm before it (nn::fuse_relu; Note [fused
// relu] in src/ops/conv2d.cpp): VGG16's 13 into its convolutions, on CUDA one cuDNN graph each
// where cuDNN takes it; ResNet-50's 33 into BatchNorm's kernel. The same names and, on the CPU,
// the same bits.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>

#include <minigrad/cuda.h>
#include <minigrad/minigrad.h>

#include "common/run.h"
#include "vgg_ckpt/conv_algos.h"
#include "vgg_ckpt/images.h"

int main(int argc, char** argv) {
  const auto session = start_session("vgg_ckpt", &argc, &argv);  // under mpirun: one rank of the run
  CLI::App app{"Train VGG16 or a ResNet with a gradient-checkpointing plan; report memory and time."};
  RunFlags f{.timeline = true};
  std::string data_dir, model_name = "vgg16", tf32 = "conv", conv_workspace_limit, layout_name = "nchw";
  int64_t batch_size = 8, steps = 0, epochs = 0, width_div = 1, image_size = 224;
  bool resume = false, cudnn_benchmark = false, cudnn_nondeterministic = false, conv_algos = false, fuse = false;
  app.add_option("--model", model_name, "vgg16 | resnet18 | resnet34 | resnet50 (torchvision layouts)")
      ->check(CLI::IsMember({"vgg16", "resnet18", "resnet34", "resnet50"}))->capture_default_str();
  app.add_option("--layout", layout_name, "nchw | nhwc: channels first, or channels last (cuDNN's tensor-core layout)")
      ->check(CLI::IsMember({"nchw", "nhwc"}))->capture_default_str();
  app.add_flag("--fuse-relu", fuse, "each ReLU fused into the Conv2d or BatchNorm before it (on CUDA: conv + bias + "
               "ReLU as one cuDNN graph, BatchNorm's ReLU in its kernel)");
  app.add_option("--batch-size", batch_size, "images per step")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  auto* steps_opt = app.add_option("--steps", steps, "number of steps")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--epochs", epochs, "number of epochs")->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->excludes(steps_opt);
  app.add_option("--width-div", width_div, "divide channels and hidden sizes by K")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{64}));
  app.add_option("--image-size", image_size, "square input size")->capture_default_str()->check(CLI::Range(32, 4096));
  app.add_option("--data", data_dir, "class sub-folders of JPEG/PNG images (default: synthetic)")->check(nonempty());
  app.add_option("--tf32", tf32, "CUDA TF32: on (matmuls and convolutions) | off (strict FP32) | conv (convolutions only, the default as in PyTorch)")
      ->check(CLI::IsMember({"on", "off", "conv"}))->capture_default_str();
  app.add_flag("--cudnn-benchmark", cudnn_benchmark, "CUDA: time cuDNN's algorithms once per shape (torch.backends.cudnn.benchmark)");
  app.add_flag("--cudnn-nondeterministic", cudnn_nondeterministic,
               "CUDA: admit cuDNN's non-deterministic algorithms (atomics), as PyTorch does by default; checkpointed "
               "gradients then equal plain ones only to rounding (Note [deterministic convolutions])");
  app.add_option("--conv-workspace-limit", conv_workspace_limit, "CUDA: the largest cuDNN workspace a convolution may "
                 "take (e.g. 4GiB; default 1 GiB); algorithms needing more are passed over")->check(nonempty());
  app.add_flag("--conv-algos", conv_algos, "CUDA: after training, print what cuDNN ran for each convolution of the step "
               "(algorithm, workspace, what the limit passed over), and put every choice in --json");
  add_run_flags(app, f, "the effective batch");
  app.add_flag("--resume", resume, "continue after the newest epoch saved in --save-dir (the same bits as a run "
               "never stopped)")->needs("--save-dir");
  CLI11_PARSE(app, argc, argv);
  mg::cuda::set_tf32_matmul(tf32 == "on");
  mg::cuda::set_tf32_conv(tf32 != "off");
  mg::cuda::set_cudnn_benchmark(cudnn_benchmark);
  mg::cuda::set_cudnn_deterministic(!cudnn_nondeterministic);
  return run_main("vgg_ckpt", f, [&] {
    if (!conv_workspace_limit.empty()) {
      mg::cuda::set_conv_workspace_limit(for_flag("--conv-workspace-limit", [&] { return mg::parse_bytes(conv_workspace_limit); }));
    }
    const RunSetup run = setup_run(f, "final.safetensors");
    f.phases.mark("device");
    // Data parallelism: each rank reads its shard (every K-th sample of each epoch's order) and
    // --batch-size samples per step (with --memory-budget: the global batch, split over the ranks).
    const int64_t world = mg::dist::world_size();
    const bool joint = !f.memory_budget.empty();
    const int64_t step_images = joint ? batch_size : batch_size * world;
    const mg::Layout layout = layout_name == "nhwc" ? mg::Layout::nhwc : mg::Layout::nchw;
    images::Data data = images::load(data_dir, image_size, f.seed, step_images);
    if (layout == mg::Layout::nhwc) data.set = std::make_shared<mg::data::ChannelsLast>(data.set);
    const int64_t batches_per_epoch = data.set->size() / step_images;  // the short last batch dropped
    const int64_t total_steps = epochs > 0 ? epochs * batches_per_epoch : (steps > 0 ? steps : 5);
    f.phases.mark("data");

    mg::manual_seed(f.seed);
    auto model = mg::nn::make_model(model_name, images::kNumClasses, width_div, layout);
    const size_t fused = fuse ? mg::nn::fuse_relu(*model) : 0;
    model->to(run.dev);
    mg::optim::SGD opt(model->parameters(), {.lr = 0.001f, .momentum = 0.9f});
    f.phases.mark("model");
    float last_loss = NAN;
    mg::TrainerCallbacks cb;
    cb.on_step_start = [&](int64_t step, bool redo) { redo ? f.prof.restart(step, total_steps) : f.prof.begin(step, total_steps); };
    cb.on_step = [&](const mg::StepReport& r) {
      last_loss = static_cast<float>(r.info.loss_sum / static_cast<double>(r.info.samples));
      f.prof.end(r.step, total_steps, r.ms + r.data_ms);  // the profile's steps hold their data
      LEAD_PRINTF("step %lld/%lld  epoch %lld  loss %.5f  time %.1f ms (cpu %.1f ms)  peak in use %s  peak reserved %s\n",
                  static_cast<long long>(r.step + 1), static_cast<long long>(total_steps), static_cast<long long>(r.epoch),
                  last_loss, r.ms, r.cpu_ms, mg::format_bytes(r.peak_in_use).c_str(), mg::format_bytes(r.peak_reserved).c_str());
      std::fflush(stdout);
    };
    // Note [the trainer's step] (minigrad/train/trainer.h): the plan (--checkpoint at the batch, or
    // the joint plan of --memory-budget), exact accumulation, out-of-memory recovery, BatchNorm's
    // buffers shared over the ranks, the epoch checkpoints.
    mg::Trainer trainer(*model, data.set, opt,
                        {.batch_size = step_images, .memory_budget = f.memory_budget, .checkpoint = f.checkpoint,
                         .epochs = (total_steps + batches_per_epoch - 1) / batches_per_epoch, .max_steps = total_steps,
                         .save_dir = f.save_dir, .resume = resume, .seed = f.seed, .tiles = f.tiles == "on", .plan_timing_passes = f.plan_timings, .offload = offload_mode(f),
                         .precision = mg::parse_precision(f.precision), .prefetch = prefetch_mode(f)},
                        cb);
    const mg::nn::TrainPlan& tp = print_plan(trainer, f);
    f.phases.mark("plan");
    LEAD_PRINTF("%s width/%lld, %lldx%lld %s, batch %lld, %lld params, %zu layers, device %s\n", model_name.c_str(),
                static_cast<long long>(width_div), static_cast<long long>(image_size), static_cast<long long>(image_size), layout_name.c_str(),
                static_cast<long long>(step_images / world), static_cast<long long>(model->parameter_count()), model->size(),
                run.dev.str().c_str());
    LEAD_PRINTF("data: %s\n", data.description.c_str());
    if (fuse) LEAD_PRINTF("fused relu: %zu ReLUs into the layer before them\n", fused);
    if (mg::dist::active()) {  // a world of one too (Note [a world of one])
      LEAD_PRINTF("data parallel: %lld ranks (%s) x %lld samples = a global batch of %lld per optimizer step\n",
                  static_cast<long long>(world), mg::dist::backend_name(run.dev).c_str(),
                  static_cast<long long>(step_images / world), static_cast<long long>(step_images));
    }

    if (!f.timeline_path.empty()) mg::dist::record_timeline(true);  // Note [reduction timeline]
    const mg::FitReport r = trainer.fit();
    f.phases.mark("train");
    write_timeline(f.timeline_path);
    f.prof.print();
    if (!f.save_dir.empty() && lead()) {
      mg::nn::save_safetensors(f.save_dir + "/final.safetensors", model->state_dict(), {{"steps", std::to_string(total_steps)}});
      f.phases.mark("save");
    }
    const mg::nn::TrainPlan& last = r.plan;  // after any re-plan
    if (conv_algos) print_conv_algorithms({last.micro_batch, last.last_micro_batch});
    const double med = r.median_step_ms();
    LEAD_PRINTF("median step %.1f ms; peak in use %s (predicted %s, measured/predicted %.3f); peak reserved %s\n", med,
                mg::format_bytes(r.peak_in_use).c_str(), mg::format_bytes(last.predicted_peak).c_str(),
                static_cast<double>(r.peak_in_use) / static_cast<double>(last.predicted_peak),
                mg::format_bytes(r.peak_reserved).c_str());
    if (last.predicted_step_ms > 0) {
      LEAD_PRINTF("joint plan: step %.1f ms predicted, %.1f ms measured (median; measured/predicted %.3f); peak %s of a "
                  "budget of %s\n", last.predicted_step_ms, med, med / last.predicted_step_ms,
                  mg::format_bytes(r.peak_in_use).c_str(), mg::format_bytes(trainer.budget()).c_str());
    }
    if (lead()) f.phases.print();
    if (!f.json_path.empty() && lead()) {
      nlohmann::ordered_json j = plan_json(trainer, r, f);
      j["global_batch"] = step_images;
      j["batch_size"] = step_images / world;
      j["final_loss"] = last_loss;
      j["steps"] = total_steps;
      j["model"] = model_name;
      j["width_div"] = width_div;
      j["image_size"] = image_size;
      j["layout"] = layout_name;
      j["fused_relu"] = fused;
      j["conv_fusion_ran"] = mg::cuda::conv_fusion_counts().ran;
      j["conv_fusion_refused"] = mg::cuda::conv_fusion_counts().refused;
      j["conv_dgrad_fusion_ran"] = mg::cuda::conv_fusion_counts().dgrad_ran;
      j["conv_dgrad_fusion_refused"] = mg::cuda::conv_fusion_counts().dgrad_refused;
      j["conv_fusion_refusal"] = mg::cuda::conv_fusion_refusal();
      j["cudnn_dgrad_fusion"] = mg::cuda::cudnn_dgrad_fusion();  // MG_CUDNN_DGRAD_FUSION=1
      j["conv_dgrad_fusion_refusal"] = mg::cuda::conv_fusion_refusal(true);
      j["data"] = data.description;
      j["tf32"] = tf32;
      j["cudnn_benchmark"] = cudnn_benchmark;
      j["cudnn_deterministic"] = !cudnn_nondeterministic;
      j["conv_workspace_limit_bytes"] = mg::cuda::conv_workspace_limit();
      if (conv_algos) j["conv_algorithms"] = conv_algorithms_json();
      mg::write_file_atomic(f.json_path, j.dump(2) + "\n");
    }
    return 0;
  });
}
