// The joint planner of micro-batch, accumulation and checkpointing (Note [joint plan] in
// minigrad/nn/train_plan.h): its choice against enumeration of every micro-batch and every
// checkpoint plan on made-up profiles, its errors, and a real step under a memory cap of the
// budget, which must fit and give the big batch's gradients.
#include <cmath>
#include <functional>
#include <random>

#include "helpers.h"
#include <minigrad/nn/train_plan.h>
#include <minigrad/optim/accumulate.h>

using namespace mg;

namespace {

// A made-up chain measured at micro-batches 1, 2, 4, ...: bytes grow with b, times are a fixed
// cost per call plus a cost per sample (so larger micro-batches are cheaper per sample).
nn::ChainProfile random_profile(size_t units, int64_t max_b, std::mt19937_64& rng) {
  auto uni = [&](size_t lo, size_t hi) { return std::uniform_int_distribution<size_t>(lo, hi)(rng); };
  struct PerSample {
    size_t out, extra, fwd, bwd;
    bool si, so;
    double call_ms, sample_ms;
  };
  std::vector<PerSample> per(units);
  for (PerSample& u : per) {
    u.out = uni(1, 400);
    u.extra = uni(0, 3) == 0 ? uni(1, 200) : 0;
    u.fwd = u.out + u.extra + uni(0, 300);
    u.bwd = uni(0, 600);
    u.si = uni(0, 1) == 1;
    u.so = uni(0, 2) == 0;
    u.call_ms = static_cast<double>(uni(1, 50)) / 10;
    u.sample_ms = static_cast<double>(uni(1, 50)) / 100;
  }
  const size_t fixed = uni(1000, 5000), input = uni(10, 300);
  nn::ChainProfile p;
  for (int64_t b = 1; b <= max_b; b *= 2) {
    nn::ChainCost c;
    c.num_layers = units;
    c.fixed_bytes = fixed + 8 * static_cast<size_t>(b);
    c.input_bytes = input * static_cast<size_t>(b);
    for (size_t i = 0; i < units; ++i) {
      const PerSample& s = per[i];
      nn::UnitCost u;
      u.begin = i;
      u.end = i + 1;
      u.out_bytes = s.out * static_cast<size_t>(b);
      u.extra_bytes = s.extra * static_cast<size_t>(b);
      u.fwd_peak = s.fwd * static_cast<size_t>(b);
      u.bwd_peak = s.bwd * static_cast<size_t>(b);
      u.saves_input = s.si;
      u.saves_output = s.so;
      u.flops = static_cast<double>(s.out * static_cast<size_t>(b));
      u.forward_ms = s.call_ms + s.sample_ms * static_cast<double>(b);
      u.backward_ms = 2 * u.forward_ms;
      c.units.push_back(u);
    }
    c.head_bytes = 2 * c.units.back().out_bytes + 8;
    p.micro_batches.push_back(b);
    p.costs.push_back(c);
  }
  return p;
}

}  // namespace

TEST_CASE("joint planner: candidate micro-batches split the effective batch evenly") {
  CHECK(nn::candidate_micro_batches(32) == std::vector<int64_t>{1, 2, 4, 8, 16, 32});
  CHECK(nn::candidate_micro_batches(100) == std::vector<int64_t>{1, 2, 4, 7, 13, 25, 50, 100});
  CHECK(nn::candidate_micro_batches(3) == std::vector<int64_t>{1, 2, 3});
  CHECK(nn::candidate_micro_batches(1) == std::vector<int64_t>{1});
  CHECK_THROWS_WITH_AS(nn::candidate_micro_batches(0), doctest::Contains("must be >= 1, got 0"), Error);
}

