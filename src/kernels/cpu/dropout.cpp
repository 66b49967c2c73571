#include "kernels/dropout.h"

#include <minigrad/core/rng.h>
#include "kernels/cpu/eigen.h"

namespace mg {

namespace {
// Element i uses word (offset + i) % 4 of Philox block (offset + i) / 4 (minigrad/core/rng.h), so one block
// serves four consecutive elements: compute it once for them instead of once per element.
void masked_scale(float* out, const float* in, int64_t n, float p, uint64_t seed, uint64_t offset) {
  if (n <= 0) return;
  const float keep_scale = 1.0f / (1.0f - p);
  const uint64_t first_block = offset >> 2, last_block = (offset + static_cast<uint64_t>(n) - 1) >> 2;
  const int64_t blocks = static_cast<int64_t>(last_block - first_block) + 1;
#pragma omp parallel for if (n > cpu::kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    const uint64_t block = first_block + static_cast<uint64_t>(b);
    const Philox4 r = philox4x32(seed, block);
    for (int k = 0; k < 4; ++k) {
      const uint64_t counter = block * 4 + static_cast<uint64_t>(k);
      if (counter < offset || counter - offset >= static_cast<uint64_t>(n)) continue;
      const int64_t i = static_cast<int64_t>(counter - offset);
      const float u = static_cast<float>(r.v[k] >> 8) * (1.0f / 16777216.0f);  // philox_uniform
      out[i] = u >= p ? in[i] * keep_scale : 0.0f;
    }
  }
}
}  // namespace

template <>
void dropout_forward<Cpu>(Tensor& y, const Tensor& x, float p, uint64_t seed, uint64_t offset) {
  masked_scale(y.data<float>(), x.data<float>(), y.numel(), p, seed, offset);
}

template <>
void dropout_backward<Cpu>(Tensor& dx, const Tensor& dy, float p, uint64_t seed, uint64_t offset) {
  masked_scale(dx.data<float>(), dy.data<float>(), dx.numel(), p, seed, offset);
}

}  // namespace mg
