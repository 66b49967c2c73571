#include "kernels/elementwise.h"

#include <cstring>

#include "kernels/cpu/eigen.h"

namespace mg {

template <> void add_forward<Cpu>(Tensor& y, const Tensor& a, const Tensor& b) {
  const float *pa = a.data<float>(), *pb = b.data<float>();
  float* py = y.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for simd if (n > cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) py[i] = pa[i] + pb[i];
}

template <> void add_inplace<Cpu>(Tensor& y, const Tensor& x) {
  MG_CHECK(y.numel() == x.numel(), "add_inplace: " << shape_str(y.shape()) << " += " << shape_str(x.shape()));
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for simd if (n > cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) py[i] += px[i];
}

template <> void scale_forward<Cpu>(Tensor& y, const Tensor& x, float s) {
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for simd if (n > cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) py[i] = s * px[i];
}

template <> void fill<Cpu>(Tensor& y, float v) {
  float* py = y.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for simd if (n > cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) py[i] = v;
}

template <> double sum_squares<Cpu>(const Tensor& x) {
  const float* px = x.data<float>();
  const int64_t n = x.numel();
  double s = 0.0;
#pragma omp parallel for simd reduction(+ : s) if (n > cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(px[i]) * px[i];
  return s;
}

}  // namespace mg