TEST_CASE("joint planner: the least time per sample of every fitting plan, against enumeration") {
  std::mt19937_64 rng(11);
  int fitted = 0, checkpointed = 0, accumulated = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const size_t units = 2 + rng() % 4;
    const nn::ChainProfile p = random_profile(units, 16, rng);
    const int64_t B = 1 + static_cast<int64_t>(rng() % 24);
    // Budgets from below the least need to above the largest plain peak.
    const size_t lo = nn::min_feasible_peak(p.costs.front()), hi = nn::plan_none(p.costs.back()).predicted_peak;
    const size_t budget = lo / 2 + rng() % (hi + hi / 4 - lo / 2);
    const auto plans = mg::test::all_plans(units);
    double best = INFINITY;
    for (size_t i = 0; i < p.costs.size() && p.micro_batches[i] <= B; ++i) {
      for (const auto& segs : plans) {
        if (nn::predict_peak(p.costs[i], segs) > budget) continue;
        best = std::min(best, nn::predict_step_ms(p, i, segs, B));
      }
    }
    INFO("trial " << trial << ": B " << B << ", budget " << budget);
    if (!std::isfinite(best)) {
      CHECK_THROWS_WITH_AS(nn::plan_training(p, B, budget, {.headroom = 0}), doctest::Contains("no plan fits a budget of"), Error);
      continue;
    }
    const nn::TrainPlan t = nn::plan_training(p, B, budget, {.headroom = 0});
    ++fitted;
    checkpointed += !t.checkpoint.segments.empty();
    accumulated += t.accumulation > 1;
    CHECK(t.predicted_peak <= budget);
    CHECK(t.micro_batch * (t.accumulation - 1) + t.last_micro_batch == B);
    CHECK(t.last_micro_batch >= 1);
    CHECK(t.last_micro_batch <= t.micro_batch);
    CHECK(t.predicted_step_ms == doctest::Approx(best).epsilon(1e-12));
  }
  // The trials cover plans that fit, that checkpoint and that accumulate.
  MESSAGE("fitted " << fitted << ", checkpointed " << checkpointed << ", accumulated " << accumulated);
  CHECK(fitted > 20);
  CHECK(checkpointed > 3);
  CHECK(accumulated > 3);
}

TEST_CASE("joint planner: when nothing fits, the error names the least any plan needs") {
  std::mt19937_64 rng(3);
  const nn::ChainProfile p = random_profile(3, 8, rng);
  const size_t need = nn::min_feasible_peak(p.costs.front());
  const std::string want = "the least any plan needs is " + format_bytes(need) + " (" + std::to_string(need) +
                           " bytes: micro-batch 1 with the 'min' checkpoint plan)";
  CHECK_THROWS_WITH_AS(nn::plan_training(p, 8, need - 1, {.headroom = 0}), doctest::Contains(want.c_str()), Error);
  CHECK(nn::plan_training(p, 8, need, {.headroom = 0}).micro_batch == 1);
  // The default headroom leaves 1/64 of the budget free.
  CHECK_THROWS_WITH_AS(nn::plan_training(p, 8, need), doctest::Contains("less the headroom"), Error);
  const nn::TrainPlan t = nn::plan_training(p, 8, need * 64 / 63 + 1);
  CHECK(t.predicted_peak <= need);
  CHECK_THROWS_WITH_AS(nn::plan_training(p, 8, need, {.headroom = 1}), doctest::Contains("headroom must be in [0, 1)"), Error);
  CHECK_THROWS_WITH_AS(nn::plan_training(p, 0, need), doctest::Contains("effective batch must be >= 1"), Error);
  CHECK_THROWS_WITH_AS(nn::plan_training(nn::ChainProfile{}, 8, need), doctest::Contains("holds no measurement"), Error);
  nn::ChainProfile large = p;  // only micro-batches 4 and 8 measured, for an effective batch of 2
  large.micro_batches.erase(large.micro_batches.begin(), large.micro_batches.begin() + 2);
  large.costs.erase(large.costs.begin(), large.costs.begin() + 2);
  CHECK_THROWS_WITH_AS(nn::plan_training(large, 2, need * 100),
                       doctest::Contains("every micro-batch measured (the smallest is 4) is larger than the effective batch of 2"),
                       Error);
}

