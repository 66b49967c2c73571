// The NCCL half of mg::dist (src/dist/nccl.cpp, built with the CUDA backend and NCCL; without
// them src/dist/no_nccl.cpp refuses CUDA tensors with a clear error).
#pragma once

#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::dist::detail {

bool nccl_built();
// Sums `tensors` (CUDA, one device) over the world on NCCL's own stream, ordered after the work
// already queued on the compute stream and before the work queued after it returns. The
// communicator is made on first use; its unique id comes from rank 0 over MPI.
void nccl_all_reduce(const std::vector<Tensor>& tensors, int rank, int size, double timeout_s);
// The same in two halves (mg::dist::all_reduce_start / all_reduce_wait): start enqueues the sums on
// NCCL's stream and returns; wait orders the compute stream after every one started and polls
// their end against the deadline. Without NCCL, or with nothing started, wait returns at once.
void nccl_all_reduce_start(const std::vector<Tensor>& tensors, int rank, int size);
void nccl_all_reduce_wait(double timeout_s);
void nccl_broadcast(const std::vector<Tensor>& tensors, int root, int rank, int size, double timeout_s);
// Destroys the communicator (aborting it when `failing`).
void nccl_shutdown(bool failing);

}  // namespace mg::dist::detail
