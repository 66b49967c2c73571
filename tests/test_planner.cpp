// The checkpoint planner (Note [checkpoint cost model] in minigrad/nn/checkpoint_plan.h): the dynamic
// programme against enumeration of every plan on random chains, the measured peak of real
// training steps against the prediction, and the errors (budgets, sizes, specs).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "helpers.h"
#include <minigrad/nn/checkpoint_plan.h>

using namespace mg;

namespace {

// A random chain of n one-layer units with random activation sizes, keeps, workspaces and costs.
nn::ChainCost random_chain(size_t n, std::mt19937_64& rng) {
  auto uni = [&](size_t lo, size_t hi) { return std::uniform_int_distribution<size_t>(lo, hi)(rng); };
  nn::ChainCost c;
  c.num_layers = n;
  c.fixed_bytes = uni(0, 5000);
  c.input_bytes = uni(10, 3000);
  c.input_requires_grad = uni(0, 1) == 1;
  for (size_t i = 0; i < n; ++i) {
    nn::UnitCost u;
    u.begin = i;
    u.end = i + 1;
    u.out_bytes = uni(1, 4000);
    u.extra_bytes = uni(0, 3) == 0 ? uni(1, 2000) : 0;
    u.saves_input = uni(0, 1) == 1;
    u.saves_output = uni(0, 2) == 0;
    u.fwd_peak = u.out_bytes + u.extra_bytes + (uni(0, 1) ? uni(0, 5000) : 0);
    u.bwd_peak = uni(0, 6000);
    u.flops = static_cast<double>(uni(1, 1000));
    c.units.push_back(u);
  }
  c.head_bytes = 2 * c.units.back().out_bytes + 8;
  return c;
}

}  // namespace

TEST_CASE("planner: the dynamic programme is optimal against enumeration on random chains") {
  std::mt19937_64 rng(2024);
  int budgets_checked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const size_t n = 1 + trial % 8;
    const nn::ChainCost c = random_chain(n, rng);
    const auto plans = mg::test::all_plans(n);
    size_t min_peak = std::numeric_limits<size_t>::max(), max_peak = 0;
    std::vector<std::pair<size_t, double>> scored;
    for (const auto& p : plans) {
      const size_t peak = nn::predict_peak(c, p);
      scored.push_back({peak, nn::recompute_flops(c, p)});
      min_peak = std::min(min_peak, peak);
      max_peak = std::max(max_peak, peak);
    }
    INFO("trial " << trial << ", " << n << " units, " << plans.size() << " plans");
    CHECK(nn::min_feasible_peak(c) == min_peak);
    CHECK(nn::plan_min_peak(c).predicted_peak == min_peak);
    // Budgets from the minimum to above every plan's peak, including exact plan peaks.
    std::vector<size_t> budgets = {min_peak, max_peak, max_peak + 1000};
    for (int k = 0; k < 6; ++k) budgets.push_back(scored[rng() % scored.size()].first);
    for (int k = 0; k < 4; ++k) budgets.push_back(min_peak + (max_peak - min_peak) * (k + 1) / 5);
    for (size_t budget : budgets) {
      double best = std::numeric_limits<double>::infinity();
      for (const auto& [peak, flops] : scored) {
        if (peak <= budget) best = std::min(best, flops);
      }
      const nn::Plan p = nn::plan_budget(c, budget);
      INFO("budget " << budget << ", plan " << p.str());
      CHECK(p.predicted_peak <= budget);
      CHECK(p.predicted_peak == nn::predict_peak(c, p.segments));
      CHECK(p.recompute_flops == best);
      ++budgets_checked;
    }
    const std::string floor_text = "(" + std::to_string(min_peak) + " bytes)";
    CHECK_THROWS_WITH_AS(nn::plan_budget(c, min_peak - 1), doctest::Contains(floor_text.c_str()), Error);
  }
  CHECK(budgets_checked > 500);
}

