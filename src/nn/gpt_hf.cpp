// Hugging Face's GPT-2 checkpoints into make_gpt2 (Note [loading Hugging Face's GPT-2] in
// minigrad/nn/models.h).
#include <minigrad/nn/models.h>
#include <minigrad/nn/serialize.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "nn/load_report.h"

namespace mg::nn {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Hugging Face's GPT-2 stores these as Conv1D: (in, out), the transpose of ours.
bool is_conv1d(const std::string& name) {
  for (const char* t : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    if (ends_with(name, t)) return true;
  }
  return false;
}

// A file tensor's values as floats (F32, BF16, F64).
std::vector<float> as_floats(const Tensor& t, const std::string& name, const std::string& path) {
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> v(n);
  switch (t.dtype()) {
    case DType::f32: std::memcpy(v.data(), t.raw_data(), n * sizeof(float)); break;
    case DType::f64: {
      const double* d = t.data<double>();
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(d[i]);
      break;
    }
    case DType::bf16:
    case DType::f16: v = t.to_vector<float>(); break;  // widened exactly
    default:
      MG_FAIL("load_gpt2_hf_weights: '" << path << "': tensor '" << name << "' is " << dtype_name(t.dtype())
                                         << "; expected floating point (F32, BF16, F16 or F64)");
  }
  return v;
}

}  // namespace

GPTConfig read_gpt2_hf_config(const std::string& config_json) {
  std::ifstream f(config_json);
  MG_CHECK(f.good(), "read_gpt2_hf_config: cannot open '" << config_json << "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    MG_FAIL("read_gpt2_hf_config: '" << config_json << "' is not valid JSON: " << e.what());
  }
  MG_CHECK(j.is_object(), "read_gpt2_hf_config: '" << config_json << "': expected a JSON object, got " << j.type_name());
  auto integer = [&](const char* key, const char* alt) -> int64_t {
    const char* k = j.contains(key) || !alt ? key : alt;
    MG_CHECK(j.contains(k), "read_gpt2_hf_config: '" << config_json << "' has no \"" << key << "\"");
    MG_CHECK(j[k].is_number_integer() && j[k].get<int64_t>() > 0,
             "read_gpt2_hf_config: '" << config_json << "': \"" << k << "\" must be a positive integer, got " << j[k].dump());
    return j[k].get<int64_t>();
  };
  GPTConfig c;
  c.vocab_size = integer("vocab_size", nullptr);
  c.block_size = integer("n_positions", "n_ctx");
  c.n_layer = integer("n_layer", nullptr);
  c.n_head = integer("n_head", nullptr);
  c.n_embd = integer("n_embd", nullptr);
  MG_CHECK(c.n_embd % c.n_head == 0,
           "read_gpt2_hf_config: '" << config_json << "': n_head " << c.n_head << " does not divide n_embd " << c.n_embd);

  // What make_gpt2 builds; anything else would load and compute something else, silently.
  auto expect = [&](const char* key, const nlohmann::json& want, const char* what) {
    if (!j.contains(key) || j[key].is_null()) return;
    MG_CHECK(j[key] == want, "read_gpt2_hf_config: '" << config_json << "': \"" << key << "\" is " << j[key].dump()
                                                      << "; this model supports " << want.dump() << " (" << what << ")");
  };
  if (j.contains("model_type")) expect("model_type", "gpt2", "GPT-2");
  if (j.contains("activation_function") && j["activation_function"] != "gelu_pytorch_tanh") {
    expect("activation_function", "gelu_new", "GELU, tanh form");
  }
  expect("n_inner", 4 * c.n_embd, "an MLP 4 times the width");
  expect("scale_attn_weights", true, "scores divided by sqrt(head size)");
  expect("scale_attn_by_inverse_layer_idx", false, "no per-layer scaling");
  expect("tie_word_embeddings", true, "lm_head tied to wte");
  expect("add_cross_attention", false, "a decoder without cross-attention");
  if (j.contains("layer_norm_epsilon")) {
    MG_CHECK(j["layer_norm_epsilon"].is_number() && std::abs(j["layer_norm_epsilon"].get<double>() - 1e-5) <= 1e-12,
             "read_gpt2_hf_config: '" << config_json << "': \"layer_norm_epsilon\" is " << j["layer_norm_epsilon"].dump()
                                      << "; this model's LayerNorm uses 1e-05");
  }
  return c;
}

