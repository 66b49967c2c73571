// Gradient accumulation: exactness against one large batch (Note [accumulation normalises by
// samples]), the schedule, clipping once per step, optimizer state per real step, non-finite
// handling, and bit-exact resume.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include <minigrad/data/idx.h>
#include <minigrad/data/loader.h>
#include "helpers.h"
#include <minigrad/optim/accumulate.h>
#include <minigrad/optim/train_state.h>

using namespace mg;
using mg::test::bit_equal;
using mg::test::max_abs_diff;

namespace {

// 7,992 = 124 * 64 + 56: the last batch of 64 is short, and it is 3 micro-batches of 16 plus
// one of 8.
constexpr int64_t kEpochSamples = 7992;

const data::IdxDataset& epoch_data() {
  static const data::IdxDataset d = data::make_synthetic(kEpochSamples, 7);
  return d;
}

std::shared_ptr<nn::Sequential> small_mlp(uint64_t seed) {
  manual_seed(seed);
  return nn::make_mlp({784, 64, 10});
}

std::vector<Tensor> snapshot(const nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.clone());
  return out;
}

double max_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, max_abs_diff(a[i], b[i]));
  return m;
}

double max_abs(const std::vector<Tensor>& a) {
  double m = 0;
  for (const Tensor& t : a)
    for (float v : t.to_vector<float>()) m = std::max(m, static_cast<double>(std::abs(v)));
  return m;
}

struct RunResult {
  std::vector<Tensor> weights;
  int64_t optimizer_steps = 0;
  int64_t step_count = 0;
};

enum class Opt { sgd, sgd_momentum, adam, adamw };

std::unique_ptr<optim::Optimizer> make_opt(const nn::Module& m, Opt which, float lr) {
  switch (which) {
    case Opt::sgd: return std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = lr});
    case Opt::sgd_momentum:
      return std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = lr, .momentum = 0.9f});
    case Opt::adam: return std::make_unique<optim::Adam>(m.parameters(), optim::AdamOptions{.lr = lr});
    case Opt::adamw:
      return std::make_unique<optim::AdamW>(m.parameters(), optim::AdamOptions{.lr = lr, .weight_decay = 0.1f});
  }
  return nullptr;
}

RunResult run(int64_t batch, int64_t accum, Opt which, float lr, int64_t epochs = 1,
              optim::Normalize norm = optim::Normalize::samples, float clip = 0.0f,
              const data::IdxDataset& d = epoch_data()) {
  auto model = small_mlp(3);
  auto opt = make_opt(*model, which, lr);
  optim::Accumulator acc(*opt, {.steps = accum, .clip_norm = clip, .normalize = norm});
  data::DataLoader loader(d, {.batch_size = batch, .seed = 11});
  RunResult r;
  for (int64_t e = 0; e < epochs; ++e) r.optimizer_steps += optim::train_epoch(*model, loader, acc, e).optimizer_steps;
  r.weights = snapshot(*model);
  r.step_count = opt->step_count();
  return r;
}

}  // namespace

// Tolerances for "the same update, up to float rounding". The runs add the same products in a
// different order (one GEMM over 64 rows against four GEMMs over 16 rows added into the buffer),
// so each gradient element differs by a few ulps of its partial sums, and 125 steps of the
// nonlinear network carry those differences forward. SGD passes a gradient difference to the
// weights scaled by lr: measured |dw| ~ 1e-7 on weights of ~0.1, so 1e-6 (about 10 ulps of the
// weights) bounds it. Adam divides by sqrt(v): for a parameter whose gradient is a near-cancelling
// sum, a relative rounding difference in g becomes an absolute difference of order lr * 1e-3 in
// its update: measured ~3e-6, bound 2e-5. Dividing by N changes a whole step, not its rounding.
constexpr double kRoundingTolSgd = 1e-6;
constexpr double kRoundingTolAdam = 2e-5;

TEST_CASE("batch 16 x 4 ends an epoch of 7,992 samples with the weights of batch 64; dividing by N does not") {
  for (Opt which : {Opt::sgd, Opt::sgd_momentum, Opt::adam}) {
    const float lr = which == Opt::adam ? 1e-3f : which == Opt::sgd ? 0.05f : 0.01f;
    const double tol = which == Opt::adam ? kRoundingTolAdam : kRoundingTolSgd;
    INFO("optimizer " << static_cast<int>(which));
    RunResult big = run(64, 1, which, lr);
    RunResult acc = run(16, 4, which, lr);
    auto init = snapshot(*small_mlp(3));
    const double moved = max_diff(big.weights, init);
    const double d_acc = max_diff(big.weights, acc.weights);
    CHECK(big.optimizer_steps == 125);  // 124 full windows + the short one of 56 samples
    CHECK(acc.optimizer_steps == 125);
    CHECK(acc.step_count == 125);
    CHECK(moved > 1e-2);
    CHECK(d_acc < tol);
    if (which == Opt::adam) {
      // Adam's first moment takes (1 - beta1) = 10% of the last step's gradient, so the wrong
      // last window moves the weights by only ~4e-5 here; the Adam test below uses an epoch
      // whose last window is a single micro-batch of 8, where the error is large.
      MESSAGE("Adam: weights moved " << moved << "; |64 - 16x4| = " << d_acc);
      continue;
    }
    RunResult wrong = run(16, 4, which, lr, 1, optim::Normalize::micro_batches);
    const double d_wrong = max_diff(big.weights, wrong.weights);
    MESSAGE(std::string(which == Opt::sgd ? "SGD" : "SGD momentum 0.9") << ": weights moved " << moved << " from init; |64 - 16x4| = "
                                                            << d_acc << "; |64 - 16x4 divided by N| = " << d_wrong);
    CHECK(d_wrong > 20 * tol);  // measured: ~650x (SGD), ~75x (momentum, whose late gradients are small)
  }
}

