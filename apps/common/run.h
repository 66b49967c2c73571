// The flags every app takes for a run through mg::Trainer, defined once: the device, the seed, the
// memory (--memory-budget, --memory-limit, --checkpoint, --tiles), reading ahead (--prefetch), the
// records (--save-dir, --json, --profile, --timeline); what is set up from them before the model is made; the plan as the apps
// print it and write it to --json; and main's error handling.
//
//   RunFlags f{.device = "cpu"};                     // an app's defaults
//   add_run_flags(app, f, "images per step");        // what --batch-size means under --memory-budget
//   CLI11_PARSE(app, argc, argv);
//   return run_main("vgg_ckpt", f, [&] {
//     const RunSetup run = setup_run(f, "final.safetensors");
//     ... mg::Trainer trainer(..., {.memory_budget = f.memory_budget, .checkpoint = f.checkpoint, ...});
//     print_plan(trainer, f);  ... write plan_json(trainer, report) ...
//     return 0;
//   });
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include <minigrad/dist/dist.h>
#include <minigrad/minigrad.h>
#include <minigrad/nn/checkpoint_plan.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/train/trainer.h>
#include <minigrad/util/bytes.h>
#include <minigrad/util/file.h>
#include <nlohmann/json.hpp>

#include "common/flags.h"
#include "common/phases.h"
#include "common/plan.h"
#include "common/profile.h"
#include "common/ranks.h"
#include "common/stats.h"
#include "common/timeline.h"

struct RunFlags {
  std::string device = "cpu";
  uint64_t seed = 0;
  std::string memory_budget, memory_limit, checkpoint = "none", tiles = "on", precision = "fp32";
  int plan_timings = 1;
  std::string offload = "auto", host_memory_limit, prefetch = "auto";
  bool explain_memory = false;
  std::string save_dir, json_path, timeline_path;
  StepProfile prof;
  Phases phases;          // where the run's wall time goes (common/phases.h)
  bool timeline = false;  // offer --timeline (the apps that train data-parallel on CUDA)
};

// --device, --seed, --memory-budget (which excludes --checkpoint), --memory-limit, --checkpoint,
// --tiles, --offload, --prefetch, --save-dir, --json, --profile and, when f.timeline, --timeline. `per_step` says what
// --batch-size counts under --memory-budget.
inline void add_run_flags(CLI::App& app, RunFlags& f, const std::string& per_step) {
  app.add_option("--device", f.device, "auto, cpu or cuda[:i]")->check(nonempty())->capture_default_str();
  app.add_option("--seed", f.seed, "seed of the weights, the sample order and dropout")->check(unsigned64())->capture_default_str();
  auto* checkpoint = app.add_option("--checkpoint", f.checkpoint, "none | sqrt | min | segments=K | budget=SIZE, or the "
                                    "segments as plans print them: '[0,3)@host [3,6)/4 [8,12)' (@host: offloaded, /R: tiles)")
                         ->check(nonempty())->capture_default_str();
  auto* budget = app.add_option("--memory-budget", f.memory_budget,
                                "plan micro-batch, accumulation and checkpointing for this many bytes (e.g. 200MB, or "
                                "'free': what the device has); --batch-size is then " + per_step)
                     ->check(nonempty());
  checkpoint->excludes(budget);
  app.add_option("--plan-timings", f.plan_timings, "with --memory-budget: time each micro-batch size this many times and "
                 "plan on each layer's least time (steadier choices between nearly equal plans; measuring takes that "
                 "many times longer)")
      ->check(CLI::Range(1, 10))->capture_default_str();
  app.add_option("--memory-limit", f.memory_limit, "cap the device's allocator at this many bytes (mg::set_memory_limit)")
      ->check(nonempty());
  app.add_option("--tiles", f.tiles, "on: plans may run checkpointed segments in tiles of the batch (min, budget=, "
                 "--memory-budget) | off: whole layers only")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_option("--offload", f.offload, "auto (CUDA only) | on | off: plans may keep a segment's activations in the host "
                 "pool instead of recomputing them (on the CPU an emulation: Note [offload])")
      ->check(CLI::IsMember({"auto", "on", "off"}))->capture_default_str();
  app.add_option("--prefetch", f.prefetch, "auto (CUDA only) | on | off: read the next micro-batch on a thread and copy "
                 "it to the device while one computes, one micro-batch more in memory (Note [prefetched micro-batches])")
      ->check(CLI::IsMember({"auto", "on", "off"}))->capture_default_str();
  app.add_option("--host-memory-limit", f.host_memory_limit, "cap the host pool offloaded activations wait in "
                 "(mg::set_host_memory_limit); plans offload no more")->check(nonempty());
  app.add_flag("--explain-memory", f.explain_memory, "before training, print where the step's memory goes, term by "
               "term (mg::nn::explain_memory), and add it to --json");
  app.add_option("--precision", f.precision, "fp32 | tf32 (CUDA's TF32 products) | bf16 | fp16: what the steps compute "
                 "in; parameters, gradients and optimizer state stay float32 (Note [autocast])")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}))->capture_default_str();
  app.add_option("--save-dir", f.save_dir, "write epoch_K.safetensors and its training state after each epoch")->check(nonempty());
  app.add_option("--json", f.json_path, "write a JSON summary here")->check(nonempty());
  app.add_flag("--profile", f.prof.on, "after training, the time of every op by pass (forward, backward, replay) over "
               "the steps after the first (minigrad/core/profiler.h)");
  if (f.timeline) {
    app.add_option("--timeline", f.timeline_path, "write where each CUDA reduction ran against backward, a trace for "
                   "chrome://tracing (data parallel on CUDA; bench/timeline.py summarises it)")->check(nonempty());
  }
}

