// The copies of offloaded segments (Note [offload schedule] in include/minigrad/core/checkpoint.h)
// and of staged batches (Note [staged batches] in src/core/staging.h): each device has a copy
// stream of its own, ordered against the device's stream with events, so that a copy runs beside
// the kernels queued after it.
#include <array>
#include <string>
#include <mutex>

#include "core/staging.h"
#include "core/tape.h"
#include "kernels/cuda/common.cuh"

namespace mg {
namespace {

cudaStream_t copy_stream(int device_index) {
  static std::array<cudaStream_t, cuda::kMaxDevices> streams{};
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  cudaStream_t& s = streams.at(static_cast<size_t>(device_index));
  if (s == nullptr) {
    cuda::DeviceGuard guard(device_index);
    MG_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));  // kept for the whole program
  }
  return s;
}

cudaEvent_t new_event() {
  cudaEvent_t e = nullptr;
  MG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

// Runs f, which queues copies on `copies`; when it throws part-way, the copies already queued
// finish before the error leaves: the caller then frees or refills their memory (a staged batch's
// host buffers and device tensors, an offloaded storage), and no copy may still read or write it.
template <class F> void* settled_on_error(cudaStream_t copies, F&& f) {
  try {
    return f();
  } catch (...) {
    (void)cudaStreamSynchronize(copies);
    (void)cudaGetLastError();
    throw;
  }
}

}  // namespace

void* cuda_offload_copy(void* dst, const void* src, size_t nbytes, int device_index, bool to_host) {
  cuda::DeviceGuard guard(device_index);
  const cudaStream_t compute = cuda::stream(device_index), copies = copy_stream(device_index);
  // After what is queued so far: the kernels that wrote the source (to the host), or that last
  // read the destination's block before it was freed and handed out again (to the device).
  cudaEvent_t ready = new_event();
  const cudaError_t recorded = cudaEventRecord(ready, compute);
  const cudaError_t waits = recorded == cudaSuccess ? cudaStreamWaitEvent(copies, ready, 0) : recorded;
  (void)cudaEventDestroy(ready);  // released once the wait has run
  MG_CUDA_CHECK(waits);
  return settled_on_error(copies, [&]() -> void* {
    // A span on the timeline's copy row while --timeline records (Note [reduction timeline]).
    const size_t span = timeline_span_begin(
        std::string(to_host ? "offload to host, " : "offload back, ") + std::to_string(nbytes) + " bytes", "copy", copies);
    MG_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, copies));
    timeline_span_end(span, copies);
    cudaEvent_t done = new_event();
    MG_CUDA_CHECK(cudaEventRecord(done, copies));
    return done;
  });
}

void* cuda_stage_mark(int device_index) {
  cuda::DeviceGuard guard(device_index);
  cudaEvent_t mark = new_event();
  MG_CUDA_CHECK(cudaEventRecord(mark, cuda::stream(device_index)));
  return mark;
}

void* cuda_stage_copy(int device_index, void* mark, const StageCopy* copies, size_t count) {
  cuda::DeviceGuard guard(device_index);
  const cudaStream_t s = copy_stream(device_index);
  if (mark != nullptr) {  // after the kernels that last used the destination's blocks
    const cudaError_t waits = cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(mark), 0);
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(mark));  // released once the wait has run
    MG_CUDA_CHECK(waits);
  }
  return settled_on_error(s, [&]() -> void* {
    size_t bytes = 0;
    for (size_t i = 0; i < count; ++i) bytes += copies[i].nbytes;
    const size_t span = timeline_span_begin("batch to the device, " + std::to_string(bytes) + " bytes", "copy", s);
    for (size_t i = 0; i < count; ++i) {
      MG_CUDA_CHECK(cudaMemcpyAsync(copies[i].dst, copies[i].src, copies[i].nbytes, cudaMemcpyHostToDevice, s));
    }
    timeline_span_end(span, s);
    cudaEvent_t done = new_event();
    MG_CUDA_CHECK(cudaEventRecord(done, s));
    return done;
  });
}

void cuda_stage_join(int device_index, void* event) {
  cuda::DeviceGuard guard(device_index);
  MG_CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(device_index), static_cast<cudaEvent_t>(event), 0));
}

bool cuda_event_done(void* event) {
  const cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (r == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: cleared, or the next launch check would report it
    return false;
  }
  MG_CUDA_CHECK(r);
  return true;
}

void cuda_event_free(void* event) { MG_CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(event))); }

void cuda_offload_wait(void* event) {
  auto e = static_cast<cudaEvent_t>(event);
  const cudaError_t waited = cudaEventSynchronize(e);
  (void)cudaEventDestroy(e);  // destroyed whatever the wait said: the caller has let go of it
  MG_CUDA_CHECK(waited);
}

void cuda_offload_wait_quietly(void* event) noexcept {
  auto e = static_cast<cudaEvent_t>(event);
  (void)cudaEventSynchronize(e);
  (void)cudaEventDestroy(e);
  (void)cudaGetLastError();
}

}  // namespace mg
