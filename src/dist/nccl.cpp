// mg::dist's NCCL backend: collectives on CUDA tensors (src/dist/backend.h). One communicator for
// the device of the first CUDA collective, made with the unique id rank 0 broadcasts over MPI.
// NCCL runs on a stream of its own: an event orders it after the compute stream's work (the
// backward that produced the gradients) and the compute stream waits for its end, so the host
// does not stop the GPU between the two. The host then polls the end against the deadline
// (Note [collectives never hang]); on a timeout the communicator is aborted.
//
// ONLY COMPILED so far: no session has had a GPU with NCCL (docs/distributed.md).
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <string>
#include <thread>

#include <minigrad/core/error.h>

#include "dist/backend.h"

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
  int device = -1;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr, done = nullptr;
  int started = 0;  // reductions enqueued by nccl_all_reduce_start and not waited for
};
Comm g_comm;

Comm& comm_for(const Tensor& t, int rank, int size) {
  const int device = t.device().index;
  if (g_comm.comm) {
    MG_CHECK(g_comm.device == device, "mg::dist (NCCL): collectives on cuda:" << device << ", but this rank's "
                                      "communicator is on cuda:" << g_comm.device << " (one device per rank)");
    return g_comm;
  }
  ncclUniqueId id;
  if (rank == 0) MG_NCCL_CHECK(ncclGetUniqueId(&id));
  MG_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD) == MPI_SUCCESS,
           "mg::dist (NCCL): broadcasting the unique id over MPI failed");
  MG_CUDA_RT_CHECK(cudaSetDevice(device));
  MG_NCCL_CHECK(ncclCommInitRank(&g_comm.comm, size, id, rank));
  MG_CUDA_RT_CHECK(cudaStreamCreateWithFlags(&g_comm.stream, cudaStreamNonBlocking));
  MG_CUDA_RT_CHECK(cudaEventCreateWithFlags(&g_comm.ready, cudaEventDisableTiming));
  MG_CUDA_RT_CHECK(cudaEventCreateWithFlags(&g_comm.done, cudaEventDisableTiming));
  g_comm.device = device;
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
template <class Issue>
void enqueue_ordered(Comm& c, Issue&& issue) {
  MG_CUDA_RT_CHECK(cudaEventRecord(c.ready, nullptr));  // the legacy default stream (Note [cuda stream])
  MG_CUDA_RT_CHECK(cudaStreamWaitEvent(c.stream, c.ready, 0));
  MG_NCCL_CHECK(ncclGroupStart());
  issue();
  MG_NCCL_CHECK(ncclGroupEnd());
  MG_CUDA_RT_CHECK(cudaEventRecord(c.done, c.stream));
}

// Orders the compute stream after c.done and waits for it against the deadline.
void wait_done(Comm& c, const std::string& what, double timeout_s) {
  MG_CUDA_RT_CHECK(cudaStreamWaitEvent(nullptr, c.done, 0));
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const cudaError_t q = cudaEventQuery(c.done);
    if (q == cudaSuccess) return;
    MG_CHECK(q == cudaErrorNotReady, "mg::dist (NCCL): " << what << ": " << cudaGetErrorString(q));
    ncclResult_t async = ncclSuccess;
    MG_NCCL_CHECK(ncclCommGetAsyncError(c.comm, &async));
    MG_CHECK(async == ncclSuccess, "mg::dist (NCCL): " << what << ": " << ncclGetErrorString(async));
    if (clock::now() > deadline) {
      ncclCommAbort(c.comm);
      c.comm = nullptr;
      MG_FAIL("mg::dist (NCCL): waited " << timeout_s << " s in " << what << " and not every rank arrived: a rank "
              "died, threw, or is in a different collective. ---> HINT: MG_DIST_TIMEOUT sets this wait");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

template <class Issue>
void run_ordered(Comm& c, const std::string& what, double timeout_s, Issue&& issue) {
  enqueue_ordered(c, issue);
  wait_done(c, what, timeout_s);
}

void issue_all_reduce(Comm& c, const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors) {
    MG_NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                                ncclSum, c.comm, c.stream));
  }
}

}  // namespace

bool nccl_built() { return true; }

void nccl_all_reduce(const std::vector<Tensor>& tensors, int rank, int size, double timeout_s) {
  Comm& c = comm_for(tensors[0], rank, size);
  // ncclGroupStart/End makes one launch of the whole list: NCCL fuses small tensors itself, so
  // they need no packing into buckets (Note [gradient buckets] in src/dist/dist.cpp).
  run_ordered(c, "all_reduce of " + std::to_string(tensors.size()) + " CUDA tensors", timeout_s,
              [&] { issue_all_reduce(c, tensors); });
  c.started = 0;  // c.done came after those too
}

void nccl_all_reduce_start(const std::vector<Tensor>& tensors, int rank, int size) {
  Comm& c = comm_for(tensors[0], rank, size);
  enqueue_ordered(c, [&] { issue_all_reduce(c, tensors); });
  ++c.started;
}

void nccl_all_reduce_wait(double timeout_s) {
  if (!g_comm.comm || g_comm.started == 0) return;
  const int n = g_comm.started;
  g_comm.started = 0;
  wait_done(g_comm, std::to_string(n) + " gradient bucket reduction(s) started during backward", timeout_s);
}

void nccl_broadcast(const std::vector<Tensor>& tensors, int root, int rank, int size, double timeout_s) {
  Comm& c = comm_for(tensors[0], rank, size);
  run_ordered(c, "broadcast of " + std::to_string(tensors.size()) + " CUDA tensors", timeout_s, [&] {
    for (const Tensor& t : tensors) {
      MG_NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), t.nbytes(), ncclUint8, root, c.comm, c.stream));
    }
  });
  c.started = 0;  // c.done came after those too
}

void nccl_shutdown(bool failing) {
  if (!g_comm.comm) return;
  if (failing) ncclCommAbort(g_comm.comm);
  else ncclCommDestroy(g_comm.comm);
  cudaStreamDestroy(g_comm.stream);
  cudaEventDestroy(g_comm.ready);
  cudaEventDestroy(g_comm.done);
  g_comm = Comm{};
}

}  // namespace mg::dist::detail