TEST_CASE("planner: with tiled segments, still optimal against enumeration on random chains") {
  // The chain at 8 rows and, scaled down, at 2 and 4 (Note [tiled segments]); some units cannot
  // run in tiles. Every plan: every segmentation, each segment whole or in either tile size.
  std::mt19937_64 rng(77);
  int budgets_checked = 0, tiled_chosen = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const size_t n = 1 + trial % 6;
    nn::ChainCost c = random_chain(n, rng);
    c.rows = 8;
    for (nn::UnitCost& u : c.units) u.tiles = rng() % 4 != 0;
    for (int64_t r : {2, 4}) {
      nn::ChainCost t = c;
      auto scale = [&](size_t b) { return b * static_cast<size_t>(r) / 8 + rng() % 7; };  // not exactly linear
      t.rows = r;
      t.input_bytes = c.input_bytes * static_cast<size_t>(r) / 8;
      for (nn::UnitCost& u : t.units) {
        u.out_bytes = scale(u.out_bytes);
        u.extra_bytes = u.extra_bytes ? scale(u.extra_bytes) : 0;
        u.fwd_peak = u.out_bytes + u.extra_bytes + scale(u.fwd_peak);
        u.bwd_peak = scale(u.bwd_peak);
        u.flops = u.flops * static_cast<double>(r) / 8 * 1.25;  // tiles run slower per sample
      }
      c.tile_costs.push_back(std::move(t));
    }
    std::vector<std::vector<nn::Segment>> plans;
    for (const auto& base : mg::test::all_plans(n)) {
      std::vector<std::vector<nn::Segment>> grown{{}};
      for (const nn::Segment& g : base) {
        bool tileable = true;
        for (size_t u = g.begin; u < g.end; ++u) tileable &= c.units[u].tiles;
        std::vector<std::vector<nn::Segment>> next;
        for (const auto& p : grown) {
          for (int64_t r : {0, 2, 4}) {
            if (r && !tileable) continue;
            next.push_back(p);
            next.back().push_back({g.begin, g.end, r});
          }
        }
        grown = std::move(next);
      }
      plans.insert(plans.end(), grown.begin(), grown.end());
    }
    size_t min_peak = std::numeric_limits<size_t>::max(), max_peak = 0;
    std::vector<std::pair<size_t, double>> scored;
    for (const auto& p : plans) {
      const size_t peak = nn::predict_peak(c, p);
      scored.push_back({peak, nn::recompute_flops(c, p)});
      min_peak = std::min(min_peak, peak);
      max_peak = std::max(max_peak, peak);
    }
    INFO("trial " << trial << ", " << n << " units, " << plans.size() << " plans");
    CHECK(nn::min_feasible_peak(c) == min_peak);
    std::vector<size_t> budgets = {min_peak, max_peak};
    for (int k = 0; k < 8; ++k) budgets.push_back(scored[rng() % scored.size()].first);
    for (size_t budget : budgets) {
      double best = std::numeric_limits<double>::infinity();
      for (const auto& [peak, flops] : scored) {
        if (peak <= budget) best = std::min(best, flops);
      }
      const nn::Plan p = nn::plan_budget(c, budget);
      INFO("budget " << budget << ", plan " << p.str());
      CHECK(p.predicted_peak <= budget);
      CHECK(p.predicted_peak == nn::predict_peak(c, p.segments));
      CHECK(p.recompute_flops == best);
      for (const nn::Segment& g : p.segments) tiled_chosen += g.tile_rows > 0;
      ++budgets_checked;
    }
  }
  CHECK(budgets_checked > 300);
  CHECK(tiled_chosen > 10);  // tiles are what fits some of these budgets
}

namespace {

// Every segmentation of the chain, each segment replayed or offloaded.
std::vector<std::vector<nn::Segment>> plans_with_offload(size_t n) {
  std::vector<std::vector<nn::Segment>> out;
  for (const auto& base : mg::test::all_plans(n)) {
    std::vector<std::vector<nn::Segment>> grown{{}};
    for (const nn::Segment& g : base) {
      std::vector<std::vector<nn::Segment>> next;
      for (const auto& p : grown) {
        for (bool off : {false, true}) {
          next.push_back(p);
          next.back().push_back({g.begin, g.end, 0, off});
        }
      }
      grown = std::move(next);
    }
    out.insert(out.end(), grown.begin(), grown.end());
  }
  return out;
}

// The planner's objective for a plan: recomputed FLOPs, plus the offload's copy time at the
// chain's forward rate (FLOPs per millisecond).
double plan_cost(const nn::ChainCost& c, const std::vector<nn::Segment>& p) {
  double flops = 0, ms = 0;
  for (const nn::UnitCost& u : c.units) flops += u.flops, ms += u.forward_ms;
  return nn::recompute_flops(c, p) + nn::offload_ms(c, p) * flops / ms;
}

}  // namespace