TEST_CASE("joint planner: micro-batches the chain cannot train at are skipped, the window's last one too") {
  // ResNet-18/16 at 32x32: its last stage is 1x1, so one image leaves its BatchNorms one value
  // per channel, which training refuses. (vgg_ckpt --model resnet18 --image-size 32
  // --memory-budget ... stopped with that error before, instead of planning at 2 and more.)
  manual_seed(5);
  auto m = nn::make_resnet18(10, 16);
  m->train();
  std::vector<Tensor> buffers;
  for (const auto& [name, t] : m->named_buffers()) buffers.push_back(t.clone());
  const nn::ChainProfile p = nn::profile_chain(*m, {3, 32, 32}, nn::candidate_micro_batches(17));
  CHECK(p.cannot_train == std::vector<int64_t>{1});
  CHECK(p.cannot_train_why.find("more than one value per channel") != std::string::npos);
  CHECK(p.micro_batches == std::vector<int64_t>{2, 3, 5, 9, 17});
  // The model is left as it was: no gradient buffers, the running statistics untouched.
  for (const Tensor& w : m->parameters()) CHECK_FALSE(w.grad().defined());
  const auto after = m->named_buffers();
  for (size_t i = 0; i < buffers.size(); ++i) CHECK(test::bit_equal(after[i].second, buffers[i]));

  const size_t roomy = size_t{1} << 30;
  CHECK(nn::plan_training(p, 17, roomy).last_micro_batch >= 2);
  // Measured 2 and 3: 17 = 8 x 2 + 1 would end on one image, so 3 (5 x 3 + 2) is the plan.
  nn::ChainProfile small = p;
  small.micro_batches.resize(2);
  small.costs.resize(2);
  const nn::TrainPlan t = nn::plan_training(small, 17, roomy);
  CHECK(t.micro_batch == 3);
  CHECK(t.last_micro_batch == 2);
  CHECK(nn::plan_training(small, 16, roomy).micro_batch >= 2);
  // Measured 2 only (a budget that stopped there): 17 has no split; the error says why.
  small.micro_batches.resize(1);
  small.costs.resize(1);
  CHECK_THROWS_WITH_AS(nn::plan_training(small, 17, roomy),
                       doctest::Contains("no measured micro-batch splits the effective batch of 17 into micro-batches the "
                                         "chain can train at; micro-batch 1 cannot train (BatchNorm2d"),
                       Error);
  CHECK(nn::plan_training(small, 16, roomy).micro_batch == 2);
  // No size runs (only 1 asked for), or a second size fails too (a wrong sample shape): the
  // chain's first error comes out.
  CHECK_THROWS_WITH_AS(nn::profile_chain(*m, {3, 32, 32}, {1}), doctest::Contains("more than one value per channel"), Error);
  CHECK_THROWS_WITH_AS(nn::profile_chain(*m, {4, 32, 32}, {2, 4}), doctest::Contains("channels"), Error);
}

TEST_CASE("joint planner: a real step fits the budget under a memory cap, with the big batch's gradients") {
  const Device cpu = Device::cpu();
  manual_seed(7);
  auto m = nn::make_mlp({64, 512, 512, 512, 10});
  optim::SGD opt(m->parameters(), {.lr = 0.0f});
  const int64_t B = 32;
  Tensor x = mg::test::rand_tensor({B, 64}, 5);
  std::vector<int64_t> ys(B);
  for (int64_t i = 0; i < B; ++i) ys[static_cast<size_t>(i)] = i % 10;
  Tensor y = Tensor::from_vector(ys, {B});

  // The gradients of the whole batch at once, with no cap.
  opt.zero_grad();
  cross_entropy(m->forward(x), y, Reduction::sum).backward();
  std::vector<std::vector<float>> want;
  for (const Tensor& g : opt.grads()) want.push_back(g.to_vector<float>());

  // A budget between the floor and the plain step at B: the planner must split or checkpoint.
  const nn::ChainProfile prof = nn::profile_chain(*m, {64}, nn::candidate_micro_batches(B));
  REQUIRE(prof.micro_batches.back() == B);
  const size_t floor = nn::min_feasible_peak(prof.costs.front()), full = nn::plan_none(prof.costs.back()).predicted_peak;
  REQUIRE(floor < full);
  for (double f : {0.2, 0.5, 0.8}) {
    const size_t usable = floor + static_cast<size_t>(static_cast<double>(full - floor) * f);
    const size_t budget = usable * 64 / 63 + 1;  // the default headroom leaves 1/64 free
    const nn::TrainPlan plan = nn::plan_training(prof, B, budget);
    INFO("budget " << budget << ": " << plan.str() << ", predicted peak " << plan.predicted_peak);
    CHECK(plan.predicted_peak <= budget - budget / 64);
    CHECK((plan.accumulation > 1 || !plan.checkpoint.segments.empty()));

    // The step the plan describes, under a cap of the budget: micro-batches of b (the last one
    // shorter), each through the checkpoint plan, accumulated into one step.
    optim::Accumulator acc(opt, {.steps = plan.accumulation});
    opt.zero_grad();
    reset_peak_memory_stats(cpu);
    set_memory_limit(cpu, budget);
    struct Uncap {
      ~Uncap() { set_memory_limit(Device::cpu(), 0); }
    } uncap;
    for (int64_t k = 0; k < plan.accumulation; ++k) {
      const int64_t begin = k * plan.micro_batch, n = std::min(plan.micro_batch, B - begin);
      std::vector<float> xs = x.to_vector<float>();
      Tensor xb = Tensor::from_vector(std::vector<float>(xs.begin() + begin * 64, xs.begin() + (begin + n) * 64), {n, 64});
      Tensor yb = Tensor::from_vector(std::vector<int64_t>(ys.begin() + begin, ys.begin() + begin + n), {n});
      acc.backward(cross_entropy(nn::forward_with_plan(*m, plan.checkpoint, xb), yb, Reduction::sum), n);
    }
    const size_t peak = memory_stats(cpu).peak_in_use;
    set_memory_limit(cpu, 0);
    INFO("measured peak " << peak);
    CHECK(peak <= budget);
    // The cost model's prediction, to within what it leaves out (TrainPlanOptions::headroom).
    CHECK(static_cast<double>(peak) >= 0.99 * static_cast<double>(plan.predicted_peak));
    CHECK(static_cast<double>(peak) <= 1.01 * static_cast<double>(plan.predicted_peak));
    // The summed gradients equal the whole batch's (sums of the same terms in another order).
    const std::vector<Tensor> grads = opt.grads();
    for (size_t i = 0; i < grads.size(); ++i) {
      const std::vector<float> got = grads[i].to_vector<float>();
      double worst = 0, scale = 0;
      for (size_t j = 0; j < got.size(); ++j) {
        worst = std::max(worst, std::abs(static_cast<double>(got[j]) - want[i][j]));
        scale = std::max(scale, std::abs(static_cast<double>(want[i][j])));
      }
      CHECK(worst <= 1e-5 * scale);
    }
    opt.zero_grad();
  }
}

