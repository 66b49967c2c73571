// Where an app's wall time goes around its steps, in order: starting the process (the dynamic
// loader's work, CUDA's libraries among it, and MPI's under mpirun), the device (its CUDA context),
// the data, the model (its weights drawn on the host and copied to the device, the optimizer's
// state), the plan (measuring; on CUDA also the first cuBLAS and cuDNN calls and cuDNN's choices of
// algorithm), the training; printed after training and written under "phases_ms" in --json. On
// the GPU a run spent 25 to 38 s outside its steps (docs/gpu-queue.md, item 3): these say where.
//
//   Phases phases;             // early in main: "start" is the process's time before it
//   ... phases.mark("data"); ... phases.mark("model"); ...
//   phases.print();  j["phases_ms"] = phases.json();
#pragma once

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

// Milliseconds from the process's start (/proc/self/stat's starttime, in clock ticks since boot)
// until now (CLOCK_BOOTTIME, the same clock); -1 where /proc cannot say. 10 ms resolution.
inline double ms_since_process_start() {
  std::ifstream in("/proc/self/stat");
  std::string stat;
  if (!std::getline(in, stat)) return -1;
  const size_t close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 2));  // from field 3 (state)
  std::string field;
  for (int i = 3; i <= 22; ++i) {  // field 22: starttime
    if (!(rest >> field)) return -1;
  }
  timespec now{};
  const long ticks = sysconf(_SC_CLK_TCK);
  if (ticks <= 0 || clock_gettime(CLOCK_BOOTTIME, &now) != 0) return -1;
  const double start_ms = std::stod(field) * 1000.0 / static_cast<double>(ticks);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) / 1e6 - start_ms;
}

struct Phases {
  using Clock = std::chrono::steady_clock;
  Clock::time_point last = Clock::now();
  std::vector<std::pair<std::string, double>> ms{{"start", ms_since_process_start()}};

  // The wall time since the previous mark (or since main began), as phase `name`.
  void mark(const std::string& name) {
    const Clock::time_point now = Clock::now();
    ms.emplace_back(name, std::chrono::duration<double, std::milli>(now - last).count());
    last = now;
  }
  nlohmann::ordered_json json() const {
    nlohmann::ordered_json j;
    for (const auto& [name, t] : ms) j[name] = t;
    return j;
  }
  // One line: "wall time: start 0.05 s, device 0.00 s, ..." (a phase /proc could not time left out).
  void print() const {
    std::string line = "wall time:";
    for (const auto& [name, t] : ms) {
      if (t < 0) continue;
      char buf[96];
      std::snprintf(buf, sizeof buf, "%s %s %.2f s", line.back() == ':' ? "" : ",", name.c_str(), t / 1e3);
      line += buf;
    }
    std::printf("%s\n", line.c_str());
  }
};
