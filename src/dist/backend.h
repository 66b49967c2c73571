// The NCCL half of mg::dist (src/dist/nccl.cpp, built with the CUDA backend and NCCL; without
// them src/dist/no_nccl.cpp refuses CUDA tensors with a clear error).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <minigrad/dist/dist.h>

#include <minigrad/core/tensor.h>

namespace mg::dist::detail {

bool nccl_built();
// Copies rank `root`'s `n` bytes at `data` into every rank's (for NCCL's unique id), waiting at
// most the collective deadline: over MPI under a launcher; in a world of one, nothing to do.
// Defined in src/dist/dist.cpp.
void broadcast_bytes(void* data, size_t n, int root, const char* what);
// Sums `tensors` (CUDA, one device) over the world on NCCL's own stream, ordered after the work
// already queued on the compute stream and before the work queued after it returns. The
// communicator is made on first use; its unique id comes from rank 0 (broadcast_bytes).
void nccl_all_reduce(const std::vector<Tensor>& tensors, int rank, int size, double timeout_s);
// The same in two halves (mg::dist::all_reduce_start / all_reduce_wait): start enqueues the sums on
// NCCL's stream and returns; wait orders the compute stream after every one started and polls
// their end against the deadline. Without NCCL, or with nothing started, wait returns at once.
void nccl_all_reduce_start(const std::vector<Tensor>& tensors, int rank, int size, double timeout_s);
void nccl_all_reduce_wait(double timeout_s);
void nccl_broadcast(const std::vector<Tensor>& tensors, int root, int rank, int size, double timeout_s);
// Destroys the communicator: aborts it when `failing`, otherwise finalizes it first, waiting at
// most `timeout_s` (then aborts it).
void nccl_shutdown(bool failing, double timeout_s);
// Note [reduction timeline] in minigrad/dist/dist.h: the events behind mg::dist::timeline.
void nccl_record_timeline(bool on);
void nccl_timeline_mark(std::string_view name);
std::vector<TimelineSpan> nccl_timeline();

}  // namespace mg::dist::detail
