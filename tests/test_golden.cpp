// Golden values from PyTorch for whole training steps (tests/golden/make_golden.py writes
// tests/golden/mlp_steps.json; see its docstring), and the statistics of the default init.
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "helpers.h"
#include <minigrad/nn/models.h>

using namespace mg;
using nlohmann::json;

namespace {

std::vector<float> decode_f32(const std::string& b64) {
  static const std::string kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes;
  uint32_t acc = 0;
  int bits = 0;
  bool bad_char = false;
  for (char c : b64) {
    if (c == '=') break;
    const size_t v = kAlphabet.find(c);
    if (v == std::string::npos) {
      bad_char = true;
      break;
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  REQUIRE(!bad_char);
  REQUIRE(bytes.size() % 4 == 0);
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

Tensor tensor_of(const json& j) {
  const Shape shape = j.at("shape").get<Shape>();
  return Tensor::from_vector(decode_f32(j.at("data").get<std::string>()), shape);
}

const json& golden() {
  static const json j = [] {
    const std::string path = std::string(MG_SOURCE_DIR) + "/tests/golden/mlp_steps.json";
    std::ifstream f(path);
    REQUIRE_MESSAGE(f.good(), "cannot open " << path << " (regenerate: /usr/bin/python3 tests/golden/make_golden.py)");
    return json::parse(f);
  }();
  return j;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& name, const json& o,
                                                 std::vector<Tensor> params) {
  if (name == "SGD") {
    optim::SGDOptions s;
    s.lr = o.at("lr").get<float>();
    s.momentum = o.value("momentum", 0.0f);
    s.dampening = o.value("dampening", 0.0f);
    s.weight_decay = o.value("weight_decay", 0.0f);
    s.nesterov = o.value("nesterov", false);
    return std::make_unique<optim::SGD>(std::move(params), s);
  }
  optim::AdamOptions a;
  a.lr = o.at("lr").get<float>();
  a.weight_decay = o.value("weight_decay", 0.0f);
  if (name == "Adam") return std::make_unique<optim::Adam>(std::move(params), a);
  REQUIRE(name == "AdamW");
  return std::make_unique<optim::AdamW>(std::move(params), a);
}

void run_golden(const std::string& config) {
  const json& g = golden();
  const json& run = g.at("runs").at(config);
  auto model = nn::make_mlp(g.at("sizes").get<std::vector<int64_t>>());
  // Identical start: the script's float32 weights, copied into make_mlp's parameters.
  auto named = model->named_parameters();
  REQUIRE(named.size() == g.at("initial").size());
  for (auto& [name, p] : named) {
    INFO("parameter " << name);
    REQUIRE(g.at("initial").contains(name));
    Tensor init = tensor_of(g.at("initial").at(name));
    REQUIRE(init.shape() == p.shape());
    Tensor dst = p;
    dst.copy_(init);
  }
  Tensor x = tensor_of(g.at("inputs"));
  Tensor y = Tensor::from_vector(g.at("labels").get<std::vector<int64_t>>(), {x.size(0)});
  auto opt = make_optimizer(run.at("optimizer").get<std::string>(), run.at("options"), model->parameters());

  const auto want_losses = run.at("losses").get<std::vector<double>>();
  for (size_t step = 0; step < want_losses.size(); ++step) {
    opt->zero_grad();
    Tensor loss = cross_entropy(model->forward(x), y);
    const double got = loss.item();
    loss.backward();
    opt->step();
    const double err = std::abs(got - want_losses[step]) / std::abs(want_losses[step]);
    INFO(config << " step " << step << ": loss " << got << ", PyTorch " << want_losses[step] << ", rel err " << err);
    CHECK(err < 1e-5);
  }
  double worst = 0;
  for (auto& [name, p] : model->named_parameters()) {
    Tensor want = tensor_of(run.at("final").at(name));
    const double err = test::rel_err(p, want);
    worst = std::max(worst, err);
    INFO(config << " parameter " << name << " " << shape_str(p.shape()) << ": rel err " << err);
    CHECK(err < 1e-5);
  }
  MESSAGE(config << ": 3 steps match PyTorch; worst parameter rel err " << worst);
}

}  // namespace

TEST_CASE("golden: 3 training steps of MLP 784-32-16-10 match PyTorch") {
  // The golden data must not be a degenerate case (see make_golden.py).
  const json& g = golden();
  for (double f : g.at("active_fraction_hidden").get<std::vector<double>>()) CHECK((f > 0.2 && f < 0.9));
  SUBCASE("SGD") { run_golden("sgd"); }
  SUBCASE("SGD momentum 0.9, dampening 0.1, weight decay 1e-3") { run_golden("sgd_momentum"); }
  SUBCASE("SGD nesterov") { run_golden("sgd_nesterov"); }
  SUBCASE("Adam, L2 weight decay 0.01") { run_golden("adam"); }
  SUBCASE("AdamW, weight decay 0.01") { run_golden("adamw"); }
}

namespace {

struct Moments {
  double min = 1e30, max = -1e30, mean = 0, m2 = 0, m4 = 0;
};

Moments moments(const Tensor& t) {
  Moments m;
  auto v = t.to_vector<float>();
  for (float f : v) {
    m.min = std::min<double>(m.min, f);
    m.max = std::max<double>(m.max, f);
    m.mean += f;
    m.m2 += static_cast<double>(f) * f;
    m.m4 += static_cast<double>(f) * f * f * f;
  }
  m.mean /= v.size();
  m.m2 /= v.size();
  m.m4 /= v.size();
  return m;
}

// U(-b, b): all inside, reaching close to both ends, mean 0, E[w^2] = b^2/3, E[w^4] = b^4/5.
// `tol` is relative on the moments; the standard error of E[w^2] is 0.9/sqrt(n) relative.
void check_uniform(const Tensor& t, double b, double tol, const std::string& what) {
  const Moments m = moments(t);
  INFO(what << ": n " << t.numel() << ", bound " << b << ", min " << m.min << ", max " << m.max << ", mean "
            << m.mean << ", E[w^2] " << m.m2 << " (want " << b * b / 3 << "), E[w^4] " << m.m4 << " (want "
            << b * b * b * b / 5 << ")");
  CHECK(m.min >= -b);
  CHECK(m.max <= b);
  CHECK(m.min < -b * (1 - 20.0 / t.numel()));
  CHECK(m.max > b * (1 - 20.0 / t.numel()));
  CHECK(std::abs(m.mean) < 4 * b / std::sqrt(3.0 * t.numel()));
  CHECK(std::abs(m.m2 / (b * b / 3) - 1) < tol);
  CHECK(std::abs(m.m4 / (b * b * b * b / 5) - 1) < 2 * tol);
}

}  // namespace

TEST_CASE("default init: U(+-1/sqrt(fan_in)) for Linear and Conv2d weights and biases") {
  manual_seed(123);
  nn::Linear big(1000, 600);  // 600k weights: moments within ~0.1% by chance
  check_uniform(big.weight(), 1 / std::sqrt(1000.0), 0.01, "Linear(1000, 600).weight");
  check_uniform(big.bias(), 1 / std::sqrt(1000.0), 0.15, "Linear(1000, 600).bias");

  nn::Conv2d conv(16, 64, 3, 1, 1);  // fan_in 144, 9216 weights
  check_uniform(conv.weight(), 1 / 12.0, 0.05, "Conv2d(16, 64, 3).weight");
  auto cp = conv.named_parameters();
  REQUIRE(cp.size() == 2);
  CHECK(cp[1].first == "bias");
  const Moments cb = moments(cp[1].second);
  CHECK(cb.min >= -1 / 12.0);
  CHECK(cb.max <= 1 / 12.0);

  auto mlp = nn::make_mlp({300, 200, 7});
  for (auto& [name, p] : mlp->named_parameters()) {
    const double b = 1 / std::sqrt(name[0] == '1' ? 300.0 : 200.0);
    const Moments m = moments(p);
    INFO(name << " min " << m.min << " max " << m.max << " bound " << b);
    CHECK(m.min >= -b);
    CHECK(m.max <= b);
    CHECK(m.max - m.min > b);  // not collapsed
  }
}

TEST_CASE("default init is reproducible under mg::manual_seed and differs across seeds") {
  auto params_of = [](uint64_t seed) {
    manual_seed(seed);
    auto m = nn::make_mlp({20, 11, 5});
    nn::Conv2d c(3, 4, 3);
    auto p = m->parameters();
    for (const Tensor& t : c.parameters()) p.push_back(t);
    return p;
  };
  auto a = params_of(7), b = params_of(7), c = params_of(8);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(test::bit_equal(a[i], b[i]));
    CHECK(!test::bit_equal(a[i], c[i]));
  }
  // Successive layers draw fresh numbers (not the same stream restarted).
  auto w1 = a[0].to_vector<float>(), w2 = a[2].to_vector<float>();
  CHECK(!std::equal(w2.begin(), w2.end(), w1.begin()));
}
