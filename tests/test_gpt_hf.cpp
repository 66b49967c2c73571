// GPT-2 checkpoints written by Hugging Face's transformers itself (tests/reference/gpt2_hf.py: a
// tiny random GPT2LMHeadModel saved with save_pretrained, in the three layouts users meet) load
// through nn::load_gpt2_hf, and our logits equal transformers' within 1e-4 relative. Run by ctest
// through tests/with_reference.sh (MG_GPT_HF_REFERENCE); skipped (77) without it. With MG_GPT2_DIR
// set to a GPT-2 folder of the user's (the hub's gpt2), that one too.
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

TEST_CASE("a GPT-2 folder of the user's (MG_GPT2_DIR) gives transformers' logits") {
  const char* env = std::getenv("MG_GPT_HF_REFERENCE");
  const char* dir = std::getenv("MG_GPT2_DIR");
  const std::string ref = std::string(env ? env : "") + "/pretrained.safetensors", folder = dir ? dir : "";
  if (folder.empty() || !env || !std::filesystem::exists(ref)) {
    MESSAGE("MG_GPT2_DIR is not set (a folder with the hub's gpt2): not compared");
    return;
  }
  const nn::SafetensorsFile r = nn::load_safetensors(ref);
  auto gpt = nn::load_gpt2_hf(folder);
  gpt->eval();
  MESSAGE(folder << ": " << gpt->parameter_count() << " parameters");
  const double e = test::rel_err(gpt->forward(test::tensor_in(r, "tokens")), test::tensor_in(r, "logits"));
  MESSAGE(folder << ": logits relative error " << e);
  CHECK(e < 1e-4);
}