TEST_CASE("joint planner: measuring stops at the first micro-batch over the budget or out of memory") {
  const Device cpu = Device::cpu();
  manual_seed(8);
  auto m = nn::make_mlp({64, 256, 256, 10});
  optim::SGD opt(m->parameters(), {.lr = 0.0f});
  const nn::ChainProfile all = nn::profile_chain(*m, {64}, {1, 2, 4, 8, 16, 32, 64});
  REQUIRE(all.micro_batches.size() == 7);
  CHECK(all.stopped.empty());
  // A budget that micro-batch 8 cannot meet: 1, 2, 4 and 8 are measured, the rest not.
  const size_t budget = nn::min_feasible_peak(all.costs[3]) - 1;
  REQUIRE(nn::min_feasible_peak(all.costs[2]) <= budget);
  const nn::ChainProfile some = nn::profile_chain(*m, {64}, {1, 2, 4, 8, 16, 32, 64}, budget);
  CHECK(some.micro_batches == std::vector<int64_t>{1, 2, 4, 8});
  CHECK(some.stopped.find("micro-batch 8 needs at least") != std::string::npos);
  const nn::TrainPlan t = nn::plan_training(some, 64, budget, {.headroom = 0});
  CHECK(t.micro_batch <= 4);
  CHECK(t.predicted_peak <= budget);
  // Under a cap too small to measure micro-batch 64 at all: measuring stops there, and leaves the
  // gradients and the generator as they were.
  opt.zero_grad();
  for (Tensor g : opt.grads()) g.fill_(0.5f);
  const uint64_t offset = default_generator().offset();
  set_memory_limit(cpu, memory_stats(cpu).in_use + all.costs[4].units[0].fwd_peak + all.costs[4].input_bytes);
  nn::ChainProfile capped;
  {
    struct Uncap {
      ~Uncap() { set_memory_limit(Device::cpu(), 0); }
    } uncap;
    capped = nn::profile_chain(*m, {64}, {1, 2, 4, 8, 16, 32, 64});
  }
  CHECK(capped.micro_batches.size() < 7);
  CHECK(capped.stopped.find("ran out of memory while measured") != std::string::npos);
  CHECK(default_generator().offset() == offset);
  for (const Tensor& g : opt.grads()) {
    const auto v = g.to_vector<float>();
    CHECK(std::all_of(v.begin(), v.end(), [](float e) { return e == 0.5f; }));
  }
}

