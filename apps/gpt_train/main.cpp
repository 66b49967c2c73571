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

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numbers>

#include <minigrad/cuda.h>
#include <minigrad/data/tokens.h>
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

// The synthetic stream: token i+1 is succ[token i] with probability 0.9, else uniform; succ is a
// fixed random map. A model that learns succ gets the loss down to about 0.9 * 0 + the noise's
// share, far below ln(vocab).
std::vector<uint16_t> synthetic_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  auto draw = [vocab](float u) { return static_cast<uint16_t>(std::min<int64_t>(vocab - 1, static_cast<int64_t>(u * static_cast<float>(vocab)))); };
  std::vector<uint16_t> succ(static_cast<size_t>(vocab)), out(static_cast<size_t>(n));
  for (int64_t v = 0; v < vocab; ++v) succ[static_cast<size_t>(v)] = draw(mg::philox_uniform(seed, static_cast<uint64_t>(v)));
  uint16_t t = 0;
  for (int64_t i = 0; i < n; ++i) {
    out[static_cast<size_t>(i)] = t;
    const uint64_t k = 2 * static_cast<uint64_t>(i);
    t = mg::philox_uniform(seed ^ 0x5EEDull, k) < 0.9f ? succ[t] : draw(mg::philox_uniform(seed ^ 0x5EEDull, k + 1));
  }
  return out;
}

mg::nn::GPTConfig preset(const std::string& name) {
  if (name == "gpt2") return {};  // 124M
  if (name == "small") return {.vocab_size = 8192, .block_size = 256, .n_layer = 4, .n_head = 4, .n_embd = 128};
  return {.vocab_size = 512, .block_size = 64, .n_layer = 2, .n_head = 4, .n_embd = 64};  // tiny
}

}  // namespace

