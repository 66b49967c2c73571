// BatchNorm1d/2d (Note [batch norm and the step] in minigrad/nn/module.h): training and eval
// against the formulas in double, the running statistics as PyTorch updates them, buffers in
// state_dict and safetensors under PyTorch's names, checkpointing (bit-identical weights and
// running statistics, updated once), accumulation (split-dependent, and frozen: not), and the
// errors. The op's gradient check in training mode is a row of tests/test_ops.cpp.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>

#include "helpers.h"
#include <minigrad/nn/checkpoint_plan.h>
#include <minigrad/optim/accumulate.h>

using namespace mg;
using mg::test::bit_equal;
using mg::test::rand_tensor;

namespace {

// The batch's per-channel mean and biased variance of x (N, C, S...), in double.
void stats(const std::vector<float>& x, int64_t n, int64_t c, int64_t s, std::vector<double>& mean,
           std::vector<double>& var) {
  mean.assign(c, 0.0);
  var.assign(c, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k)
      for (int64_t j = 0; j < s; ++j) mean[k] += x[(i * c + k) * s + j];
  for (double& m : mean) m /= static_cast<double>(n * s);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k)
      for (int64_t j = 0; j < s; ++j) {
        const double d = x[(i * c + k) * s + j] - mean[k];
        var[k] += d * d;
      }
  for (double& v : var) v /= static_cast<double>(n * s);
}

double max_rel(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return worst / std::max(scale, 1e-30);
}

std::shared_ptr<nn::Sequential> bn_cnn() {
  auto m = std::make_shared<nn::Sequential>();
  m->add<nn::Conv2d>(3, 6, 3, 1, 1);
  m->add<nn::BatchNorm2d>(6);
  m->add<nn::ReLU>();
  m->add<nn::MaxPool2d>(2);
  m->add<nn::Conv2d>(6, 8, 3, 1, 1);
  m->add<nn::BatchNorm2d>(8);
  m->add<nn::ReLU>();
  m->add<nn::AdaptiveAvgPool2d>(2, 2);
  m->add<nn::Flatten>();
  m->add<nn::Linear>(32, 16);
  m->add<nn::BatchNorm1d>(16);
  m->add<nn::ReLU>();
  m->add<nn::Dropout>(0.3f);
  m->add<nn::Linear>(16, 3);
  return m;
}

Tensor targets(int64_t n) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 5 + 1) % 3;
  return Tensor::from_vector(t, {n});
}

}  // namespace

TEST_CASE("BatchNorm2d in training: the batch's statistics, PyTorch's running-statistic update") {
  manual_seed(1);
  nn::BatchNorm2d bn(4, 1e-5f, 0.1f);
  bn.train();
  // weight and bias away from 1 and 0 so that they matter
  bn.state_dict()[0].second.copy_(Tensor::from_vector(std::vector<float>{0.5f, 1.5f, -2.0f, 1.0f}, {4}));
  bn.state_dict()[1].second.copy_(Tensor::from_vector(std::vector<float>{0.1f, -0.2f, 0.3f, 0.0f}, {4}));
  const int64_t n = 3, c = 4, s = 5 * 6;
  std::vector<double> rm(4, 0.0), rv(4, 1.0);
  for (int step = 0; step < 3; ++step) {
    Tensor x = rand_tensor({n, c, 5, 6}, 10 + step) * 3.0f + Tensor::full({n, c, 5, 6}, static_cast<float>(step));
    const std::vector<float> xv = x.to_vector<float>();
    std::vector<double> mean, var;
    stats(xv, n, c, s, mean, var);
    const Tensor y = bn.forward(x);
    const std::vector<float> w = {0.5f, 1.5f, -2.0f, 1.0f}, b = {0.1f, -0.2f, 0.3f, 0.0f};
    std::vector<double> want(xv.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < c; ++k)
        for (int64_t j = 0; j < s; ++j) {
          const int64_t e = (i * c + k) * s + j;
          want[static_cast<size_t>(e)] = (xv[e] - mean[k]) / std::sqrt(var[k] + 1e-5) * w[k] + b[k];
        }
    CHECK(max_rel(y.to_vector<float>(), want) < 1e-5);
    for (int64_t k = 0; k < c; ++k) {
      rm[k] = 0.9 * rm[k] + 0.1 * mean[k];
      rv[k] = 0.9 * rv[k] + 0.1 * var[k] * static_cast<double>(n * s) / static_cast<double>(n * s - 1);
    }
    CHECK(max_rel(bn.running_mean().to_vector<float>(), rm) < 1e-5);
    CHECK(max_rel(bn.running_var().to_vector<float>(), rv) < 1e-5);
    CHECK(bn.num_batches_tracked() == step + 1);
  }
}

