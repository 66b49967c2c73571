// Multi-tensor launches: one kernel launch over a list of tensors (the fused optimizer updates,
// zero_grad's zero_many, the gradient norm's sum_squares_into). The list travels as a kernel
// argument, so nothing is copied to the device first and the host never waits: for each of up
// to kMax tensors, kPtrs pointers (the parameter, its gradient, its state buffers, ...), its
// size, and the first block of the grid that works on it. Each block handles kChunk elements of
// one tensor; a list of more than kMax tensors takes one launch per kMax.
//
//   for_each_chunk_list<2, 96>({&params, &grads}, [&](const ChunkList<2, 96>& l, int64_t blocks) {
//     my_kernel<<<blocks, cuda::kThreads, 0, stream>>>(l);  // l.ptr[0][t]: params[t], l.ptr[1][t]: grads[t]
//   });
//   // in my_kernel:  const Chunk c = chunk_of_block(l);  for (i = c.begin + threadIdx.x; i < c.end; ...)
#pragma once

#include <cstdint>
#include <vector>

#include <minigrad/core/tensor.h>
#include "kernels/cuda/multi_tensor_math.h"

namespace mg::cuda {

constexpr int kChunk = 4096;  // elements per block

template <int kPtrs, int kMax>
struct ChunkList {
  int count;
  float* ptr[kPtrs][kMax];  // ptr[j][t]: tensor t of list j (null where list j is absent)
  int64_t n[kMax];
  int64_t first_block[kMax + 1];
};

struct Chunk {
  int tensor;
  int64_t begin, end;  // element range of this block within its tensor
};

template <int kPtrs, int kMax>
__device__ inline Chunk chunk_of_block(const ChunkList<kPtrs, kMax>& l) {
  const int t = math::tensor_of_block(l.first_block, l.count, blockIdx.x);
  const int64_t begin = (blockIdx.x - l.first_block[t]) * int64_t{kChunk};
  return Chunk{t, begin, min(begin + kChunk, l.n[t])};
}

// Calls launch(list, blocks) for each group of at most kMax non-empty tensors. lists[0] gives
// the sizes; a null entry of `lists` leaves that pointer row null.
template <int kPtrs, int kMax, class Launch>
void for_each_chunk_list(const std::vector<const std::vector<Tensor>*>& lists, Launch launch) {
  ChunkList<kPtrs, kMax> l{};
  int64_t blocks = 0;
  auto flush = [&] {
    if (l.count == 0) return;
    l.first_block[l.count] = blocks;
    MG_CHECK(blocks < (int64_t{1} << 31), "multi-tensor launch: too many elements for one grid");
    launch(l, blocks);
    l = ChunkList<kPtrs, kMax>{};
    blocks = 0;
  };
  const std::vector<Tensor>& first = *lists[0];
  for (size_t i = 0; i < first.size(); ++i) {
    const int64_t n = first[i].numel();
    if (n == 0) continue;
    const int k = l.count++;
    for (int j = 0; j < kPtrs; ++j) {
      l.ptr[j][k] = j < static_cast<int>(lists.size()) && lists[j] ? (*lists[j])[i].data<float>()
                                                                    : nullptr;
    }
    l.n[k] = n;
    l.first_block[k] = blocks;
    blocks += (n + kChunk - 1) / kChunk;
    if (l.count == kMax) flush();
  }
  flush();
}

}  // namespace mg::cuda
