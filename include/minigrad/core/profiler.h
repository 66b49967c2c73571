// Where a step's time goes: per op and pass, the calls and their total time, from start() to stop().
//
//   mg::profiler::start();
//   for (int i = 0; i < 10; ++i) train_step();
//   mg::profiler::stop();
//   std::fputs(mg::profiler::table(mg::profiler::report()).c_str(), stdout);
//
// Every op is counted under its name (the op table's: "linear", "conv2d", ...) and its pass:
// "forward", "backward", or "replay" for the forward a checkpointed segment runs again during
// backward. The optimizers' updates and zeroing, and the Accumulator's reduction across ranks,
// count as scopes ("optimizer.step", "optimizer.zero_grad", "dist.reduce"). What none of them
// covers (the loss's read, the data, the host's own work) is the step's time minus the table's
// total.
//
// CPU: the wall time of each call (CPU kernels return when their work is done). CUDA: the device's
// time between two events recorded on its stream before and after the call's launches, so a
// kernel is charged to the op that launched it, and report() waits for the device. A call inside
// another counted one counts for the outer one only. Not recording costs one flag check per call;
// recording, two clock reads (CPU) or two CUDA events (CUDA) per call; CUDA's are read back
// (and freed) in batches as the device finishes them, so a long run holds few.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <minigrad/core/device.h>

namespace mg::profiler {

void start();   // forgets what was recorded and records from now on
void stop();    // stops recording; what was recorded stays for report()
void resume();  // records again, adding to what was recorded: ops run while stopped are not counted,
                // but a span open across stop() and resume() counts whole
bool recording();

struct Row {
  std::string name;    // the op's ("linear") or the scope's ("optimizer.step")
  std::string pass;    // "forward", "backward", "replay", or "" for a scope
  std::string device;  // "cpu", "cuda:0"
  int64_t calls = 0;
  double ms = 0.0;  // all calls
};
// One row per (name, pass, device), the longest first.
std::vector<Row> report();
// The rows as a table: total and mean time, calls, share of the rows' total; a last line totals them.
std::string table(const std::vector<Row>& rows);

// A span of one's own, counted as `name` (with no pass) from construction to destruction while
// recording. One opened before start() counts for nothing, nor does what runs inside it.
class Scope {
 public:
  Scope(const char* name, Device device, const char* pass = "");
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  enum class State : uint8_t { off, nested, open };
  State state_ = State::off;
  uint64_t generation_ = 0;
  std::string name_, pass_;
  Device device_;
  int64_t t0_ns_ = 0;
  void* e0_ = nullptr;  // CUDA: the event before
};

}  // namespace mg::profiler
