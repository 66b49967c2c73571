// The per-element body of dropout.cu's kernel (kernels/dropout.h).
// Plain C++ (no CUDA headers; MG_HOST_DEVICE comes from minigrad/core/rng.h): dropout.cu
// calls them on the GPU, tests/test_cuda_kernel_math.cpp checks them on the CPU.
#pragma once

#include <cstdint>

#include <minigrad/core/rng.h>

namespace mg::cuda::math {

// Elements first .. first+3 (those below n): one Philox block serves all four when the offset
// is block-aligned (as Generator::advance makes it); otherwise each draws on its own.
MG_HOST_DEVICE void dropout4(float* out, const float* in, int64_t first, int64_t n, float p, float keep_scale,
                             uint64_t seed, uint64_t offset) {
  if ((offset & 3) == 0) {
    const Philox4 r = philox4x32(seed, (offset + static_cast<uint64_t>(first)) >> 2);
    for (int k = 0; k < 4 && first + k < n; ++k) {
      const float u = uniform_of(r.v[k]);  // = philox_uniform
      out[first + k] = u >= p ? in[first + k] * keep_scale : 0.0f;
    }
  } else {
    for (int k = 0; k < 4 && first + k < n; ++k) {
      const float u = philox_uniform(seed, offset + static_cast<uint64_t>(first + k));
      out[first + k] = u >= p ? in[first + k] * keep_scale : 0.0f;
    }
  }
}

}  // namespace mg::cuda::math
