// mg::nn::explain_memory: the cost model's terms, named and summed (minigrad/nn/memory_report.h).
#include <minigrad/nn/memory_report.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include <minigrad/optim/optimizer.h>
#include <minigrad/util/bytes.h>

namespace mg::nn {

FixedParts fixed_parts(const Sequential& model, const optim::Optimizer* opt) {
  FixedParts p;
  for (const Tensor& t : model.parameters()) p.parameters += t.nbytes();
  p.gradient_buffers = p.parameters;  // float32, one per parameter (Note [checkpoint cost model])
  if (opt) {
    for (const auto& [name, t] : opt->state_tensors()) p.optimizer_state += t.nbytes();
  }
  return p;
}

MemoryReport explain_memory(const ChainCost& cost, const Plan& plan, const FixedParts& parts, size_t capacity) {
  const PeakBreakdown at = explain_peak(cost, plan.segments);
  MemoryReport r;
  r.predicted_peak = at.peak;
  r.peak_at = at.where;
  r.plan = plan.str();
  r.capacity = capacity;
  r.host_bytes = predict_host_peak(cost, plan.segments);
  r.min_feasible_peak = min_feasible_peak(cost);
  r.units = unit_memory(cost, plan.segments);
  for (const UnitCost& u : cost.units) r.unit_names.push_back(u.name);

  // The fixed part, known pieces first, each no more than what is left of it.
  size_t left = cost.fixed_bytes;
  auto fixed = [&](const char* name, size_t bytes, const char* note) {
    bytes = std::min(bytes, left);
    left -= bytes;
    r.terms.push_back({name, bytes, note});
  };
  fixed("parameters", parts.parameters, "float32 masters");
  fixed("gradient buffers", parts.gradient_buffers, "float32, owned by the optimizer; accumulation adds into them");
  fixed("optimizer state", parts.optimizer_state, "momentum, moments (what the optimizer has made so far)");
  fixed("low-precision weight copies", cost.weight_copy_bytes, "made once per step under autocast, shared by its micro-batches");
  fixed("targets", cost.target_bytes, "the loss's int64 labels");
  if (cost.staged_bytes > 0) {
    fixed("the next micro-batch", cost.staged_bytes, "its inputs and targets, copied to the device while this one computes");
  }
  fixed("other fixed", left, "in use when the chain was measured: workspaces, the caller's tensors");
  r.terms.push_back({"activations kept by plain units", at.kept_plain, "saved for backward by units the plan keeps"});
  r.terms.push_back({"boundaries of replayed segments", at.kept_replayed, "each replayed segment's input, kept to replay it"});
  r.terms.push_back({"kept on the device by offloaded segments", at.kept_offloaded,
                     "their inputs and saved outputs; the rest waits in the host pool"});
  const size_t working = at.peak - cost.fixed_bytes - at.kept_by_earlier;
  r.terms.push_back({"working set at the peak", working,
                     at.phase + " of unit " + std::to_string(at.unit) + " (" + cost.units[at.unit].name +
                         "): its input, output, gradients in flight, workspace"});

  std::ostringstream a;
  if (capacity != 0 && at.peak > capacity) {
    a << "the plan does not fit: " << format_bytes(at.peak - capacity) << " over " << format_bytes(capacity) << ". ";
  }
  // The largest of the activation terms: what a plan can cut.
  const MemoryTerm* largest = &r.terms[r.terms.size() - 4];
  for (size_t i = r.terms.size() - 4; i < r.terms.size(); ++i) {
    if (r.terms[i].bytes > largest->bytes) largest = &r.terms[i];
  }
  if (r.min_feasible_peak < at.peak) {
    const Plan floor = plan_min_peak(cost);
    a << "the largest term a plan can cut is the " << largest->name << " (" << format_bytes(largest->bytes)
      << "): a budget plan (--checkpoint budget=SIZE, or --memory-budget) recomputes"
      << (offload_offered(cost) ? " or offloads" : "") << " activations down to a peak of " << format_bytes(r.min_feasible_peak)
      << " (" << floor.str() << "). Below that, a smaller micro-batch with gradient accumulation (the same gradients).";
  } else {
    a << "This plan is at the floor for this micro-batch (" << format_bytes(r.min_feasible_peak)
      << "). To fit less, cut the working set and what segments keep with a smaller micro-batch and gradient "
         "accumulation (the same gradients)";
    if (!offload_offered(cost)) a << ", or offload (--offload on, CUDA)";
    a << "; the fixed part (" << format_bytes(cost.fixed_bytes) << ") stays.";
  }
  r.advice = a.str();
  return r;
}

std::string MemoryReport::str() const {
  std::ostringstream os;
  os << "memory at the predicted peak, " << format_bytes(predicted_peak) << " (" << peak_at << "), plan " << plan << ":\n";
  char line[256];
  for (const MemoryTerm& t : terms) {
    std::snprintf(line, sizeof line, "  %-42s %12s  %s\n", t.name.c_str(), format_bytes(t.bytes).c_str(), t.note.c_str());
    os << line;
  }
  std::snprintf(line, sizeof line, "  %-42s %12s\n", "sum", format_bytes(predicted_peak).c_str());
  os << line;
  if (capacity != 0) {
    os << "  device: " << format_bytes(capacity) << ", headroom "
       << (capacity >= predicted_peak ? format_bytes(capacity - predicted_peak) : "none: over by " + format_bytes(predicted_peak - capacity))
       << "\n";
  }
  os << "  host pool: " << format_bytes(host_bytes) << " offloaded at the end of forward\n";
  os << "per unit (kept on the device through the step / recomputed / offloaded):\n";
  for (size_t u = 0; u < units.size(); ++u) {
    const UnitMemory& m = units[u];
    std::snprintf(line, sizeof line, "  %3zu %-28s %-10s %12s %12s %12s\n", u, unit_names[u].substr(0, 28).c_str(),
                  m.choice.c_str(), format_bytes(m.kept).c_str(), format_bytes(m.dropped).c_str(),
                  format_bytes(m.offloaded).c_str());
    os << line;
  }
  os << "to fit less: " << advice << "\n";
  return os.str();
}

}  // namespace mg::nn
