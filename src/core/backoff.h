// The thread pool's back-off policy (Note [backing off]), apart from the pool so that tests can
// drive it with made-up timings.
#pragma once

#include <algorithm>
#include <chrono>

namespace mg::cpu::detail {

// Note [backing off]
// ~~~~~~~~~~~~~~~~~~
// The caller times each part with more than one thread: from publishing it to claiming nothing
// more (its own work), and from then to the last piece's end (waiting). Waiting up to two of
// its own pieces' average time, or up to the CPU time of the longest piece a worker ran (each
// worker piece reads its thread's CPU clock), is the normal unevenness of the last pieces; the
// rest is a stall, a worker descheduled inside a piece. (Without the second allowance a part of
// two unequal pieces, as convolutions have at micro-batch 1, looked like a stall whenever the
// worker drew the longer one, and a quiet machine ran on one thread for seconds at a time, which
// slowed VGG16/8 at micro-batch 1: BENCHMARKS.md, "Figures behind the design notes".) Over a
// window of 10 ms of parallel time, stalls above a quarter of it mean the machine is shared: one
// thread fewer. After a pause (200 ms, doubling while it keeps failing, at most 3.2 s) the full
// count is tried again. Results do not change
// (Note [fixed pieces]); only who computes the pieces does.
struct Backoff {
  using clock = std::chrono::steady_clock;

  int active = 0;  // threads in use now; 0: all of num_threads()
  clock::duration window_total{}, window_stall{};
  clock::time_point retry_at{};
  clock::duration pause = std::chrono::milliseconds(200);

  int threads(int configured, clock::time_point now) {
    if (active != 0 && now >= retry_at) active = 0;  // try them all again
    return active == 0 ? configured : std::min(active, configured);
  }
  void record(int used, clock::duration total, clock::duration stall, clock::time_point now) {
    window_total += total;
    window_stall += stall;
    if (window_total < std::chrono::milliseconds(10)) return;
    const bool stalled = window_stall * 4 > window_total;
    window_total = window_stall = {};
    if (stalled) {
      active = std::max(used - 1, 1);
      retry_at = now + pause;
      pause = std::min<clock::duration>(pause * 2, std::chrono::milliseconds(3200));
    } else if (active == 0) {
      pause = std::chrono::milliseconds(200);  // the full count works: forget earlier failures
    }
  }
};

}  // namespace mg::cpu::detail
