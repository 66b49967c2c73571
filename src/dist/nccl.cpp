// mg::dist's NCCL backend: collectives on CUDA tensors (src/dist/backend.h). One communicator for
// the device of the first CUDA collective, made with the unique id rank 0 broadcasts over MPI (or
// makes alone, in a world of one: Note [a world of one] in minigrad/dist/dist.h; no MPI is needed).
// NCCL runs on a stream of its own: an event orders it after the compute stream's work (the
// backward that produced the gradients) and the compute stream waits for its end, so the host
// does not stop the GPU between the two. The host then polls the end against the deadline
// (Note [collectives never hang]); on a timeout the communicator is aborted. The communicator is
// non-blocking, so its creation and launches are bounded by the same deadline (Note [NCCL never
// blocks the host]).
//
// ONLY COMPILED so far: no session has had a GPU with NCCL (docs/distributed.md).
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <minigrad/core/error.h>

#include "core/tape.h"
#include "dist/backend.h"
#include "kernels/cuda/common.cuh"

#define MG_NCCL_CHECK(expr)                                                                           \
  do {                                                                                                \
    const ncclResult_t mg_nccl_rc = (expr);                                                           \
    MG_CHECK_GEN(mg_nccl_rc == ncclSuccess, #expr, "NCCL: " << ncclGetErrorString(mg_nccl_rc)         \
                                                            << " (" << ncclGetLastError(nullptr) << ")"); \
  } while (0)