TEST_CASE("BatchNorm in eval mode: the running statistics, and their gradients by finite differences") {
  nn::BatchNorm1d bn(3);
  bn.running_mean().copy_(Tensor::from_vector(std::vector<float>{0.5f, -1.0f, 2.0f}, {3}));
  bn.running_var().copy_(Tensor::from_vector(std::vector<float>{0.25f, 4.0f, 1.0f}, {3}));
  bn.state_dict()[0].second.copy_(Tensor::from_vector(std::vector<float>{2.0f, -1.0f, 0.5f}, {3}));
  bn.eval();
  Tensor x = rand_tensor({5, 3}, 7, true);
  Tensor y = bn.forward(x);
  const std::vector<float> xv = x.to_vector<float>(), yv = y.to_vector<float>();
  const float w[3] = {2.0f, -1.0f, 0.5f}, mu[3] = {0.5f, -1.0f, 2.0f}, v[3] = {0.25f, 4.0f, 1.0f};
  std::vector<double> want(xv.size());
  for (size_t e = 0; e < xv.size(); ++e) want[e] = (xv[e] - mu[e % 3]) / std::sqrt(v[e % 3] + 1e-5) * w[e % 3];
  CHECK(max_rel(yv, want) < 1e-6);
  CHECK(bn.num_batches_tracked() == 0);  // eval updates nothing
  // dL/dx for L = sum(y * r): r * w / sqrt(v + eps) per element; dL/dw = sum r xhat; dL/db = sum r
  Tensor r = rand_tensor({5, 3}, 8);
  y.backward(r);
  const std::vector<float> rv = r.to_vector<float>(), gx = x.grad().to_vector<float>();
  std::vector<double> want_gx(xv.size()), want_gw(3, 0.0), want_gb(3, 0.0);
  for (size_t e = 0; e < xv.size(); ++e) {
    const double inv = 1.0 / std::sqrt(v[e % 3] + 1e-5);
    want_gx[e] = rv[e] * w[e % 3] * inv;
    want_gw[e % 3] += rv[e] * (xv[e] - mu[e % 3]) * inv;
    want_gb[e % 3] += rv[e];
  }
  CHECK(max_rel(gx, want_gx) < 1e-6);
  CHECK(max_rel(bn.state_dict()[0].second.grad().to_vector<float>(), want_gw) < 1e-5);
  CHECK(max_rel(bn.state_dict()[1].second.grad().to_vector<float>(), want_gb) < 1e-5);

  // dL/dx does not depend on x in eval mode: an infinite or NaN input still gets r * w / sqrt(v +
  // eps), as PyTorch and the CUDA kernel give (the batch-statistics formula made 0 * inf = NaN).
  std::vector<float> bad = xv;
  bad[0] = std::numeric_limits<float>::infinity();
  bad[4] = -std::numeric_limits<float>::infinity();
  bad[8] = std::numeric_limits<float>::quiet_NaN();
  Tensor xb = Tensor::from_vector(bad, {5, 3}).requires_grad_();
  bn.forward(xb).backward(r);
  const std::vector<float> gb = xb.grad().to_vector<float>();
  for (size_t e = 0; e < gb.size(); ++e) {
    INFO("element " << e << " of input " << bad[e]);
    CHECK(std::isfinite(gb[e]));
  }
  CHECK(max_rel(gb, want_gx) < 1e-6);
}

TEST_CASE("BatchNorm buffers: PyTorch's state_dict names and order, saved and loaded with the weights") {
  auto m = bn_cnn();
  std::vector<std::string> names;
  for (auto& [name, t] : m->state_dict()) names.push_back(name);
  REQUIRE(names.size() == 4 * 2 + 3 * 5);  // 4 conv/linear layers with bias, 3 batch norms
  CHECK(names[2] == "1.weight");
  CHECK(names[3] == "1.bias");
  CHECK(names[4] == "1.running_mean");
  CHECK(names[5] == "1.running_var");
  CHECK(names[6] == "1.num_batches_tracked");
  CHECK(m->named_parameters().size() == 4 + 3 * 2 + 4);  // buffers are not parameters
  m->train();
  manual_seed(2);
  m->forward(rand_tensor({4, 3, 8, 8}, 3));  // running statistics move
  const std::string path = (std::filesystem::temp_directory_path() / "mg_bn_state.safetensors").string();
  nn::save_safetensors(path, m->state_dict());
  auto fresh = bn_cnn();
  nn::load_into(*fresh, path);
  auto a = m->state_dict(), b = fresh->state_dict();
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(bit_equal(a[i].second, b[i].second));
  }
  CHECK(dynamic_cast<nn::BatchNorm&>((*fresh)[1]).num_batches_tracked() == 1);
  std::filesystem::remove(path);
}