// A float flag's value as a string that reads back to the same float (a run's signature).
inline std::string exact_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

struct RunSetup {
  mg::Device dev;
  size_t limit = 0;  // --memory-limit's bytes (0: none)
};

// Checks the run's flags before any work and sets up what they ask: the device (under data
// parallelism "cuda" or "auto" is each rank's own GPU, its context started), the memory cap, the
// --json and --save-dir paths (`save_file`: a file the app writes there, checked writable).
inline RunSetup setup_run(const RunFlags& f, const std::string& save_file) {
  RunSetup s;
  mg::Device dev = f.device == "auto" ? (mg::cuda_available() ? mg::Device::cuda() : mg::Device::cpu())
                                      : for_flag("--device", [&] { return mg::Device::parse(f.device); });
  s.dev = mg::dist::device_for_rank(dev, f.device.find(':') != std::string::npos);
  if (s.dev.is_cuda()) MG_CHECK(mg::cuda_available(), "--device cuda: no CUDA device (or a build without CUDA); use --device cpu");
  if (!f.memory_limit.empty()) s.limit = for_flag("--memory-limit", [&] { return mg::parse_bytes(f.memory_limit); });
  if (!f.memory_budget.empty() && f.memory_budget != "free") for_flag("--memory-budget", [&] { return mg::parse_bytes(f.memory_budget); });
  if (f.memory_budget.empty()) for_flag("--checkpoint", [&] { mg::nn::check_plan_spec(f.checkpoint); });
  if (s.limit != 0) mg::set_memory_limit(s.dev, s.limit);
  if (!f.host_memory_limit.empty()) {
    mg::set_host_memory_limit(for_flag("--host-memory-limit", [&] { return mg::parse_bytes(f.host_memory_limit); }));
  }
  if (!f.json_path.empty()) mg::check_writable(f.json_path, "--json");
  check_timeline_flag(f.timeline_path, s.dev, f.offload != "off");
  if (!f.save_dir.empty()) {
    for_flag("--save-dir", [&] { return std::filesystem::create_directories(f.save_dir); });
    mg::check_writable(f.save_dir + "/" + save_file, "--save-dir");
  }
  mg::synchronize(s.dev);  // on CUDA the device's context starts here: the "device" phase (common/phases.h)
  return s;
}

inline mg::nn::MeasureOptions::Offload offload_mode(const RunFlags& f) {
  using O = mg::nn::MeasureOptions::Offload;
  return f.offload == "on" ? O::on : f.offload == "off" ? O::off : O::automatic;
}

inline mg::Prefetch prefetch_mode(const RunFlags& f) {
  return f.prefetch == "on" ? mg::Prefetch::on : f.prefetch == "off" ? mg::Prefetch::off : mg::Prefetch::automatic;
}