#define MG_CUDA_RT_CHECK(expr)                                                                        \
  do {                                                                                                \
    const cudaError_t mg_cuda_rc = (expr);                                                            \
    MG_CHECK_GEN(mg_cuda_rc == cudaSuccess, #expr, "CUDA: " << cudaGetErrorString(mg_cuda_rc));       \
  } while (0)

namespace mg::dist::detail {

namespace {

struct Comm {
  ncclComm_t comm = nullptr;
  int device = -1, size = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr, done = nullptr;
  int started = 0;  // reductions enqueued by nccl_all_reduce_start and not waited for
  // Their tensors, held until the compute stream is ordered after them: the caching allocator
  // reuses a freed block at once on the compute stream (Note [cuda stream]), and NCCL may still be
  // reading or writing it.
  std::vector<Tensor> in_flight;
};
Comm g_comm;

// Note [NCCL never blocks the host]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The communicator is made non-blocking
// (ncclConfig_t::blocking = 0). Its creation, the host half of a group's launch (NCCL connects
// to the peers on first use) and its finalization then return ncclInProgress at once, and the
// host polls ncclCommGetAsyncError against the collective deadline (Note [collectives never
// hang]). A blocking communicator would wait forever in ncclCommInitRank, in the first
// ncclGroupEnd or in ncclCommDestroy for a peer that died after the unique id was exchanged.
// Until a launch has settled its kernels may not be on NCCL's stream yet, so nothing is recorded
// after them before it has.
using Clock = std::chrono::steady_clock;

Clock::time_point deadline_in(double timeout_s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}

// Polls the communicator's state until it leaves ncclInProgress or `deadline` passes; returns the
// state it reached, or ncclInProgress on the deadline.
ncclResult_t poll_state(ncclComm_t comm, Clock::time_point deadline) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) return rc;
    if (state != ncclInProgress) return state;
    if (Clock::now() > deadline) return ncclInProgress;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// Ends the communicator with its stream and events: on `abort` (a timeout, an asynchronous
// error, an exception unwinding through the Session) at once; otherwise after it finalizes (its
// work flushed), which is waited for at most `timeout_s` before it is aborted instead. Work still
// queued on NCCL's stream is abandoned by an abort, so the compute stream, which may wait on
// c.done, is not left waiting on a kernel that never ends.
void teardown(Comm& c, bool abort, double timeout_s = 0) {
  // On the communicator's device, without throwing (cuda::DeviceGuard throws): this runs in the
  // Session's destructor, and on a device already in error.
  int prev = -1;
  const bool switched = c.device >= 0 && cudaGetDevice(&prev) == cudaSuccess && prev != c.device &&
                        cudaSetDevice(c.device) == cudaSuccess;
  if (c.comm) {
    bool finalized = false;
    if (!abort) {
      const ncclResult_t rc = ncclCommFinalize(c.comm);
      finalized = (rc == ncclSuccess || rc == ncclInProgress) &&
                  poll_state(c.comm, deadline_in(timeout_s)) == ncclSuccess;
      if (!finalized) {
        std::fprintf(stderr, "mg::dist (NCCL): the communicator did not finalize within %g s; aborted\n", timeout_s);
      }
    }
    if (finalized) ncclCommDestroy(c.comm);
    else ncclCommAbort(c.comm);
  }
  if (c.stream) cudaStreamDestroy(c.stream);
  if (c.ready) cudaEventDestroy(c.ready);
  if (c.done) cudaEventDestroy(c.done);
  c = Comm{};
  if (switched) cudaSetDevice(prev);
}

// Aborts the communicator and throws NCCL's error `rc`, met while `doing`, with NCCL's last
// message (read first: the abort's own warnings would overwrite it).
[[noreturn]] void abort_on_error(Comm& c, const std::string& doing, ncclResult_t rc) {
  const std::string last = ncclGetLastError(nullptr);
  teardown(c, true);
  MG_FAIL("mg::dist (NCCL): " << doing << ": " << ncclGetErrorString(rc) << " (" << last
          << "); the communicator was aborted");
}

// Aborts the communicator and throws: `doing` waited `timeout_s` for ranks that did not come.
[[noreturn]] void abort_on_timeout(Comm& c, const std::string& doing, double timeout_s) {
  teardown(c, true);
  MG_FAIL("mg::dist (NCCL): waited " << timeout_s << " s in " << doing << " and not every rank arrived: a rank "
          "died, threw, or is in a different collective. ---> HINT: MG_DIST_TIMEOUT sets this wait");
}

// Waits, at most `timeout_s`, until the communicator's last call (its creation, a group's
// launch) has settled. A failure or a timeout aborts it and throws, naming what() it was doing.
template <class What>
void settle(Comm& c, What&& what, double timeout_s) {
  const ncclResult_t state = poll_state(c.comm, deadline_in(timeout_s));
  if (state == ncclSuccess) return;
  if (state == ncclInProgress) abort_on_timeout(c, what(), timeout_s);
  abort_on_error(c, what(), state);
}

// Note [reduction timeline] (minigrad/dist/dist.h): the events of the spans recorded so far. A
// mark's begin and end are one event.
struct Recorded {
  std::string name;
  const char* stream = "compute";  // "compute", "nccl" or "copy" (offload: Note [offload schedule])
  cudaEvent_t begin = nullptr, end = nullptr;
};
struct Timeline {
  bool on = false, full = false;
  std::vector<Recorded> spans;
};
Timeline g_timeline;
constexpr size_t kMaxSpans = 100000;

cudaEvent_t timing_event() {
  cudaEvent_t e = nullptr;
  MG_CUDA_RT_CHECK(cudaEventCreate(&e));
  return e;
}

bool recording() {
  if (!g_timeline.on) return false;
  if (g_timeline.spans.size() < kMaxSpans) return true;
  g_timeline.on = false;
  g_timeline.full = true;
  return false;
}

void forget_timeline() {
  for (Recorded& r : g_timeline.spans) {
    cudaEventDestroy(r.begin);
    if (r.end != r.begin) cudaEventDestroy(r.end);
  }
  g_timeline = Timeline{};
}

std::string describe(const std::vector<Tensor>& tensors) {
  size_t bytes = 0;
  for (const Tensor& t : tensors) bytes += t.nbytes();
  return std::to_string(tensors.size()) + " tensors, " + std::to_string(bytes) + " bytes";
}

Comm& comm_for(const Tensor& t, int rank, int size, double timeout_s) {
  const int device = t.device().index;
  if (g_comm.comm) {
    MG_CHECK(g_comm.device == device, "mg::dist (NCCL): collectives on cuda:" << device << ", but this rank's "
                                      "communicator is on cuda:" << g_comm.device << " (one device per rank)");
    return g_comm;
  }
  ncclUniqueId id;
  if (rank == 0) MG_NCCL_CHECK(ncclGetUniqueId(&id));
  broadcast_bytes(&id, sizeof id, 0, "NCCL's unique id");
  cuda::DeviceGuard on(device);  // NCCL takes the current device; so do the stream and events
  g_comm.device = device;
  g_comm.size = size;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // Note [NCCL never blocks the host]
  const ncclResult_t rc = ncclCommInitRankConfig(&g_comm.comm, size, id, rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    abort_on_error(g_comm, "creating the communicator of " + std::to_string(size) + " ranks on cuda:" +
                               std::to_string(device), rc);
  }
  settle(g_comm, [&] { return "creating the communicator of " + std::to_string(size) + " ranks"; }, timeout_s);
  try {
    MG_CUDA_RT_CHECK(cudaStreamCreateWithFlags(&g_comm.stream, cudaStreamNonBlocking));
    MG_CUDA_RT_CHECK(cudaEventCreateWithFlags(&g_comm.ready, cudaEventDisableTiming));
    MG_CUDA_RT_CHECK(cudaEventCreateWithFlags(&g_comm.done, cudaEventDisableTiming));
  } catch (...) {
    teardown(g_comm, true);  // no communicator without its stream and events
    throw;
  }
  return g_comm;
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    default: MG_FAIL("mg::dist (NCCL): collectives take float32 or float64 tensors, got " << dtype_name(t));
  }
}

// Orders `issue` (NCCL calls on c.stream) after the work queued so far on the compute stream, and
// records c.done after it (c.stream runs in order: c.done then follows everything enqueued).
// The launch settles within `timeout_s` (Note [NCCL never blocks the host]). While the timeline
// records, the calls get a span named name() (Note [reduction timeline]).
template <class Name, class Issue>
void enqueue_ordered(Comm& c, Name&& name, double timeout_s, Issue&& issue) {
  cuda::DeviceGuard on(c.device);  // the events are the communicator's device's
  MG_CUDA_RT_CHECK(cudaEventRecord(c.ready, cuda::stream(c.device)));  // the compute stream (Note [cuda stream])
  MG_CUDA_RT_CHECK(cudaStreamWaitEvent(c.stream, c.ready, 0));
  const bool timed = recording();
  if (timed) {
    g_timeline.spans.push_back({name(), "nccl", timing_event(), timing_event()});
    MG_CUDA_RT_CHECK(cudaEventRecord(g_timeline.spans.back().begin, c.stream));
  }
  auto drop_span = [&] {
    if (!timed) return;
    cudaEventDestroy(g_timeline.spans.back().begin);
    cudaEventDestroy(g_timeline.spans.back().end);
    g_timeline.spans.pop_back();
  };
  MG_NCCL_CHECK(ncclGroupStart());
  try {
    issue();
  } catch (...) {
    // NCCL's group depth is per thread: a group left open would swallow every later call. The
    // calls already issued are launched by that end and never settled or waited for (their
    // tensors could be reused while NCCL writes them), so the communicator is aborted.
    ncclGroupEnd();
    drop_span();
    teardown(c, true);
    throw;
  }
  try {
    const ncclResult_t rc = ncclGroupEnd();
    if (rc != ncclSuccess && rc != ncclInProgress) abort_on_error(c, name(), rc);
    if (rc == ncclInProgress) settle(c, name, timeout_s);
  } catch (...) {
    drop_span();
    throw;
  }
  if (timed) MG_CUDA_RT_CHECK(cudaEventRecord(g_timeline.spans.back().end, c.stream));
  MG_CUDA_RT_CHECK(cudaEventRecord(c.done, c.stream));
}

// Orders the compute stream after c.done (the tensors in flight may then be freed) and waits for
// it against the deadline. On a timeout or an asynchronous NCCL error the communicator is
// aborted (teardown), which also ends the kernels the compute stream may be waiting on.
void wait_done(Comm& c, const std::string& what, double timeout_s) {
  cuda::DeviceGuard on(c.device);
  MG_CUDA_RT_CHECK(cudaStreamWaitEvent(cuda::stream(c.device), c.done, 0));  // the compute stream
  c.in_flight.clear();
  const auto deadline = deadline_in(timeout_s);
  for (;;) {
    const cudaError_t q = cudaEventQuery(c.done);
    if (q == cudaSuccess) return;
    MG_CHECK(q == cudaErrorNotReady, "mg::dist (NCCL): " << what << ": " << cudaGetErrorString(q));
    // "Not ready" is recorded as the thread's last error too: cleared, or the next kernel
    // launch's check (cudaGetLastError) would report it as its own failure.
    (void)cudaGetLastError();
    ncclResult_t async = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(c.comm, &async);
    if (rc != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      abort_on_error(c, what, rc != ncclSuccess ? rc : async);
    }
    if (Clock::now() > deadline) abort_on_timeout(c, what, timeout_s);
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

template <class Issue>
void run_ordered(Comm& c, const std::string& what, double timeout_s, Issue&& issue) {
  enqueue_ordered(c, [&] { return what; }, timeout_s, issue);
  wait_done(c, what, timeout_s);
}

// Note [one rank runs a kernel]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Over one rank NCCL skips an in-place sum altogether (nothing to
// add), so a world of one would test no ordering at all: a bucket reduced before its gradients
// were final would pass unseen. Its average is a pre-multiplied sum, x * (1/1), which for floats
// is x to the bit, and NCCL runs it as a kernel that reads and writes the buffer on its stream.
void issue_all_reduce(Comm& c, const std::vector<Tensor>& tensors) {
  const ncclRedOp_t op = c.size == 1 ? ncclAvg : ncclSum;
  for (const Tensor& t : tensors) {
    MG_NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                                op, c.comm, c.stream));
  }
}

}  // namespace

