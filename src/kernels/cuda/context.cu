// The CUDA backend's per-device context (handles, stream, error flag) and the
// device queries of minigrad/core/device.h. Handles and streams are created once per device, on
// first use, and live for the whole program (destroying them at exit would race the driver's own
// teardown).
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>
#include <string_view>

#include <minigrad/core/device.h>
#include "core/tape.h"
#include "kernels/cuda/common.cuh"

namespace mg {

bool cuda_available() { return cuda_device_count() > 0; }

int cuda_device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver or no device: not an error for a query
      n = 0;
    }
    return n;
  }();
  return count;
}

std::string cuda_unavailable_reason() {
  if (cuda_available()) return "";
  int n = 0, driver = 0, runtime = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  (void)cudaDriverGetVersion(&driver);  // 0 when no driver is installed
  (void)cudaRuntimeGetVersion(&runtime);
  std::ostringstream os;
  os << "cudaGetDeviceCount: " << (st == cudaSuccess ? "0 devices" : cudaGetErrorString(st)) << "; ";
  if (driver == 0) os << "no CUDA driver";
  else os << "the driver supports CUDA " << driver / 1000 << "." << driver % 1000 / 10;
  os << ", the runtime is CUDA " << runtime / 1000 << "." << runtime % 1000 / 10;
  return os.str();
}

