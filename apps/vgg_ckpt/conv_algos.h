// vgg_ckpt --conv-algos: what cuDNN ran for each convolution (mg::cuda::conv_algorithms), printed
// for the step's micro-batches and written whole to --json. Issue 36's batch-64 cliff: which
// layers changed algorithm between two batch sizes, and what the workspace limit passed over.
//
//   print_conv_algorithms({64});   j["conv_algorithms"] = conv_algorithms_json();
#pragma once

#include <cstdint>
#include <cstdio>
#include <set>
#include <string>

#include <minigrad/cuda.h>
#include <minigrad/util/bytes.h>
#include <nlohmann/json.hpp>

#include "common/ranks.h"

inline std::string ms_str(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", ms);
  return buf;
}

inline std::string conv_shape_str(const mg::cuda::ConvAlgorithm& a) {
  return "x " + std::to_string(a.n) + "x" + std::to_string(a.c) + "x" + std::to_string(a.h) + "x" + std::to_string(a.w) +
         " w " + std::to_string(a.o) + "x" + std::to_string(a.c) + "x" + std::to_string(a.kh) + "x" + std::to_string(a.kw) +
         " s" + std::to_string(a.stride) + " p" + std::to_string(a.pad) + (a.layout == "nhwc" ? " nhwc" : "");
}

// The choices made for batches of `rows` (the plan's micro-batches); those of other sizes (the
// planner's measuring, tiles) are counted, not listed.
inline void print_conv_algorithms(const std::set<int64_t>& rows) {
  const auto all = mg::cuda::conv_algorithms();
  if (all.empty()) {
    LEAD_PRINTF("conv algorithms: none chosen (no convolution ran on a GPU)\n");
    return;
  }
  LEAD_PRINTF("conv algorithms (cuDNN, workspace limit %s):\n", mg::format_bytes(mg::cuda::conv_workspace_limit()).c_str());
  size_t others = 0;
  for (const auto& a : all) {
    if (!rows.count(a.n)) {
      ++others;
      continue;
    }
    std::string passed;
    for (const auto& s : a.skipped) {
      passed += (passed.empty() ? "" : ", ") + s.algo_name + " (" + s.why + ", " + mg::format_bytes(s.workspace_bytes) +
                (s.time_ms >= 0 ? ", " + ms_str(s.time_ms) : std::string()) + ")";
    }
    LEAD_PRINTF("  %-40s %-15s %-22s %-10s %10s  %s%s%s\n", conv_shape_str(a).c_str(), a.pass.c_str(), a.algo_name.c_str(),
                a.math.c_str(), mg::format_bytes(a.workspace_bytes).c_str(), a.how.c_str(),
                a.time_ms >= 0 ? (", " + ms_str(a.time_ms)).c_str() : "",
                passed.empty() ? "" : ("; passed over: " + passed).c_str());
  }
  if (others > 0) LEAD_PRINTF("  (%zu more at other batch sizes, made while planning: in --json)\n", others);
}

inline nlohmann::ordered_json conv_algorithms_json() {
  nlohmann::ordered_json list = nlohmann::json::array();
  for (const auto& a : mg::cuda::conv_algorithms()) {
    nlohmann::ordered_json j;
    j["x"] = {a.n, a.c, a.h, a.w};
    j["w"] = {a.o, a.c, a.kh, a.kw};
    j["stride"] = a.stride;
    j["pad"] = a.pad;
    j["dtype"] = a.dtype;
    j["layout"] = a.layout;
    j["pass"] = a.pass;
    j["algo"] = a.algo;
    j["algo_name"] = a.algo_name;
    j["math"] = a.math;
    j["workspace_bytes"] = a.workspace_bytes;
    j["how"] = a.how;
    j["rank"] = a.rank;
    j["time_ms"] = a.time_ms;
    j["skipped"] = nlohmann::json::array();
    for (const auto& s : a.skipped) {
      j["skipped"].push_back({{"algo_name", s.algo_name}, {"workspace_bytes", s.workspace_bytes}, {"time_ms", s.time_ms},
                              {"why", s.why}});
    }
    j["tf32"] = a.tf32;
    j["benchmark"] = a.benchmark;
    j["deterministic"] = a.deterministic;
    j["workspace_limit_bytes"] = a.workspace_limit;
    list.push_back(j);
  }
  return list;
}