bool nccl_built() { return true; }

void nccl_all_reduce(const std::vector<Tensor>& tensors, int rank, int size, double timeout_s) {
  Comm& c = comm_for(tensors[0], rank, size, timeout_s);
  // ncclGroupStart/End makes one launch of the whole list: NCCL fuses small tensors itself, so
  // they need no packing into buckets (Note [MPI packing] in src/dist/dist.cpp).
  run_ordered(c, "all_reduce of " + describe(tensors), timeout_s, [&] { issue_all_reduce(c, tensors); });
  c.started = 0;  // c.done came after those too
}

void nccl_all_reduce_start(const std::vector<Tensor>& tensors, int rank, int size, double timeout_s) {
  Comm& c = comm_for(tensors[0], rank, size, timeout_s);
  enqueue_ordered(c, [&] { return "bucket " + std::to_string(c.started) + ": " + describe(tensors); }, timeout_s,
                  [&] { issue_all_reduce(c, tensors); });
  ++c.started;
  c.in_flight.insert(c.in_flight.end(), tensors.begin(), tensors.end());
}

void nccl_all_reduce_wait(double timeout_s) {
  if (!g_comm.comm || g_comm.started == 0) return;
  const int n = g_comm.started;
  g_comm.started = 0;
  wait_done(g_comm, std::to_string(n) + " gradient bucket reduction(s) started during backward", timeout_s);
}

