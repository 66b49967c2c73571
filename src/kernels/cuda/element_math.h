// An element as float32, for the per-element bodies that the CUDA kernels and the CPU tests share
// (src/kernels/cuda/*_math.h, checked by tests/test_cuda_kernel_math.cpp): value(p, i) for a
// float pointer here; for bf16, f16 and Elems (a pointer with its dtype) in
// src/kernels/cuda/storage.cuh, found by argument-dependent lookup where a kernel instantiates a
// body for them (Note [cuda half kernels]).
// Plain C++ (no CUDA headers; MG_HOST_DEVICE comes from minigrad/core/rng.h).
#pragma once

#include <cstdint>

#include <minigrad/core/rng.h>

namespace mg::cuda::math {

MG_HOST_DEVICE float value(const float* p, int64_t i) { return p[i]; }

}  // namespace mg::cuda::math
