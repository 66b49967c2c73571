#include "kernels/optim.h"

#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"

namespace mg {

namespace {
// One SGD pass over n elements; the branches on hyper-parameters are compile-time, so each case
// is a straight vectorised loop.
template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
void sgd_loop(float* p, const float* g, float* buf, int64_t n, const SgdHyper& h) {
  const float s = h.grad_scale, wd = h.weight_decay, mu = h.momentum, damp = 1.0f - h.dampening, lr = h.lr;
  cpu::parallel_for(n, cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      float d = s * g[i];
      if constexpr (kDecay) d += wd * p[i];
      if constexpr (kMomentum) {
        const float b = kFirst ? d : mu * buf[i] + damp * d;
        buf[i] = b;
        d = kNesterov ? d + mu * b : b;
      }
      p[i] -= lr * d;
    }
  });
}

template <bool kDecay>
void sgd_dispatch(float* p, const float* g, float* buf, int64_t n, const SgdHyper& h) {
  if (h.momentum == 0.0f) return sgd_loop<kDecay, false, false, false>(p, g, buf, n, h);
  if (h.first_step) {
    return h.nesterov ? sgd_loop<kDecay, true, true, true>(p, g, buf, n, h)
                      : sgd_loop<kDecay, true, true, false>(p, g, buf, n, h);
  }
  return h.nesterov ? sgd_loop<kDecay, true, false, true>(p, g, buf, n, h)
                    : sgd_loop<kDecay, true, false, false>(p, g, buf, n, h);
}
}  // namespace

template <>
void sgd_update<Cpu>(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                     std::vector<Tensor>& momentum_bufs, const SgdHyper& h) {
  for (size_t t = 0; t < params.size(); ++t) {
    float* p = params[t].data<float>();
    const float* g = grads[t].data<float>();
    float* buf = h.momentum != 0.0f ? momentum_bufs[t].data<float>() : nullptr;
    const int64_t n = params[t].numel();
    if (h.weight_decay != 0.0f) sgd_dispatch<true>(p, g, buf, n, h);
    else sgd_dispatch<false>(p, g, buf, n, h);
  }
}

namespace {
// One Adam pass over n elements, written as sgd_loop is: the hyper-parameters in locals and the
// decay's form a compile-time choice. With -fno-math-errno (CMakeLists.txt) std::sqrt is sqrtps,
// correctly rounded as sqrtss is. The scalar loop this replaced (errno's branch, every
// hyper-parameter read through h) and parallel_for's inlined small ranges (core/parallel.h) kept
// AdamW scalar: optimizer.step of GPT-2's ops at width 48 (393k parameters) took 2.1 ms a step,
// 0.2 ms now (docs/gpt.md, "The cost of an op"). Its bits are the old loop's for every decay form
// (checked over 100k elements and 5 steps each, with FMA contraction and without).
enum class Decay { none, decoupled, l2 };

template <Decay kDecay>
void adam_loop(float* p, const float* g, float* m, float* v, int64_t n, const AdamHyper& h, float step_size,
               float bias_c2_sqrt) {
  const float s = h.grad_scale, shrink = 1.0f - h.lr * h.weight_decay, wd = h.weight_decay;
  const float one_minus_b1 = 1.0f - h.beta1, b2 = h.beta2, one_minus_b2 = 1.0f - h.beta2, eps = h.eps;
  cpu::parallel_for(n, cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      float d = s * g[i];
      if constexpr (kDecay == Decay::decoupled) p[i] *= shrink;
      if constexpr (kDecay == Decay::l2) {
#ifdef __FMA__  // the old loop's contraction: its d had two uses, so GCC fused wd * p into the add
        d = std::fma(wd, p[i], d);
#else
        d += wd * p[i];
#endif
      }
      const float mi = m[i] + (d - m[i]) * one_minus_b1;  // torch: exp_avg.lerp_(grad, 1 - beta1)
      const float vi = b2 * v[i] + one_minus_b2 * d * d;
      m[i] = mi;
      v[i] = vi;
      const float denom = std::sqrt(vi) / bias_c2_sqrt + eps;
      p[i] -= step_size * (mi / denom);
    }
  });
}
}  // namespace

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
    if (h.weight_decay == 0.0f) adam_loop<Decay::none>(p, g, m, v, n, h, step_size, bias_c2_sqrt);
    else if (h.decoupled) adam_loop<Decay::decoupled>(p, g, m, v, n, h, step_size, bias_c2_sqrt);
    else adam_loop<Decay::l2>(p, g, m, v, n, h, step_size, bias_c2_sqrt);
  }
}

}  // namespace mg
