// bf16 against PyTorch 1.13's CPU autocast (tests/reference/precision_torch.py, run first by
// tests/with_reference.sh into MG_PRECISION_REFERENCE): an MLP 64-128-128-10 (SGD with momentum),
// the tiny GPT-2 (AdamW, clipping), VGG16/8 and ResNet-18 (SGD with momentum, 32x32 images), 20
// steps on one batch from the same initial weights. Each
// step's loss within 2e-2 of PyTorch's bf16 loss, and our bf16 weights no further from our
// float32 weights than twice PyTorch's bf16 weights are from its float32 ones (relative Frobenius
// norm over all parameters).
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

void load_params(nn::Module& m, const nn::SafetensorsFile& f) {
  NoGradGuard ng;
  for (auto& [name, t] : m.named_parameters()) {
    const Tensor* src = f.find(name);
    REQUIRE_MESSAGE(src != nullptr, "the reference's init has no " << name);
    Tensor dst = t;
    dst.copy_(*src);
  }
}

Run train_mlp(const nn::SafetensorsFile& init, Precision p) {
  auto m = nn::make_mlp({64, 128, 128, 10});
  load_params(*m, init);
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

// A CNN on (64, 3, 32, 32) images, 10 classes: SGD (momentum 0.9) on the batch's mean
// cross-entropy, as the reference trains vgg and resnet.
Run train_cnn(nn::Sequential& m, const nn::SafetensorsFile& init, Precision p, float lr) {
  load_params(m, init);
  const Tensor x = *init.find("x"), y = *init.find("y");
  optim::SGD opt(m.parameters(), {.lr = lr, .momentum = 0.9f});
  Run r;
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    {
      AutocastGuard cast(p);
      Tensor loss = cross_entropy(m.forward(x), y, Reduction::sum);
      r.losses.push_back(loss.item() / 64.0f);
      loss.backward();
    }
    opt.step(1.0f / 64.0f);
  }
  for (auto& [name, t] : m.named_parameters()) r.weights.push_back(t.to_vector<float>());
  return r;
}

Run train_vgg(const nn::SafetensorsFile& init, Precision p) { return train_cnn(*nn::make_vgg16(10, 8, 0.0f), init, p, 0.05f); }
Run train_resnet(const nn::SafetensorsFile& init, Precision p) { return train_cnn(*nn::make_resnet18(10), init, p, 3e-4f); }