TEST_CASE("planner: with offload, still optimal against enumeration on random chains, host cap and overlap included") {
  std::mt19937_64 rng(31);
  int budgets_checked = 0, offloaded = 0, replayed = 0, capped_by_host = 0, hidden = 0;
  for (int trial = 0; trial < 48; ++trial) {
    const size_t n = 1 + trial % 7;
    nn::ChainCost c = random_chain(n, rng);
    for (nn::UnitCost& u : c.units) {
      u.forward_ms = u.flops / 100.0;  // 100 FLOPs per millisecond
      u.backward_ms = 2 * u.forward_ms;
    }
    // Copies that cost about as much as recomputing: bytes per millisecond each way; every other
    // chain's copies run beside compute (CUDA), hidden where the schedule has compute to hide them.
    c.to_host_bytes_per_ms = 100.0 + static_cast<double>(rng() % 900);
    c.from_host_bytes_per_ms = 100.0 + static_cast<double>(rng() % 900);
    c.copies_overlap = trial % 2 == 1;
    REQUIRE(nn::offload_offered(c));
    if (trial % 3 == 2) {  // a host cap below what the cheapest plan offloads at some budget
      const size_t lo = nn::min_feasible_peak(c), hi = nn::plan_none(c).predicted_peak;
      size_t host = 0;
      for (int k = 0; k <= 8 && host == 0; ++k) host = nn::plan_budget(c, lo + (hi - lo) * static_cast<size_t>(k) / 8).predicted_host_peak;
      c.host_limit = std::max<size_t>(1, host / 2);
    }
    const auto plans = plans_with_offload(n);
    size_t min_peak = std::numeric_limits<size_t>::max(), max_peak = 0;
    struct Scored {
      size_t peak, host;
      double cost;
    };
    std::vector<Scored> scored;
    for (const auto& p : plans) {
      const size_t host = nn::predict_host_peak(c, p);
      if (c.host_limit != 0 && host > c.host_limit) continue;
      scored.push_back({nn::predict_peak(c, p), host, plan_cost(c, p)});
      min_peak = std::min(min_peak, scored.back().peak);
      max_peak = std::max(max_peak, scored.back().peak);
    }
    INFO("trial " << trial << ", " << n << " units, " << scored.size() << " plans within the host cap " << c.host_limit);
    CHECK(nn::min_feasible_peak(c) == min_peak);
    std::vector<size_t> budgets = {min_peak, max_peak};
    for (int k = 0; k < 8; ++k) budgets.push_back(scored[rng() % scored.size()].peak);
    for (size_t budget : budgets) {
      double best = std::numeric_limits<double>::infinity();
      for (const Scored& x : scored) {
        if (x.peak <= budget) best = std::min(best, x.cost);
      }
      const nn::Plan p = nn::plan_budget(c, budget);
      INFO("budget " << budget << ", plan " << p.str());
      CHECK(p.predicted_peak <= budget);
      CHECK(p.predicted_peak == nn::predict_peak(c, p.segments));
      CHECK(p.predicted_host_peak == nn::predict_host_peak(c, p.segments));
      if (c.host_limit != 0) CHECK(p.predicted_host_peak <= c.host_limit);
      CHECK(plan_cost(c, p.segments) == doctest::Approx(best).epsilon(1e-9));
      for (const nn::Segment& g : p.segments) (g.offload ? offloaded : replayed) += 1;
      if (c.copies_overlap && p.predicted_host_peak > 0) {
        nn::ChainCost serial = c;
        serial.copies_overlap = false;
        hidden += p.offload_ms < nn::offload_ms(serial, p.segments);
      }
      ++budgets_checked;
    }
    capped_by_host += c.host_limit > 1;
  }
  CHECK(budgets_checked > 300);
  CHECK(offloaded > 20);  // both choices are what some budgets call for
  CHECK(replayed > 20);
  CHECK(capped_by_host > 0);
  CHECK(hidden > 0);  // some chosen plans' copies ran beside compute, in part or whole
}

TEST_CASE("planner: chains whose best plan keeps, recomputes and offloads") {
  // Random chains of 8 units with a host link: under some budgets the least-cost plan (optimal, as
  // the test above checks against enumeration) leaves units plain, replays some and offloads others.
  // Offload pays less than it would without its schedule's memory (Note [offload schedule]: the
  // last offloaded segment comes back during the loss's backward), so such budgets are rare.
  std::mt19937_64 rng(8);
  int mixed = 0;
  for (int trial = 0; trial < 160; ++trial) {
    nn::ChainCost c = random_chain(8, rng);
    for (nn::UnitCost& u : c.units) u.forward_ms = u.flops / 100.0;
    c.to_host_bytes_per_ms = c.from_host_bytes_per_ms = 40.0 * static_cast<double>(1 + trial % 4);
    const size_t lo = nn::min_feasible_peak(c), hi = nn::plan_none(c).predicted_peak;
    for (int k = 0; k <= 20; ++k) {
      const nn::Plan p = nn::plan_budget(c, lo + (hi - lo) * static_cast<size_t>(k) / 20);
      bool off = false, replay = false;
      size_t covered = 0;
      for (const nn::Segment& g : p.segments) {
        (g.offload ? off : replay) = true;
        covered += g.end - g.begin;
      }
      if (off && replay && covered < 8 && p.predicted_host_peak > 0) {
        if (mixed == 0) MESSAGE("trial " << trial << ": " << p.str() << " (host " << p.predicted_host_peak << " bytes)");
        ++mixed;
      }
    }
  }
  CHECK(mixed > 0);
}