// Note [joint plan]: each size timed timing_passes times, each unit keeping its least time; the
// bytes are one measurement's (the same in every pass).
TEST_CASE("joint planner: timing passes change the times only") {
  manual_seed(8);
  auto m = nn::make_mlp({64, 256, 256, 10});
  optim::SGD opt(m->parameters(), {.lr = 0.0f});
  const nn::ChainProfile one = nn::profile_chain(*m, {64}, {4, 16});
  const nn::ChainProfile three = nn::profile_chain(*m, {64}, {4, 16}, 0, {.timing_passes = 3});
  REQUIRE(three.micro_batches == one.micro_batches);
  for (size_t i = 0; i < one.costs.size(); ++i) {
    REQUIRE(three.costs[i].units.size() == one.costs[i].units.size());
    CHECK(nn::min_feasible_peak(three.costs[i]) == nn::min_feasible_peak(one.costs[i]));
    for (size_t u = 0; u < one.costs[i].units.size(); ++u) {
      const nn::UnitCost &a = one.costs[i].units[u], &b = three.costs[i].units[u];
      CHECK(b.fwd_peak == a.fwd_peak);
      CHECK(b.out_bytes == a.out_bytes);
      CHECK(b.extra_bytes == a.extra_bytes);
      CHECK(b.forward_ms > 0);
      CHECK(b.backward_ms > 0);
    }
  }
  CHECK_THROWS_WITH_AS(nn::profile_chain(*m, {64}, {4}, 0, {.timing_passes = 0}), doctest::Contains("timing_passes must be >= 1"),
                       Error);
}

namespace {

// An MLP with dropout, and one SGD step of its 32 samples in micro-batches of b through a
// checkpoint plan, with dropout by sample (Note [dropout by sample]).
std::shared_ptr<nn::Sequential> dropout_mlp() {
  manual_seed(9);
  auto m = std::make_shared<nn::Sequential>();
  m->add<nn::Linear>(64, 512);
  m->add<nn::ReLU>();
  m->add<nn::Dropout>(0.3f);
  m->add<nn::Linear>(512, 512);
  m->add<nn::ReLU>();
  m->add<nn::Dropout>(0.3f);
  m->add<nn::Linear>(512, 10);
  m->train();
  return m;
}

void run_window(nn::Sequential& m, optim::Accumulator& acc, const Tensor& x, const std::vector<int64_t>& ys, int64_t b,
                const std::vector<nn::Segment>& plan) {
  const int64_t B = x.size(0), F = x.size(1);
  const std::vector<float> xs = x.to_vector<float>();
  for (int64_t first = 0; first < B; first += b) {
    const int64_t n = std::min(b, B - first);
    Tensor xb = Tensor::from_vector(std::vector<float>(xs.begin() + first * F, xs.begin() + (first + n) * F), {n, F});
    Tensor yb = Tensor::from_vector(std::vector<int64_t>(ys.begin() + first, ys.begin() + first + n), {n});
    Tensor loss;
    {
      const SampleWindowGuard window = acc.sample_window();
      loss = cross_entropy(nn::forward_with_plan(m, plan, xb), yb, Reduction::sum);
    }
    acc.backward(loss, n);
  }
}

}  // namespace

TEST_CASE("joint planner: stop_when_flat measures no size past the first one no faster per sample") {
  manual_seed(8);
  auto m = nn::make_mlp({64, 256, 256, 10});
  const std::vector<int64_t> sizes = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048};
  const nn::ChainProfile p = nn::profile_chain(*m, {64}, sizes, 0, {.stop_when_flat = true});
  auto per_sample = [&](size_t i) {
    double ms = 0;
    for (const nn::UnitCost& u : p.costs[i].units) ms += u.forward_ms + u.backward_ms;
    return ms / static_cast<double>(p.micro_batches[i]);
  };
  REQUIRE(!p.micro_batches.empty());
  CHECK(std::equal(p.micro_batches.begin(), p.micro_batches.end(), sizes.begin()));  // a prefix, in order
  // Every size it went on from was either below 64 or at least 3% faster per sample than the
  // best before it; where it stopped, the last size was neither.
  double best = per_sample(0);
  for (size_t i = 1; i + 1 < p.micro_batches.size(); ++i) {
    CHECK((p.micro_batches[i] < 64 || per_sample(i) <= 0.97 * best));
    best = std::min(best, per_sample(i));
  }
  if (p.micro_batches.size() < sizes.size()) {
    CHECK(p.stopped.find("is no faster per sample than smaller ones") != std::string::npos);
    CHECK(p.micro_batches.back() >= 64);
    CHECK(per_sample(p.micro_batches.size() - 1) > 0.97 * best);
  } else {
    CHECK(p.stopped.empty());
  }
}

