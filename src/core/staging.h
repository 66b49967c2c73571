// A batch on its way from host memory to a device: its host side in page-locked memory, its copy
// on the device's copy stream beside the kernels, the device's stream made to wait for it only
// where the batch is used. mg::Trainer keeps the next micro-batch here while one computes (Note
// [prefetched micro-batches] in minigrad/train/trainer.h).
//
//   BatchStage stage(dev);
//   stage.reserve(7, {{{64, 3, 32, 32}, DType::f32}, {{64}, DType::i64}});   // device memory, now
//   std::vector<HostBuffer> host = {stage.host_buffer(x_bytes), stage.host_buffer(y_bytes)};
//   ... fill host[0].data(), host[1].data() (any thread) ...
//   stage.send(std::move(host));                  // the copies queued
//   std::vector<Tensor> xy = stage.take(7);       // the device's stream waits for them
//
// Note [staged batches]
// ~~~~~~~~~~~~~~~~~~~~~
// Three moments, each with its own rule:
//   - reserve: the device tensors are taken from the caching allocator, and on CUDA an event is
//     recorded on the device's stream. A block handed out may have been freed by kernels still
//     queued there (Note [cuda stream]: one stream reuses blocks at once); the copy waits for that
//     event, so it never writes under them. Reserving before the kernels of the step it runs
//     beside are queued lets the copy start at once: it waits only for what came before.
//   - send: the copies run on the device's copy stream (the one offloaded activations use,
//     src/kernels/cuda/offload.cu), after the reserve's event; an event marks their end. The host
//     buffers stay with the stage until that event has completed (polled, never waited for in a
//     step), so no reader writes into memory a copy still reads.
//   - take (or clear, for a batch never taken): the device's stream waits for the copies'
//     event (cudaStreamWaitEvent: the host does not wait). Every later use of the tensors'
//     memory, the kernels that read the batch and whatever gets the blocks after them, is then
//     queued behind the copies.
// On the CPU the host buffers are ordinary memory, apart from the CPU allocator (as the host
// pool's are), and send is a plain copy into the reserved tensors: the same path, with the same
// bytes in use at the same moments, so the tests run it. Page-locked memory comes from
// cudaHostAlloc where the device is a GPU; a refusal falls back to ordinary memory, which CUDA
// copies too (staged by the driver). Buffers are kept by size for the next batches and freed
// with the last stage or buffer (cudaFreeHost waits for the device: never inside a step).
// **Compiled only** on CUDA (2026-11-29): docs/gpu-queue.md, item 13.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg {

struct StagingPool;

// A block of host memory for one tensor of a batch, page-locked for a CUDA device's copies. Back
// to its pool when destroyed.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(std::shared_ptr<StagingPool> pool, void* data, size_t bytes);
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }  // at least what was asked

 private:
  void release() noexcept;
  std::shared_ptr<StagingPool> pool_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// One batch at a time between reserve and take (Note [staged batches]). reserve, send, take and
// clear on one thread; host_buffer on any.
class BatchStage {
 public:
  struct Spec {
    Shape shape;
    DType dtype = DType::f32;
    size_t nbytes() const { return static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype); }
  };

  explicit BatchStage(Device device);
  ~BatchStage();  // waits for copies still running (the end of a run, never a step)
  BatchStage(const BatchStage&) = delete;
  BatchStage& operator=(const BatchStage&) = delete;

  // A host buffer of at least `bytes` (thread-safe).
  HostBuffer host_buffer(size_t bytes);
  // Device tensors for batch `id` of these shapes and dtypes, taken now. Drops a batch still staged.
  void reserve(int64_t id, const std::vector<Spec>& specs);
  // The reserved batch's bytes, one buffer per spec (each at least its bytes), queued to the device.
  void send(std::vector<HostBuffer> host);
  // Batch `id`, reserved and sent, on the device, its device's stream ordered after its copies.
  std::vector<Tensor> take(int64_t id);
  // Drops the staged batch, if any (its copies ordered before any later use of its memory).
  void clear();

  bool holds(int64_t id) const { return reserved_ && id_ == id; }  // reserved, sent or not
  bool sent() const { return reserved_ && sent_; }
  Device device() const { return device_; }

 private:
  void retire(bool wait);  // host buffers whose copies are done back to the pool (all, waiting, if `wait`)

  Device device_;
  std::shared_ptr<StagingPool> pool_;
  int64_t id_ = -1;
  bool reserved_ = false, sent_ = false;
  std::vector<Spec> specs_;
  std::vector<Tensor> tensors_;
  std::vector<HostBuffer> host_;
  void* mark_ = nullptr;  // CUDA: the reserve's event on the device's stream
  void* done_ = nullptr;  // CUDA: the copies' end
  struct InFlight {
    std::vector<HostBuffer> host;
    void* done = nullptr;
  };
  std::vector<InFlight> in_flight_;
};

// The CUDA side (src/kernels/cuda/offload.cu; a build without CUDA never calls the first three).
struct StageCopy {
  void* dst;
  const void* src;
  size_t nbytes;
};
void* cuda_stage_mark(int device_index);  // an event recorded on the device's stream now
// Queues the copies on the device's copy stream after `mark` (released here); returns their end's event.
void* cuda_stage_copy(int device_index, void* mark, const StageCopy* copies, size_t count);
void cuda_stage_join(int device_index, void* event);  // the device's stream waits for it (no host wait)
bool cuda_event_done(void* event);                     // cudaEventQuery: completed
void cuda_event_free(void* event);

}  // namespace mg