TEST_CASE("planner: sizes and plan specs") {
  CHECK(nn::parse_bytes("512MB") == 512'000'000u);
  CHECK(nn::parse_bytes("1.5GiB") == 1'610'612'736u);
  CHECK(nn::parse_bytes("100000") == 100000u);
  CHECK(nn::parse_bytes(" 64 KiB ") == 65536u);
  CHECK(nn::parse_bytes("3mib") == 3u * 1024 * 1024);
  CHECK(nn::parse_bytes("2kB") == 2000u);
  CHECK(nn::parse_bytes("7B") == 7u);
  CHECK(nn::parse_bytes(".5MB") == 500'000u);
  for (const char* bad : {"", "MB", "abc", "-5MB", "5XB", "1.5.2MB", "0", "0.1", "12 M B", "1e9"}) {
    INFO("'" << bad << "'");
    CHECK_THROWS_AS(nn::parse_bytes(bad), Error);
  }
  CHECK_THROWS_WITH_AS(nn::parse_bytes("5XB"), doctest::Contains("unknown unit 'XB'"), Error);
  // Found by fuzz/fuzz_parse_bytes.cpp: sizes past a long long came back as 2^63, and a number
  // too long for a double threw std::out_of_range instead of mg::Error.
  CHECK(nn::parse_bytes("16000000000000000000") == 16'000'000'000'000'000'000u);
  CHECK(nn::parse_bytes("10000000 TB") == 10'000'000'000'000'000'000u);
  CHECK_THROWS_WITH_AS(nn::parse_bytes(std::string(400, '9')), doctest::Contains("too large"), Error);

  std::mt19937_64 rng(7);
  const nn::ChainCost c = random_chain(6, rng);
  for (const char* bad : {"segments=0", "segments=x", "segments=", "segments=7", "budget=", "budget=lots",
                          "foo", "sqrt2", ""}) {
    INFO("'" << bad << "'");
    CHECK_THROWS_AS(nn::make_plan(c, bad), Error);
  }
  // The spelling alone, before any costs (the apps check --checkpoint so before they measure).
  for (const char* bad : {"segments=x", "segments=", "budget=", "budget=lots", "foo", "sqrt2", ""}) {
    INFO("'" << bad << "'");
    CHECK_THROWS_AS(nn::check_plan_spec(bad), Error);
  }
  for (const char* good : {"none", "sqrt", "min", "segments=3", "budget=10MB"}) CHECK_NOTHROW(nn::check_plan_spec(good));
  CHECK(nn::make_plan(c, "none").segments.empty());
  CHECK(nn::make_plan(c, "segments=3").segments == std::vector<nn::Segment>{{0, 2}, {2, 4}});
  CHECK(nn::make_plan(c, "sqrt").segments == nn::pytorch_segments(6, 2));
  CHECK(nn::make_plan(c, "budget=1GB").budget == 1'000'000'000u);
  // The segments spelled out, as Plan::str() prints them, read back.
  const std::vector<nn::Segment> listed = {{0, 2, 0, true}, {2, 3, 4}, {4, 6}};
  const nn::Plan given = nn::make_plan(c, "[0,2)@host [2,3)/4 [4,6)");
  CHECK(given.segments == listed);
  CHECK(given.kind == "given");
  CHECK(given.str() == "[0,2)@host [2,3)/4 [4,6)");
  CHECK(nn::make_plan(c, given.str()).segments == listed);
  for (const char* bad : {"[0,2", "[2,0)", "[0,2)[2,3)", "[0,2)/0", "[0,2)/4@host", "[0,3) [2,4)", "[a,2)", "[0,2)@hos",
                          "[0,2) x"}) {
    INFO("'" << bad << "'");
    CHECK_THROWS_WITH_AS(nn::check_plan_spec(bad), doctest::Contains("expected segments such as"), Error);
  }
  CHECK_THROWS_WITH_AS(nn::make_plan(c, "[0,9)"), doctest::Contains("within [0, 6)"), Error);
}

namespace {

// Conv stages at one resolution (3x3, then pointwise), pools, a classifier: enough activations
// before the first backward that checkpointing pays, as in VGG.
std::shared_ptr<nn::Sequential> small_vgg_like() {
  auto m = std::make_shared<nn::Sequential>();
  m->add<nn::Conv2d>(3, 8, 3, 1, 1);
  m->add<nn::ReLU>();
  for (int i = 0; i < 3; ++i) {
    m->add<nn::Conv2d>(8, 8, 1);
    m->add<nn::ReLU>();
  }
  m->add<nn::MaxPool2d>(2);
  m->add<nn::Conv2d>(8, 16, 3, 1, 1);
  m->add<nn::ReLU>();
  m->add<nn::MaxPool2d>(2);
  m->add<nn::AdaptiveAvgPool2d>(3, 3);
  m->add<nn::Flatten>();
  m->add<nn::Linear>(144, 32);
  m->add<nn::ReLU>();
  m->add<nn::Dropout>(0.5f);
  m->add<nn::Linear>(32, 2);
  return m;
}

// Peak in use over one SGD training step with the plan (the optimizer's buffers exist already).
size_t measured_step_peak(nn::Sequential& m, optim::SGD& opt, const std::vector<nn::Segment>& plan,
                          const Shape& in_shape, int64_t classes) {
  const Device cpu = Device::cpu();
  Tensor x = mg::test::rand_tensor(in_shape, 31);
  std::vector<int64_t> t(static_cast<size_t>(in_shape[0]));
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int64_t>(i) % classes;
  Tensor target = Tensor::from_vector(t, {in_shape[0]});
  reset_peak_memory_stats(cpu);
  opt.zero_grad();
  {
    Tensor loss = cross_entropy(nn::forward_with_plan(m, plan, x), target);
    loss.backward();
    opt.step();
  }
  return memory_stats(cpu).peak_in_use;
}

void check_predictions(nn::Sequential& m, const Shape& in_shape, int64_t classes, bool tiles) {
  optim::SGD opt(m.parameters(), {.lr = 0.001f, .momentum = 0.9f});
  const nn::ChainCost cost = nn::measure_chain(m, in_shape, {.tile_rows = nn::tile_rows_below(in_shape[0])});
  std::vector<nn::Plan> plans = {nn::plan_none(cost), nn::plan_sqrt(cost), nn::plan_segments(cost, 2),
                                 nn::plan_segments(cost, 3), nn::plan_min_peak(cost)};
  // Tiled: the first tileable units in tiles of each measured size (none in an MLP: linear
  // layers do not run in tiles).
  size_t tileable = 0;
  while (tileable < cost.units.size() && cost.units[tileable].tiles) ++tileable;
  CHECK(tileable >= (tiles ? 2 : 0));
  CHECK(cost.tile_costs.size() == static_cast<size_t>(std::log2(static_cast<double>(in_shape[0]) - 1)) + 1);
  for (const nn::ChainCost& t : cost.tile_costs) {
    for (size_t e : {size_t{1}, tileable / 2, tileable}) {
      if (e == 0 || e > tileable) continue;
      nn::Plan p;
      p.kind = "tiled";
      p.segments = {{0, cost.units[e - 1].end, t.rows}};
      p.predicted_peak = nn::predict_peak(cost, p.segments);
      plans.push_back(p);
    }
  }
  const size_t lo = nn::min_feasible_peak(cost), hi = nn::plan_none(cost).predicted_peak;
  for (double f : {0.3, 0.7}) plans.push_back(nn::plan_budget(cost, lo + static_cast<size_t>((hi - lo) * f)));
  // A few arbitrary segmentations on unit boundaries too.
  std::mt19937_64 rng(5);
  for (int k = 0; k < 4; ++k) {
    nn::Plan p;
    p.kind = "random";
    size_t u = rng() % 3;
    while (u < cost.units.size()) {
      const size_t e = std::min(cost.units.size(), u + 1 + rng() % 4);
      p.segments.push_back({cost.units[u].begin, cost.units[e - 1].end});
      u = e + rng() % 3;
    }
    p.predicted_peak = nn::predict_peak(cost, p.segments);
    plans.push_back(p);
  }
  for (const nn::Plan& p : plans) {
    const size_t measured = measured_step_peak(m, opt, p.segments, in_shape, classes);
    const double ratio = static_cast<double>(measured) / static_cast<double>(p.predicted_peak);
    INFO("plan " << p.kind << " " << p.str() << ": predicted " << p.predicted_peak << ", measured " << measured);
    CHECK(ratio > 0.9);
    CHECK(ratio < 1.1);
    if (p.budget) CHECK(measured <= p.budget + p.budget / 10);
  }
  // Checkpointing buys something on these chains, and the floor is above the fixed part.
  CHECK(lo < hi);
  CHECK(lo > cost.fixed_bytes);
}

}  // namespace

TEST_CASE("planner: measured peak of a training step is within 10% of the prediction (small VGG-like CNN)") {
  manual_seed(1);
  auto m = small_vgg_like();
  m->train();
  check_predictions(*m, {4, 3, 40, 44}, 2, true);
}

TEST_CASE("planner: measured peak of a training step is within 10% of the prediction (MLP)") {
  manual_seed(2);
  auto m = nn::make_mlp({48, 128, 128, 128, 128, 10});
  check_predictions(*m, {512, 3, 4, 4}, 10, false);
}

TEST_CASE("planner: measured peak within 10% of the prediction (scaled ResNet-50, blocks as units)") {
  manual_seed(4);
  auto m = nn::make_resnet50(3, 16, 0.5f);
  m->train();
  check_predictions(*m, {8, 3, 64, 64}, 3, false);
}

TEST_CASE("planner: measure_chain leaves gradients and the generator as they were") {
  manual_seed(3);
  auto m = small_vgg_like();
  optim::SGD opt(m->parameters(), {.lr = 0.1f});
  for (Tensor g : opt.grads()) g.fill_(0.25f);
  const uint64_t offset = default_generator().offset();
  const size_t before = memory_stats(Device::cpu()).in_use;
  const nn::ChainCost c = nn::measure_chain(*m, {2, 3, 24, 24});
  CHECK(default_generator().offset() == offset);
  CHECK(memory_stats(Device::cpu()).in_use == before);
  for (const Tensor& g : opt.grads()) {
    auto v = g.to_vector<float>();
    CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.25f; }));
  }
  // Flatten joins the Linear after it; every other layer is a unit of its own.
  CHECK(c.units.size() == m->size() - 1);
  CHECK(c.units[13].begin == 13);
  CHECK(c.units[13].end == 15);
  // A plan boundary inside that unit is refused by the cost model, snapped by PyTorch-style plans.
  CHECK_THROWS_WITH_AS(nn::predict_peak(c, {{14, 16}}), doctest::Contains("inside a unit"), Error);
}

