// Where a training step's memory goes, before it runs: the checkpoint cost model's predicted peak
// (minigrad/nn/checkpoint_plan.h) split into the terms that hold it at that moment, what the plan
// does with each unit's activations, the host memory it needs, and which term to cut to fit less.
//
//   auto mlp = mg::nn::make_mlp({16, 32, 4});
//   mg::optim::SGD opt(mlp->parameters(), {.lr = 0.1f});
//   mg::nn::ChainCost cost = mg::nn::measure_chain(*mlp, {8, 16});
//   mg::nn::Plan plan = mg::nn::make_plan(cost, "none");
//   mg::nn::MemoryReport r = mg::nn::explain_memory(cost, plan, mg::nn::fixed_parts(*mlp, &opt));
//   std::fputs(r.str().c_str(), stdout);   // or trainer.explain_memory(), or --explain-memory
//
// The terms add up to the predicted peak exactly: the fixed part (parameters, gradient buffers,
// optimizer state, low-precision weight copies, targets, and the rest of what was in use when the
// chain was measured: workspaces, the caller's tensors), the activations earlier units keep (by
// plain units, as the boundaries of replayed segments, on the device for offloaded ones), and the
// working set of the unit running at the peak (its input and output, gradients in flight,
// workspace).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <minigrad/nn/checkpoint_plan.h>
#include <minigrad/nn/module.h>

namespace mg::optim {
class Optimizer;
}

namespace mg::nn {

// What the caller knows of ChainCost::fixed_bytes; the report counts the rest as "other fixed".
struct FixedParts {
  size_t parameters = 0, gradient_buffers = 0, optimizer_state = 0;
};
// The parameters' bytes, as many for their float32 gradient buffers, and the optimizer's state
// tensors (those it has made so far: SGD's momentum and Adam's moments come with the first step).
FixedParts fixed_parts(const Sequential& model, const optim::Optimizer* opt);

struct MemoryTerm {
  std::string name;
  size_t bytes = 0;
  std::string note;
};

struct MemoryReport {
  std::vector<MemoryTerm> terms;  // at the predicted peak; they sum to predicted_peak
  size_t predicted_peak = 0;
  std::string peak_at;            // explain_peak's words
  std::string plan;               // Plan::str()
  std::vector<std::string> unit_names;
  std::vector<UnitMemory> units;  // per unit: kept, recomputed or offloaded
  size_t host_bytes = 0;          // the host pool's predicted peak (offloaded segments)
  size_t capacity = 0;            // what the device can hold (a budget or what it has; 0: not given)
  size_t min_feasible_peak = 0;   // the least any plan needs at this micro-batch
  std::string advice;             // which term to cut to fit a smaller budget
  std::string str() const;        // all of it, as the apps print it
};

MemoryReport explain_memory(const ChainCost& cost, const Plan& plan, const FixedParts& parts = {}, size_t capacity = 0);

}  // namespace mg::nn