Run train_gpt(const nn::SafetensorsFile& init, Precision p) {
  auto m = nn::make_gpt2({.vocab_size = 512, .block_size = 64, .n_layer = 2, .n_head = 4, .n_embd = 64});
  load_params(*m, init);
  const Tensor x = *init.find("x"), y = init.find("y")->reshape({-1});
  optim::AdamW opt(m->parameters(), {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                                     .decay_matrices_only = true});
  optim::Accumulator acc(opt, {.steps = 1, .clip_norm = 1.0f});
  Run r;
  for (int step = 0; step < 20; ++step) {
    {
      AutocastGuard cast(p);
      acc.backward(cross_entropy(m->forward(x).reshape({-1, 512}), y, Reduction::sum), y.numel());
    }
    const optim::StepInfo info = acc.step();
    r.losses.push_back(static_cast<float>(info.loss_sum / static_cast<double>(info.samples)));
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

// The losses against PyTorch's, and the weight errors against each one's float32 run.
// `same`: how close our float32 losses are to PyTorch's (the same experiment): 1e-4, but ResNet-18's
// float32 runs, which sum its convolutions in other orders than PyTorch's, drift apart to 5e-4 by
// step 20 as the batch is learnt.
// PyTorch's bf16 convolutions on the CPU are a reference for ours (float32 sums of bf16 inputs,
// rounded once) only where oneDNN has bf16 kernels: PyTorch 1.13 on a CPU without AVX-512 keeps
// the sums in bf16 (its probe's error 2.7e-2 against the output's rounding's 2e-3, measured on
// an AVX2 EPYC, 2026-11-28), and its bf16 ResNet-18 then trails its own float32 run by 2% at the
// first step and by 30% later, where ours stays within 1%. There the CNNs' bf16 comparisons with
// PyTorch (losses and weight errors) say nothing about ours and are not made (the float32 one
// still is), and the reference script does not train them (precision_torch.py's
// CONV_PROBE_BOUND, the same number).
constexpr double kConvProbeBound = 1e-2;

void compare(const std::string& model, Run (*train)(const nn::SafetensorsFile&, Precision), const nn::Module& m,
             double same = 1e-4) {
  const char* dir = std::getenv("MG_PRECISION_REFERENCE");
  REQUIRE_MESSAGE(dir != nullptr, "MG_PRECISION_REFERENCE is not set (ctest runs tests/reference/precision_torch.py first)");
  const std::string base = std::string(dir) + "/" + model;
  const nn::SafetensorsFile init = nn::load_safetensors(base + "_init.safetensors");
  const nn::SafetensorsFile t32 = nn::load_safetensors(base + "_fp32.safetensors");
  const Tensor* probe = init.find("conv_probe_error");
  REQUIRE_MESSAGE(probe != nullptr, "the reference predates conv_probe_error: run tests/reference/precision_torch.py again");
  const double probe_error = probe->to_vector<float>().at(0);
  const bool conv_model = model == "vgg" || model == "resnet";
  const bool torch_bf16_is_reference = !conv_model || probe_error <= kConvProbeBound;
  const Run ours32 = train(init, Precision::fp32), ours16 = train(init, Precision::bf16);
  const std::vector<float> l32 = t32.find("losses")->to_vector<float>();
  REQUIRE(l32.size() == 20);
  const double ours = relative_error(ours16.weights, ours32.weights);
  if (!torch_bf16_is_reference) {  // the script made no bf16 run to compare with
    for (size_t i = 0; i < 20; ++i) {
      INFO(model << " step " << i);
      CHECK(ours32.losses[i] == doctest::Approx(l32[i]).epsilon(same));  // the same experiment
    }
    MESSAGE(model << ": PyTorch's bf16 convolution on this CPU is " << probe_error << " from float32 sums rounded once (over "
                  << kConvProbeBound << "): its sums are kept in bf16, so its bf16 run is no reference here; not made or "
                  << "compared. Ours: last losses bf16 " << ours16.losses[19] << ", fp32 " << ours32.losses[19]
                  << " (PyTorch fp32 " << l32[19] << "); bf16 against fp32 weights after 20 steps " << ours);
    CHECK(ours > 0);
    return;
  }
  const nn::SafetensorsFile t16 = nn::load_safetensors(base + "_bf16.safetensors");
  const std::vector<float> l16 = t16.find("losses")->to_vector<float>();
  for (size_t i = 0; i < 20; ++i) {
    INFO(model << " step " << i);
    CHECK(ours32.losses[i] == doctest::Approx(l32[i]).epsilon(same));  // the same experiment
    CHECK(ours16.losses[i] == doctest::Approx(l16[i]).epsilon(2e-2));
  }
  const double theirs = relative_error(torch_weights(t16, m), torch_weights(t32, m));
  MESSAGE(model << ": bf16 against fp32 after 20 steps, relative weight error: ours " << ours << ", PyTorch autocast "
                << theirs);
  CHECK(theirs > 0);
  CHECK(ours > 0);
  CHECK(ours <= 2 * theirs);
}

TEST_CASE("bf16 MLP against PyTorch's CPU autocast: losses within 2e-2, weight error at most twice PyTorch's") {
  compare("mlp", train_mlp, *nn::make_mlp({64, 128, 128, 10}));
}

TEST_CASE("bf16 tiny GPT-2 against PyTorch's CPU autocast: losses within 2e-2, weight error at most twice PyTorch's") {
  compare("gpt", train_gpt, *nn::make_gpt2({.vocab_size = 512, .block_size = 64, .n_layer = 2, .n_head = 4, .n_embd = 64}));
}

TEST_CASE("bf16 VGG16/8 against PyTorch's CPU autocast: losses within 2e-2, weight error at most twice PyTorch's") {
  compare("vgg", train_vgg, *nn::make_vgg16(10, 8, 0.0f));
}

TEST_CASE("bf16 ResNet-18 against PyTorch's CPU autocast: losses within 2e-2, weight error at most twice PyTorch's") {
  compare("resnet", train_resnet, *nn::make_resnet18(10), 1e-3);
}
