// bf16 against PyTorch 1.13's CPU autocast (tests/reference/mlp_bf16_torch.py, run first by
// tests/with_reference.sh into MG_PRECISION_REFERENCE): an MLP 64-128-128-10, SGD with momentum,
// 20 steps on one batch from the same initial weights. Each step's loss within 2e-2 of PyTorch's
// bf16 loss, and our bf16 weights no further from our float32 weights than twice PyTorch's bf16
// weights are from its float32 ones (relative Frobenius norm over all parameters).
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "helpers.h"
#include <minigrad/nn/models.h>
#include <minigrad/nn/serialize.h>

using namespace mg;

namespace {

struct Run {
  std::vector<float> losses;
  std::vector<std::vector<float>> weights;  // in named_parameters() order
};

Run train(const nn::SafetensorsFile& init, Precision p) {
  auto m = nn::make_mlp({64, 128, 128, 10});
  {
    NoGradGuard ng;
    for (auto& [name, t] : m->named_parameters()) {
      const Tensor* src = init.find(name);
      REQUIRE_MESSAGE(src != nullptr, "init.safetensors has no " << name);
      Tensor dst = t;
      dst.copy_(*src);
    }
  }
  const Tensor x = *init.find("x"), y = *init.find("y");
  optim::SGD opt(m->parameters(), {.lr = 0.05f, .momentum = 0.9f});
  Run r;
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    {
      AutocastGuard cast(p);
      Tensor loss = cross_entropy(m->forward(x), y, Reduction::sum);
      r.losses.push_back(loss.item() / 64.0f);
      loss.backward();
    }
    opt.step(1.0f / 64.0f);  // the mean's gradient
  }
  for (auto& [name, t] : m->named_parameters()) r.weights.push_back(t.to_vector<float>());
  return r;
}

// |a - b| / |b| over all parameters (Frobenius).
double relative_error(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t k = 0; k < a[i].size(); ++k) {
      num += std::pow(static_cast<double>(a[i][k]) - b[i][k], 2);
      den += std::pow(static_cast<double>(b[i][k]), 2);
    }
  }
  return std::sqrt(num / den);
}

std::vector<std::vector<float>> torch_weights(const nn::SafetensorsFile& f, const nn::Module& m) {
  std::vector<std::vector<float>> w;
  for (auto& [name, t] : m.named_parameters()) w.push_back(f.find(name)->to_vector<float>());
  return w;
}

}  // namespace

TEST_CASE("bf16 MLP against PyTorch's CPU autocast: losses within 2e-2, weight error at most twice PyTorch's") {
  const char* dir = std::getenv("MG_PRECISION_REFERENCE");
  REQUIRE_MESSAGE(dir != nullptr, "MG_PRECISION_REFERENCE is not set (ctest runs tests/reference/mlp_bf16_torch.py first)");
  const nn::SafetensorsFile init = nn::load_safetensors(std::string(dir) + "/init.safetensors");
  const nn::SafetensorsFile t32 = nn::load_safetensors(std::string(dir) + "/fp32.safetensors");
  const nn::SafetensorsFile t16 = nn::load_safetensors(std::string(dir) + "/bf16.safetensors");
  const Run ours32 = train(init, Precision::fp32), ours16 = train(init, Precision::bf16);
  const std::vector<float> l32 = t32.find("losses")->to_vector<float>(), l16 = t16.find("losses")->to_vector<float>();
  REQUIRE(l32.size() == 20);
  for (size_t i = 0; i < 20; ++i) {
    CHECK(ours32.losses[i] == doctest::Approx(l32[i]).epsilon(1e-4));  // the same experiment
    CHECK(ours16.losses[i] == doctest::Approx(l16[i]).epsilon(2e-2));
  }
  auto m = nn::make_mlp({64, 128, 128, 10});
  const double theirs = relative_error(torch_weights(t16, *m), torch_weights(t32, *m));
  const double ours = relative_error(ours16.weights, ours32.weights);
  MESSAGE("bf16 against fp32 after 20 steps, relative weight error: ours " << ours << ", PyTorch autocast " << theirs);
  CHECK(theirs > 0);
  CHECK(ours > 0);
  CHECK(ours <= 2 * theirs);
}