TEST_CASE("the same on the first 7,992 real MNIST digits (../shared/data/mnist)") {
  const std::string dir = std::string(MG_SHARED_DATA_DIR) + "/mnist";
  if (!std::filesystem::exists(dir + "/t10k-images-idx3-ubyte.gz")) {
    MESSAGE("skipped: no MNIST in " << dir);
    return;
  }
  const data::IdxDataset real = data::load_mnist_auto(dir).train.limit(kEpochSamples);
  REQUIRE(real.size() == kEpochSamples);
  RunResult big = run(64, 1, Opt::sgd, 0.05f, 1, optim::Normalize::samples, 0.0f, real);
  RunResult acc = run(16, 4, Opt::sgd, 0.05f, 1, optim::Normalize::samples, 0.0f, real);
  RunResult wrong = run(16, 4, Opt::sgd, 0.05f, 1, optim::Normalize::micro_batches, 0.0f, real);
  MESSAGE("real digits, SGD: |64 - 16x4| = " << max_diff(big.weights, acc.weights)
          << "; divided by N: " << max_diff(big.weights, wrong.weights));
  CHECK(max_diff(big.weights, acc.weights) < kRoundingTolSgd);
  CHECK(max_diff(big.weights, wrong.weights) > 20 * kRoundingTolSgd);
}

TEST_CASE("the short last window: one accumulated step equals the step on the concatenated batch") {
  // 5 micro-batches of sizes 16, 16, 16, 3 and (flushed) nothing else: the window has 51 samples.
  const data::IdxDataset d = data::make_synthetic(51, 21);
  auto ref_model = small_mlp(5);
  auto acc_model = small_mlp(5);
  optim::SGD ref_opt(ref_model->parameters(), {.lr = 0.5f});
  optim::SGD acc_opt(acc_model->parameters(), {.lr = 0.5f});
  data::DataLoader whole(d, {.batch_size = 51, .shuffle = false});
  data::DataLoader parts(d, {.batch_size = 16, .shuffle = false});
  data::Batch b;
  whole.start_epoch(0);
  REQUIRE(whole.next(b));
  cross_entropy(ref_model->forward(b.x), b.y).backward();  // mean over 51
  ref_opt.step();
  optim::Accumulator acc(acc_opt, {.steps = 8});
  parts.start_epoch(0);
  int n = 0;
  while (parts.next(b)) {
    acc.backward(cross_entropy(acc_model->forward(b.x), b.y, Reduction::sum), b.size());
    ++n;
  }
  CHECK(n == 4);
  CHECK(!acc.ready());
  optim::StepInfo info;
  CHECK(acc.flush(&info));
  CHECK(info.samples == 51);
  CHECK(info.micro_batches == 4);
  CHECK(info.grad_scale == doctest::Approx(1.0 / 51));
  CHECK(!acc.flush());  // nothing pending any more
  CHECK(max_diff(snapshot(*ref_model), snapshot(*acc_model)) < 1e-6);
  for (const Tensor& g : acc_opt.grads()) CHECK(max_abs({g}) == 0.0);  // zeroed after the step
}

TEST_CASE("accumulation schedule: parsing") {
  auto s = optim::AccumulationSchedule::parse("0:8,4:2");
  CHECK(s.steps_for_epoch(0) == 8);
  CHECK(s.steps_for_epoch(3) == 8);
  CHECK(s.steps_for_epoch(4) == 2);
  CHECK(s.steps_for_epoch(100) == 2);
  CHECK(s.str() == "0:8,4:2");
  auto late = optim::AccumulationSchedule::parse("2:4, 5:3");  // Lightning: N = 1 before the first key
  CHECK(late.steps_for_epoch(0) == 1);
  CHECK(late.steps_for_epoch(1) == 1);
  CHECK(late.steps_for_epoch(2) == 4);
  CHECK(late.steps_for_epoch(6) == 3);
  CHECK(optim::AccumulationSchedule::parse("4").steps_for_epoch(9) == 4);
  CHECK(optim::AccumulationSchedule::parse("4:2,0:8").str() == "0:8,4:2");
  for (const char* bad : {"", "0:8,", ",0:8", "0:8,,4:2", "0-8", "0:0", "0:-2", "-1:2", "a:2", "0:2x",
                          "0:8,0:4", "0:8:2", "0:", ":8", "0", "1.5:2"}) {
    INFO("spec \"" << bad << "\"");
    CHECK_THROWS_AS(optim::AccumulationSchedule::parse(bad), Error);
  }
  CHECK_THROWS_WITH_AS(optim::AccumulationSchedule::parse("0:8,0:4"), doctest::Contains("appears twice"), Error);
  CHECK_THROWS_WITH_AS(optim::AccumulationSchedule::parse("0:8,x:2"), doctest::Contains("not a non-negative integer"), Error);
}