TEST_CASE("planner: measure_chain leaves zeroed gradients zero, and -0.0 as -0.0") {
  // Zero gradients (all bits 0) are zeroed again rather than copied to the host and back.
  manual_seed(3);
  auto m = small_vgg_like();
  optim::SGD opt(m->parameters(), {.lr = 0.1f});
  opt.zero_grad();
  std::vector<Tensor> grads = opt.grads();
  REQUIRE(grads.size() >= 2);
  grads[1].fill_(-0.0f);
  const size_t before = memory_stats(Device::cpu()).in_use;
  nn::measure_chain(*m, {2, 3, 24, 24});
  CHECK(memory_stats(Device::cpu()).in_use == before);
  for (size_t i = 0; i < grads.size(); ++i) {
    INFO("gradient " << i);
    CHECK(grads[i].shares_storage(m->parameters()[i].grad()));
    const std::vector<float> v = grads[i].to_vector<float>();
    CHECK(std::all_of(v.begin(), v.end(), [&](float x) { return x == 0.0f && std::signbit(x) == (i == 1); }));
  }
  // MeasureOptions::gradients_zero (mg::Trainer's): zeroed again, never copied; on the CPU a
  // gradient that is not zero is refused before anything changes.
  opt.zero_grad();
  const nn::ChainCost a = nn::measure_chain(*m, {2, 3, 24, 24}, {.gradients_zero = true});
  for (const Tensor& g : grads) {
    const std::vector<float> v = g.to_vector<float>();
    CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f && !std::signbit(x); }));
  }
  grads[3].fill_(0.5f);
  CHECK_THROWS_WITH_AS(nn::measure_chain(*m, {2, 3, 24, 24}, {.gradients_zero = true}),
                       doctest::Contains("gradients_zero, but the gradient of parameter 3"), Error);
  const std::vector<float> v3 = grads[3].to_vector<float>();
  CHECK(std::all_of(v3.begin(), v3.end(), [](float x) { return x == 0.5f; }));
  CHECK(memory_stats(Device::cpu()).in_use == before);
  // The same costs either way.
  opt.zero_grad();
  const nn::ChainCost b = nn::measure_chain(*m, {2, 3, 24, 24});
  REQUIRE(a.units.size() == b.units.size());
  for (size_t u = 0; u < a.units.size(); ++u) {
    CHECK(a.units[u].fwd_peak == b.units[u].fwd_peak);
    CHECK(a.units[u].bwd_peak == b.units[u].bwd_peak);
  }
  CHECK(a.fixed_bytes == b.fixed_bytes);
}