namespace cuda {

DeviceGuard::DeviceGuard(int index) {
  MG_CUDA_CHECK(cudaGetDevice(&prev_));
  if (prev_ != index) MG_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::~DeviceGuard() {
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) (void)cudaSetDevice(prev_);
}

namespace {
// Fixed and trivially destructible, the contexts leaked (see the file comment): a lookup is one
// atomic load, and still works from destructors of statics that run after main returns.
std::atomic<Context*> g_contexts[kMaxDevices] = {};
std::mutex g_context_mu;  // taken only to create a context

Context* find_context(int device_index) {
  return device_index >= 0 && device_index < kMaxDevices ? g_contexts[device_index].load(std::memory_order_acquire)
                                                         : nullptr;
}

// The streams of stream(): `made` is needed apart from the value, the legacy stream being null.
// Trivially destructible and never destroyed, as the contexts.
struct StreamSlot {
  std::atomic<bool> made{false};
  cudaStream_t stream = nullptr;
};
StreamSlot g_streams[kMaxDevices];
std::mutex g_stream_mu;  // taken only to make a stream

// MG_CUDA_STREAM: unset, empty or "legacy" is the legacy default stream; "own" a non-blocking
// stream per device (Note [cuda stream]).
bool own_stream_from_env() {
  static const bool own = [] {
    const char* v = std::getenv("MG_CUDA_STREAM");
    if (v == nullptr || *v == '\0' || std::string_view(v) == "legacy") return false;
    MG_CHECK(std::string_view(v) == "own", "MG_CUDA_STREAM=\"" << v << "\": expected own (a non-blocking stream "
                                           "per device) or legacy (the legacy default stream, the default)");
    return true;
  }();
  return own;
}
}  // namespace

cudaStream_t stream(int device_index) {
  if (device_index >= 0 && device_index < kMaxDevices) {
    const StreamSlot& slot = g_streams[device_index];
    if (slot.made.load(std::memory_order_acquire)) return slot.stream;
  }
  MG_CHECK(device_index >= 0 && device_index < cuda_device_count() && device_index < kMaxDevices,
           "cuda:" << device_index << " does not exist (" << cuda_device_count()
                   << " CUDA devices visible)");
  std::lock_guard<std::mutex> lock(g_stream_mu);
  StreamSlot& slot = g_streams[device_index];
  if (!slot.made.load(std::memory_order_relaxed)) {
    cudaStream_t s = nullptr;  // the legacy default stream (Note [cuda stream])
    if (own_stream_from_env()) {
      DeviceGuard guard(device_index);
      MG_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    }
    slot.stream = s;
    slot.made.store(true, std::memory_order_release);
  }
  return slot.stream;
}

Context& context(int device_index) {
  if (Context* ctx = find_context(device_index)) return *ctx;
  const cudaStream_t s = stream(device_index);  // checks the index; before the lock (its own)
  std::lock_guard<std::mutex> lock(g_context_mu);
  if (Context* ctx = find_context(device_index)) return *ctx;
  DeviceGuard guard(device_index);
  auto ctx = std::make_unique<Context>();
  ctx->device = device_index;
  ctx->stream = s;
  MG_CUBLAS_CHECK(cublasCreate(&ctx->cublas));
  // A failure below (the workspace over a memory limit, say) must not leak the handle: the next
  // call creates the context again.
  bool kept = false;
  struct Undo {
    cublasHandle_t h;
    const bool& kept;
    ~Undo() {
      if (!kept) cublasDestroy(h);
    }
  } undo{ctx->cublas, kept};
  MG_CUBLAS_CHECK(cublasSetStream(ctx->cublas, ctx->stream));
  // cuBLAS's workspace comes from our allocator, so it is counted (size: cuBLAS's advice,
  // 32 MiB on Hopper, 4 MiB before).
  cudaDeviceProp prop{};
  MG_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
  const size_t ws = prop.major >= 9 ? (size_t{32} << 20) : (size_t{4} << 20);
  void* ws_ptr = cuda_allocator(device_index).allocate(ws);
  const auto give_back = [&] { cuda_allocator(device_index).deallocate(ws_ptr, ws); };
  try {
    MG_CUBLAS_CHECK(cublasSetWorkspace(ctx->cublas, ws_ptr, ws));
    ctx->workspace = ws_ptr;
    ctx->workspace_bytes = ws;
    ctx->error_flag = static_cast<long long*>(cuda_allocator(device_index).allocate(3 * sizeof(long long)));
  } catch (...) {
    give_back();
    throw;
  }
  MG_CUDA_CHECK(cudaMemsetAsync(ctx->error_flag, 0, 3 * sizeof(long long), ctx->stream));
  Context* created = ctx.release();
  kept = true;  // the context keeps the handle
  g_contexts[device_index].store(created, std::memory_order_release);
  return *created;
}

namespace {
// The handle in `slot`, made by `make` on the device the first time it is asked for.
template <class H, class Make> H made_once(std::atomic<H>& slot, int device_index, Make make) {
  if (H h = slot.load(std::memory_order_acquire)) return h;
  std::lock_guard<std::mutex> lock(g_context_mu);
  if (H h = slot.load(std::memory_order_acquire)) return h;
  DeviceGuard guard(device_index);
  const H h = make();
  slot.store(h, std::memory_order_release);
  return h;
}
}  // namespace

cudnnHandle_t cudnn_handle(int device_index) {
  Context& ctx = context(device_index);
  return made_once(ctx.cudnn, device_index, [&] {
    cudnnHandle_t h = nullptr;
    MG_CUDNN_CHECK(cudnnCreate(&h));
    if (const cudnnStatus_t st = cudnnSetStream(h, ctx.stream); st != CUDNN_STATUS_SUCCESS) {
      cudnnDestroy(h);
      MG_CUDNN_CHECK(st);
    }
    return h;
  });
}

cublasLtHandle_t cublaslt_handle(int device_index) {
  return made_once(context(device_index).cublaslt, device_index, [] {
    cublasLtHandle_t h = nullptr;
    MG_CUBLAS_CHECK(cublasLtCreate(&h));
    return h;
  });
}

void check_error_flag(int device_index) {
  // Kernels that raise the flag run only after the context exists: none yet, nothing to read.
  Context* ctx = find_context(device_index);
  if (ctx == nullptr) return;
  DeviceGuard guard(device_index);
  long long flag[3] = {0, 0, 0};
  // The kernels that raise the flag run on the stream: the host reads it after them.
  MG_CUDA_CHECK(cudaMemcpyAsync(flag, ctx->error_flag, sizeof(flag), cudaMemcpyDeviceToHost, ctx->stream));
  MG_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
  if (flag[0] == kFlagNone) return;
  MG_CUDA_CHECK(cudaMemsetAsync(ctx->error_flag, 0, sizeof(flag), ctx->stream));
  if (flag[0] == kFlagBadTarget) {
    MG_FAIL("cross_entropy: target[" << flag[1] << "] = " << flag[2]
                                     << " is not a class index in [0, C) (found on cuda:" << device_index
                                     << " at the next synchronisation after the forward)");
  }
  if (flag[0] == kFlagBadIndex) {
    MG_FAIL("embedding: index[" << flag[1] << "] = " << flag[2] << " is not a row of the table (found on cuda:"
                                << device_index << " at the next synchronisation after the forward or backward)");
  }
  MG_FAIL("a CUDA kernel on cuda:" << device_index << " raised error code " << flag[0]);
}

void synchronize(int device_index) {
  DeviceGuard guard(device_index);
  MG_CUDA_CHECK(cudaStreamSynchronize(stream(device_index)));
  check_error_flag(device_index);
}

Workspace::Workspace(int device_index, size_t nbytes) : device_(device_index), nbytes_(nbytes) {
  if (nbytes_ > 0) ptr_ = cuda_allocator(device_).allocate(nbytes_);
}

Workspace::~Workspace() {
  if (ptr_ != nullptr) cuda_allocator(device_).deallocate(ptr_, nbytes_);
}

}  // namespace cuda

void synchronize_cuda(int device_index) { cuda::synchronize(device_index); }

void* cuda_mark(int device_index) {
  cuda::DeviceGuard guard(device_index);
  cudaEvent_t e = nullptr;
  MG_CUDA_CHECK(cudaEventCreate(&e));  // with timing: the default flags
  if (const cudaError_t st = cudaEventRecord(e, cuda::context(device_index).stream); st != cudaSuccess) {
    cudaEventDestroy(e);
    MG_CUDA_CHECK(st);
  }
  return e;
}

double cuda_mark_ms(void* from, void* to) {
  MG_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(to)));
  float ms = 0.0f;
  MG_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)));
  return ms;
}

void cuda_mark_free(void* mark) {
  if (mark != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(mark));  // no throw: called while cleaning up
}

}  // namespace mg
