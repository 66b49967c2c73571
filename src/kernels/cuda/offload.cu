// The copies of offloaded segments (Note [offload schedule] in include/minigrad/core/checkpoint.h):
// each device has a copy stream of its own, ordered against the device's stream with events, so
// that a copy runs beside the kernels queued after it.
#include <array>
#include <string>
#include <mutex>

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

}  // namespace

void* cuda_offload_copy(void* dst, const void* src, size_t nbytes, int device_index, bool to_host) {
  cuda::DeviceGuard guard(device_index);
  const cudaStream_t compute = cuda::stream(device_index), copies = copy_stream(device_index);
  // After what is queued so far: the kernels that wrote the source (to the host), or that last
  // read the destination's block before it was freed and handed out again (to the device).
  cudaEvent_t ready = new_event();
  MG_CUDA_CHECK(cudaEventRecord(ready, compute));
  MG_CUDA_CHECK(cudaStreamWaitEvent(copies, ready, 0));
  MG_CUDA_CHECK(cudaEventDestroy(ready));  // released once the wait has run
  // A span on the timeline's copy row while --timeline records (Note [reduction timeline]).
  const size_t span = timeline_span_begin(
      std::string(to_host ? "offload to host, " : "offload back, ") + std::to_string(nbytes) + " bytes", "copy", copies);
  MG_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, copies));
  timeline_span_end(span, copies);
  cudaEvent_t done = new_event();
  MG_CUDA_CHECK(cudaEventRecord(done, copies));
  return done;
}

void cuda_offload_wait(void* event) {
  auto e = static_cast<cudaEvent_t>(event);
  MG_CUDA_CHECK(cudaEventSynchronize(e));
  MG_CUDA_CHECK(cudaEventDestroy(e));
}

}  // namespace mg
