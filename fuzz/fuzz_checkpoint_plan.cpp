// The checkpoint-plan parser and the planners behind it (minigrad/nn/checkpoint_plan.h):
// make_plan(cost, spec) as `vgg_ckpt --checkpoint SPEC` calls it.
//
// The input is the spec, then optionally a newline and bytes that describe the chain (a
// ChainCost of 1 to 12 units, each of one or two layers, sizes up to 1 TiB); without them the
// spec is planned for a fixed 8-unit chain. A plan make_plan returns must be valid layer ranges
// on unit boundaries, its predicted peak and recomputation must be what predict_peak and
// recompute_flops say of its segments (and its host bytes predict_host_peak's), a budget plan must
// fit its budget (and the host cap, offloading only where the chain has a host link), and "min"
// must reach min_feasible_peak; the planner's own "internal error" is a finding. Specs may spell
// the segments out ("[0,3)@host [3,5)/2").
// Seeds: make_corpus.cpp (checkpoint_plan/); dictionary: dicts/checkpoint_plan.dict.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>

#include <minigrad/nn/checkpoint_plan.h>

#include "fuzz_common.h"

namespace {

constexpr size_t kMaxBytes = size_t{1} << 40;

// Conv-like units getting smaller, then two linear ones; the shape of a small VGG.
mg::nn::ChainCost fixed_chain() {
  mg::nn::ChainCost c;
  c.fixed_bytes = 3'000'000;
  c.input_bytes = 600'000;
  const size_t outs[] = {3'200'000, 3'200'000, 800'000, 1'600'000, 400'000, 400'000, 16'000, 80};
  for (size_t i = 0; i < std::size(outs); ++i) {
    mg::nn::UnitCost u;
    u.begin = c.num_layers;
    u.end = c.num_layers + (i == 6 ? 2 : 1);  // a Flatten merged with the Linear after it
    c.num_layers = u.end;
    u.out_bytes = outs[i];
    u.extra_bytes = i == 2 || i == 4 ? outs[i] / 4 : 0;  // max-pool indices
    u.saves_input = i % 2 == 0;
    u.saves_output = i % 3 == 1;
    u.fwd_peak = u.out_bytes + u.extra_bytes + 100'000;
    u.bwd_peak = 2 * u.out_bytes;
    u.flops = 1e6 * static_cast<double>(8 - i);
    c.units.push_back(u);
  }
  c.head_bytes = 2 * c.units.back().out_bytes + 8;
  return c;
}

mg::nn::ChainCost chain_from(FuzzedDataProvider& p) {
  mg::nn::ChainCost c;
  const size_t n = p.ConsumeIntegralInRange<size_t>(1, 12);
  c.fixed_bytes = p.ConsumeIntegralInRange<size_t>(0, kMaxBytes);
  c.input_bytes = p.ConsumeIntegralInRange<size_t>(1, kMaxBytes);
  c.input_requires_grad = p.ConsumeBool();
  for (size_t i = 0; i < n; ++i) {
    mg::nn::UnitCost u;
    u.begin = c.num_layers;
    u.end = c.num_layers + p.ConsumeIntegralInRange<size_t>(1, 2);
    c.num_layers = u.end;
    u.out_bytes = p.ConsumeIntegralInRange<size_t>(1, kMaxBytes);
    u.extra_bytes = p.ConsumeIntegralInRange<size_t>(0, kMaxBytes);
    u.saves_input = p.ConsumeBool();
    u.saves_output = p.ConsumeBool();
    u.fwd_peak = u.out_bytes + u.extra_bytes + p.ConsumeIntegralInRange<size_t>(0, kMaxBytes);
    u.bwd_peak = p.ConsumeIntegralInRange<size_t>(0, kMaxBytes);
    u.flops = static_cast<double>(p.ConsumeIntegralInRange<uint64_t>(0, uint64_t{1} << 50));
    c.units.push_back(u);
  }
  c.head_bytes = 2 * c.units.back().out_bytes + p.ConsumeIntegralInRange<size_t>(0, 64);
  // A host link (Note [offload]) on some chains: measured times, link rates, overlap, a host cap.
  if (p.ConsumeBool()) {
    for (mg::nn::UnitCost& u : c.units) {
      u.forward_ms = static_cast<double>(p.ConsumeIntegralInRange<uint32_t>(1, 1 << 20)) / 64.0;
      u.backward_ms = static_cast<double>(p.ConsumeIntegralInRange<uint32_t>(0, 1 << 20)) / 64.0;
      u.extra_held_bytes = p.ConsumeIntegralInRange<size_t>(0, u.extra_bytes);
    }
    c.to_host_bytes_per_ms = static_cast<double>(p.ConsumeIntegralInRange<uint64_t>(1, uint64_t{1} << 40));
    c.from_host_bytes_per_ms = static_cast<double>(p.ConsumeIntegralInRange<uint64_t>(1, uint64_t{1} << 40));
    c.copies_overlap = p.ConsumeBool();
    c.host_limit = p.ConsumeBool() ? p.ConsumeIntegralInRange<size_t>(1, kMaxBytes) : 0;
  }
  return c;
}

void check_plan(const mg::nn::ChainCost& c, const std::string& spec, const mg::nn::Plan& plan) {
  size_t prev_end = 0;
  for (const mg::nn::Segment& g : plan.segments) {
    MG_FUZZ_CHECK(g.begin < g.end && g.end <= c.num_layers && g.begin >= prev_end,
                  spec + ": plan " + plan.str() + " has a bad layer range");
    bool begin_ok = false, end_ok = false;
    for (const mg::nn::UnitCost& u : c.units) {
      begin_ok = begin_ok || u.begin == g.begin;
      end_ok = end_ok || u.end == g.end;
    }
    MG_FUZZ_CHECK(begin_ok && end_ok, spec + ": plan " + plan.str() + " cuts a unit");
    prev_end = g.end;
  }
  MG_FUZZ_CHECK(plan.predicted_peak == mg::nn::predict_peak(c, plan.segments),
                spec + ": the plan's predicted peak is not predict_peak of its segments");
  MG_FUZZ_CHECK(plan.recompute_flops == mg::nn::recompute_flops(c, plan.segments),
                spec + ": the plan's recomputation is not recompute_flops of its segments");
  MG_FUZZ_CHECK(plan.predicted_host_peak == mg::nn::predict_host_peak(c, plan.segments),
                spec + ": the plan's host bytes are not predict_host_peak of its segments");
  if (spec.rfind("budget=", 0) == 0) {
    MG_FUZZ_CHECK(plan.budget == mg::parse_bytes(spec.substr(7)), spec + ": the plan's budget is not the spec's");
    MG_FUZZ_CHECK(plan.predicted_peak <= plan.budget, spec + ": the plan does not fit its budget");
    MG_FUZZ_CHECK(c.host_limit == 0 || plan.predicted_host_peak <= c.host_limit, spec + ": the plan offloads past the host cap");
    for (const mg::nn::Segment& g : plan.segments) {
      MG_FUZZ_CHECK(!g.offload || mg::nn::offload_offered(c), spec + ": the plan offloads without a host link");
    }
  }
  if (spec == "min") {
    MG_FUZZ_CHECK(plan.predicted_peak == mg::nn::min_feasible_peak(c), "min: not the smallest feasible peak");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const mg::nn::ChainCost kFixed = fixed_chain();
  const char* text = reinterpret_cast<const char*>(data);
  const auto* newline = static_cast<const char*>(std::memchr(text, '\n', size));
  const std::string spec(text, newline ? static_cast<size_t>(newline - text) : size);
  mg::nn::ChainCost chain = kFixed;
  if (newline != nullptr) {
    FuzzedDataProvider rest(data + spec.size() + 1, size - spec.size() - 1);
    chain = chain_from(rest);
  }
  mg::nn::Plan plan;
  try {
    plan = mg::nn::make_plan(chain, spec);
  } catch (const mg::Error& e) {
    // Messages that echo the spec start with words of their own, so the prefix cannot be forged.
    const std::string what = e.what();
    MG_FUZZ_CHECK(what.rfind("checkpoint planner: internal error", 0) != 0, what);
    return 0;
  }
  check_plan(chain, spec, plan);
  return 0;
}
