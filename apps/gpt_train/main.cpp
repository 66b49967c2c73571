// gpt_train: train a GPT-2 (minigrad/nn/models.h) on a token stream, under a checkpoint plan or a
// memory budget, and report loss, tokens/s and memory.
//
//   build/bin/gpt_train --config tiny --steps 50                        # synthetic tokens
//   build/bin/gpt_train --config gpt2 --data train.bin --batch-size 4 --seq-len 1024 --accum 8 \
//       --checkpoint sqrt --json run.json --save-dir ckpt
//   build/bin/gpt_train --config small --batch-size 32 --memory-budget 200MB --steps 20
//   build/bin/gpt_train --init-from models/gpt2 --data train.bin --seq-len 256   # Hugging Face's weights
//
// Data: --data FILE in llm.c's .bin format (minigrad/data/tokens.h: header checked, tokens checked
// against the vocabulary), or by default a synthetic stream: a fixed random successor for every
// token, taken with probability 0.9 (else a random token), so the loss has somewhere to go.
// Windows of B x T + 1 tokens as llm.c reads them.
// Training: AdamW (betas 0.9, 0.95, eps 1e-8, weight decay --weight-decay on 2-D parameters only),
// learning rate warmed up linearly for --warmup-steps then cosine down to --min-lr-frac of --lr at
// the last step, the gradient clipped to a global norm of --clip once per step, and accumulation
// counting tokens (minigrad/optim/accumulate.h). --batch-size B sequences of --seq-len T per
// micro-batch, --accum N micro-batches per step; with --memory-budget, --batch-size is the
// sequences per step and the joint planner (minigrad/nn/train_plan.h) picks the micro-batch, N and
// the checkpoint plan, with the transformer blocks as units (a micro-batch that does not divide
// the sequences per step leaves a shorter last one). Under mpirun every rank reads its own
// windows and the Accumulator reduces the step's gradient once. Out of memory, a single process
// re-plans jointly for what the device has and redoes the step (Note [recovering from
// out-of-memory] in minigrad/optim/accumulate.h).
#include <CLI/CLI.hpp>

#include <cstdio>

#include <minigrad/cuda.h>
#include <minigrad/minigrad.h>

#include "common/run.h"
#include "gpt_train/gpt.h"

