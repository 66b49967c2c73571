// GPT-2 checkpoints written by Hugging Face's transformers itself (tests/reference/gpt2_hf.py: a
// tiny random GPT2LMHeadModel saved with save_pretrained, in the three layouts users meet) load
// through nn::load_gpt2_hf, and our logits equal transformers' within 1e-4 relative. Run by ctest
// through tests/with_reference.sh (MG_GPT_HF_REFERENCE); skipped (77) without it.
#include <cstdlib>
#include <filesystem>

#include <minigrad/minigrad.h>

#include "helpers.h"

using namespace mg;

TEST_CASE("GPT-2 saved by transformers (GPT2LMHeadModel, GPT2Model, the hub's older layout) gives transformers' logits") {
  const char* env = std::getenv("MG_GPT_HF_REFERENCE");
  const std::string dir = env ? env : "";
  if (dir.empty() || !std::filesystem::exists(dir + "/ref.safetensors")) {
    MESSAGE("MG_GPT_HF_REFERENCE is not set to the folder of tests/reference/gpt2_hf.py: skipped");
    std::exit(77);
  }
  const nn::SafetensorsFile ref = nn::load_safetensors(dir + "/ref.safetensors");
  const Tensor& tokens = test::tensor_in(ref, "tokens");
  for (const std::string layout : {"lm", "base", "hub"}) {
    INFO(layout);
    const nn::GPTConfig c = nn::read_gpt2_hf_config(dir + "/" + layout + "/config.json");
    CHECK(c.vocab_size == 512);
    CHECK(c.block_size == 64);
    CHECK(c.n_layer == 2);
    CHECK(c.n_head == 4);
    CHECK(c.n_embd == 64);
    auto gpt = nn::load_gpt2_hf(dir + "/" + layout);
    const double e = test::rel_err(gpt->forward(tokens), test::tensor_in(ref, "logits"));
    MESSAGE(layout << ": logits relative error " << e);
    CHECK(e < 1e-4);
  }
}
