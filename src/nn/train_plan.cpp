// The joint planner of micro-batch, accumulation and checkpointing (Note [joint plan] in
// minigrad/nn/train_plan.h): measuring at a few micro-batch sizes, then arithmetic.
#include <minigrad/nn/train_plan.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <sstream>

#include <minigrad/core/error.h>
#include <minigrad/core/memory.h>

#include "nn/checkpoint_segments.h"

namespace mg::nn {

namespace {

// The chain with each unit's measured forward time in place of its FLOPs: the budget planner,
// which minimises recomputed FLOPs, then minimises recomputation time.
ChainCost with_times_as_flops(const ChainCost& cost) {
  ChainCost t = cost;
  for (UnitCost& u : t.units) u.flops = u.forward_ms;
  for (ChainCost& tile : t.tile_costs) tile = with_times_as_flops(tile);
  return t;
}

int64_t windows(int64_t effective_batch, int64_t micro_batch) { return (effective_batch + micro_batch - 1) / micro_batch; }

// Each unit's least time of two measurements of the same chain and rows (Note [joint plan]); the
// host link's best rate. The bytes are the same in both.
void keep_fastest(ChainCost& into, const ChainCost& again) {
  MG_CHECK(into.units.size() == again.units.size() && into.tile_costs.size() == again.tile_costs.size(),
           "profile_chain: two measurements of one micro-batch size have different units");
  for (size_t u = 0; u < into.units.size(); ++u) {
    into.units[u].forward_ms = std::min(into.units[u].forward_ms, again.units[u].forward_ms);
    into.units[u].backward_ms = std::min(into.units[u].backward_ms, again.units[u].backward_ms);
  }
  for (size_t t = 0; t < into.tile_costs.size(); ++t) keep_fastest(into.tile_costs[t], again.tile_costs[t]);
  into.to_host_bytes_per_ms = std::max(into.to_host_bytes_per_ms, again.to_host_bytes_per_ms);
  into.from_host_bytes_per_ms = std::max(into.from_host_bytes_per_ms, again.from_host_bytes_per_ms);
}

}  // namespace

ChainCost cost_with_tiles(const ChainProfile& profile, size_t i) {
  MG_CHECK(i < profile.costs.size(), "cost_with_tiles: no micro-batch " << i << " in a profile of " << profile.costs.size());
  ChainCost c = profile.costs[i];
  c.rows = profile.micro_batches[i];
  c.tile_costs.clear();
  for (size_t j = 0; j < i; ++j) {
    ChainCost t = profile.costs[j];
    t.rows = profile.micro_batches[j];
    t.tile_costs.clear();
    c.tile_costs.push_back(std::move(t));
  }
  return c;
}

std::string TrainPlan::str() const {
  std::ostringstream os;
  os << "micro-batch " << micro_batch << " x " << accumulation;
  if (last_micro_batch != micro_batch) os << " (the last " << last_micro_batch << ")";
  os << " (" << effective_batch << " per step), checkpoint " << checkpoint.str();
  return os.str();
}

std::vector<int64_t> candidate_micro_batches(int64_t effective_batch) {
  MG_CHECK(effective_batch >= 1, "candidate_micro_batches: the effective batch must be >= 1, got " << effective_batch);
  std::vector<int64_t> out;
  for (int64_t n = 1;; n *= 2) {
    const int64_t b = windows(effective_batch, n);
    if (out.empty() || out.back() != b) out.push_back(b);
    if (b == 1) break;
  }
  return {out.rbegin(), out.rend()};
}

ChainProfile profile_chain(Sequential& seq, const Shape& sample_shape, const std::vector<int64_t>& micro_batches,
                           size_t budget, const MeasureOptions& opts) {
  return profile_chain(
      seq,
      [&](int64_t b) {
        Shape s{b};
        s.insert(s.end(), sample_shape.begin(), sample_shape.end());
        return probe_input(seq, s);
      },
      micro_batches, budget, opts);
}

ChainProfile profile_chain(Sequential& seq, const InputMaker& make_input, const std::vector<int64_t>& micro_batches,
                           size_t budget, const MeasureOptions& opts) {
  MG_CHECK(!micro_batches.empty(), "profile_chain: no micro-batch sizes to measure");
  MG_CHECK(opts.timing_passes >= 1, "profile_chain: timing_passes must be >= 1, got " << opts.timing_passes);
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    MG_CHECK(micro_batches[i] >= 1 && (i == 0 || micro_batches[i] > micro_batches[i - 1]),
             "profile_chain: micro-batch sizes must be >= 1 and increasing; got " << micro_batches[i] << " at position " << i);
  }
  ChainProfile p;
  std::exception_ptr first_error;
  double best_per_sample = std::numeric_limits<double>::infinity();
  for (int64_t b : micro_batches) {
    ChainCost cost;
    if (opts.on_measure) opts.on_measure(b);
    try {
      // A first pass is slower (threads start, pages are touched for the first time): unmeasured.
      if (p.costs.empty()) measure_chain(seq, make_input(b), opts);
      cost = measure_chain(seq, make_input(b), opts);
      for (int pass = 1; pass < opts.timing_passes; ++pass) keep_fastest(cost, measure_chain(seq, make_input(b), opts));
    } catch (const OutOfMemoryError& e) {
      p.stopped = "micro-batch " + std::to_string(b) + " ran out of memory while measured (" +
                  std::string(e.what()).substr(0, std::string(e.what()).find('\n')) + ")";
      break;
    } catch (const Error& e) {
      // Too few rows for the chain to train at (measure_chain left the model as it was): the
      // next size may run. Only the smallest size may fail so: an error at a second size, or
      // after one has run, is not about the size, and is passed on (the first one, if two).
      if (!p.costs.empty()) throw;
      if (first_error) std::rethrow_exception(first_error);
      first_error = std::current_exception();
      p.cannot_train_why = std::string(e.what()).substr(0, std::string(e.what()).find('\n'));
      p.cannot_train.push_back(b);
      continue;
    }
    double ms = 0;
    for (const UnitCost& u : cost.units) ms += u.forward_ms + u.backward_ms;
    const double per_sample = ms / static_cast<double>(b);
    p.micro_batches.push_back(b);
    p.costs.push_back(std::move(cost));
    if (opts.stop_when_flat && b >= 64 && b != micro_batches.back() && per_sample > 0.97 * best_per_sample) {
      p.stopped = "micro-batch " + std::to_string(b) + " is no faster per sample than smaller ones; larger ones were not measured";
      break;
    }
    best_per_sample = std::min(best_per_sample, per_sample);
    // The least it needs, in tiles of the smaller micro-batches where that is less.
    const size_t need = min_feasible_peak(cost_with_tiles(p, p.costs.size() - 1));
    if (budget != 0 && need > budget) {
      if (b != micro_batches.back()) {
        p.stopped = "micro-batch " + std::to_string(b) + " needs at least " + format_bytes(need) +
                    ", over the budget; larger ones were not measured";
      }
      break;
    }
  }
  if (p.costs.empty() && p.stopped.empty() && first_error) std::rethrow_exception(first_error);
  return p;
}