// The trainer's plan, printed (rank 0) as the apps do: the split, the checkpoint plan, its
// predicted peak and the least any plan needs, the cap, where the peak falls.
inline const mg::nn::TrainPlan& print_plan(mg::Trainer& trainer, const RunFlags& f) {
  const mg::nn::TrainPlan& tp = plan_naming_flags(trainer, !f.memory_budget.empty(), f.memory_limit);
  const mg::nn::Plan& plan = tp.checkpoint;
  const mg::nn::ChainCost& cost = trainer.cost();
  mg::nn::ChainCost whole_layers = cost;  // the floor without tiles, for comparison
  whole_layers.tile_costs.clear();
  const size_t floor = mg::nn::min_feasible_peak(cost), floor_whole = mg::nn::min_feasible_peak(whole_layers);
  if (trainer.budget()) {
    LEAD_PRINTF("memory budget %s%s: %s\n  predicted step %.1f ms (%.2f ms per sample)\n",
                mg::format_bytes(trainer.budget()).c_str(),
                f.memory_budget == "free" || f.memory_budget.empty() ? " (what the device has)" : "", tp.str().c_str(),
                tp.predicted_step_ms, tp.ms_per_sample());
  }
  LEAD_PRINTF("plan %s: %s\n  predicted peak %s, recompute %.3g GFLOP; smallest feasible peak %s%s; fixed %s\n",
              plan.kind.c_str(), plan.str().c_str(), mg::format_bytes(plan.predicted_peak).c_str(),
              plan.recompute_flops / 1e9, mg::format_bytes(floor).c_str(),
              floor < floor_whole ? (" (" + mg::format_bytes(floor_whole) + " in whole layers)").c_str() : "",
              mg::format_bytes(cost.fixed_bytes).c_str());
  if (plan.predicted_host_peak > 0) {
    LEAD_PRINTF("  offloaded: %s in the host pool at once, %.2f ms on the link a step (%.2f GB/s to the host, %.2f back)\n",
                mg::format_bytes(plan.predicted_host_peak).c_str(), plan.offload_ms, cost.to_host_bytes_per_ms / 1e6,
                cost.from_host_bytes_per_ms / 1e6);
  }
  if (!f.memory_limit.empty()) LEAD_PRINTF("memory limit %s (mg::set_memory_limit)\n", f.memory_limit.c_str());
  LEAD_PRINTF("  peak at %s\n", mg::nn::explain_peak(cost, plan.segments).where.c_str());
  if (f.explain_memory) LEAD_PRINTF("%s", trainer.explain_memory().str().c_str());
  return tp;
}