TEST_CASE("accumulation schedule switches N by epoch, and each epoch matches the equivalent large batch") {
  // 200 samples; batch 16 -> 13 micro-batches per epoch. Schedule "0:4,1:2":
  // epoch 0: windows of 4 -> 4 steps (4+4+4+1); epoch 1: windows of 2 -> 7 steps (2*6+1).
  const data::IdxDataset d = data::make_synthetic(200, 5);
  const auto sched = optim::AccumulationSchedule::parse("0:4,1:2");
  auto model = small_mlp(9);
  optim::SGD opt(model->parameters(), {.lr = 0.05f, .momentum = 0.9f});
  optim::Accumulator acc(opt, {.steps = sched.steps_for_epoch(0)});
  data::DataLoader loader(d, {.batch_size = 16, .seed = 4});
  std::vector<int64_t> steps;
  for (int64_t e = 0; e < 2; ++e) {
    acc.set_steps(sched.steps_for_epoch(e));
    steps.push_back(optim::train_epoch(*model, loader, acc, e).optimizer_steps);
  }
  CHECK(steps == std::vector<int64_t>{4, 7});
  CHECK(opt.step_count() == 11);
  // on_step (where an LR schedule hooks in) runs once per optimizer step, not per micro-batch.
  int64_t on_step_calls = 0, on_mb_calls = 0;
  acc.set_steps(sched.steps_for_epoch(2));
  optim::train_epoch(*model, loader, acc, 2, {},
                     {.on_micro_batch = [&](const data::Batch&) { ++on_mb_calls; },
                      .on_step = [&](const optim::StepInfo&) { ++on_step_calls; opt.set_lr(opt.lr() * 0.9f); }});
  CHECK(on_mb_calls == 13);
  CHECK(on_step_calls == 7);
  CHECK(opt.lr() == doctest::Approx(0.05 * std::pow(0.9, 7)));
  CHECK(opt.step_count() == 18);
  // The same run as batch 64, then batch 32 (twice, the second with the LR decay), without
  // accumulation: equal up to rounding.
  auto ref = small_mlp(9);
  optim::SGD ref_opt(ref->parameters(), {.lr = 0.05f, .momentum = 0.9f});
  optim::Accumulator one(ref_opt, {.steps = 1});
  data::DataLoader l64(d, {.batch_size = 64, .seed = 4}), l32(d, {.batch_size = 32, .seed = 4});
  optim::train_epoch(*ref, l64, one, 0);
  optim::train_epoch(*ref, l32, one, 1);
  optim::train_epoch(*ref, l32, one, 2, {}, {.on_step = [&](const optim::StepInfo&) { ref_opt.set_lr(ref_opt.lr() * 0.9f); }});
  CHECK(ref_opt.step_count() == 18);
  CHECK(max_diff(snapshot(*model), snapshot(*ref)) < 1e-6);
  // N cannot change in the middle of a window.
  data::Batch b;
  loader.start_epoch(0);
  REQUIRE(loader.next(b));
  acc.backward(cross_entropy(model->forward(b.x), b.y, Reduction::sum), b.size());
  CHECK_THROWS_WITH_AS(acc.set_steps(3), doctest::Contains("pending"), Error);
}

TEST_CASE("clipping by global norm is applied once per optimizer step, to the window's mean gradient") {
  const data::IdxDataset d = data::make_synthetic(40, 13);
  const float lr = 0.1f, clip = 0.05f;
  auto model = small_mlp(17);
  auto init = snapshot(*model);
  // Manual: the summed gradient of the 3 micro-batches (16, 16, 8), its mean, the norm, the step.
  std::vector<Tensor> sum_grads;
  {
    auto m = small_mlp(17);
    for (Tensor& p : m->parameters()) p.set_grad(Tensor());
    data::DataLoader l(d, {.batch_size = 16, .shuffle = false});
    data::Batch b;
    l.start_epoch(0);
    while (l.next(b)) cross_entropy(m->forward(b.x), b.y, Reduction::sum).backward();
    for (const Tensor& p : m->parameters()) sum_grads.push_back(p.grad().clone());
  }
  double ss = 0;
  for (const Tensor& g : sum_grads)
    for (float v : g.to_vector<float>()) ss += static_cast<double>(v / 40.0f) * (v / 40.0f);
  const double norm = std::sqrt(ss);
  REQUIRE(norm > 4 * clip);  // clipping must be active for the test to mean anything
  const double coef = clip / (norm + 1e-6);
  // The accumulator.
  optim::SGD opt(model->parameters(), {.lr = lr});
  optim::Accumulator acc(opt, {.steps = 3, .clip_norm = clip});
  data::DataLoader l(d, {.batch_size = 16, .shuffle = false});
  data::Batch b;
  l.start_epoch(0);
  while (l.next(b)) acc.backward(cross_entropy(model->forward(b.x), b.y, Reduction::sum), b.size());
  REQUIRE(acc.ready());
  optim::StepInfo info = acc.step();
  CHECK(info.grad_norm == doctest::Approx(norm).epsilon(1e-5));
  CHECK(info.clip_coef == doctest::Approx(coef).epsilon(1e-5));
  auto after = snapshot(*model);
  double worst = 0, step_norm2 = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    auto p0 = init[i].to_vector<float>(), p1 = after[i].to_vector<float>(), g = sum_grads[i].to_vector<float>();
    for (size_t k = 0; k < g.size(); ++k) {
      const double expect = p0[k] - lr * coef * (g[k] / 40.0);
      worst = std::max(worst, std::abs(expect - p1[k]));
      step_norm2 += (static_cast<double>(p1[k]) - p0[k]) * (static_cast<double>(p1[k]) - p0[k]);
    }
  }
  CHECK(worst < 1e-6);
  // The step taken has norm lr * clip exactly (up to rounding): clipped once, on the whole window.
  CHECK(std::sqrt(step_norm2) == doctest::Approx(lr * clip).epsilon(1e-3));
  // Clipping each micro-batch separately would give a different step; make sure the test can tell.
  double per_mb_norm2 = 0;
  {
    auto m = small_mlp(17);
    optim::SGD o(m->parameters(), {.lr = lr});
    data::DataLoader l2(d, {.batch_size = 16, .shuffle = false});
    l2.start_epoch(0);
    std::vector<Tensor> total;
    for (const Tensor& p : m->parameters()) total.push_back(Tensor::zeros(p.shape()));
    while (l2.next(b)) {
      o.zero_grad();
      cross_entropy(m->forward(b.x), b.y, Reduction::sum).backward();
      const double n = optim::global_grad_norm(o.grads(), 1.0 / 40);
      const double c = std::min(1.0, clip / (n + 1e-6));
      auto gs = o.grads();
      for (size_t i = 0; i < gs.size(); ++i) {
        auto gv = gs[i].to_vector<float>();
        float* t = total[i].data<float>();
        for (size_t k = 0; k < gv.size(); ++k) t[k] += static_cast<float>(c * gv[k] / 40.0);
      }
    }
    for (const Tensor& t : total) for (float v : t.to_vector<float>()) per_mb_norm2 += lr * lr * static_cast<double>(v) * v;
  }
  CHECK(std::abs(std::sqrt(per_mb_norm2) - lr * clip) > 0.05 * lr * clip);
}