double predict_step_ms(const ChainProfile& profile, size_t i, const std::vector<Segment>& segments,
                       int64_t effective_batch, double update_ms) {
  MG_CHECK(i < profile.costs.size(), "predict_step_ms: no micro-batch " << i << " in a profile of " << profile.costs.size());
  const int64_t b = profile.micro_batches[i];
  const ChainCost cost = cost_with_tiles(profile, i);
  double t = recompute_flops(with_times_as_flops(cost), segments) + offload_ms(cost, segments);
  for (const UnitCost& u : cost.units) t += u.forward_ms + u.backward_ms;
  for (const Segment& g : segments) {  // a tiled segment's forward and backward run at the tile's rows
    if (g.tile_rows == 0 || g.tile_rows >= b) continue;
    const ChainCost* tile = cost.tile_cost(g.tile_rows);
    MG_CHECK(tile != nullptr, "predict_step_ms: a segment in tiles of " << g.tile_rows << " rows, but the profile has no micro-batch of " << g.tile_rows);
    for (size_t u = 0; u < cost.units.size(); ++u) {
      if (cost.units[u].begin < g.begin || cost.units[u].end > g.end) continue;
      const UnitCost &whole = cost.units[u], &part = tile->units[u];
      t += (part.forward_ms + part.backward_ms) * static_cast<double>(b) / static_cast<double>(g.tile_rows) -
           (whole.forward_ms + whole.backward_ms);
    }
  }
  const int64_t n = windows(effective_batch, b);
  const int64_t last = effective_batch - (n - 1) * b;
  return static_cast<double>(n - 1) * t + t * static_cast<double>(last) / static_cast<double>(b) + update_ms;
}