TEST_CASE("joint planner: out of memory in a window, discard, re-plan for what is there, redo: the planned step") {
  // Note [recovering from out-of-memory] in minigrad/optim/accumulate.h.
  const Device cpu = Device::cpu();
  const int64_t B = 32;
  const Tensor x = mg::test::rand_tensor({B, 64}, 12);
  std::vector<int64_t> ys(B);
  for (int64_t i = 0; i < B; ++i) ys[static_cast<size_t>(i)] = (i * 7) % 10;
  struct Uncap {
    ~Uncap() { set_memory_limit(Device::cpu(), 0); }
  } uncap;

  // The cap: half-way between the floor and the plain step at 32.
  size_t cap = 0;
  {
    auto m = dropout_mlp();
    optim::SGD opt(m->parameters(), {.lr = 0.05f, .momentum = 0.9f});
    const nn::ChainProfile p = nn::profile_chain(*m, {64}, nn::candidate_micro_batches(B));
    const size_t floor = nn::min_feasible_peak(p.costs.front()), full = nn::plan_none(p.costs.back()).predicted_peak;
    REQUIRE(floor < full);
    cap = (floor + full) / 2;
  }

  // Run A starts with the plain step at 32 under the cap, runs out of memory, and recovers.
  std::vector<std::vector<float>> wa;
  std::string recovered;
  {
    auto a = dropout_mlp();
    optim::SGD opt_a(a->parameters(), {.lr = 0.05f, .momentum = 0.9f});
    optim::Accumulator acc_a(opt_a, {.steps = 1});
    set_memory_limit(cpu, cap);
    bool ran_out = false;
    try {
      run_window(*a, acc_a, x, ys, B, {});
    } catch (const OutOfMemoryError&) {
      ran_out = true;
    }
    REQUIRE(ran_out);
    CHECK(acc_a.pending_micro_batches() == 0);  // the failed micro-batch was never recorded
    acc_a.discard();
    for (const Tensor& g : opt_a.grads()) {
      const auto v = g.to_vector<float>();
      CHECK(std::all_of(v.begin(), v.end(), [](float e) { return e == 0.0f; }));
    }
    CHECK(opt_a.step_count() == 0);
    const size_t there = memory_capacity(cpu);
    CHECK(there == cap);
    const nn::TrainPlan ra = nn::plan_training(*a, {64}, B, there);
    CHECK(ra.predicted_peak <= cap);
    acc_a.set_steps(ra.accumulation);
    run_window(*a, acc_a, x, ys, ra.micro_batch, ra.checkpoint.segments);
    acc_a.step();
    CHECK(opt_a.step_count() == 1);
    set_memory_limit(cpu, 0);
    recovered = ra.str();
    for (const Tensor& p : a->parameters()) wa.push_back(p.to_vector<float>());
  }

  // Run B plans for the cap from the start.
  std::vector<std::vector<float>> wb;
  std::string planned;
  {
    auto b = dropout_mlp();
    optim::SGD opt_b(b->parameters(), {.lr = 0.05f, .momentum = 0.9f});
    set_memory_limit(cpu, cap);
    const nn::TrainPlan rb = nn::plan_training(*b, {64}, B, memory_capacity(cpu));
    optim::Accumulator acc_b(opt_b, {.steps = rb.accumulation});
    run_window(*b, acc_b, x, ys, rb.micro_batch, rb.checkpoint.segments);
    acc_b.step();
    set_memory_limit(cpu, 0);
    planned = rb.str();
    for (const Tensor& p : b->parameters()) wb.push_back(p.to_vector<float>());
  }

  INFO("recovered: " << recovered << "; planned: " << planned);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < wa.size(); ++i) {
    for (size_t j = 0; j < wa[i].size(); ++j) {
      worst = std::max(worst, std::abs(static_cast<double>(wa[i][j]) - wb[i][j]));
      scale = std::max(scale, std::abs(static_cast<double>(wb[i][j])));
    }
  }
  CHECK(worst <= 1e-5 * scale);
  // Dropout was on: a step with other masks would differ by far more.
  CHECK(scale > 0);
}

namespace {
// A Sequential run through a checkpoint plan that can change between micro-batches.
class Planned : public nn::Module {
 public:
  explicit Planned(nn::Sequential& seq) : seq_(seq) {}
  Tensor forward(const Tensor& x) override { return nn::forward_with_plan(seq_, segments, x); }
  std::string name() const override { return "Planned"; }
  std::vector<nn::Segment> segments;

