// Out-of-memory recovery in the apps (Note [recovering from out-of-memory] in
// minigrad/optim/accumulate.h): what vgg_ckpt, gpt_train and mnist_ga say and check before they
// re-plan.
#pragma once

#include <cstdint>
#include <string>

#include <minigrad/dist/dist.h>
#include <minigrad/minigrad.h>
#include <minigrad/util/bytes.h>

#include "common/ranks.h"

// The first line of an error's message (its hint follows on the next lines).
inline std::string first_line(const std::exception& e) {
  const std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

// Plans again after `where` (measuring, or a step) ran out of memory with the error whose first
// line is `cause`: plan() throws mg::Error when no plan fits `memory`, what the device has; that
// error then says it came from recovering, and names the cap when there is one. An
// out-of-memory error passes as it is.
template <class Plan>
void replan_or_explain(const std::string& cause, const std::string& where, size_t memory,
                       const std::string& memory_limit, Plan&& plan) {
  try {
    plan();
  } catch (const mg::OutOfMemoryError&) {
    throw;
  } catch (const mg::Error& no_plan) {
    throw mg::Error(where + " ran out of memory (" + cause + "), and no plan fits what the device has, " +
                    mg::format_bytes(memory) + (memory_limit.empty() ? "" : " under --memory-limit " + memory_limit) +
                    ": " + no_plan.what());
  }
}

// Step `step` (from 0) ran out of memory with `e`: under data parallelism the error stands (every
// rank would have to re-plan at the same window; the others stop, Note [collectives never hang]);
// otherwise says so and returns what the device has now, the memory to plan the redone step for.
inline size_t memory_for_redone_step(const mg::OutOfMemoryError& e, int64_t step, const mg::Device& dev) {
  if (mg::dist::active()) throw e;
  const size_t there = mg::memory_capacity(dev);
  LEAD_PRINTF("step %lld: %s\n  the step is dropped and redone under a joint plan for %s\n",
              static_cast<long long>(step + 1), first_line(e).c_str(), mg::format_bytes(there).c_str());
  return there;
}
