// gpt_train's model and data: the sizes (--config, its overrides, --init-from), the learning-rate
// schedule, and the token stream (a file in llm.c's format, or synthetic).
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numbers>
#include <cstdint>
#include <string>
#include <vector>

#include <minigrad/data/tokens.h>
#include <minigrad/minigrad.h>

#include "common/flags.h"

namespace gpt {

// The synthetic stream: token i+1 is succ[token i] with probability 0.9, else uniform; succ is a
// fixed random map. A model that learns succ gets the loss down to about 0.9 * 0 + the noise's
// share, far below ln(vocab).
inline std::vector<uint16_t> synthetic_tokens(int64_t n, int64_t vocab, uint64_t seed) {
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

inline mg::nn::GPTConfig preset(const std::string& name) {
  if (name == "gpt2") return {};  // 124M
  if (name == "small") return {.vocab_size = 8192, .block_size = 256, .n_layer = 4, .n_head = 4, .n_embd = 128};
  // GPT-2 124M's ops (12 layers, 12 heads) at a width where a step costs the framework's own work
  // per op, not arithmetic (docs/gpt.md, "The cost of an op").
  if (name == "ops") return {.vocab_size = 96, .block_size = 1024, .n_layer = 12, .n_head = 12, .n_embd = 48};
  return {.vocab_size = 512, .block_size = 64, .n_layer = 2, .n_head = 4, .n_embd = 64};  // tiny
}

struct ModelFlags {
  std::string config = "tiny", init_from;
  int64_t n_layer = 0, n_head = 0, n_embd = 0, vocab = 0;
  double dropout = 0.0;
};

inline void add_model_flags(CLI::App& app, ModelFlags& f) {
  app.add_option("--config", f.config, "tiny (2 layers, 4 heads, 64 wide, vocab 512, context 64) | small (4, 4, 128, "
                                       "8192, 256) | gpt2 (124M: 12, 12, 768, 50257, 1024) | ops (12, 12, 48, 96, 1024: GPT-2's "
                                       "ops, at a width where a step costs the framework's work per op)")
      ->check(CLI::IsMember({"tiny", "small", "gpt2", "ops"}))->capture_default_str();
  auto* sizes = app.add_option_group("sizes");
  sizes->add_option("--n-layer", f.n_layer, "override the preset's layers")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  sizes->add_option("--n-head", f.n_head, "override the preset's heads")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  sizes->add_option("--n-embd", f.n_embd, "override the preset's width")->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  sizes->add_option("--vocab-size", f.vocab, "override the preset's vocabulary")->check(CLI::Range(int64_t{2}, int64_t{65536}));
  auto* init = app.add_option("--init-from", f.init_from, "start from Hugging Face GPT-2 weights: a folder with config.json "
                              "and model.safetensors (the hub's gpt2, or save_pretrained's); its sizes replace --config's")
                   ->check(nonempty())->excludes(app.get_option("--config"));
  sizes->excludes(init);
  app.add_option("--dropout", f.dropout, "dropout after the embeddings, on the attention probabilities and after each "
                                         "c_proj (nanoGPT's one rate)")->capture_default_str()->check(finite_in(0, 0.99, "[0, 0.99]"));
}

// The sizes: the preset or --init-from's config.json, with the overrides.
inline mg::nn::GPTConfig model_config(const ModelFlags& f) {
  mg::nn::GPTConfig cfg = f.init_from.empty() ? preset(f.config) : for_flag("--init-from", [&] {
    return mg::nn::read_gpt2_hf_config(f.init_from + "/config.json");
  });
  if (f.n_layer) cfg.n_layer = f.n_layer;
  if (f.n_head) cfg.n_head = f.n_head;
  if (f.n_embd) cfg.n_embd = f.n_embd;
  if (f.vocab) cfg.vocab_size = f.vocab;
  MG_CHECK(cfg.n_embd % cfg.n_head == 0, "--n-head " << cfg.n_head << " must divide the width " << cfg.n_embd
                                                        << " (--n-embd or the preset's)");
  cfg.dropout = static_cast<float>(f.dropout);
  return cfg;
}

// Warm-up for `warmup` steps, then a cosine down to min_frac * lr at the last of `steps`.
inline double cosine_lr(int64_t step, double lr, int64_t warmup, int64_t steps, double min_frac) {
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double span = std::max<double>(1.0, static_cast<double>(steps - warmup - 1));
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
  return lr * (min_frac + (1.0 - min_frac) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
}

struct Tokens {
  std::vector<uint16_t> tokens;
  std::string description;
};

// --data FILE in llm.c's .bin format (header checked, tokens checked against the vocabulary), or
// `synthetic` tokens of the stream above.
inline Tokens load(const std::string& path, int64_t vocab, int64_t synthetic, uint64_t seed) {
  if (path.empty()) {
    return {synthetic_tokens(synthetic, vocab, seed),
            "synthetic (" + std::to_string(synthetic) + " tokens, successor rule with p 0.9)"};
  }
  mg::data::TokenFile f = for_flag("--data", [&] { return mg::data::load_token_file(path); });
  MG_CHECK(f.max_token() < vocab, "--data: token " << f.max_token() << " is outside the vocabulary of " << vocab
                                                   << " (--config/--vocab-size)");
  const std::string what = path + " (" + std::to_string(f.tokens.size()) + " tokens)";
  return {std::move(f.tokens), what};
}

}  // namespace gpt