int main(int argc, char** argv) {
  const auto session = start_session("gpt_train", &argc, &argv);
  CLI::App app{"Train a GPT-2 on a token stream with a checkpoint plan or a memory budget; report loss, tokens/s "
               "and memory."};
  std::string config = "tiny", init_from, data_path, checkpoint = "none", device_str = "cpu", json_path, timeline_path, save_dir, memory_budget,
              memory_limit;
  int64_t batch_size = 8, seq_len = 0, accum = 1, steps = 20, warmup = 0, n_layer = 0, n_head = 0, n_embd = 0,
          vocab = 0;
  double lr = 1e-3, min_lr_frac = 0.1, weight_decay = 0.1, clip = 1.0, dropout = 0.0;
  uint64_t seed = 0;
  app.add_option("--config", config, "tiny (2 layers, 4 heads, 64 wide, vocab 512, context 64) | small (4, 4, 128, "
                                     "8192, 256) | gpt2 (124M: 12, 12, 768, 50257, 1024)")
      ->check(CLI::IsMember({"tiny", "small", "gpt2"}))
      ->capture_default_str();
  auto* sizes = app.add_option_group("sizes");
  sizes->add_option("--n-layer", n_layer, "override the preset's layers")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  sizes->add_option("--n-head", n_head, "override the preset's heads")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  sizes->add_option("--n-embd", n_embd, "override the preset's width")->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  sizes->add_option("--vocab-size", vocab, "override the preset's vocabulary")->check(CLI::Range(int64_t{2}, int64_t{65536}));
  auto* init_opt = app.add_option("--init-from", init_from,
                                  "start from Hugging Face GPT-2 weights: a folder with config.json and model.safetensors "
                                  "(the hub's gpt2, or save_pretrained's); its sizes replace --config's")
                       ->check(nonempty());
  init_opt->excludes(app.get_option("--config"));
  sizes->excludes(init_opt);
  app.add_option("--data", data_path, "token file in llm.c's .bin format (default: synthetic tokens)")->check(nonempty());
  app.add_option("--batch-size", batch_size, "sequences per micro-batch (with --memory-budget: per step)")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--seq-len", seq_len, "tokens per sequence (default: the context)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  auto* accum_opt = app.add_option("--accum", accum, "micro-batches per optimizer step")
                        ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--steps", steps, "optimizer steps")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--lr", lr, "peak learning rate")->capture_default_str()->check(finite_in(0, 10, "[0, 10]"));
  app.add_option("--warmup-steps", warmup, "linear warm-up steps")->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  app.add_option("--min-lr-frac", min_lr_frac, "the cosine ends at this fraction of --lr")->capture_default_str()->check(finite_in(0, 1, "[0, 1]"));
  app.add_option("--weight-decay", weight_decay, "AdamW weight decay on 2-D parameters")->capture_default_str()->check(finite_in(0, 10, "[0, 10]"));
  app.add_option("--dropout", dropout, "dropout after the embeddings, on the attention probabilities and after each "
                                       "c_proj (nanoGPT's one rate)")
      ->capture_default_str()->check(finite_in(0, 0.99, "[0, 0.99]"));
  app.add_option("--clip", clip, "max global gradient norm (0: no clipping)")->capture_default_str()->check(finite_in(0, 1e30, "[0, 1e30]"));
  app.add_option("--checkpoint", checkpoint, "none | sqrt | min | segments=K | budget=SIZE")->check(nonempty())->capture_default_str();
  auto* budget_opt = app.add_option("--memory-budget", memory_budget,
                                    "plan micro-batch, accumulation and checkpointing for this many bytes (or 'free'); "
                                    "--batch-size is then the sequences per step")
                         ->check(nonempty());
  app.get_option("--checkpoint")->excludes(budget_opt);
  accum_opt->excludes(budget_opt);
  app.add_option("--memory-limit", memory_limit, "cap the device's allocator (mg::set_memory_limit)")->check(nonempty());
  app.add_option("--device", device_str, "cpu or cuda[:i]")->check(nonempty())->capture_default_str();
  app.add_option("--seed", seed, "seed of weights and synthetic data")->check(unsigned64())->capture_default_str();
  app.add_option("--json", json_path, "write a JSON summary here")->check(nonempty());
  app.add_option("--timeline", timeline_path, "write where each CUDA reduction ran against backward, a trace for "
                 "chrome://tracing (data parallel on CUDA; bench/timeline.py summarises it)")->check(nonempty());
  app.add_option("--save-dir", save_dir, "write final.safetensors here (rank 0)")->check(nonempty());
  std::string tf32 = "off";
  app.add_option("--tf32", tf32, "CUDA matrix products in TF32: on | off (strict FP32, the default as in PyTorch)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  StepProfile prof;
  app.add_flag("--profile", prof.on, "after training, the time of every op by pass (forward, backward, replay) over "
               "the steps after the first (minigrad/core/profiler.h)");
  CLI11_PARSE(app, argc, argv);
  mg::cuda::set_tf32_matmul(tf32 == "on");

  try {
    const mg::Device dev = mg::dist::device_for_rank(for_flag("--device", [&] { return mg::Device::parse(device_str); }),
                                                     device_str.find(':') != std::string::npos);
    const int64_t world = mg::dist::world_size(), rank = mg::dist::rank();
    mg::nn::GPTConfig cfg = init_from.empty() ? preset(config)
                                              : for_flag("--init-from", [&] {
                                                  return mg::nn::read_gpt2_hf_config(init_from + "/config.json");
                                                });
    if (n_layer) cfg.n_layer = n_layer;
    if (n_head) cfg.n_head = n_head;
    if (n_embd) cfg.n_embd = n_embd;
    if (vocab) cfg.vocab_size = vocab;
    MG_CHECK(cfg.n_embd % cfg.n_head == 0, "--n-head " << cfg.n_head << " must divide the width " << cfg.n_embd
                                                          << " (--n-embd or the preset's)");
    cfg.dropout = static_cast<float>(dropout);
    if (seq_len == 0) seq_len = cfg.block_size;
    MG_CHECK(seq_len <= cfg.block_size, "--seq-len " << seq_len << " is longer than the context of " << cfg.block_size);
    size_t limit = 0, budget = 0;
    if (!memory_limit.empty()) limit = for_flag("--memory-limit", [&] { return mg::parse_bytes(memory_limit); });
    if (!memory_budget.empty() && memory_budget != "free") {
      budget = for_flag("--memory-budget", [&] { return mg::parse_bytes(memory_budget); });
    }
    if (limit != 0) mg::set_memory_limit(dev, limit);
    if (!json_path.empty()) mg::nn::check_writable(json_path, "--json");
    check_timeline_flag(timeline_path, dev);
    if (!save_dir.empty()) {
      for_flag("--save-dir", [&] { return std::filesystem::create_directories(save_dir); });
      mg::nn::check_writable(save_dir + "/final.safetensors", "--save-dir");
    }

    // The token stream.
    std::vector<uint16_t> tokens;
    std::string data_str;
    if (!data_path.empty()) {
      mg::data::TokenFile f = for_flag("--data", [&] { return mg::data::load_token_file(data_path); });
      MG_CHECK(f.max_token() < cfg.vocab_size, "--data: token " << f.max_token() << " is outside the vocabulary of "
                                                                  << cfg.vocab_size << " (--config/--vocab-size)");
      tokens = std::move(f.tokens);
      data_str = data_path + " (" + std::to_string(tokens.size()) + " tokens)";
    } else {
      const int64_t n = std::max<int64_t>(1 << 16, 4 * world * batch_size * seq_len * accum + 1);
      tokens = synthetic_tokens(n, cfg.vocab_size, seed);
      data_str = "synthetic (" + std::to_string(n) + " tokens, successor rule with p 0.9)";
    }

    mg::manual_seed(seed);
    auto model = mg::nn::make_gpt2(cfg);
    if (!init_from.empty()) {
      for_flag("--init-from", [&] { mg::nn::load_gpt2_hf_weights(*model, init_from + "/model.safetensors"); });
      config = "from " + init_from;
    }
    model->to(dev);
    mg::dist::check_same_parameters(model->named_parameters());
    mg::dist::broadcast(model->parameters());
    model->train();

    // The optimizer first: its state is part of what the plan must fit.
    mg::optim::AdamW opt(model->parameters(), {.lr = static_cast<float>(lr), .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                               .weight_decay = static_cast<float>(weight_decay),
                                               .decay_matrices_only = true});

    // The plan: checkpointing at the micro-batch, or jointly for the budget.
    int64_t micro = batch_size, n_micro = accum;
    mg::nn::Plan plan;
    mg::nn::ChainCost cost;
    mg::nn::TrainPlan tp;
    auto tokens_of = [&](int64_t b) {
      std::vector<int64_t> v(static_cast<size_t>(b * seq_len));
      for (size_t i = 0; i < v.size(); ++i) v[i] = tokens[i % tokens.size()];
      return Tensor::from_vector(v, {b, seq_len}).to(dev);
    };
    // The joint plan of `per_rank` sequences a step for `memory` bytes: tp, and the checkpoint
    // plan, chain cost and micro-batches it picks.
    auto plan_jointly = [&](size_t memory, int64_t per_rank) {
      const mg::nn::ChainProfile profile =
          mg::nn::profile_chain(*model, tokens_of, mg::nn::candidate_micro_batches(per_rank), memory);
      tp = mg::nn::plan_training(profile, per_rank, memory, {.tiles = false});
      for (size_t i = 0; i < profile.micro_batches.size(); ++i) {
        if (profile.micro_batches[i] == tp.micro_batch) cost = profile.costs[i];
      }
      plan = tp.checkpoint;
      micro = tp.micro_batch;
      n_micro = tp.accumulation;
    };
    nlohmann::ordered_json replans = nlohmann::json::array();  // what out-of-memory recovery changed
    bool joint = !memory_budget.empty();
    if (!joint) {
      // The spelling first: a measuring that runs out of memory replaces the plan (below).
      for_flag("--checkpoint", [&] { mg::nn::check_plan_spec(checkpoint); });
      try {
        cost = mg::nn::measure_chain(*model, tokens_of(micro));
      } catch (const mg::OutOfMemoryError& e) {  // Note [recovering from out-of-memory]
        // Not under data parallelism: each rank would plan alone, unseen but on rank 0.
        if (mg::dist::active()) throw;
        LEAD_PRINTF("measuring %lld sequences: %s\n  planning jointly for what the device has instead: the %lld "
                    "sequences of a step kept, --accum %lld and --checkpoint %s replaced by the plan\n",
                    static_cast<long long>(micro), first_line(e).c_str(), static_cast<long long>(micro * n_micro),
                    static_cast<long long>(n_micro), checkpoint.c_str());
        const std::string before = std::to_string(n_micro) + " x " + std::to_string(micro) + ", checkpoint " + checkpoint;
        joint = true;
        budget = mg::memory_capacity(dev);
        replan_or_explain(first_line(e), "measuring", budget, memory_limit, [&] { plan_jointly(budget, micro * n_micro); });
        replans.push_back({{"step", 0}, {"memory_bytes", budget}, {"from", before + " (measuring ran out of memory)"},
                           {"to", tp.str()}});
      }
      if (!joint) plan = for_flag("--checkpoint", [&] { return mg::nn::make_plan(cost, checkpoint); });
    } else {
      if (budget == 0) budget = mg::memory_capacity(dev);
      MG_CHECK(batch_size % world == 0, "--batch-size " << batch_size << " with --memory-budget is the sequences per step "
                                                        "over all " << world << " ranks: it must be a multiple of " << world);
      for_flag("--memory-budget", [&] { plan_jointly(budget, batch_size / world); });
    }

    // Each step reads one window of the rank's sequences and runs it as micro-batches of `micro`,
    // the last one the remainder when the planner's micro-batch does not divide them.
    const int64_t per_step = joint ? tp.effective_batch : micro * n_micro;
    auto last_micro_of = [&] { return per_step - (n_micro - 1) * micro; };
    int64_t last_micro = last_micro_of();
    mg::optim::Accumulator acc(opt, {.steps = static_cast<int>(n_micro), .clip_norm = static_cast<float>(clip)});
    mg::data::TokenBatches batches = for_flag(data_path.empty() ? "--batch-size" : "--data", [&] {
      return mg::data::TokenBatches(tokens, per_step, seq_len, rank, world, cfg.vocab_size);
    });
    const int64_t tokens_per_step = world * per_step * seq_len;
    LEAD_PRINTF("gpt2 %s: %lld layers, %lld heads, width %lld, vocab %lld, context %lld; %lld params; device %s\n",
                config.c_str(), static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.n_head),
                static_cast<long long>(cfg.n_embd), static_cast<long long>(cfg.vocab_size),
                static_cast<long long>(cfg.block_size), static_cast<long long>(model->parameter_count()),
                dev.str().c_str());
    LEAD_PRINTF("data: %s\n", data_str.c_str());
    const std::string last_str = last_micro == micro ? "" : " (the last " + std::to_string(last_micro) + ")";
    LEAD_PRINTF("step: %lld rank(s) x %lld micro-batch(es) x %lld sequences%s x %lld tokens = %lld tokens\n",
                static_cast<long long>(world), static_cast<long long>(n_micro), static_cast<long long>(micro),
                last_str.c_str(), static_cast<long long>(seq_len), static_cast<long long>(tokens_per_step));
    if (joint) LEAD_PRINTF("memory budget %s: %s\n", mg::format_bytes(budget).c_str(), tp.str().c_str());
    LEAD_PRINTF("plan %s: %s; predicted peak %s; smallest feasible %s\n", plan.kind.c_str(), plan.str().c_str(),
                mg::format_bytes(plan.predicted_peak).c_str(), mg::format_bytes(mg::nn::min_feasible_peak(cost)).c_str());

    auto lr_at = [&](int64_t step) {  // warm-up, then cosine to min_lr_frac * lr at the last step
      if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
      const double span = std::max<double>(1.0, static_cast<double>(steps - warmup - 1));
      const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
      return lr * (min_lr_frac + (1.0 - min_lr_frac) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
    };
    // Note [recovering from out-of-memory] (minigrad/optim/accumulate.h): a window that runs out of
    // memory is dropped and redone from its first micro-batch under a joint plan for what the
    // device has then; dropout by sequence keeps the step the one planned. Under data parallelism
    // the error stands: every rank would have to re-plan at the same window (the others stop,
    // Note [collectives never hang]).
    auto replan = [&](const mg::OutOfMemoryError& e, int64_t step) {
      const size_t there = memory_for_redone_step(e, step, dev);
      const std::string before = joint ? tp.str() : std::to_string(n_micro) + " x " + std::to_string(micro) + ", checkpoint " + plan.str();
      const size_t before_peak = joint ? tp.predicted_peak : plan.predicted_peak;
      replan_or_explain(first_line(e), "step " + std::to_string(step + 1), there, memory_limit,
                        [&] { plan_jointly(there, per_step); });
      joint = true;
      budget = there;
      acc.set_steps(n_micro);
      last_micro = last_micro_of();
      LEAD_PRINTF("  re-planned: %s, predicted peak %s (was %s, predicted peak %s)\n", tp.str().c_str(),
                  mg::format_bytes(tp.predicted_peak).c_str(), before.c_str(), mg::format_bytes(before_peak).c_str());
      replans.push_back({{"step", step + 1}, {"memory_bytes", there}, {"from", before}, {"to", tp.str()}});
    };
    std::vector<double> step_ms, losses, lrs, norms;
    size_t peak_in_use = 0;
    if (!timeline_path.empty()) mg::dist::record_timeline(true);  // Note [reduction timeline]
    for (int64_t step = 0; step < steps; ++step) {
      opt.set_lr(static_cast<float>(lr_at(step)));
      mg::reset_peak_memory_stats(dev);
      mg::synchronize(dev);
      prof.begin(step, steps);
      auto t0 = std::chrono::steady_clock::now();
      // On the host; each micro-batch goes to the device when it runs.
      std::vector<mg::data::TokenBatch> window = batches.next_split(micro);
      for (int tries = 0;; ++tries) {
        try {
          int64_t rows = 0;
          for (const mg::data::TokenBatch& host : window) {
            const Tensor x = dev.is_cuda() ? host.x.to(dev) : host.x, y = dev.is_cuda() ? host.y.to(dev) : host.y;
            Tensor loss;
            {  // dropout masks by sequence, whatever the split (Note [dropout by sample])
              const mg::SampleWindowGuard guard = acc.sample_window(rows);
              // The logits are not held past the loss (the loss keeps what backward needs).
              loss = mg::cross_entropy(mg::nn::forward_with_plan(*model, plan, x).reshape({-1, cfg.vocab_size}),
                                       y.reshape({-1}), mg::Reduction::sum);
            }
            acc.backward(loss, x.numel());
            rows += x.size(0);
          }
          break;
        } catch (const mg::OutOfMemoryError& e) {
          acc.discard();
          if (tries == 2) throw;  // a third plan did not fit either: the prediction is off, say so
          replan(e, step);
          window = batches.split_last(micro);
          // The step's time and peak are the new plan's: not the failed try's, nor the profiling's,
          // nor the old plan's steps before.
          mg::reset_peak_memory_stats(dev);
          peak_in_use = 0;
          prof.restart(step, steps);
          t0 = std::chrono::steady_clock::now();
        }
      }
      const mg::optim::StepInfo info = acc.step();
      mg::synchronize(dev);  // the optimizer's update too: step() queues it after its one read
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const size_t peak = mg::memory_stats(dev).peak_in_use;
      peak_in_use = std::max(peak_in_use, peak);
      const double loss = info.loss_sum / static_cast<double>(info.samples);
      step_ms.push_back(ms);
      prof.end(step, steps, ms);
      losses.push_back(loss);
      lrs.push_back(lr_at(step));
      norms.push_back(info.grad_norm);
      LEAD_PRINTF("step %lld/%lld  loss %.5f  lr %.3g  norm %.3f  time %.1f ms  %.0f tokens/s  peak in use %s\n",
                  static_cast<long long>(step + 1), static_cast<long long>(steps), loss, lr_at(step), info.grad_norm, ms,
                  static_cast<double>(tokens_per_step) / (ms / 1000.0), mg::format_bytes(peak).c_str());
      std::fflush(stdout);
    }
    write_timeline(timeline_path);
    // Steady state: the first step warms up threads and caches.
    std::vector<double> timed(step_ms.begin() + (step_ms.size() > 1 ? 1 : 0), step_ms.end());
    const double med = median(timed);
    LEAD_PRINTF("median step %.1f ms, %.0f tokens/s; peak in use %s (predicted %s)\n", med,
                static_cast<double>(tokens_per_step) / (med / 1000.0), mg::format_bytes(peak_in_use).c_str(),
                mg::format_bytes(plan.predicted_peak).c_str());
    prof.print();
    if (!save_dir.empty() && lead()) mg::nn::save_safetensors(save_dir + "/final.safetensors", model->state_dict());
    if (!json_path.empty() && lead()) {
      nlohmann::ordered_json j;
      j["config"] = {{"name", config}, {"vocab_size", cfg.vocab_size}, {"block_size", cfg.block_size},
                     {"n_layer", cfg.n_layer}, {"n_head", cfg.n_head}, {"n_embd", cfg.n_embd}};
      j["params"] = model->parameter_count();
      j["data"] = data_str;
      j["device"] = dev.str();
      j["ranks"] = world;
      j["dropout"] = dropout;
      j["micro_batch"] = micro;
      j["last_micro_batch"] = last_micro;
      j["accumulation"] = n_micro;
      j["seq_len"] = seq_len;
      j["tokens_per_step"] = tokens_per_step;
      j["plan"] = plan.kind;
      j["tf32"] = tf32;
      j["segments"] = nlohmann::json::array();
      for (const auto& g : plan.segments) j["segments"].push_back({g.begin, g.end});
      j["predicted_peak_bytes"] = plan.predicted_peak;
      j["peak_in_use_bytes"] = peak_in_use;
      if (joint) j["memory_budget_bytes"] = budget;
      j["replans"] = replans;
      j["step_ms"] = step_ms;
      j["median_step_ms"] = med;
      j["tokens_per_s"] = static_cast<double>(tokens_per_step) / (med / 1000.0);
      j["losses"] = losses;
      j["lr"] = lrs;
      j["grad_norm"] = norms;
      j["threads"] = mg::num_threads();
      if (prof.on) j["profile"] = prof.json();
      mg::nn::write_file_atomic(json_path, j.dump(2) + "\n");
    }
    return 0;
  } catch (const mg::OutOfMemoryError& e) {
    std::fprintf(stderr, "gpt_train: %s%s%s\n", rank_prefix().c_str(),
                 memory_limit.empty() ? "" : ("under --memory-limit " + memory_limit + ": ").c_str(), e.what());
    if (mg::dist::world_size() > 1) mg::dist::abort_all(1);  // Note [collectives never hang]
    return 1;
  } catch (const mg::Error& e) {
    std::fprintf(stderr, "gpt_train: %s%s\n", rank_prefix().c_str(), e.what());
    if (mg::dist::world_size() > 1) mg::dist::abort_all(1);
    return 1;
  }
}