 private:
  nn::Sequential& seq_;
};
}  // namespace

TEST_CASE("train_epoch: out of memory mid-epoch, re-planned by on_out_of_memory, the window redone: the same epoch") {
  // Note [recovering from out-of-memory]: 96 samples, windows of 32 (micro-batch 32, N = 1). After
  // the first step the device is capped below the plain step at 32: the second window runs out of
  // memory, train_epoch drops it, the callback plans jointly for what is there, and the epoch goes
  // on in the new micro-batches from the second window's first sample. The weights end as those of
  // the uncapped epoch, to float rounding (dropout on, by sample).
  const Device cpu = Device::cpu();
  const int64_t n = 96, B = 32;
  std::vector<int64_t> ys(n);
  for (int64_t i = 0; i < n; ++i) ys[static_cast<size_t>(i)] = (i * 7) % 10;
  data::TensorDataset set(mg::test::rand_tensor({n, 64}, 13), Tensor::from_vector(ys, {n}));
  struct Uncap {
    ~Uncap() { set_memory_limit(Device::cpu(), 0); }
  } uncap;

  auto train = [&](bool capped, std::vector<std::string>* replans) {
    auto m = dropout_mlp();
    Planned planned(*m);
    optim::SGD opt(m->parameters(), {.lr = 0.05f, .momentum = 0.9f});
    optim::Accumulator acc(opt, {.steps = 1});
    data::DataLoader loader(set, {.batch_size = B, .seed = 4});
    optim::TrainCallbacks cb;
    int64_t steps = 0;
    cb.on_step = [&](const optim::StepInfo&) {
      if (++steps != 1 || !capped) return;
      const nn::ChainProfile p = nn::profile_chain(*m, {64}, nn::candidate_micro_batches(B));
      const size_t floor = nn::min_feasible_peak(p.costs.front()), full = nn::plan_none(p.costs.back()).predicted_peak;
      REQUIRE(floor < full);
      set_memory_limit(cpu, (floor + full) / 2);
    };
    cb.on_out_of_memory = [&](const OutOfMemoryError&, int64_t b) {
      const nn::TrainPlan tp = nn::plan_training(*m, {64}, B, memory_capacity(cpu), {.micro_batches = {1, 2, 4, 8, 16}});
      planned.segments = tp.checkpoint.segments;
      replans->push_back("from " + std::to_string(b) + " to " + tp.str());
      return tp.micro_batch;
    };
    const optim::EpochStats st = optim::train_epoch(planned, loader, acc, 0, {}, cb);
    set_memory_limit(cpu, 0);
    CHECK(st.samples == n);
    CHECK(st.optimizer_steps == 3);
    CHECK(opt.step_count() == 3);
    if (capped) {
      CHECK(loader.options().batch_size < B);
      CHECK(acc.steps() * loader.options().batch_size == B);
    }
    std::vector<std::vector<float>> w;
    for (const Tensor& p : m->parameters()) w.push_back(p.to_vector<float>());
    return w;
  };
  std::vector<std::string> replans;
  const auto ref = train(false, &replans);
  REQUIRE(replans.empty());
  const auto got = train(true, &replans);
  REQUIRE(replans.size() == 1);
  INFO("re-planned " << replans[0]);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    for (size_t j = 0; j < ref[i].size(); ++j) {
      worst = std::max(worst, std::abs(static_cast<double>(ref[i][j]) - got[i][j]));
      scale = std::max(scale, std::abs(static_cast<double>(ref[i][j])));
    }
  }
  CHECK(worst <= 1e-5 * scale);

  // A size that does not divide the window is refused with a clear error.
  auto m = dropout_mlp();
  optim::SGD opt(m->parameters(), {.lr = 0.05f});
  optim::Accumulator acc(opt, {.steps = 1});
  data::DataLoader loader(set, {.batch_size = B, .seed = 4});
  optim::TrainCallbacks cb;
  // Room for the next batch (8 KiB of inputs), not for its forward.
  cb.on_step = [&](const optim::StepInfo&) { set_memory_limit(cpu, memory_stats(cpu).in_use + 16 * 1024); };
  cb.on_out_of_memory = [](const OutOfMemoryError&, int64_t) { return int64_t{5}; };
  CHECK_THROWS_WITH_AS(optim::train_epoch(*m, loader, acc, 0, {}, cb),
                       doctest::Contains("returned micro-batch 5, which does not divide the window of 32 samples"), Error);
}

