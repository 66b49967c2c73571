// The op profiler (minigrad/core/profiler.h): spans recorded while on, summed by report().
#include <minigrad/core/profiler.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>

#include "core/tape.h"

namespace mg {

namespace {
thread_local int t_replay = 0;
}  // namespace

ReplayPass::ReplayPass() { ++t_replay; }
ReplayPass::~ReplayPass() { --t_replay; }
const char* forward_pass() { return t_replay > 0 ? "replay" : "forward"; }

namespace profiler {
namespace {

using Clock = std::chrono::steady_clock;

// One call: CPU spans hold two clock readings, CUDA spans two events until report() reads them.
struct Span {
  std::string name;
  const char* pass = "";
  Device device;
  Clock::time_point t0, t1;
  void* e0 = nullptr;
  void* e1 = nullptr;
  bool done = false;
  double ms = -1.0;  // known once read
};

std::mutex g_mutex;
std::vector<Span> g_spans;
std::atomic<bool> g_on{false};
uint64_t g_generation = 0;  // start() begins a new one: a Scope opened before it is not counted
thread_local int t_depth = 0;

void free_marks(Span& s) {
  cuda_mark_free(s.e0);
  cuda_mark_free(s.e1);
  s.e0 = s.e1 = nullptr;
}

void clear() {
  for (Span& s : g_spans) free_marks(s);
  g_spans.clear();
}

}  // namespace

void start() {
  std::lock_guard<std::mutex> lock(g_mutex);
  clear();
  ++g_generation;
  g_on = true;
}

void stop() { g_on = false; }

bool recording() { return g_on; }

// slot_: -1 when not recording at construction, -2 inside another counted span (the depth was
// raised, nothing recorded), else the span's index in g_spans of generation_.
Scope::Scope(const char* name, Device device, const char* pass) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  if (t_depth++ > 0) {
    slot_ = -2;
    return;
  }
  try {
    Span s;
    s.name = name;
    s.pass = pass;
    s.device = device;
    if (device.is_cuda()) s.e0 = cuda_mark(device.index);
    else s.t0 = Clock::now();
    std::lock_guard<std::mutex> lock(g_mutex);
    slot_ = static_cast<int64_t>(g_spans.size());
    generation_ = g_generation;
    g_spans.push_back(std::move(s));
  } catch (...) {
    --t_depth;
    throw;
  }
}

Scope::~Scope() {
  if (slot_ == -1) return;
  --t_depth;
  if (slot_ == -2) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (generation_ != g_generation || slot_ >= static_cast<int64_t>(g_spans.size())) return;  // start() since
  Span& s = g_spans[static_cast<size_t>(slot_)];
  if (s.device.is_cuda()) {
    try {
      s.e1 = cuda_mark(s.device.index);
    } catch (...) {  // a destructor must not throw: the span is dropped
      free_marks(s);
      return;
    }
  } else {
    s.t1 = Clock::now();
  }
  s.done = true;
}

std::vector<Row> report() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<Row> rows;
  for (Span& s : g_spans) {
    if (!s.done) continue;
    if (s.ms < 0.0) {
      if (s.device.is_cuda()) {
        s.ms = cuda_mark_ms(s.e0, s.e1);
        free_marks(s);
      } else {
        s.ms = std::chrono::duration<double, std::milli>(s.t1 - s.t0).count();
      }
    }
    const std::string device = s.device.str();
    auto it = std::find_if(rows.begin(), rows.end(),
                           [&](const Row& r) { return r.name == s.name && r.pass == s.pass && r.device == device; });
    if (it == rows.end()) {
      rows.push_back({s.name, s.pass, device, 0, 0.0});
      it = rows.end() - 1;
    }
    ++it->calls;
    it->ms += s.ms;
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  return rows;
}

std::string table(const std::vector<Row>& rows) {
  double total = 0.0;
  int64_t calls = 0;
  for (const Row& r : rows) {
    total += r.ms;
    calls += r.calls;
  }
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-28s %-9s %-7s %9s %12s %11s %7s\n", "op or scope", "pass", "device", "calls",
                "total ms", "mean us", "share");
  out += line;
  for (const Row& r : rows) {
    std::snprintf(line, sizeof line, "%-28s %-9s %-7s %9lld %12.3f %11.1f %6.1f%%\n", r.name.c_str(), r.pass.c_str(),
                  r.device.c_str(), static_cast<long long>(r.calls), r.ms, 1000.0 * r.ms / static_cast<double>(r.calls),
                  total > 0.0 ? 100.0 * r.ms / total : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-28s %-9s %-7s %9lld %12.3f\n", "total", "", "", static_cast<long long>(calls),
                total);
  out += line;
  return out;
}

}  // namespace profiler
}  // namespace mg