TEST_CASE("AdamW's weight decay is applied once per real step: 16 x 4 matches 64") {
  const data::IdxDataset d = data::make_synthetic(1000, 12);
  RunResult big = run(64, 1, Opt::adamw, 2e-3f, 1, optim::Normalize::samples, 0.0f, d);
  RunResult acc = run(16, 4, Opt::adamw, 2e-3f, 1, optim::Normalize::samples, 0.0f, d);
  RunResult per_mb = run(16, 1, Opt::adamw, 2e-3f, 1, optim::Normalize::samples, 0.0f, d);
  CHECK(acc.step_count == 16);
  CHECK(max_diff(big.weights, acc.weights) < kRoundingTolAdam);
  CHECK(max_diff(big.weights, per_mb.weights) > 50 * kRoundingTolAdam);  // decay 63 times: different
}

TEST_CASE("Adam's step count is the number of real steps, and 16 x 4 matches 64 on a short epoch") {
  const data::IdxDataset d = data::make_synthetic(328, 3);  // 5 full windows of 64 + 8
  RunResult big = run(64, 1, Opt::adam, 2e-3f, 2, optim::Normalize::samples, 0.0f, d);
  RunResult acc = run(16, 4, Opt::adam, 2e-3f, 2, optim::Normalize::samples, 0.0f, d);
  CHECK(big.step_count == 12);
  CHECK(acc.step_count == 12);  // not 2 * 21 micro-batches
  CHECK(acc.optimizer_steps == 12);
  CHECK(max_diff(big.weights, acc.weights) < kRoundingTolAdam);
  // Stepping Adam per micro-batch (t = 42) would change its bias correction: a different result.
  RunResult per_mb = run(16, 1, Opt::adam, 2e-3f, 2, optim::Normalize::samples, 0.0f, d);
  CHECK(per_mb.step_count == 42);
  CHECK(max_diff(big.weights, per_mb.weights) > 50 * kRoundingTolAdam);
  // Dividing by N: the last window (one micro-batch of 8) gets a quarter of its gradient.
  RunResult wrong = run(16, 4, Opt::adam, 2e-3f, 2, optim::Normalize::micro_batches, 0.0f, d);
  MESSAGE("Adam, 328 samples x 2 epochs: |64 - 16x4| = " << max_diff(big.weights, acc.weights)
          << "; divided by N: " << max_diff(big.weights, wrong.weights));
  CHECK(max_diff(big.weights, wrong.weights) > 50 * kRoundingTolAdam);
}

TEST_CASE("non-finite loss or gradient: found at the step, error by default, skip on request") {
  auto model = small_mlp(1);
  optim::SGD opt(model->parameters(), {.lr = 0.1f});
  auto init = snapshot(*model);
  const data::IdxDataset d = data::make_synthetic(32, 1);
  data::DataLoader l(d, {.batch_size = 16, .shuffle = false});
  data::Batch b;
  l.start_epoch(0);
  REQUIRE(l.next(b));
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto good_loss = [&] { return cross_entropy(model->forward(b.x), b.y, Reduction::sum); };
  auto all_grads_zero = [&] {
    for (const Tensor& g : opt.grads()) if (max_abs({g}) != 0.0) return false;
    return true;
  };
  {
    // Note [one read per step]: backward does not read the loss, so it does not throw; the step
    // names the micro-batch, drops the window and leaves the weights alone.
    optim::Accumulator acc(opt, {.steps = 3});
    acc.backward(good_loss(), b.size());
    acc.backward(scale(good_loss(), nan), b.size());
    acc.backward(good_loss(), b.size());
    CHECK_THROWS_WITH_AS(acc.step(), doctest::Contains("loss is nan at micro-batch 2 of 3"), Error);
    CHECK(acc.pending_micro_batches() == 0);
    CHECK(all_grads_zero());
    acc.add_micro_batch(16, Tensor::full({1}, inf));
    CHECK_THROWS_WITH_AS(acc.step(), doctest::Contains("loss is inf at micro-batch 1 of 1"), Error);
    CHECK(opt.step_count() == 0);
    CHECK(max_diff(init, snapshot(*model)) == 0.0);
    // The window after a dropped one steps normally.
    acc.backward(good_loss(), b.size());
    acc.backward(good_loss(), b.size());
    acc.backward(good_loss(), b.size());
    CHECK(!acc.step().skipped);
    CHECK(opt.step_count() == 1);
    CHECK_THROWS_WITH_AS(acc.backward(Tensor::zeros({2}), 16), doctest::Contains("float32 scalar"), Error);
    CHECK_THROWS_WITH_AS(acc.backward(good_loss(), 0), doctest::Contains("0 samples"), Error);
  }
  init = snapshot(*model);
  {
    // A finite loss whose gradient is not: poison one element of the accumulated gradient.
    optim::Accumulator acc(opt, {.steps = 1});
    for (float bad : {inf, nan}) {
      acc.backward(good_loss(), b.size());
      opt.grads()[1].data<float>()[3] = bad;
      CHECK_THROWS_WITH_AS(acc.step(), doctest::Contains(std::isnan(bad) ? "gradient norm is nan" : "gradient norm is inf"), Error);
      CHECK(all_grads_zero());
    }
    CHECK(opt.step_count() == 1);
    CHECK(max_diff(init, snapshot(*model)) == 0.0);
  }
  {
    optim::Accumulator acc(opt, {.steps = 2, .non_finite = optim::NonFinite::skip});
    acc.backward(scale(good_loss(), nan), b.size());
    acc.backward(good_loss(), b.size());
    REQUIRE(acc.ready());
    optim::StepInfo info = acc.step();
    CHECK(info.skipped);
    CHECK(std::isnan(info.loss_sum));
    CHECK(acc.skipped_steps() == 1);
    CHECK(opt.step_count() == 1);
    CHECK(max_diff(init, snapshot(*model)) == 0.0);
    CHECK(all_grads_zero());
    // The next window is clean and steps.
    acc.backward(good_loss(), b.size());
    acc.backward(good_loss(), b.size());
    CHECK(!acc.step().skipped);
    CHECK(opt.step_count() == 2);
  }
  CHECK_THROWS_AS(optim::Accumulator(opt, {.steps = 0}), Error);
  CHECK_THROWS_AS(optim::Accumulator(opt, {.clip_norm = -1.0f}), Error);
  optim::Accumulator acc(opt, {.steps = 2});
  CHECK_THROWS_WITH_AS(acc.step(), doctest::Contains("no micro-batch"), Error);
}