void load_gpt2_hf_weights(Sequential& gpt, const std::string& path) {
  const SafetensorsFile file = load_safetensors(path);
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : file.tensors) by_name[name] = &t;
  // Names with "transformer." (GPT2LMHeadModel) or without (GPT2Model, the hub's gpt2).
  const std::string prefix = "transformer.";
  const bool prefixed = by_name.count(prefix + "wte.weight") > 0;
  MG_CHECK(prefixed || by_name.count("wte.weight"),
           "load_gpt2_hf_weights: '" << path << "' is not a GPT-2 checkpoint: it has neither 'wte.weight' nor "
                                     "'transformer.wte.weight' (" << file.tensors.size() << " tensors)");

  std::vector<std::string> missing, mismatched, unexpected;
  std::set<std::string> used;
  std::vector<std::pair<Tensor, std::vector<float>>> writes;  // everything checked first
  for (auto& [name, p] : gpt.state_dict()) {
    MG_CHECK(name.compare(0, prefix.size(), prefix) == 0,
             "load_gpt2_hf_weights: the model has '" << name << "', not a make_gpt2 parameter");
    const std::string key = prefixed ? name : name.substr(prefix.size());
    auto it = by_name.find(key);
    if (it == by_name.end()) {
      missing.push_back(key + " " + shape_str(p.shape()));
      continue;
    }
    used.insert(key);
    const Tensor& t = *it->second;
    const bool transposed = is_conv1d(name) && p.dim() == 2;
    const Shape want = transposed ? Shape{p.size(1), p.size(0)} : p.shape();
    if (t.shape() != want) {
      mismatched.push_back(key + ": expected " + shape_str(want) + (transposed ? " (Conv1D: in, out)" : "") +
                           ", file has " + shape_str(t.shape()));
      continue;
    }
    std::vector<float> v = as_floats(t, key, path);
    if (transposed) {  // (in, out) -> (out, in)
      const int64_t rows = want[0], cols = want[1];
      std::vector<float> tr(v.size());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) tr[static_cast<size_t>(c * rows + r)] = v[static_cast<size_t>(r * cols + c)];
      }
      v = std::move(tr);
    }
    writes.emplace_back(p, std::move(v));
  }
  const std::string wte_key = prefixed ? prefix + "wte.weight" : "wte.weight";
  for (const auto& [name, t] : file.tensors) {
    if (used.count(name)) continue;
    if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) continue;  // the causal-mask buffers
    if (name == "lm_head.weight") {  // tied: the same values as wte, or refused
      const Tensor& wte = *by_name.at(wte_key);
      const bool tied = t.shape() == wte.shape() && as_floats(t, name, path) == as_floats(wte, wte_key, path);
      MG_CHECK(tied, "load_gpt2_hf_weights: '" << path << "': lm_head.weight differs from " << wte_key
                                               << "; GPT-2 ties them and so does this model (an untied head is not supported)");
      continue;
    }
    unexpected.push_back(name + " " + shape_str(t.shape()));
  }
  throw_if_mismatched("load_gpt2_hf_weights: '" + path + "' does not match the model (Note [loading Hugging Face's GPT-2])",
                      missing, unexpected, "wrong shape", mismatched);
  NoGradGuard no_grad;
  for (auto& [p, v] : writes) {
    Tensor dst = p;  // shares storage: the parameter keeps its identity and device
    dst.copy_(Tensor::from_vector(v, p.shape()));
  }
}

std::shared_ptr<Sequential> load_gpt2_hf(const std::string& folder) {
  namespace fs = std::filesystem;
  MG_CHECK(fs::is_directory(folder), "load_gpt2_hf: '" << folder << "' is not a folder (expected one holding "
                                                          "config.json and model.safetensors)");
  const std::string config = (fs::path(folder) / "config.json").string();
  const std::string weights = (fs::path(folder) / "model.safetensors").string();
  MG_CHECK(fs::exists(config), "load_gpt2_hf: '" << folder << "' has no config.json");
  MG_CHECK(fs::exists(weights), "load_gpt2_hf: '" << folder << "' has no model.safetensors (PyTorch's .bin "
                                                     "checkpoints are not read; save with safe_serialization=True)");
  auto gpt = make_gpt2(read_gpt2_hf_config(config));
  load_gpt2_hf_weights(*gpt, weights);
  return gpt;
}

}  // namespace mg::nn
