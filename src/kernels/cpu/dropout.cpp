#include "kernels/dropout.h"

#include <minigrad/core/rng.h>
#include "core/parallel.h"
#include "kernels/cpu/eigen.h"

#include <algorithm>

namespace mg {

namespace {
// Element i uses word (offset + i) % 4 of Philox block (offset + i) / 4 (minigrad/core/rng.h), so one block
// serves four consecutive elements: compute it once for them instead of once per element.
void masked_scale(float* out, const float* in, int64_t n, float p, uint64_t seed, uint64_t offset) {
  if (n <= 0) return;
  const float keep_scale = 1.0f / (1.0f - p);
  const uint64_t first_block = offset >> 2, last_block = (offset + static_cast<uint64_t>(n) - 1) >> 2;
  const int64_t blocks = static_cast<int64_t>(last_block - first_block) + 1;
  cpu::parallel_for(blocks, cpu::kParallelGrain / 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
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
  });
}
// Samples spread over the counters: each sample's F elements are contiguous counters of their own.
void masked_scale_strided(float* out, const float* in, int64_t n, float p, uint64_t seed, uint64_t offset,
                          int64_t per_sample, uint64_t sample_stride) {
  if (n <= 0) return;
  const int64_t samples = n / per_sample;
  cpu::parallel_for(samples, cpu::items_per_piece(per_sample), [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      masked_scale(out + s * per_sample, in + s * per_sample, per_sample, p, seed,
                   offset + static_cast<uint64_t>(s) * sample_stride);
    }
  });
}

void dropout(float* out, const float* in, int64_t n, float p, uint64_t seed, uint64_t offset, int64_t per_sample,
             uint64_t sample_stride) {
  if (sample_stride == 0 || sample_stride == static_cast<uint64_t>(per_sample)) {
    masked_scale(out, in, n, p, seed, offset);
  } else {
    masked_scale_strided(out, in, n, p, seed, offset, per_sample, sample_stride);
  }
}
}  // namespace

template <>
void dropout_forward<Cpu>(Tensor& y, const Tensor& x, float p, uint64_t seed, uint64_t offset, int64_t per_sample,
                          uint64_t sample_stride) {
  dropout(y.data<float>(), x.data<float>(), y.numel(), p, seed, offset, per_sample, sample_stride);
}

template <>
void dropout_backward<Cpu>(Tensor& dx, const Tensor& dy, float p, uint64_t seed, uint64_t offset, int64_t per_sample,
                           uint64_t sample_stride) {
  dropout(dx.data<float>(), dy.data<float>(), dx.numel(), p, seed, offset, per_sample, sample_stride);
}

}  // namespace mg