TEST_CASE("the step reports the window's summed loss, however many micro-batches it holds") {
  const data::IdxDataset d = data::make_synthetic(120, 5);
  auto model = small_mlp(4);
  // The per-sample losses of the 120 samples at the initial weights, in double.
  std::vector<double> per_batch;  // summed loss of each micro-batch of 16 (the last has 8)
  {
    data::DataLoader l(d, {.batch_size = 16, .shuffle = false});
    data::Batch b;
    NoGradGuard no_grad;
    for (l.start_epoch(0); l.next(b);) per_batch.push_back(cross_entropy(model->forward(b.x), b.y, Reduction::sum).item());
  }
  REQUIRE(per_batch.size() == 8);
  for (auto normalize : {optim::Normalize::samples, optim::Normalize::micro_batches}) {
    INFO("normalize " << static_cast<int>(normalize));
    // lr 0 keeps the weights, so every window sees the initial model.
    optim::SGD opt(model->parameters(), {.lr = 0.0f});
    optim::Accumulator acc(opt, {.steps = 2, .normalize = normalize});
    const Reduction red = normalize == optim::Normalize::samples ? Reduction::sum : Reduction::mean;
    data::DataLoader l(d, {.batch_size = 16, .shuffle = false});
    data::Batch b;
    l.start_epoch(0);
    // 3 micro-batches with N = 2 (the window outgrows its statistics slots), then N = 4 with 5.
    for (int k = 0; k < 3 && l.next(b); ++k) acc.backward(cross_entropy(model->forward(b.x), b.y, red), b.size());
    optim::StepInfo first = acc.step();
    CHECK(first.micro_batches == 3);
    CHECK(first.loss_sum == doctest::Approx(per_batch[0] + per_batch[1] + per_batch[2]).epsilon(1e-6));
    acc.set_steps(4);
    for (int k = 0; k < 5 && l.next(b); ++k) acc.backward(cross_entropy(model->forward(b.x), b.y, red), b.size());
    optim::StepInfo second = acc.step();
    CHECK(second.micro_batches == 5);
    CHECK(second.samples == 72);
    double rest = 0;
    for (size_t k = 3; k < 8; ++k) rest += per_batch[k];
    CHECK(second.loss_sum == doctest::Approx(rest).epsilon(1e-6));
  }
  // train_epoch's mean loss is the same sum, divided by the epoch's samples.
  optim::SGD opt(model->parameters(), {.lr = 0.0f});
  optim::Accumulator acc(opt, {.steps = 3});
  data::DataLoader l(d, {.batch_size = 16, .shuffle = false});
  const optim::EpochStats st = optim::train_epoch(*model, l, acc, 0);
  double all = 0;
  for (double v : per_batch) all += v;
  CHECK(st.samples == 120);
  CHECK(st.mean_loss() == doctest::Approx(all / 120).epsilon(1e-6));
}

TEST_CASE("linear LR scaling") {
  CHECK(optim::scale_lr_linear(0.1f, 256, 1024) == doctest::Approx(0.4f));
  CHECK(optim::scale_lr_linear(1e-3f, 64, 16) == doctest::Approx(2.5e-4f));
  CHECK_THROWS_AS(optim::scale_lr_linear(0.1f, 0, 64), Error);
}

TEST_CASE("resume: a Dropout's own generator comes back with the training state") {
  // Outside a sample window dropout advances its generator call by call; a resumed run must draw
  // the masks the uninterrupted one draws next.
  const std::string dir = (std::filesystem::temp_directory_path() / "mg_test_resume_gen").string();
  std::filesystem::create_directories(dir);
  auto build = [](Generator& gen) {
    manual_seed(7);
    auto m = std::make_shared<nn::Sequential>();
    m->add<nn::Linear>(6, 32);
    m->add<nn::Dropout>(0.5f, &gen);
    m->train();
    return m;
  };
  const Tensor x = Tensor::full({4, 6}, 0.5f);
  Generator gen(21);
  auto m = build(gen);
  optim::SGD o(m->parameters(), {.lr = 0.1f});
  for (int i = 0; i < 3; ++i) m->forward(x);
  const std::string path = dir + "/gen.safetensors";
  optim::save_train_state(path, *m, o, {});
  const auto next = m->forward(x).to_vector<float>();

  Generator gen2(21);  // as a restarted program makes it: the seed, at offset 0
  auto m2 = build(gen2);
  optim::SGD o2(m2->parameters(), {.lr = 0.1f});
  CHECK(m2->forward(x).to_vector<float>() != next);
  optim::load_train_state(path, *m2, o2);
  CHECK(m2->forward(x).to_vector<float>() == next);
  CHECK(gen2.offset() == gen.offset());

  // A model that draws from another number of generators of its own is refused, and left as it was.
  manual_seed(7);
  auto plain = std::make_shared<nn::Sequential>();
  plain->add<nn::Linear>(6, 32);
  optim::SGD o3(plain->parameters(), {.lr = 0.1f});
  CHECK_THROWS_WITH_AS(optim::load_train_state(path, *plain, o3),
                       doctest::Contains("positions of 1 generator(s) of the model's own, the run's model draws from 0"),
                       Error);
  // A file written before the model's generators were kept loads, and leaves them where they are.
  nn::SafetensorsFile f = nn::load_safetensors(path);
  nn::Metadata old = f.metadata;
  for (auto it = old.begin(); it != old.end();) it = it->first.starts_with("minigrad.model_generator") ? old.erase(it) : std::next(it);
  nn::save_safetensors(dir + "/old.safetensors", f.tensors, old);
  const uint64_t offset = gen2.offset();
  optim::load_train_state(dir + "/old.safetensors", *m2, o2);
  CHECK(gen2.offset() == offset);
  std::filesystem::remove_all(dir);
}

