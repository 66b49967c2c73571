// Test helpers: random inputs and comparisons. The one finite-difference gradient check is
// tests/test_ops.cpp's, over every op's case rows (OpDef::cases in src/ops/op.h).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <minigrad/minigrad.h>

namespace mg::test {

// Options a test answers itself before doctest runs (tests/test_main.cpp): the exit code, or -1.
int own_options(int argc, char** argv);

// MG_REQUIRE_GPU=1 (scripts/gpu_verify.sh): a GPU test that finds no device fails instead of
// skipping (tests/cuda_helpers.h, test_ops' CUDA case).
inline bool gpu_required() {
  const char* v = std::getenv("MG_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// Uniform(-1, 1) of the given shape (never zeros: see STYLE.md).
inline Tensor rand_tensor(const Shape& s, uint64_t seed, bool requires_grad = false) {
  Generator g(seed);
  Tensor t = Tensor::uniform(s, -1.0f, 1.0f, g);
  if (requires_grad) t.requires_grad_();
  return t;
}

// A labelled data set of n random samples of `sample`'s shape, label i the class (7 i + seed) % classes.
inline std::shared_ptr<const data::Dataset> random_dataset(int64_t n, const Shape& sample, int64_t classes, uint64_t seed) {
  Shape s{n};
  s.insert(s.end(), sample.begin(), sample.end());
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[static_cast<size_t>(i)] = (i * 7 + static_cast<int64_t>(seed)) % classes;
  return std::make_shared<data::TensorDataset>(rand_tensor(s, seed), Tensor::from_vector(y, {n}));
}

// A tensor's bytes (copied to the CPU).
inline std::vector<uint8_t> raw_bytes(const Tensor& t) {
  const Tensor c = t.cpu();
  const auto* p = static_cast<const uint8_t*>(c.raw_data());
  return {p, p + c.nbytes()};
}

// A model's parameters and buffers (BatchNorm's running statistics and counts) as raw bytes: two
// models compare equal only bit for bit.
inline std::vector<std::vector<uint8_t>> state_bits(const nn::Module& m) {
  std::vector<std::vector<uint8_t>> out;
  auto add = [&](const Tensor& t) { out.push_back(raw_bytes(t)); };
  for (const auto& [name, p] : m.named_parameters()) add(p);
  for (const auto& [name, b] : m.named_buffers()) add(b);
  return out;
}

// Moves elements within `margin` of zero away from it: finite differences are meaningless at a
// kink (relu, max), and a step h would straddle it.
inline Tensor away_from_zero(Tensor t, float margin = 0.05f) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (std::abs(p[i]) < margin) p[i] = p[i] < 0 ? p[i] - margin : p[i] + margin;
  }
  return t;
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  auto va = a.to_vector<float>(), vb = b.to_vector<float>();
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(static_cast<double>(va[i]) - vb[i]));
  return m;
}