TEST_CASE("planner: tiles measured before are taken as they are, and equal what measuring them gives") {
  // mg::Trainer's pre-flight check measures one and two samples; the plan's measuring then takes
  // them as its tiles of 1 and 2 rows instead of measuring them again.
  manual_seed(5);
  auto m = small_vgg_like();
  optim::SGD opt(m->parameters(), {.lr = 0.1f});
  const Shape in{8, 3, 24, 24};
  const nn::ChainCost measured = nn::measure_chain(*m, in, {.tile_rows = {1, 2, 4}});
  const nn::ChainCost one = nn::measure_chain(*m, {1, 3, 24, 24}), two = nn::measure_chain(*m, {2, 3, 24, 24});
  const nn::ChainCost reused = nn::measure_chain(*m, in, {.tile_rows = {1, 2, 4}, .tiles_measured = {one, two}});
  REQUIRE(measured.tile_costs.size() == 3);
  REQUIRE(reused.tile_costs.size() == 3);
  for (size_t t = 0; t < 3; ++t) {
    const nn::ChainCost &a = measured.tile_costs[t], &b = reused.tile_costs[t];
    CHECK(a.rows == b.rows);
    REQUIRE(a.units.size() == b.units.size());
    for (size_t u = 0; u < a.units.size(); ++u) {
      INFO("tile of " << a.rows << " rows, unit " << u);
      CHECK(a.units[u].fwd_peak == b.units[u].fwd_peak);
      CHECK(a.units[u].bwd_peak == b.units[u].bwd_peak);
      CHECK(a.units[u].replay_peak == b.units[u].replay_peak);
      CHECK(a.units[u].out_bytes == b.units[u].out_bytes);
      CHECK(a.units[u].extra_bytes == b.units[u].extra_bytes);
      CHECK(a.units[u].leaf_bytes == b.units[u].leaf_bytes);
      CHECK(a.units[u].flops == b.units[u].flops);
    }
  }
  // Taken, not measured again: the times are those of the earlier measurements.
  CHECK(reused.tile_costs[0].units[0].forward_ms == one.units[0].forward_ms);
  CHECK(reused.tile_costs[1].units[0].backward_ms == two.units[0].backward_ms);
  CHECK(nn::min_feasible_peak(reused) == nn::min_feasible_peak(measured));
  // A chain of other units is refused.
  nn::ChainCost other = one;
  other.units.pop_back();
  CHECK_THROWS_WITH_AS(nn::measure_chain(*m, in, {.tile_rows = {1}, .tiles_measured = {other}}),
                       doctest::Contains("measured before at 1 rows has"), Error);
}