TEST_CASE("train_epoch: a window redone after out of memory counts once in BatchNorm's running statistics") {
  // The failed try's forward had already moved the running statistics (and the batch count):
  // train_epoch puts them back to the window's start before it is redone.
  const Device cpu = Device::cpu();
  const int64_t n = 96, B = 32;
  std::vector<int64_t> ys(n);
  for (int64_t i = 0; i < n; ++i) ys[static_cast<size_t>(i)] = (i * 3) % 10;
  data::TensorDataset set(mg::test::rand_tensor({n, 64}, 17), Tensor::from_vector(ys, {n}));
  struct Uncap {
    ~Uncap() { set_memory_limit(Device::cpu(), 0); }
  } uncap;
  manual_seed(5);
  nn::Sequential m;
  m.add<nn::Linear>(64, 1024);
  m.add<nn::BatchNorm>(1024, 2);
  m.add<nn::ReLU>();
  m.add<nn::Linear>(1024, 1024);
  m.add<nn::ReLU>();
  m.add<nn::Linear>(1024, 10);
  m.train();
  optim::SGD opt(m.parameters(), {.lr = 0.05f});
  optim::Accumulator acc(opt, {.steps = 1});
  data::DataLoader loader(set, {.batch_size = B, .seed = 4});
  const nn::ChainCost c = nn::measure_chain(m, {B, 64});
  // The cap: 90% of what a step needs beyond what is held between steps, so that the second
  // window runs out of memory late, after its BatchNorm ran.
  const size_t step_bytes = nn::plan_none(c).predicted_peak - c.fixed_bytes;
  optim::TrainCallbacks cb;
  int64_t steps = 0, ran_out = 0;
  cb.on_step = [&](const optim::StepInfo&) {
    if (++steps == 1) set_memory_limit(cpu, memory_stats(cpu).in_use + step_bytes * 9 / 10);
  };
  cb.on_out_of_memory = [&](const OutOfMemoryError&, int64_t) {
    ++ran_out;
    set_memory_limit(cpu, 0);
    return int64_t{8};
  };
  optim::train_epoch(m, loader, acc, 0, {}, cb);
  REQUIRE(ran_out == 1);
  const auto* bn = dynamic_cast<const nn::BatchNorm*>(&m[1]);
  REQUIRE(bn != nullptr);
  CHECK(bn->num_batches_tracked() == 1 + 2 * (B / 8));  // window 1 in one batch, windows 2 and 3 in four
}

TEST_CASE("joint planner: at a budget of exactly the least it names, measuring and the step fit under a cap") {
  // Measuring holds no more than the step it measures (the unit's output waits in host memory
  // during its backward, an input nothing keeps is dropped, the input gradient is not copied), so
  // the least need the planner names is a budget it can plan under a cap of that budget. (Before,
  // measuring micro-batch 1 ran out of memory here, one activation over.)
  const Device cpu = Device::cpu();
  struct Uncap {
    ~Uncap() { set_memory_limit(Device::cpu(), 0); }
  } uncap;
  auto m = dropout_mlp();
  optim::SGD opt(m->parameters(), {.lr = 0.05f, .momentum = 0.9f});
  const nn::ChainProfile p = nn::profile_chain(*m, {64}, {1});
  const size_t need = nn::min_feasible_peak(p.costs.front());
  const size_t budget = need;  // no headroom: the cap is the least need, to the byte
  set_memory_limit(cpu, budget);
  const nn::TrainPlan tp = nn::plan_training(*m, {64}, 32, budget, {.headroom = 0});
  CHECK(tp.micro_batch == 1);
  CHECK(tp.predicted_peak <= budget);
  optim::Accumulator acc(opt, {.steps = tp.accumulation});
  const Tensor x = mg::test::rand_tensor({32, 64}, 12);
  std::vector<int64_t> ys(32);
  for (int64_t i = 0; i < 32; ++i) ys[static_cast<size_t>(i)] = (i * 7) % 10;
  // The step itself gets the default headroom: the cost model leaves out allocations of bytes to
  // kilobytes (the micro-batch's inputs, the loss), which is what the headroom is for.
  set_memory_limit(cpu, budget + budget / 64);
  reset_peak_memory_stats(cpu);
  run_window(*m, acc, x, ys, tp.micro_batch, tp.checkpoint.segments);
  acc.step();
  CHECK(memory_stats(cpu).peak_in_use <= budget + budget / 64);
}