// What every app writes to --json about the plan and the run: the split, the checkpoint plan and
// its segments ([begin, end], [begin, end, tile rows] or [begin, end, "host"] when offloaded), predicted and measured peaks, re-plans
// (steps counted from 1; 0: while planning), step times.
inline nlohmann::ordered_json plan_json(const mg::Trainer& trainer, const mg::FitReport& r, const RunFlags& f) {
  const mg::nn::TrainPlan& last = r.plan;  // after any re-plan
  nlohmann::ordered_json j;
  j["device"] = trainer.device().str();
  j["world_size"] = mg::dist::world_size();
  j["plan"] = last.checkpoint.kind;
  j["micro_batch"] = last.micro_batch;
  j["last_micro_batch"] = last.last_micro_batch;
  j["accumulation"] = last.accumulation;
  j["segments"] = nlohmann::json::array();
  for (const auto& s : last.checkpoint.segments) {
    nlohmann::ordered_json seg = nlohmann::ordered_json::array({s.begin, s.end});
    if (s.tile_rows) seg.push_back(s.tile_rows);
    if (s.offload) seg.push_back("host");
    j["segments"].push_back(seg);
  }
  const mg::nn::ChainCost& c = trainer.cost();  // what the plan was made from
  j["num_layers"] = c.units.empty() ? 0 : c.units.back().end;
  j["predicted_peak_bytes"] = last.predicted_peak;
  j["predicted_peak_at"] = mg::nn::explain_peak(c, last.checkpoint.segments).where;
  if (last.checkpoint.budget) j["budget_bytes"] = last.checkpoint.budget;
  j["recompute_gflop"] = last.checkpoint.recompute_flops / 1e9;
  j["offload"] = f.offload;
  j["predicted_host_peak_bytes"] = last.checkpoint.predicted_host_peak;
  j["host_peak_in_use_bytes"] = mg::host_memory_stats().peak_in_use;
  if (mg::nn::offload_offered(c)) {
    j["offload_ms"] = last.checkpoint.offload_ms;
    j["host_link_bytes_per_ms"] = {c.to_host_bytes_per_ms, c.from_host_bytes_per_ms};
  }
  j["min_feasible_peak_bytes"] = mg::nn::min_feasible_peak(c);
  mg::nn::ChainCost whole = c;
  whole.tile_costs.clear();
  j["min_feasible_peak_whole_layers_bytes"] = mg::nn::min_feasible_peak(whole);
  j["min_feasible_plan"] = mg::nn::plan_min_peak(c).str();
  j["fixed_bytes"] = c.fixed_bytes;
  j["tiles"] = f.tiles == "on";
  j["plan_timings"] = f.plan_timings;
  j["units"] = nlohmann::json::array();
  for (const auto& u : c.units) {
    j["units"].push_back({{"layers", {u.begin, u.end}}, {"name", u.name}, {"out_bytes", u.out_bytes},
                          {"extra_bytes", u.extra_bytes}, {"leaf_bytes", u.leaf_bytes + u.leaf_only_bytes}, {"saves_input", u.saves_input}, {"saves_output", u.saves_output},
                          {"fwd_peak", u.fwd_peak}, {"replay_peak", u.replay_peak}, {"bwd_peak", u.bwd_peak}, {"gflop", u.flops / 1e9},
                          {"forward_ms", u.forward_ms}, {"backward_ms", u.backward_ms}});
  }
  j["peak_in_use_bytes"] = r.peak_in_use;
  j["peak_reserved_bytes"] = r.peak_reserved;
  if (trainer.budget()) {
    j["memory_budget_bytes"] = trainer.budget();
    j["predicted_step_ms"] = last.predicted_step_ms;
  }
  if (!f.memory_limit.empty()) j["memory_limit_bytes"] = mg::parse_bytes(f.memory_limit);
  j["replans"] = nlohmann::json::array();
  for (const mg::Replan& p : r.replans) {
    j["replans"].push_back({{"step", p.step + 1}, {"memory_bytes", p.memory}, {"from", p.from}, {"to", p.to}});
  }
  j["steps"] = r.steps;
  j["resumed_from_epoch"] = r.resumed_from_epoch;
  j["median_step_ms"] = r.median_step_ms();
  j["step_ms"] = r.step_ms;
  j["median_step_cpu_ms"] = median(r.step_cpu_ms);
  j["step_cpu_ms"] = r.step_cpu_ms;
  j["median_step_issue_ms"] = median(r.step_issue_ms);  // the host's issue time (FitReport::step_issue_ms)
  j["step_issue_ms"] = r.step_issue_ms;
  // Per step (issue 36's batch-64 cliff): the wait for data, the step's peaks, cudaMalloc calls.
  j["prefetch"] = r.prefetch;
  j["step_data_ms"] = r.step_data_ms;
  j["step_peak_in_use_bytes"] = r.step_peak_in_use;
  j["step_peak_reserved_bytes"] = r.step_peak_reserved;
  j["step_system_allocs"] = r.step_system_allocs;
  j["losses"] = r.losses;
  j["precision"] = f.precision;
  j["seed"] = f.seed;
  j["threads"] = mg::num_threads();
  j["phases_ms"] = f.phases.json();  // the marks made so far
  j["plan_preflight_ms"] = trainer.plan_times().preflight_ms;
  j["plan_measure_ms"] = trainer.plan_times().measure_ms;
  if (f.prof.on) j["profile"] = f.prof.json();
  if (f.explain_memory) {
    const mg::nn::MemoryReport m = trainer.explain_memory();
    nlohmann::ordered_json mj;
    mj["predicted_peak_bytes"] = m.predicted_peak;
    mj["terms"] = nlohmann::json::array();
    for (const auto& t : m.terms) mj["terms"].push_back({{"name", t.name}, {"bytes", t.bytes}, {"note", t.note}});
    mj["units"] = nlohmann::json::array();
    for (size_t u = 0; u < m.units.size(); ++u) {
      mj["units"].push_back({{"name", m.unit_names[u]}, {"choice", m.units[u].choice}, {"kept_bytes", m.units[u].kept},
                             {"recomputed_bytes", m.units[u].dropped}, {"offloaded_bytes", m.units[u].offloaded}});
    }
    mj["host_bytes"] = m.host_bytes;
    mj["capacity_bytes"] = m.capacity;
    mj["min_feasible_peak_bytes"] = m.min_feasible_peak;
    mj["advice"] = m.advice;
    j["memory"] = mj;
  }
  return j;
}

// main's body with the apps' error handling: an error is one line on stderr naming the rank (and
// the cap, for out of memory), exit status 1, and under data parallelism the other ranks stopped
// (Note [collectives never hang]).
template <typename F>
int run_main(const char* app, const RunFlags& f, F&& body) {
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "%s: %serror: %s\n", app, rank_prefix().c_str(), what.c_str());
    if (mg::dist::world_size() > 1) mg::dist::abort_all(1);
    return 1;
  };
  try {
    return body();
  } catch (const mg::OutOfMemoryError& e) {
    return fail((f.memory_limit.empty() ? "" : "under --memory-limit " + f.memory_limit + ": ") + e.what());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
