// The op profiler (minigrad/core/profiler.h): each closed span is added into its row at once (CPU)
// or when its two CUDA events have been read back.
#include <minigrad/core/profiler.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <unordered_map>

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

// A CUDA span whose end event the device may not have reached yet.
struct Pending {
  size_t row;
  void* e0;
  void* e1;
};
constexpr size_t kPendingBatch = 4096;  // read back the oldest half beyond twice this many

// Guarded by g_mutex.
std::mutex g_mutex;
std::vector<Row> g_rows;
std::unordered_map<std::string, size_t> g_row_of;  // name, pass and device -> index in g_rows
std::deque<Pending> g_pending;
uint64_t g_generation = 0;  // start() begins a new one: a Scope opened before it is not counted

std::atomic<bool> g_on{false};
thread_local int t_depth = 0;

size_t row_for(const std::string& name, const std::string& pass, Device device) {
  std::string key = name + '\0' + pass + '\0' + device.str();
  if (auto it = g_row_of.find(key); it != g_row_of.end()) return it->second;
  g_rows.push_back({name, pass, device.str(), 0, 0.0});
  g_row_of.emplace(std::move(key), g_rows.size() - 1);
  return g_rows.size() - 1;
}

// Reads back the first n pending CUDA spans (waiting for the device where needed) into their rows.
void resolve(size_t n) {
  while (n-- > 0 && !g_pending.empty()) {
    Pending& p = g_pending.front();
    const double ms = cuda_mark_ms(p.e0, p.e1);  // may throw: the span stays pending
    cuda_mark_free(p.e0);
    cuda_mark_free(p.e1);
    g_rows[p.row].ms += ms;
    ++g_rows[p.row].calls;
    g_pending.pop_front();
  }
}

void clear() {
  for (const Pending& p : g_pending) {
    cuda_mark_free(p.e0);
    cuda_mark_free(p.e1);
  }
  g_pending.clear();
  g_rows.clear();
  g_row_of.clear();
}

}  // namespace

void start() {
  std::lock_guard<std::mutex> lock(g_mutex);
  clear();
  ++g_generation;
  g_on = true;
}

void stop() { g_on = false; }

void resume() { g_on = true; }

bool recording() { return g_on; }

Scope::Scope(const char* name, Device device, const char* pass) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  if (t_depth++ > 0) {  // inside a counted span: the outer one counts
    state_ = State::nested;
    return;
  }
  try {
    name_ = name;
    pass_ = pass;
    device_ = device;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      generation_ = g_generation;
    }
    if (device.is_cuda()) e0_ = cuda_mark(device.index);
    else t0_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  } catch (...) {
    --t_depth;
    throw;
  }
  state_ = State::open;
}

Scope::~Scope() {
  if (state_ == State::off) return;
  --t_depth;
  if (state_ == State::nested) return;
  void* e1 = nullptr;
  double ms = 0.0;
  if (device_.is_cuda()) {
    try {
      e1 = cuda_mark(device_.index);
    } catch (...) {  // a destructor must not throw: the span is dropped
      cuda_mark_free(e0_);
      return;
    }
  } else {
    const int64_t t1 = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
    ms = static_cast<double>(t1 - t0_ns_) / 1e6;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  if (generation_ != g_generation) {  // start() since: this span belongs to no recording
    cuda_mark_free(e0_);
    cuda_mark_free(e1);
    return;
  }
  const size_t row = row_for(name_, pass_, device_);
  if (e1 == nullptr) {
    g_rows[row].ms += ms;
    ++g_rows[row].calls;
    return;
  }
  g_pending.push_back({row, e0_, e1});
  if (g_pending.size() >= 2 * kPendingBatch) {
    try {
      resolve(kPendingBatch);  // long done, as a rule: the device is rarely that far behind
    } catch (...) {  // a CUDA error: report() will meet it again
    }
  }
}

std::vector<Row> report() {
  std::lock_guard<std::mutex> lock(g_mutex);
  resolve(g_pending.size());
  std::vector<Row> rows;
  for (const Row& r : g_rows) {
    if (r.calls > 0) rows.push_back(r);
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
