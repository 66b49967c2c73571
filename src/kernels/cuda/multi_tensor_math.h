// The block-to-tensor lookup of multi-tensor launches (multi_tensor.cuh).
// Plain C++ (no CUDA headers; MG_HOST_DEVICE comes from minigrad/core/rng.h): multi_tensor.cuh
// calls them on the GPU, tests/test_cuda_kernel_math.cpp checks them on the CPU.
#pragma once

#include <cstdint>

#include <minigrad/core/rng.h>

namespace mg::cuda::math {

// The tensor that block b of a multi-tensor launch works on: the last t with first_block[t] <= b.
MG_HOST_DEVICE int tensor_of_block(const int64_t* first_block, int count, int64_t b) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_block[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace mg::cuda::math