TEST_CASE("planner: measure_chain leaves a Dropout's own generator as it was") {
  // Measuring draws masks from every generator the chain's dropout layers use; the step after it
  // must draw the masks it would have drawn without measuring.
  Generator gen(11);
  gen.advance(100);
  auto build = [&] {
    manual_seed(5);
    auto m = std::make_shared<nn::Sequential>();
    m->add<nn::Linear>(12, 16);
    m->add<nn::Dropout>(0.5f, &gen);
    auto& inner = m->add<nn::Sequential>();
    inner.add<nn::Linear>(16, 16);
    inner.add<nn::Dropout>(0.3f, &gen);  // the same generator again, deeper: kept once
    m->add<nn::Linear>(16, 4);
    m->train();
    return m;
  };
  auto m = build();
  CHECK(m->generators() == std::vector<Generator*>{&gen});
  const uint64_t seed = gen.seed(), offset = gen.offset(), default_offset = default_generator().offset();
  nn::measure_chain(*m, {6, 12});
  CHECK(gen.seed() == seed);
  CHECK(gen.offset() == offset);
  CHECK(default_generator().offset() == default_offset);
  // The forward after measuring draws the masks a forward without it draws.
  const Tensor x = Tensor::full({6, 12}, 0.5f);
  const auto measured = m->forward(x).to_vector<float>();
  gen.manual_seed(seed);
  gen.set_offset(offset);
  const auto fresh = build()->forward(x).to_vector<float>();
  CHECK(measured == fresh);
}

TEST_CASE("planner: below the whole-layer floor, a tiled plan fits a memory cap and changes no bit") {
  // The same micro-batch, a budget under the least any whole-layer plan needs: the planner runs
  // segments in tiles (Note [tiled segments]), a real step fits under a cap of the budget, and
  // its gradients are those of the plain step, bit for bit.
  manual_seed(4);
  auto m = small_vgg_like();
  m->train();
  optim::SGD opt(m->parameters(), {.lr = 0.001f, .momentum = 0.9f});
  const Shape in{8, 3, 40, 44};
  const nn::ChainCost tiled = nn::measure_chain(*m, in, {.tile_rows = nn::tile_rows_below(8)});
  nn::ChainCost whole = tiled;
  whole.tile_costs.clear();
  const size_t floor_whole = nn::min_feasible_peak(whole), floor_tiled = nn::min_feasible_peak(tiled);
  INFO("floor in whole layers " << floor_whole << " B, in tiles " << floor_tiled << " B");
  REQUIRE(floor_tiled < floor_whole - floor_whole / 10);
  const size_t budget = floor_tiled + (floor_whole - floor_tiled) / 4;
  const nn::Plan plan = nn::plan_budget(tiled, budget);
  CHECK_THROWS_AS(nn::plan_budget(whole, budget), Error);
  bool any_tiled = false;
  for (const nn::Segment& g : plan.segments) any_tiled |= g.tile_rows > 0;
  CHECK(any_tiled);

  auto grads_of = [&](const std::vector<nn::Segment>& segs, size_t cap) {
    Tensor x = mg::test::rand_tensor(in, 31);
    Tensor target = Tensor::from_vector(std::vector<int64_t>{0, 1, 1, 0, 1, 0, 0, 1}, {8});
    opt.zero_grad();
    manual_seed(9);
    reset_peak_memory_stats(Device::cpu());
    set_memory_limit(Device::cpu(), cap);
    struct Uncap {
      ~Uncap() { set_memory_limit(Device::cpu(), 0); }
    } uncap;
    cross_entropy(nn::forward_with_plan(*m, segs, x), target).backward();
    std::vector<std::vector<float>> g;  // in host vectors: nothing the allocator counts in the next step
    for (const Tensor& p : m->parameters()) g.push_back(p.grad().to_vector<float>());
    return std::make_pair(g, memory_stats(Device::cpu()).peak_in_use);
  };
  const auto [ref, ref_peak] = grads_of({}, 0);
  const auto [got, peak] = grads_of(plan.segments, budget);
  INFO("plan " << plan.str() << ": predicted " << plan.predicted_peak << " B, measured " << peak << " B (the plain step "
               << ref_peak << " B)");
  CHECK(peak <= budget);
  CHECK(peak < plan.predicted_peak + plan.predicted_peak / 100);
  REQUIRE(ref.size() == got.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(ref[i].size() == got[i].size());
    CHECK(std::memcmp(ref[i].data(), got[i].data(), ref[i].size() * sizeof(float)) == 0);
  }
}

