#include "kernels/dropout.h"

#include <minigrad/core/rng.h>
#include "core/parallel.h"
#include "kernels/cpu/eigen.h"
#include "kernels/cpu/half_rows.h"

#include <algorithm>

namespace mg {

namespace {
// out[i] = keep_i ? in[i] / (1 - p) : 0 for the n elements of a span whose first element's counter is
// `offset` (philox_uniforms: one Philox block per four elements).
void masked_scale_span(float* out, const float* in, int64_t n, float p, uint64_t seed, uint64_t offset) {
  const float keep_scale = 1.0f / (1.0f - p);
  philox_uniforms(seed, offset, n, [&](int64_t i, float u) { out[i] = u >= p ? in[i] * keep_scale : 0.0f; });
}

// The same over elements [first, first + n) of tensors of any float dtype (bf16, f16: Note [half
// operands] in kernels/cpu/gemm.h), in pieces whose bounds depend on n only; a low dtype's values
// are widened kHalfBlock at a time on the thread's stack and the results rounded into out, which
// may be `in` itself.
constexpr int64_t kHalfBlock = 1024;

void masked_scale(Tensor& out, const Tensor& in, int64_t first, int64_t n, float p, uint64_t seed, uint64_t offset) {
  const bool wide = out.dtype() == DType::f32 && in.dtype() == DType::f32;
  const char* pi = static_cast<const char*>(in.raw_data());
  char* po = static_cast<char*>(out.raw_data());
  const size_t is = dtype_size(in.dtype()), os = dtype_size(out.dtype());
  cpu::parallel_for(n, cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
    if (wide) {
      const int64_t at = first + i0;
      return masked_scale_span(out.data<float>() + at, in.data<float>() + at, i1 - i0, p, seed, offset + static_cast<uint64_t>(i0));
    }
    float a[kHalfBlock], y[kHalfBlock];
    for (int64_t b = i0; b < i1; b += kHalfBlock) {
      const int64_t len = std::min(kHalfBlock, i1 - b), at = first + b;
      cpu::widen_span(a, pi + static_cast<size_t>(at) * is, in.dtype(), len);
      masked_scale_span(y, a, len, p, seed, offset + static_cast<uint64_t>(b));
      cpu::narrow_span(po + static_cast<size_t>(at) * os, out.dtype(), y, len);
    }
  });
}

void dropout(Tensor& out, const Tensor& in, float p, uint64_t seed, uint64_t offset, int64_t per_sample,
             uint64_t sample_stride) {
  const int64_t n = out.numel();
  if (sample_stride == 0 || sample_stride == static_cast<uint64_t>(per_sample)) {
    return masked_scale(out, in, 0, n, p, seed, offset);
  }
  // Samples spread over the counters: each sample's F elements are contiguous counters of their own.
  const int64_t samples = per_sample > 0 ? n / per_sample : 0;
  cpu::parallel_for(samples, cpu::items_per_piece(per_sample), [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      masked_scale(out, in, s * per_sample, per_sample, p, seed, offset + static_cast<uint64_t>(s) * sample_stride);
    }
  });
}
}  // namespace

template <>
void dropout_forward<Cpu>(Tensor& y, const Tensor& x, float p, uint64_t seed, uint64_t offset, int64_t per_sample,
                          uint64_t sample_stride) {
  dropout(y, x, p, seed, offset, per_sample, sample_stride);
}

template <>
void dropout_backward<Cpu>(Tensor& dx, const Tensor& dy, float p, uint64_t seed, uint64_t offset, int64_t per_sample,
                           uint64_t sample_stride) {
  dropout(dx, dy, p, seed, offset, per_sample, sample_stride);
}

}  // namespace mg
