// --profile, shared by vgg_ckpt and gpt_train: where the steps after the first go, per op and
// pass (minigrad/core/profiler.h), printed after training and written under "profile" in --json.
//
//   StepProfile prof{profile_flag};
//   for (step ...) { prof.begin(step, steps); ... prof.end(step, ms); }
//   prof.print();  j["profile"] = prof.json();
#pragma once

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
  bool profiled(int64_t step, int64_t total) const { return on && step >= (total > 1 ? 1 : 0); }
  void begin(int64_t step, int64_t total) {
    if (profiled(step, total) && !mg::profiler::recording()) mg::profiler::start();
  }
  void end(int64_t step, int64_t total, double ms) {
    if (!profiled(step, total)) return;
    steps_ms += ms;
    ++steps;
  }
  void print() {
    if (!on) return;
    mg::profiler::stop();
    rows = mg::profiler::report();
    double in_table = 0;
    for (const mg::profiler::Row& r : rows) in_table += r.ms;
    LEAD_PRINTF("profile of %lld steps (the first left out), %.1f ms in all:\n%s", static_cast<long long>(steps),
                steps_ms, mg::profiler::table(rows).c_str());
    LEAD_PRINTF("outside the table (data, the step's read, the host's own work): %.1f ms (%.1f%% of the steps)\n",
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