// ---- offload (Note [offload] in minigrad/core/checkpoint.h) ----------------------------------

TEST_CASE("planner: offloaded plans of VGG16/8, device and host peaks as predicted") {
  // Random plans that mix offloaded and replayed segments, measured in a real step. This harness
  // holds 8 bytes the cost model does not count (the step with no checkpointing shows them too);
  // beyond those, the device's peak is the predicted one to the byte, and the host pool's too.
  manual_seed(6);
  auto m = nn::make_vgg16(3, 8);
  m->train();
  optim::SGD opt(m->parameters(), {.lr = 0.001f, .momentum = 0.9f});
  const Shape in{4, 3, 32, 32};
  const nn::ChainCost cost = nn::measure_chain(*m, in, {.offload = nn::MeasureOptions::Offload::on});
  REQUIRE(nn::offload_offered(cost));
  const size_t n = cost.units.size();
  auto segment = [&](size_t s, size_t e, bool offload) {
    return nn::Segment{cost.units[s].begin, cost.units[e - 1].end, 0, offload};
  };
  const long harness = static_cast<long>(measured_step_peak(*m, opt, {}, in, 3)) - static_cast<long>(nn::predict_peak(cost, {}));
  CHECK(harness == 8);
  std::vector<std::vector<nn::Segment>> plans = {
      {segment(0, n, true)}, {segment(0, 3, true)}, {segment(n - 3, n, true)}, {segment(0, 1, true)},
      {segment(n - 1, n, true)}, {segment(2, 9, true), segment(9, 12, false), segment(12, n - 2, true)},
      {segment(0, n, false)}, {segment(n - 4, n, false)}};
  std::mt19937_64 rng(9);
  for (int k = 0; k < 10; ++k) {
    std::vector<nn::Segment> p;
    size_t u = rng() % 3;
    while (u < n) {
      const size_t e = std::min(n, u + 1 + rng() % 6);
      p.push_back(segment(u, e, rng() % 3 != 0));
      u = e + rng() % 3;
    }
    plans.push_back(p);
  }
  int offloaded = 0;
  for (const auto& segs : plans) {
    nn::Plan p;
    p.segments = segs;
    reset_host_peak_memory_stats();
    const size_t measured = measured_step_peak(*m, opt, segs, in, 3);
    INFO("plan " << p.str());
    CHECK(static_cast<long>(measured) - static_cast<long>(nn::predict_peak(cost, segs)) == harness);
    CHECK(host_memory_stats().peak_in_use == nn::predict_host_peak(cost, segs));
    CHECK(host_memory_stats().in_use == 0);
    offloaded += nn::predict_host_peak(cost, segs) > 0;
  }
  CHECK(offloaded >= 12);
}

TEST_CASE("planner: a VGG16/8 budget plan that offloads, under a cap of its budget: the weights of no checkpointing") {
  // The must-show: a budget between the floor and no checkpointing, chosen so that the
  // plan offloads; three SGD steps under a memory cap of that budget, with dropout; the weights
  // bit-identical to three steps without checkpointing (no cap), and each step's device peak the
  // prediction (plus the harness's 8 bytes), within the cap; the host pool's peak as predicted.
  // Batch 8: at 4 the second conv's column blocks, early in the chain, set every plan's peak (the
  // floor 11 KB under no checkpointing), so no budget between them offloads.
  const Shape in{8, 3, 32, 32};
  auto train = [&](bool offload) {
    manual_seed(12);
    auto m = nn::make_vgg16(3, 8);
    m->train();
    optim::SGD opt(m->parameters(), {.lr = 0.01f, .momentum = 0.9f});
    nn::Plan plan;
    if (offload) {
      const nn::ChainCost cost = nn::measure_chain(*m, in, {.offload = nn::MeasureOptions::Offload::on});
      const size_t lo = nn::min_feasible_peak(cost), hi = nn::plan_none(cost).predicted_peak;
      for (int k = 1; k < 20 && plan.predicted_host_peak == 0; ++k) plan = nn::plan_budget(cost, lo + (hi - lo) * k / 20);
      REQUIRE(plan.predicted_host_peak > 0);
      MESSAGE("budget " << plan.budget << ": " << plan.str() << ", host " << plan.predicted_host_peak);
      set_memory_limit(Device::cpu(), plan.budget);
    }
    for (int step = 0; step < 3; ++step) {
      reset_host_peak_memory_stats();
      const size_t peak = measured_step_peak(*m, opt, plan.segments, in, 3);
      if (offload) {
        CHECK(peak == plan.predicted_peak + 8);
        CHECK(peak <= plan.budget);
        CHECK(host_memory_stats().peak_in_use == plan.predicted_host_peak);
      }
    }
    set_memory_limit(Device::cpu(), 0);
    return m;
  };
  auto none = train(false), offloaded = train(true);
  auto a = none->named_parameters(), b = offloaded->named_parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(mg::test::bit_equal(a[i].second, b[i].second));
  }
}
