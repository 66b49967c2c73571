#include "kernels/relu.h"

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"

namespace mg {

template <> void relu_forward<Cpu>(Tensor& y, const Tensor& x) {
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const int64_t n = y.numel();
  cpu::parallel_for(n, cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) py[i] = px[i] > 0.0f ? px[i] : 0.0f;
  });
}

template <> void relu_backward<Cpu>(Tensor& dx, const Tensor& dy, const Tensor& y) {
  const float *pdy = dy.data<float>(), *py = y.data<float>();
  float* pdx = dx.data<float>();
  const int64_t n = dx.numel();
  // dy is read whatever y's sign: a load under the condition kept GCC from vectorising the loop,
  // which then branched on every element's sign (14% of a ResNet-50/8 step on the CPU).
  cpu::parallel_for(n, cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      const float g = pdy[i];
      pdx[i] = py[i] > 0.0f ? g : 0.0f;
    }
  });
}

}  // namespace mg
