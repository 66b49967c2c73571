#include "kernels/gelu.h"

#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"

namespace mg {

namespace {
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;
}  // namespace

template <> void gelu_forward<Cpu>(Tensor& y, const Tensor& x) {
  const float* px = x.data<float>();
  float* py = y.data<float>();
  cpu::parallel_for(y.numel(), cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float v = px[i];
      py[i] = 0.5f * v * (1.0f + std::tanh(kGeluK * (v + kGeluC * v * v * v)));
    }
  });
}

template <> void gelu_backward<Cpu>(Tensor& dx, const Tensor& dy, const Tensor& x) {
  const float *pdy = dy.data<float>(), *px = x.data<float>();
  float* pdx = dx.data<float>();
  cpu::parallel_for(dx.numel(), cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float v = px[i];
      const float t = std::tanh(kGeluK * (v + kGeluC * v * v * v));
      const float dt = (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * v * v);
      pdx[i] = pdy[i] * (0.5f * (1.0f + t) + 0.5f * v * dt);
    }
  });
}

}  // namespace mg