TEST_CASE("BatchNorm under checkpointing: weights and running statistics bit-identical, updated once") {
  auto train = [](const std::vector<nn::Segment>& plan) {
    manual_seed(11);
    auto m = bn_cnn();
    m->train();
    optim::SGD opt(m->parameters(), {.lr = 0.05f, .momentum = 0.9f});
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      cross_entropy(nn::forward_with_plan(*m, plan, rand_tensor({6, 3, 8, 8}, 40 + s)), targets(6)).backward();
      opt.step();
    }
    return m;
  };
  auto ref = train({});
  using S = std::vector<nn::Segment>;
  for (const S& plan : {S{{0, 3}}, S{{1, 7}}, S{{0, 14}}, S{{0, 4}, {4, 8}, {9, 12}}}) {
    nn::Plan p;
    p.segments = plan;
    INFO("plan " << p.str());
    auto m = train(plan);
    auto a = ref->state_dict(), b = m->state_dict();
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first);
      CHECK(bit_equal(a[i].second, b[i].second));
    }
    CHECK(dynamic_cast<nn::BatchNorm&>((*m)[1]).num_batches_tracked() == 3);
  }
  // A tiled segment over a BatchNorm is refused, naming it.
  auto m = bn_cnn();
  m->train();
  CHECK_THROWS_WITH_AS(nn::forward_with_plan(*m, std::vector<nn::Segment>{{0, 3, 2}}, rand_tensor({6, 3, 8, 8}, 1)),
                       doctest::Contains("batch_norm cannot run in tiles"), Error);
}

TEST_CASE("BatchNorm under accumulation: each micro-batch its own statistics; frozen, the split does not matter") {
  // 4 micro-batches of 4 against one batch of 16, SGD, one step, dropout by sample.
  auto step = [](bool frozen, int64_t b) {
    manual_seed(21);
    auto m = bn_cnn();
    m->train();
    for (size_t i = 0; i < m->size(); ++i) {
      if (auto* bn = dynamic_cast<nn::BatchNorm*>(&(*m)[i])) bn->set_frozen(frozen);
    }
    optim::SGD opt(m->parameters(), {.lr = 0.1f});
    optim::Accumulator acc(opt, {.steps = 16 / b});
    const Tensor x = rand_tensor({16, 3, 8, 8}, 50), t = targets(16);
    const std::vector<float> xs = x.to_vector<float>();
    const std::vector<int64_t> ts = t.to_vector<int64_t>();
    const int64_t per = 3 * 8 * 8;
    for (int64_t first = 0; first < 16; first += b) {
      Tensor xb = Tensor::from_vector(std::vector<float>(xs.begin() + first * per, xs.begin() + (first + b) * per), {b, 3, 8, 8});
      Tensor tb = Tensor::from_vector(std::vector<int64_t>(ts.begin() + first, ts.begin() + first + b), {b});
      Tensor loss;
      {
        auto window = acc.sample_window();
        loss = cross_entropy(m->forward(xb), tb, Reduction::sum);
      }
      acc.backward(loss, b);
    }
    acc.step();
    std::vector<float> w;
    for (const Tensor& p : m->parameters()) {
      const auto v = p.to_vector<float>();
      w.insert(w.end(), v.begin(), v.end());
    }
    return w;
  };
  auto diff = [](const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
      scale = std::max(scale, static_cast<double>(std::abs(a[i])));
    }
    return worst / scale;
  };
  const double live = diff(step(false, 16), step(false, 4)), frozen = diff(step(true, 16), step(true, 4));
  INFO("batch statistics: 16 against 4 x 4 differ by " << live << "; frozen: " << frozen);
  CHECK(live > 1e-4);    // micro-batch statistics are not the batch's
  CHECK(frozen < 1e-5);  // running statistics: the same step whatever the split
}

TEST_CASE("BatchNorm: clear errors") {
  nn::BatchNorm2d bn(4);
  CHECK_THROWS_WITH_AS(bn.forward(rand_tensor({2, 4, 3}, 1)), doctest::Contains("expected input (N, C, H, W)"), Error);
  CHECK_THROWS_WITH_AS(bn.forward(rand_tensor({2, 5, 3, 3}, 1)), doctest::Contains("input has 5 channels"), Error);
  CHECK_THROWS_WITH_AS(bn.forward(rand_tensor({1, 4, 1, 1}, 1)), doctest::Contains("more than one value per channel"), Error);
  CHECK_THROWS_WITH_AS(nn::BatchNorm1d(0), doctest::Contains("num_features must be > 0"), Error);
  CHECK_THROWS_WITH_AS(nn::BatchNorm1d(3, 1e-5f, 1.5f), doctest::Contains("momentum must be in [0, 1]"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(rand_tensor({4, 3}, 1), rand_tensor({2}, 2), Tensor(), Tensor(), Tensor(), true),
                       doctest::Contains("weight has shape [2], expected [3]"), Error);
}