TrainPlan plan_training(const ChainProfile& profile, int64_t effective_batch, size_t budget, const TrainPlanOptions& opts) {
  MG_CHECK(effective_batch >= 1, "plan_training: the effective batch must be >= 1, got " << effective_batch);
  MG_CHECK(budget > 0, "plan_training: the budget must be > 0 bytes");
  MG_CHECK(opts.headroom >= 0 && opts.headroom < 1, "plan_training: headroom must be in [0, 1), got " << opts.headroom);
  const size_t usable = budget - static_cast<size_t>(static_cast<double>(budget) * opts.headroom);
  MG_CHECK(profile.costs.size() == profile.micro_batches.size(),
           "plan_training: the profile holds " << profile.costs.size() << " measurements of " << profile.micro_batches.size()
                                               << " micro-batch sizes");
  // Why the smallest size is missing, for the errors below.
  const std::string cannot = profile.cannot_train.empty() ? std::string()
      : "; micro-batch " + std::to_string(profile.cannot_train.back()) + " cannot train (" + profile.cannot_train_why + ")";
  MG_CHECK(!profile.costs.empty(), "plan_training: " << (profile.stopped.empty() ? "the profile holds no measurement"
                                                                                  : "no plan fits a budget of " + format_bytes(budget) +
                                                                                        ": " + profile.stopped) << cannot);
  MG_CHECK(profile.micro_batches.front() <= effective_batch,
           "plan_training: every micro-batch measured (the smallest is " << profile.micro_batches.front()
               << ") is larger than the effective batch of " << effective_batch
               << "; measure micro-batches of at most " << effective_batch << cannot);
  TrainPlan best;
  size_t least_need = 0;
  int64_t least_at = 0;
  for (size_t i = 0; i < profile.costs.size(); ++i) {
    const int64_t b = profile.micro_batches[i];
    if (b > effective_batch) break;
    // A window's last micro-batch smaller than every size that ran may not train at all.
    const int64_t last = effective_batch - (windows(effective_batch, b) - 1) * b;
    if (!profile.cannot_train.empty() && last < profile.micro_batches.front()) continue;
    ChainCost cost = cost_with_tiles(profile, i);
    if (!opts.tiles) cost.tile_costs.clear();
    const size_t need = min_feasible_peak(cost);
    if (least_at == 0 || need < least_need) least_need = need, least_at = b;
    if (need > usable) continue;
    Plan plan = plan_budget(with_times_as_flops(cost), usable);
    plan.recompute_flops = recompute_flops(cost, plan.segments);
    const double ms = predict_step_ms(profile, i, plan.segments, effective_batch, opts.update_ms);
    if (best.micro_batch != 0 && ms > best.predicted_step_ms) continue;
    best.effective_batch = effective_batch;
    best.micro_batch = b;
    best.accumulation = windows(effective_batch, b);
    best.last_micro_batch = last;
    best.checkpoint = std::move(plan);
    best.budget = budget;
    best.predicted_peak = best.checkpoint.predicted_peak;
    best.predicted_step_ms = ms;
  }
  MG_CHECK(best.micro_batch != 0 || least_at != 0,
           "plan_training: no measured micro-batch splits the effective batch of " << effective_batch
               << " into micro-batches the chain can train at" << cannot
               << (profile.stopped.empty() ? "" : "; " + profile.stopped));
  MG_CHECK(best.micro_batch != 0,
           "plan_training: no plan fits a budget of " << format_bytes(budget)
               << (usable < budget ? " (" + format_bytes(usable) + " less the headroom)" : std::string())
               << " for an effective batch of " << effective_batch
               << ": the least any plan needs is " << format_bytes(least_need) << " (" << least_need << " bytes: micro-batch "
               << least_at << " with the 'min' checkpoint plan)" << (profile.stopped.empty() ? "" : "; " + profile.stopped) << cannot
               << ". Raise the budget, or make the model or the samples smaller");
  return best;
}

TrainPlan plan_training(Sequential& seq, const Shape& sample_shape, int64_t effective_batch, size_t budget,
                        const TrainPlanOptions& opts) {
  MG_CHECK(effective_batch >= 1, "plan_training: the effective batch must be >= 1, got " << effective_batch);
  if (budget == 0) {
    const std::vector<Tensor> params = seq.parameters();
    budget = memory_capacity(params.empty() ? Device::cpu() : params[0].device());
  }
  const std::vector<int64_t> candidates =
      opts.micro_batches.empty() ? candidate_micro_batches(effective_batch) : opts.micro_batches;
  const ChainProfile profile = profile_chain(seq, sample_shape, candidates, budget, opts.measure);
  return plan_training(profile, effective_batch, budget, opts);
}

}  // namespace mg::nn
