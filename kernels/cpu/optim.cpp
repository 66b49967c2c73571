#include "kernels/optim.h"

#include <cmath>

#include "kernels/cpu/eigen.h"

namespace mg {

template <>
void sgd_update<Cpu>(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                     std::vector<Tensor>& momentum_bufs, const SgdHyper& h) {
  const bool use_momentum = h.momentum != 0.0f;
  for (size_t t = 0; t < params.size(); ++t) {
    float* p = params[t].data<float>();
    const float* g = grads[t].data<float>();
    float* buf = use_momentum ? momentum_bufs[t].data<float>() : nullptr;
    const int64_t n = params[t].numel();
#pragma omp parallel for simd if (n > cpu::kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      float d = h.grad_scale * g[i];
      if (h.weight_decay != 0.0f) d += h.weight_decay * p[i];
      if (use_momentum) {
        buf[i] = h.first_step ? d : h.momentum * buf[i] + (1.0f - h.dampening) * d;
        d = h.nesterov ? d + h.momentum * buf[i] : buf[i];
      }
      p[i] -= h.lr * d;
    }
  }
}

template <>
void adam_update<Cpu>(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq, const AdamHyper& h) {
  const double t = static_cast<double>(h.step);
  const float bias_c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta1), t));
  const float bias_c2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), t)));
  const float step_size = h.lr / bias_c1;
  for (size_t k = 0; k < params.size(); ++k) {
    float* p = params[k].data<float>();
    const float* g = grads[k].data<float>();
    float* m = exp_avg[k].data<float>();
    float* v = exp_avg_sq[k].data<float>();
    const int64_t n = params[k].numel();
#pragma omp parallel for simd if (n > cpu::kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      float d = h.grad_scale * g[i];
      if (h.weight_decay != 0.0f) {
        if (h.decoupled) p[i] *= 1.0f - h.lr * h.weight_decay;
        else d += h.weight_decay * p[i];
      }
      m[i] += (d - m[i]) * (1.0f - h.beta1);  // torch: exp_avg.lerp_(grad, 1 - beta1)
      v[i] = h.beta2 * v[i] + (1.0f - h.beta2) * d * d;
      const float denom = std::sqrt(v[i]) / bias_c2_sqrt + h.eps;
      p[i] -= step_size * (m[i] / denom);
    }
  }
}

}  // namespace mg
