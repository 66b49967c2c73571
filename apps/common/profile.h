// --profile, shared by vgg_ckpt, gpt_train and mnist_ga: where the steps after the first go, per op and
// pass (minigrad/core/profiler.h), printed after training and written under "profile" in --json.
//
//   StepProfile prof{profile_flag};
//   mg::TrainerCallbacks cb{.on_step_start = [&](int64_t step, bool redo) { redo ? prof.restart(step, steps)
//                                                                                 : prof.begin(step, steps); },
//                           .on_step = [&](const mg::StepReport& r) { prof.end(r.step, steps, r.ms + r.data_ms); }};
//   prof.print();  j["profile"] = prof.json();
// Recording stops between steps (an evaluation after an epoch is not the steps' work). After an
// out-of-memory re-plan the profile starts again from the redone step: the failed try's ops and
// the planner's runs are not the steps' work.
#pragma once

#include <cstdint>
#include <cstdio>
#include <vector>

#include <minigrad/core/profiler.h>
#include <nlohmann/json.hpp>

#include "common/ranks.h"

struct StepProfile {
  bool on = false;
  double steps_ms = 0;  // the wall time of the profiled steps
  int64_t steps = 0;
  std::vector<mg::profiler::Row> rows;

  // The first step warms up (threads, caches, cuDNN's choices) and is left out, unless it is the only one.
  bool restarted = false, only_step = false;

  bool profiled(int64_t step, int64_t total) const { return on && step >= (total > 1 ? 1 : 0); }
  bool started = false;
  void begin(int64_t step, int64_t total) {
    only_step = total <= 1;
    if (!profiled(step, total)) return;
    started ? mg::profiler::resume() : mg::profiler::start();
    started = true;
  }
  void restart(int64_t step, int64_t total) {
    if (profiled(step, total)) forget();
  }
  void forget() {  // what was recorded so far is not the steps' work
    mg::profiler::start();
    started = true;
    steps_ms = 0;
    steps = 0;
    restarted = true;
  }
  void end(int64_t step, int64_t total, double ms) {
    if (!profiled(step, total)) return;
    mg::profiler::stop();
    steps_ms += ms;
    ++steps;
  }

  void print() {
    if (!on) return;
    mg::profiler::stop();
    if (steps == 0) {
      LEAD_PRINTF("profile: no optimizer step was profiled\n");
      return;
    }
    rows = mg::profiler::report();
    double in_table = 0;
    for (const mg::profiler::Row& r : rows) in_table += r.ms;
    const char* which = restarted ? "from the last re-plan on" : only_step ? "the only one" : "the first left out";
    LEAD_PRINTF("profile of %lld steps (%s), %.1f ms in all:\n%s", static_cast<long long>(steps), which, steps_ms,
                mg::profiler::table(rows).c_str());
    LEAD_PRINTF("in no op or scope (the step's read of its losses, data read inside the step, the host's own work): "
                "%.1f ms (%.1f%% of the steps)\n",
                steps_ms - in_table, steps_ms > 0 ? 100.0 * (steps_ms - in_table) / steps_ms : 0.0);
  }
  nlohmann::ordered_json json() const {
    nlohmann::ordered_json j;
    j["steps"] = steps;
    j["steps_ms"] = steps_ms;
    j["rows"] = nlohmann::json::array();
    for (const mg::profiler::Row& r : rows) {
      j["rows"].push_back({{"name", r.name}, {"pass", r.pass}, {"device", r.device}, {"calls", r.calls}, {"ms", r.ms}});
    }
    return j;
  }
};