void nccl_broadcast(const std::vector<Tensor>& tensors, int root, int rank, int size, double timeout_s) {
  Comm& c = comm_for(tensors[0], rank, size, timeout_s);
  run_ordered(c, "broadcast of " + describe(tensors), timeout_s, [&] {
    for (const Tensor& t : tensors) {
      MG_NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), t.nbytes(), ncclUint8, root, c.comm, c.stream));
    }
  });
  c.started = 0;  // c.done came after those too
}

void nccl_shutdown(bool failing, double timeout_s) {
  forget_timeline();
  teardown(g_comm, failing, timeout_s);
}

void nccl_record_timeline(bool on) {
  if (on) forget_timeline();
  g_timeline.on = on;
}

void nccl_timeline_mark(std::string_view name) {
  if (!recording()) return;
  // The event is made on the current device: it marks that device's compute stream.
  int device = 0;
  MG_CUDA_RT_CHECK(cudaGetDevice(&device));
  const cudaEvent_t e = timing_event();
  g_timeline.spans.push_back({std::string(name), "compute", e, e});
  MG_CUDA_RT_CHECK(cudaEventRecord(e, cuda::stream(device)));  // the compute stream (Note [cuda stream])
}

size_t span_begin(std::string name, const char* stream, void* cuda_stream) {
  if (!recording()) return 0;
  g_timeline.spans.push_back({std::move(name), stream, timing_event(), timing_event()});
  MG_CUDA_RT_CHECK(cudaEventRecord(g_timeline.spans.back().begin, static_cast<cudaStream_t>(cuda_stream)));
  return g_timeline.spans.size();
}

void span_end(size_t span, void* cuda_stream) {
  if (span == 0 || span > g_timeline.spans.size()) return;  // not recorded, or forgotten since
  MG_CUDA_RT_CHECK(cudaEventRecord(g_timeline.spans[span - 1].end, static_cast<cudaStream_t>(cuda_stream)));
}

std::vector<TimelineSpan> nccl_timeline() {
  std::vector<TimelineSpan> out;
  if (g_timeline.spans.empty()) return out;
  const cudaEvent_t origin = g_timeline.spans[0].begin;
  auto ms = [&](cudaEvent_t e) {
    MG_CUDA_RT_CHECK(cudaEventSynchronize(e));
    float t = 0;
    MG_CUDA_RT_CHECK(cudaEventElapsedTime(&t, origin, e));
    return static_cast<double>(t);
  };
  MG_CUDA_RT_CHECK(cudaEventSynchronize(origin));
  for (const Recorded& r : g_timeline.spans) {
    out.push_back({r.name, r.stream, ms(r.begin), ms(r.end)});
  }
  if (g_timeline.full) {
    out.push_back({"timeline full: recording stopped after " + std::to_string(kMaxSpans) + " spans", "compute",
                   out.back().end_ms, out.back().end_ms});
  }
  return out;
}

}  // namespace mg::dist::detail

namespace mg {

// The hooks of core/tape.h: offload's copies on the timeline (Note [reduction timeline]).
size_t timeline_span_begin(std::string name, const char* stream, void* cuda_stream) {
  return dist::detail::span_begin(std::move(name), stream, cuda_stream);
}
void timeline_span_end(size_t span, void* cuda_stream) { dist::detail::span_end(span, cuda_stream); }

}  // namespace mg