inline double rel_err(const Tensor& a, const Tensor& ref) {
  auto va = a.to_vector<float>(), vb = ref.to_vector<float>();
  REQUIRE(va.size() == vb.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    num += (static_cast<double>(va[i]) - vb[i]) * (static_cast<double>(va[i]) - vb[i]);
    den += static_cast<double>(vb[i]) * vb[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// Every plan of n units: each unit is plain, starts a checkpointed segment, or continues one.
inline std::vector<std::vector<nn::Segment>> all_plans(size_t n) {
  std::vector<std::vector<nn::Segment>> out;
  std::vector<int> state(n, 0);  // 0 plain, 1 start, 2 continue
  std::function<void(size_t)> rec = [&](size_t i) {
    if (i == n) {
      std::vector<nn::Segment> segs;
      for (size_t u = 0; u < n; ++u) {
        if (state[u] == 1) segs.push_back({u, u + 1});
        if (state[u] == 2) segs.back().end = u + 1;
      }
      out.push_back(segs);
      return;
    }
    for (int s = 0; s < 3; ++s) {
      if (s == 2 && (i == 0 || state[i - 1] == 0)) continue;
      state[i] = s;
      rec(i + 1);
    }
  };
  rec(0);
  return out;
}

// Same shape, dtype and bytes (so -0 differs from +0, and a NaN equals itself), any dtype.
inline bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ha = a.cpu(), hb = b.cpu();
  return a.nbytes() == 0 || std::memcmp(ha.raw_data(), hb.raw_data(), a.nbytes()) == 0;
}

// Two small models with dropout (input (N, 4, 5) and (N, 3, H, W)) for checkpointing tests
// on either device: every layer kind of the library appears in one of them.
inline std::shared_ptr<nn::Sequential> mlp_with_dropout() {
  auto m = std::make_shared<nn::Sequential>();
  m->add<nn::Flatten>();
  m->add<nn::Linear>(20, 32);
  m->add<nn::ReLU>();
  m->add<nn::Dropout>(0.3f);
  m->add<nn::Linear>(32, 24);
  m->add<nn::ReLU>();
  m->add<nn::Dropout>(0.4f);
  m->add<nn::Linear>(24, 5);
  return m;
}

inline std::shared_ptr<nn::Sequential> small_cnn() {
  auto m = std::make_shared<nn::Sequential>();
  m->add<nn::Conv2d>(3, 4, 3, 1, 1);  // im2col + SGEMM (fewer channels than oneDNN's block)
  m->add<nn::ReLU>();
  m->add<nn::MaxPool2d>(2);
  m->add<nn::Conv2d>(4, 16, 3, 1, 1);  // oneDNN where the build has it (kernels/cpu/conv2d_onednn.h)
  m->add<nn::ReLU>();
  m->add<nn::AdaptiveAvgPool2d>(3, 3);
  m->add<nn::Flatten>();
  m->add<nn::Linear>(144, 10);
  m->add<nn::ReLU>();
  m->add<nn::Dropout>(0.5f);
  m->add<nn::Linear>(10, 3);
  return m;
}

// The tensor `name` of a safetensors file a reference script wrote (fails the test if absent).
// Linear 64->256, ReLU, Linear 256->128, ReLU, Linear 128->96, ReLU, Linear 96->8: activations of
// distinct sizes, for counting what a segment keeps (tests/test_checkpoint.cpp).
inline std::shared_ptr<nn::Sequential> seven_layer_mlp() {
  auto m = std::make_shared<nn::Sequential>();
  m->add<nn::Linear>(64, 256);
  m->add<nn::ReLU>();
  m->add<nn::Linear>(256, 128);
  m->add<nn::ReLU>();
  m->add<nn::Linear>(128, 96);
  m->add<nn::ReLU>();
  m->add<nn::Linear>(96, 8);
  return m;
}

// The tiny GPT of the memory tests: 2 layers, width 64, vocabulary 512, trained by a Trainer on
// 8 sequences of 64 tokens a step (a fixed token stream), with the summed loss over positions.
struct TinyGpt {
  nn::GPTConfig cfg{.vocab_size = 512, .block_size = 64, .n_layer = 2, .n_head = 4, .n_embd = 64};
  std::vector<uint16_t> tokens = std::vector<uint16_t>(1 << 14);  // TokenBatches reads them where they are
  std::shared_ptr<data::TokenBatches> windows;
  std::shared_ptr<nn::Sequential> model;
  // fused_head: no lm_head; the loss is linear_cross_entropy on the hidden states and wte.
  // fused_gelu: each block's c_fc and GELU as linear_gelu (Note [fused gelu]).
  // fused_residual: each block's first residual add and ln_2 as add_layer_norm.
  explicit TinyGpt(bool fused_head = false, bool fused_gelu = false, bool fused_residual = false) {
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7919) % 512);
    windows = std::make_shared<data::TokenBatches>(tokens, 8, 64, 0, 1, 512);
    manual_seed(1);
    cfg.lm_head = !fused_head;
    cfg.fused_gelu = fused_gelu;
    cfg.fused_residual = fused_residual;
    model = nn::make_gpt2(cfg);
  }
  TinyGpt(const TinyGpt&) = delete;  // windows reads this object's tokens
  TinyGpt& operator=(const TinyGpt&) = delete;
  optim::LossFn loss() const {
    const int64_t V = cfg.vocab_size, C = cfg.n_embd;
    if (!cfg.lm_head) {
      const Tensor wte = model->named_parameters().front().second;  // transformer.wte.weight
      return [C, wte](const Tensor& h, const Tensor& y) { return linear_cross_entropy(h.reshape({-1, C}), wte, y.reshape({-1})); };
    }
    return [V](const Tensor& logits, const Tensor& y) {
      return cross_entropy(logits.reshape({-1, V}), y.reshape({-1}), Reduction::sum);
    };
  }
};

inline const Tensor& tensor_in(const nn::SafetensorsFile& f, const std::string& name) {
  const Tensor* t = f.find(name);
  REQUIRE_MESSAGE(t != nullptr, "the reference has no tensor " << name);
  return *t;
}

// Relative L2 difference of two GPT parameters, with the key part of an attention's c_attn bias
// (elements [c, 2c)) held to Adam's bound instead: its true gradient is 0 (softmax ignores a shift
// shared by every key of a query), so any two summation orders give it rounding noise of either
// sign, which Adam scales up to steps of lr (docs/gpt.md). max_step: steps x lr.
inline double gpt_param_diff(const std::string& name, const Tensor& a, const Tensor& b, int64_t c, float max_step) {
  if (name.find("attn.c_attn.bias") == std::string::npos) return rel_err(a, b);
  const std::vector<float> va = a.to_vector<float>(), vb = b.to_vector<float>();
  REQUIRE(va.size() == static_cast<size_t>(3 * c));
  for (int64_t j = c; j < 2 * c; ++j) {
    CHECK_MESSAGE(std::abs(va[static_cast<size_t>(j)] - vb[static_cast<size_t>(j)]) <= 2 * max_step * 1.001f,
                  name << " key bias element " << j - c);
  }
  std::vector<float> qa(va.begin(), va.begin() + c), qb(vb.begin(), vb.begin() + c);
  qa.insert(qa.end(), va.begin() + 2 * c, va.end());
  qb.insert(qb.end(), vb.begin() + 2 * c, vb.end());
  return rel_err(Tensor::from_vector(qa, {2 * c}), Tensor::from_vector(qb, {2 * c}));
}

// A fresh folder under the system's temporary folder ("mg_test_<name>_<pid>"), removed at scope exit.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& name) {
    namespace fs = std::filesystem;
    path = (fs::temp_directory_path() / ("mg_test_" + name + "_" + std::to_string(::getpid()))).string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& f) const { return path + "/" + f; }
};

}  // namespace mg::test