TEST_CASE("resume: 2 epochs straight equal 1 epoch + save + resume 1 epoch, bit for bit") {
  const data::IdxDataset d = data::make_synthetic(1000, 8);  // 1000 = 15 * 64 + 40: short windows too
  const std::string dir = (std::filesystem::temp_directory_path() / "mg_test_resume").string();
  std::filesystem::create_directories(dir);
  for (Opt which : {Opt::sgd_momentum, Opt::adam}) {
    INFO("optimizer " << static_cast<int>(which));
    const float lr = which == Opt::adam ? 1e-3f : 0.05f;
    auto straight = [&]() {
      auto m = small_mlp(2);
      auto o = make_opt(*m, which, lr);
      optim::Accumulator acc(*o, {.steps = 4, .clip_norm = 1.0f});
      data::DataLoader l(d, {.batch_size = 16, .seed = 99});
      for (int64_t e = 0; e < 2; ++e) optim::train_epoch(*m, l, acc, e);
      return snapshot(*m);
    }();
    const std::string path = dir + "/state.safetensors";
    {
      auto m = small_mlp(2);
      auto o = make_opt(*m, which, lr);
      optim::Accumulator acc(*o, {.steps = 4, .clip_norm = 1.0f});
      data::DataLoader l(d, {.batch_size = 16, .seed = 99});
      optim::train_epoch(*m, l, acc, 0);
      optim::save_train_state(path, *m, *o, {.epoch = 1, .extra = {{"note", "test"}}});
    }
    auto m = small_mlp(1234);  // different initial weights: the load must overwrite them all
    auto o = make_opt(*m, which, lr);
    optim::TrainState st = optim::load_train_state(path, *m, *o);
    CHECK(st.epoch == 1);
    CHECK(st.extra.at("note") == "test");
    CHECK(o->step_count() == 16);  // 63 micro-batches (62 x 16 + 8) in windows of 4: 15 + 1 steps
    optim::Accumulator acc(*o, {.steps = 4, .clip_norm = 1.0f});
    data::DataLoader l(d, {.batch_size = 16, .seed = 99});
    optim::train_epoch(*m, l, acc, st.epoch);
    auto resumed = snapshot(*m);
    REQUIRE(resumed.size() == straight.size());
    for (size_t i = 0; i < resumed.size(); ++i) CHECK(bit_equal(resumed[i], straight[i]));
    // And a resume that lost the optimizer state would not be bit-identical.
    if (which == Opt::adam) {
      auto m2 = small_mlp(2);
      auto o2 = make_opt(*m2, which, lr);
      optim::load_train_state(path, *m2, *o2);
      for (auto& [name, t] : o2->state_tensors()) t.fill_(0.0f);
      optim::Accumulator acc2(*o2, {.steps = 4, .clip_norm = 1.0f});
      data::DataLoader l2(d, {.batch_size = 16, .seed = 99});
      optim::train_epoch(*m2, l2, acc2, 1);
      CHECK(max_diff(snapshot(*m2), straight) > 1e-5);
    }
  }
  // A file that is not a training state.
  auto m = small_mlp(2);
  optim::SGD o(m->parameters(), {.lr = 0.1f});
  nn::save_safetensors(dir + "/weights.safetensors", m->named_parameters());
  CHECK_THROWS_WITH_AS(optim::load_train_state(dir + "/weights.safetensors", *m, o),
                       doctest::Contains("not a libminigrad training-state file"), Error);
  // A state of another optimizer (SGD without momentum has no state tensors; Adam's are extra).
  optim::Adam adam(m->parameters(), {});
  optim::save_train_state(dir + "/adam.safetensors", *m, adam, {});
  CHECK_THROWS_WITH_AS(optim::load_train_state(dir + "/adam.safetensors", *m, o),
                       doctest::Contains("unexpected tensor"), Error);
  // Counts out of range, or not numbers: refused, and the run is left exactly as it was.
  optim::SGD mo(m->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  optim::save_train_state(dir + "/good.safetensors", *m, mo, {.epoch = 2});
  nn::SafetensorsFile good = nn::load_safetensors(dir + "/good.safetensors");
  const nn::NamedTensors tensors = good.tensors;
  for (Tensor& p : m->parameters()) p.detach().fill_(0.25f);  // differs from the file's values
  const std::vector<Tensor> before = snapshot(*m);
  const std::pair<const char*, const char*> bad[] = {
      {"minigrad.step_count", "-3"},     {"minigrad.generator_offset", "-1"}, {"minigrad.epoch", "1x"},
      {"minigrad.batches_done", ""},     {"minigrad.epoch", "9223372036854775808"},
      {"minigrad.model_generators", "-1"},
  };
  for (auto [key, value] : bad) {
    INFO(key << " = \"" << value << "\"");
    nn::Metadata meta = good.metadata;
    meta[key] = value;
    nn::save_safetensors(dir + "/bad.safetensors", tensors, meta);
    const std::string names_key = std::string("metadata \"") + key;
    CHECK_THROWS_WITH_AS(optim::load_train_state(dir + "/bad.safetensors", *m, mo),
                         doctest::Contains(names_key.c_str()), Error);
    CHECK(max_diff(before, snapshot(*m)) == 0.0);
  }
  std::filesystem::remove_all(dir);
}

// Note [a pair of files as one unit] (src/optim/train_state.cpp): the state is written before the
// weights, a pair is complete when its weights file exists, and a state left alone by a kill
// between the two writes is completed by repair_checkpoints from what it holds.
TEST_CASE("checkpoint pairs: latest complete pair, repair after a kill between the two files") {
  const std::string dir = (std::filesystem::temp_directory_path() / ("mg_test_pairs_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto m = small_mlp(2);
  auto o = make_opt(*m, Opt::adam, 1e-3f);
  CHECK(optim::latest_checkpoint(dir).empty());
  const nn::Metadata wmeta = {{"model", "small mlp"}};
  for (int64_t e = 1; e <= 3; ++e) optim::save_checkpoint(dir + "/epoch_" + std::to_string(e), *m, *o, {.epoch = e}, wmeta);
  optim::save_checkpoint(dir + "/mid", *m, *o, {.epoch = 3, .batches_done = 5}, wmeta);
  CHECK(optim::latest_checkpoint(dir) == dir + "/mid");  // (3, 5) is after (3, 0)
  std::filesystem::remove(dir + "/mid.state.safetensors");
  std::filesystem::remove(dir + "/mid.safetensors");
  CHECK(optim::latest_checkpoint(dir) == dir + "/epoch_3");
  // The weights file: the parameters under their own names and the caller's metadata only.
  const nn::SafetensorsFile w3 = nn::load_safetensors(dir + "/epoch_3.safetensors");
  CHECK(w3.metadata == wmeta);
  auto m2 = small_mlp(77);
  nn::load_into(*m2, dir + "/epoch_3.safetensors");
  CHECK(max_diff(snapshot(*m2), snapshot(*m)) == 0.0);

  // A kill after the state's rename and before the weights': epoch 4's state alone, plus a dead
  // writer's temporary of the weights file. The newest complete pair is still epoch 3.
  for (auto& p : m->parameters()) p.fill_(0.25f);
  optim::save_checkpoint(dir + "/epoch_4", *m, *o, {.epoch = 4}, wmeta);
  const std::string w4 = dir + "/epoch_4.safetensors";
  const std::string reference = [&] { std::ifstream f(w4, std::ios::binary); return std::string(std::istreambuf_iterator<char>(f), {}); }();
  std::filesystem::remove(w4);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  ::waitpid(child, nullptr, 0);
  const std::string stale = w4 + ".tmp." + std::to_string(child) + ".0";
  { std::ofstream(stale) << std::string(4096, 'x'); }
  CHECK(optim::latest_checkpoint(dir) == dir + "/epoch_3");
  const optim::CheckpointRepair r = optim::repair_checkpoints(dir);
  CHECK(r.temporaries_removed == 1);
  REQUIRE(r.completed == std::vector<std::string>{w4});
  CHECK_FALSE(std::filesystem::exists(stale));
  // The completed file is byte for byte the one save_checkpoint writes.
  const std::string repaired = [&] { std::ifstream f(w4, std::ios::binary); return std::string(std::istreambuf_iterator<char>(f), {}); }();
  CHECK(repaired == reference);
  CHECK(optim::latest_checkpoint(dir) == dir + "/epoch_4");
  CHECK(optim::repair_checkpoints(dir).completed.empty());  // nothing left to do

  // A state file that is not one is named, not skipped.
  nn::save_safetensors(dir + "/junk.state.safetensors", m->named_parameters());
  nn::save_safetensors(dir + "/junk.safetensors", m->named_parameters());
  CHECK_THROWS_WITH_AS(optim::latest_checkpoint(dir), doctest::Contains("junk.state.safetensors: not a libminigrad training-state file"), Error);
  CHECK_THROWS_WITH_AS(optim::latest_checkpoint(dir + "/nope"), doctest::Contains("does not exist"), Error);
  std::filesystem::remove_all(dir);
}

// A PyTorch user's habit: the default mean-reduced loss. Under Normalize::samples every step
// would silently be 1/b as long; the tape knows the reduction, so the accumulator refuses it,
// also behind scalar ops, and a micro-batch-normalised accumulator refuses a summed loss.
TEST_CASE("accumulator refuses a loss reduced the wrong way, and says which reduction to use") {
  auto model = small_mlp(5);
  optim::SGD opt(model->parameters(), {.lr = 0.1f});
  Generator g(3);
  Tensor x = Tensor::uniform({6, 784}, -1, 1, g);
  Tensor y = Tensor::from_vector(std::vector<int64_t>{1, 0, 9, 3, 3, 7}, {6});
  {
    optim::Accumulator acc(opt, {.steps = 2});
    CHECK_THROWS_WITH_AS(acc.backward(cross_entropy(model->forward(x), y), 6),
                         doctest::Contains("pass mg::Reduction::sum"), Error);
    CHECK_THROWS_WITH_AS(acc.backward(scale(cross_entropy(model->forward(x), y), 2.0f), 6),
                         doctest::Contains("Reduction::mean (PyTorch's default)"), Error);
    CHECK(acc.pending_micro_batches() == 0);
    acc.backward(cross_entropy(model->forward(x), y, Reduction::sum), 6);  // the right one is taken
    CHECK(acc.pending_micro_batches() == 1);
  }
  opt.zero_grad();
  optim::Accumulator per_mb(opt, {.steps = 2, .normalize = optim::Normalize::micro_batches});
  CHECK_THROWS_WITH_AS(per_mb.backward(cross_entropy(model->forward(x), y, Reduction::sum), 6),
                       doctest::Contains("pass mg::Reduction::mean"), Error);
  per_mb.backward(cross_entropy(model->forward(x), y), 6);
  CHECK(per_mb.pending_micro_batches() == 1);
}

// --accum 2^61 once sized the loss slots as (N + 1) * 8 bytes, which wrapped to 8, and wrote past
// the buffer. The slots are now at most 1024, spilled to the host when full: any N works, and a
// window longer than the slots still reports every micro-batch's loss.
TEST_CASE("accumulator: a huge N costs no memory, and windows longer than the loss slots add up") {
  auto model = small_mlp(6);
  optim::SGD opt(model->parameters(), {.lr = 0.01f});
  Generator g(4);
  Tensor x = Tensor::uniform({2, 784}, -1, 1, g);
  Tensor y = Tensor::from_vector(std::vector<int64_t>{4, 1}, {2});
  for (int64_t steps : {int64_t{1} << 61, std::numeric_limits<int64_t>::max()}) {
    optim::Accumulator acc(opt, {.steps = steps});
    double want = 0;
    for (int k = 0; k < 3; ++k) {
      Tensor loss = cross_entropy(model->forward(x), y, Reduction::sum);
      want += loss.item();
      acc.backward(loss, 2);
    }
    CHECK_FALSE(acc.ready());
    optim::StepInfo info;
    REQUIRE(acc.flush(&info));
    CHECK(info.micro_batches == 3);
    CHECK(info.loss_sum == doctest::Approx(want).epsilon(1e-6));
  }
  optim::Accumulator acc(opt, {.steps = 1500});
  double want = 0;
  for (int k = 0; k < 1500; ++k) {
    Tensor loss = scale(cross_entropy(model->forward(x), y, Reduction::sum), 1.0f + k * 1e-3f);
    want += loss.item();
    acc.add_micro_batch(2, loss.detach());
  }
  REQUIRE(acc.ready());
  const optim::StepInfo info = acc.step();
  CHECK(info.micro_batches == 1500);
  CHECK(info.loss_sum == doctest::Approx(want).epsilon(1e-6));
}

namespace {

// Three SGD steps of an MLP with two dropout layers on 32 samples per step, each step split into
// micro-batches of the given sizes, optionally through a checkpoint plan and sample windows.
std::vector<Tensor> dropout_run(const std::vector<int64_t>& split, bool windows,
                                const std::vector<nn::Segment>& plan = {}) {
  manual_seed(21);
  auto m = std::make_shared<nn::Sequential>();
  m->add<nn::Linear>(20, 64);
  m->add<nn::ReLU>();
  m->add<nn::Dropout>(0.5f);
  m->add<nn::Linear>(64, 64);
  m->add<nn::ReLU>();
  m->add<nn::Dropout>(0.5f);
  m->add<nn::Linear>(64, 10);
  m->train();
  optim::SGD opt(m->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  optim::Accumulator acc(opt, {.steps = static_cast<int64_t>(split.size())});
  const Tensor x = mg::test::rand_tensor({96, 20}, 4);
  const std::vector<float> xs = x.to_vector<float>();
  for (int64_t step = 0; step < 3; ++step) {
    int64_t first = step * 32;
    for (int64_t n : split) {
      Tensor xb = Tensor::from_vector(std::vector<float>(xs.begin() + first * 20, xs.begin() + (first + n) * 20), {n, 20});
      std::vector<int64_t> ys(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) ys[static_cast<size_t>(i)] = (first + i) % 10;
      Tensor loss;
      if (windows) {
        const SampleWindowGuard window = acc.sample_window();
        loss = cross_entropy(nn::forward_with_plan(*m, plan, xb), Tensor::from_vector(ys, {n}), Reduction::sum);
      } else {
        loss = cross_entropy(nn::forward_with_plan(*m, plan, xb), Tensor::from_vector(ys, {n}), Reduction::sum);
      }
      acc.backward(loss, n);
      first += n;
    }
    REQUIRE(acc.ready());
    acc.step();
  }
  return snapshot(*m);
}

}  // namespace

TEST_CASE("dropout by sample: any split of the step's batch draws the masks of the whole batch") {
  // Note [dropout by sample] in minigrad/core/rng.h.
  const std::vector<Tensor> whole = dropout_run({32}, true);
  const double scale = max_abs(whole);
  for (const auto& split : std::vector<std::vector<int64_t>>{{8, 8, 8, 8}, {12, 12, 8}, {1, 31}, {5, 5, 5, 5, 5, 5, 2}}) {
    INFO("split " << split.size() << " micro-batches, the first of " << split[0]);
    CHECK(max_diff(dropout_run(split, true), whole) <= 1e-5 * scale);
  }
  // Checkpointed ranges (each holding a dropout layer) replay the masks of the first pass.
  CHECK(max_diff(dropout_run({8, 8, 8, 8}, true, {{0, 3}, {3, 6}}), whole) <= 1e-5 * scale);
  const std::vector<Tensor> whole_ckpt = dropout_run({32}, true, {{0, 3}, {3, 6}});
  for (size_t i = 0; i < whole.size(); ++i) CHECK(bit_equal(whole_ckpt[i], whole[i]));
  // Without windows the masks follow the split: 4 x 8 is another run than 32 (why this exists).
  const std::vector<Tensor> plain = dropout_run({32}, false);
  CHECK(max_diff(dropout_run({8, 8, 8, 8}, false), plain) > 1e-2 * scale);
  // Windows change which masks are drawn, not how many: the weights differ from the plain run's,
  // and the dropout layers did drop (a run without dropout is another run again).
  CHECK(max_diff(plain, whole) > 1e-2 * scale);
}

TEST_CASE("dropout by sample: the window's key and first sample decide the mask; the generator does not advance") {
  const Tensor x = Tensor::ones({6, 50});
  auto mask_of = [&](uint64_t key, int64_t first) {
    const SampleWindowGuard window(key, first);
    return dropout(x, 0.5f).to_vector<float>();
  };
  const uint64_t offset = default_generator().offset();
  const std::vector<float> a = mask_of(3, 0), b = mask_of(3, 0), c = mask_of(4, 0), d = mask_of(3, 2);
  CHECK(default_generator().offset() == offset);
  CHECK(a == b);
  CHECK(a != c);
  // Sample 2 of the window at first sample 0 is sample 0 of the micro-batch starting at 2.
  CHECK(std::vector<float>(a.begin() + 100, a.end()) == std::vector<float>(d.begin(), d.begin() + 200));
  // The second dropout call of a forward draws a mask of its own.
  {
    const SampleWindowGuard window(3, 0);
    const std::vector<float> first = dropout(x, 0.5f).to_vector<float>(), second = dropout(x, 0.5f).to_vector<float>();
    CHECK(first == a);
    CHECK(first != second);
  }
  CHECK(current_sample_window() == nullptr);
  CHECK_THROWS_WITH_AS(SampleWindowGuard(1, -1), doctest::Contains("first_sample must be >= 0"), Error);
}
