// The benchmarks' clock: `run` called `warmup` times untimed, then timed in `reps` repetitions of
// `iters` calls each, the device synchronised before the first reading and after each repetition
// (so that a GPU's queued work is inside the time it belongs to); milliseconds per call.
//
//   const mg::bench::Timing t = mg::bench::time_ms([&] { mg::conv2d(x, w, b, 1, 1); }, dev, 2, 10);
//   std::printf("%.3f ms (min %.3f)\n", t.median_ms, t.min_ms);
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

#include <minigrad/core/device.h>

namespace mg::bench {

// The upper median (the element at size / 2 once sorted), as every benchmark here reports it; 0
// for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timing {
  double median_ms = 0, min_ms = 0;
};

template <class F> Timing time_ms(F&& run, Device dev, int warmup, int reps, int iters = 1) {
  for (int i = 0; i < warmup; ++i) run();
  synchronize(dev);
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) run();
    synchronize(dev);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  return {median(ms), ms.empty() ? 0 : *std::min_element(ms.begin(), ms.end())};
}

}  // namespace mg::bench
