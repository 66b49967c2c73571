// The per-element updates of optim.cu's fused optimizers (src/kernels/optim.h has the formulas).
// Plain C++ (no CUDA headers; MG_HOST_DEVICE comes from minigrad/core/rng.h): optim.cu
// calls them on the GPU, tests/test_cuda_kernel_math.cpp checks them on the CPU.
#pragma once

#include <cmath>

#include <minigrad/core/rng.h>
#include "kernels/optim.h"

namespace mg::cuda::math {

// buf is null when momentum == 0.
MG_HOST_DEVICE void sgd_element(float* p, float g, float* buf, const SgdHyper& h) {
  float d = h.grad_scale * g;
  if (h.weight_decay != 0.0f) d += h.weight_decay * *p;
  if (h.momentum != 0.0f) {
    *buf = h.first_step ? d : h.momentum * *buf + (1.0f - h.dampening) * d;
    d = h.nesterov ? d + h.momentum * *buf : *buf;
  }
  *p -= h.lr * d;
}

// step_size = lr / (1 - b1^t) and bias_c2_sqrt = sqrt(1 - b2^t), computed once per step.
MG_HOST_DEVICE void adam_element(float* p, float g, float* m, float* v, const AdamHyper& h, float step_size,
                                 float bias_c2_sqrt) {
  float d = h.grad_scale * g;
  if (h.weight_decay != 0.0f) {
    if (h.decoupled) *p *= 1.0f - h.lr * h.weight_decay;
    else d += h.weight_decay * *p;
  }
  *m += (d - *m) * (1.0f - h.beta1);  // torch: exp_avg.lerp_(grad, 1 - beta1)
  *v = h.beta2 * *v + (1.0f - h.beta2) * d * d;
  const float denom = std::sqrt(*v) / bias_c2_sqrt + h.eps;
  *p -= step_size * (*m / denom);
}

}  // namespace mg::cuda::math
