// gpt_train's data and sizes: the synthetic token stream and the presets of --config.
#pragma once

#include <algorithm>
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
  return {.vocab_size = 512, .block_size = 64, .n_layer = 2, .n_head = 4, .n_embd = 64};  // tiny
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