int main(int argc, char** argv) {
  const auto session = start_session("gpt_train", &argc, &argv);  // under mpirun: one rank of the run
  CLI::App app{"Train a GPT-2 on a token stream with a checkpoint plan or a memory budget; report loss, tokens/s "
               "and memory."};
  RunFlags f{.tiles = "off", .timeline = true};
  gpt::ModelFlags m;
  std::string data_path, tf32 = "off", fused_head = "off", fused_gelu = "off", fused_residual = "off";
  int64_t batch_size = 8, seq_len = 0, accum = 1, steps = 20, warmup = 0;
  double lr = 1e-3, min_lr_frac = 0.1, weight_decay = 0.1, clip = 1.0;
  gpt::add_model_flags(app, m);
  app.add_option("--data", data_path, "token file in llm.c's .bin format (default: synthetic tokens)")->check(nonempty());
  app.add_option("--batch-size", batch_size, "sequences per micro-batch (with --memory-budget: per step)")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--seq-len", seq_len, "tokens per sequence (default: the context)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  auto* accum_opt = app.add_option("--accum", accum, "micro-batches per optimizer step")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--steps", steps, "optimizer steps")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--lr", lr, "peak learning rate")->capture_default_str()->check(finite_in(0, 10, "[0, 10]"));
  app.add_option("--warmup-steps", warmup, "linear warm-up steps")->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  app.add_option("--min-lr-frac", min_lr_frac, "the cosine ends at this fraction of --lr")->capture_default_str()->check(finite_in(0, 1, "[0, 1]"));
  app.add_option("--weight-decay", weight_decay, "AdamW weight decay on 2-D parameters")->capture_default_str()->check(finite_in(0, 10, "[0, 10]"));
  app.add_option("--clip", clip, "max global gradient norm (0: no clipping)")->capture_default_str()->check(finite_in(0, 1e30, "[0, 1e30]"));
  app.add_option("--tf32", tf32, "CUDA matrix products in TF32: on | off (strict FP32, the default as in PyTorch)")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_option("--fused-head", fused_head,
                 "the head and the loss as one op that never holds the logits (linear_cross_entropy, a chunk of "
                 "rows at a time, made again in backward): on | off")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_option("--fused-gelu", fused_gelu,
                 "each block's c_fc and GELU as one op (linear_gelu: on CUDA the GELU in the cuBLASLt product's "
                 "epilogue): on | off")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_option("--fused-residual", fused_residual,
                 "each block's first residual add and ln_2 as one op (add_layer_norm: on CUDA one pass that writes "
                 "both; the same bits): on | off")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  add_run_flags(app, f, "the sequences per step");
  accum_opt->excludes(app.get_option("--memory-budget"));
  CLI11_PARSE(app, argc, argv);
  mg::cuda::set_tf32_matmul(tf32 == "on");
  return run_main("gpt_train", f, [&] {
    const int64_t world = mg::dist::world_size(), rank = mg::dist::rank();
    mg::nn::GPTConfig cfg = gpt::model_config(m);
    cfg.lm_head = fused_head == "off";  // on: the model ends at ln_f, the loss is the head too
    cfg.fused_gelu = fused_gelu == "on";
    cfg.fused_residual = fused_residual == "on";
    if (seq_len == 0) seq_len = cfg.block_size;
    MG_CHECK(seq_len <= cfg.block_size, "--seq-len " << seq_len << " is longer than the context of " << cfg.block_size);
    const RunSetup run = setup_run(f, "final.safetensors");
    f.phases.mark("device");
    const gpt::Tokens data = gpt::load(data_path, cfg.vocab_size,
                                       std::max<int64_t>(1 << 16, 4 * world * batch_size * seq_len * accum + 1), f.seed);
    f.phases.mark("data");

    mg::manual_seed(f.seed);
    auto model = mg::nn::make_gpt2(cfg);
    if (!m.init_from.empty()) {
      for_flag("--init-from", [&] { mg::nn::load_gpt2_hf_weights(*model, m.init_from + "/model.safetensors"); });
    }
    const std::string config = m.init_from.empty() ? m.config : "from " + m.init_from;
    model->to(run.dev);
    mg::optim::AdamW opt(model->parameters(), {.lr = static_cast<float>(lr), .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                               .weight_decay = static_cast<float>(weight_decay), .decay_matrices_only = true});
    f.phases.mark("model");

    // The windows (llm.c's reading: Note in minigrad/data/tokens.h), the plan (a checkpoint plan at
    // the micro-batch, or jointly for the budget), the loop, out-of-memory recovery: mg::Trainer
    // (Note [the trainer's step] in minigrad/train/trainer.h).
    const bool joint = !f.memory_budget.empty();
    MG_CHECK(!joint || batch_size % world == 0, "--batch-size " << batch_size << " with --memory-budget is the sequences "
                                                "per step over all " << world << " ranks: it must be a multiple of " << world);
    const int64_t per_step = joint ? batch_size / world : batch_size * accum;  // sequences per step on a rank
    auto batches = for_flag(data_path.empty() ? "--batch-size" : "--data", [&] {
      return std::make_shared<mg::data::TokenBatches>(data.tokens, per_step, seq_len, rank, world, cfg.vocab_size);
    });
    auto lr_at = [&](int64_t step) { return gpt::cosine_lr(step, lr, warmup, steps, min_lr_frac); };
    const int64_t tokens_per_step = world * per_step * seq_len;
    std::vector<double> step_ms, lrs, norms;  // a step's time holds its data's reading
    mg::TrainerCallbacks cb;
    cb.on_step_start = [&](int64_t step, bool redo) { redo ? f.prof.restart(step, steps) : f.prof.begin(step, steps); };
    cb.on_step = [&](const mg::StepReport& r) {
      const double loss = r.info.loss_sum / static_cast<double>(r.info.samples), ms = r.ms + r.data_ms;
      f.prof.end(r.step, steps, ms);
      step_ms.push_back(ms);
      lrs.push_back(lr_at(r.step));
      norms.push_back(r.info.grad_norm);
      LEAD_PRINTF("step %lld/%lld  loss %.5f  lr %.3g  norm %.3f  time %.1f ms  %.0f tokens/s  peak in use %s\n",
                  static_cast<long long>(r.step + 1), static_cast<long long>(steps), loss, lr_at(r.step), r.info.grad_norm, ms,
                  static_cast<double>(tokens_per_step) / (ms / 1000.0), mg::format_bytes(r.peak_in_use).c_str());
      std::fflush(stdout);
    };
    const int64_t V = cfg.vocab_size, C = cfg.n_embd;
    mg::Tensor wte;
    for (const auto& [name, p] : model->named_parameters()) {
      if (name == "transformer.wte.weight") wte = p;
    }
    mg::optim::LossFn loss = [V](const mg::Tensor& logits, const mg::Tensor& y) {
      // The logits are not held past the loss (the loss keeps what backward needs).
      return mg::cross_entropy(logits.reshape({-1, V}), y.reshape({-1}), mg::Reduction::sum);
    };
    if (fused_head == "on") {
      loss = [C, wte](const mg::Tensor& h, const mg::Tensor& y) {
        return mg::linear_cross_entropy(h.reshape({-1, C}), wte, y.reshape({-1}));
      };
    }
    mg::Trainer trainer(*model, batches, opt,
                        {.batch_size = world * per_step, .memory_budget = f.memory_budget,
                         .micro_batch = joint ? 0 : batch_size, .checkpoint = f.checkpoint, .epochs = 1,
                         .max_steps = steps, .clip_norm = static_cast<float>(clip),
                         .lr = [&](int64_t step) { return static_cast<float>(lr_at(step)); },
                         .loss = loss, .measure_loss = fused_head == "on",
                         .seed = f.seed, .tiles = f.tiles == "on", .plan_timing_passes = f.plan_timings, .offload = offload_mode(f),
                         .precision = mg::parse_precision(f.precision), .prefetch = prefetch_mode(f)},
                        cb);
    LEAD_PRINTF("gpt2 %s: %lld layers, %lld heads, width %lld, vocab %lld, context %lld; %lld params; device %s\n",
                config.c_str(), static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.n_head),
                static_cast<long long>(cfg.n_embd), static_cast<long long>(cfg.vocab_size), static_cast<long long>(cfg.block_size),
                static_cast<long long>(model->parameter_count()), run.dev.str().c_str());
    LEAD_PRINTF("data: %s\n", data.description.c_str());
    const mg::nn::TrainPlan& tp = print_plan(trainer, f);
    f.phases.mark("plan");
    const std::string last_str = tp.last_micro_batch == tp.micro_batch ? "" : " (the last " + std::to_string(tp.last_micro_batch) + ")";
    LEAD_PRINTF("step: %lld rank(s) x %lld micro-batch(es) x %lld sequences%s x %lld tokens = %lld tokens\n",
                static_cast<long long>(world), static_cast<long long>(tp.accumulation), static_cast<long long>(tp.micro_batch),
                last_str.c_str(), static_cast<long long>(seq_len), static_cast<long long>(tokens_per_step));

    if (!f.timeline_path.empty()) mg::dist::record_timeline(true);  // Note [reduction timeline]
    const mg::FitReport r = trainer.fit();
    f.phases.mark("train");
    write_timeline(f.timeline_path);
    // Steady state: the first step warms up threads and caches.
    std::vector<double> timed(step_ms.begin() + (step_ms.size() > 1 ? 1 : 0), step_ms.end());
    const double med = median(timed);
    LEAD_PRINTF("median step %.1f ms, %.0f tokens/s; peak in use %s (predicted %s)\n", med,
                static_cast<double>(tokens_per_step) / (med / 1000.0), mg::format_bytes(r.peak_in_use).c_str(),
                mg::format_bytes(r.plan.checkpoint.predicted_peak).c_str());
    f.prof.print();
    if (!f.save_dir.empty() && lead()) {
      mg::nn::save_safetensors(f.save_dir + "/final.safetensors", model->state_dict());
      f.phases.mark("save");
    }
    if (lead()) f.phases.print();
    if (!f.json_path.empty() && lead()) {
      nlohmann::ordered_json j = plan_json(trainer, r, f);
      j["config"] = {{"name", config}, {"vocab_size", cfg.vocab_size}, {"block_size", cfg.block_size},
                     {"n_layer", cfg.n_layer}, {"n_head", cfg.n_head}, {"n_embd", cfg.n_embd}};
      j["params"] = model->parameter_count();
      j["data"] = data.description;
      j["ranks"] = world;
      j["dropout"] = m.dropout;
      j["seq_len"] = seq_len;
      j["tokens_per_step"] = tokens_per_step;
      j["tf32"] = tf32;
      j["fused_head"] = fused_head;
      j["fused_gelu"] = fused_gelu;
      j["fused_residual"] = fused_residual;
      j["step_ms"] = step_ms;
      j["median_step_ms"] = med;  // the first step left out
      // The host's issue time on the same terms as median_step_ms: data reads in, the first step out.
      std::vector<double> issue;
      for (size_t i = r.step_issue_ms.size() > 1 ? 1 : 0; i < r.step_issue_ms.size(); ++i) {
        issue.push_back(r.step_issue_ms[i] + r.step_data_ms[i]);
      }
      j["median_step_issue_ms"] = median(issue);
      j["tokens_per_s"] = static_cast<double>(tokens_per_step) / (med / 1000.0);
      j["lr"] = lrs;
      j["grad_norm"] = norms;
      mg::write_file_atomic(f.json_path, j.dump(2) + "\n");
    }
    return 0;
  });
}
