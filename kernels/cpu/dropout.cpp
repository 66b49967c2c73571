#include "kernels/dropout.h"

#include "core/rng.h"
#include "kernels/cpu/eigen.h"

namespace mg {

namespace {
void masked_scale(float* out, const float* in, int64_t n, float p, uint64_t seed, uint64_t offset) {
  const float keep_scale = 1.0f / (1.0f - p);
#pragma omp parallel for if (n > cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = philox_uniform(seed, offset + static_cast<uint64_t>(i)) >= p;
    out[i] = keep ? in[i] * keep_scale : 0.0f;
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
