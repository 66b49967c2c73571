// Fused optimizer updates: one call updates every parameter of a step (one launch on CUDA).
// Formulas are PyTorch's (torch.optim.SGD / Adam / AdamW). `grad_scale` multiplies every
// gradient first: it carries gradient accumulation's 1/(samples in the window) and the clipping
// coefficient, so neither costs a pass of its own.
//
// SGD:   g = s*grad + wd*p;  buf = first ? g : mu*buf + (1-dampening)*g;
//        g = nesterov ? g + mu*buf : buf (when mu != 0);  p -= lr*g
// Adam:  g = s*grad (+ wd*p unless decoupled);  decoupled (AdamW): p *= 1 - lr*wd
//        m += (g - m)*(1-b1)   (torch's exp_avg.lerp_(g, 1-b1): the same as b1*m + (1-b1)*g in
//                               exact arithmetic; the kernels use this form, as torch does)
//        v = b2*v + (1-b2)*g^2
//        p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
#pragma once

#include <cstdint>
#include <vector>

#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {

struct SgdHyper {
  float lr = 0.01f, momentum = 0.0f, dampening = 0.0f, weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = true;  // momentum buffers are initialised from g on the first step
  float grad_scale = 1.0f;
};

struct AdamHyper {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  bool decoupled = false;  // AdamW
  int64_t step = 1;        // t, counted from 1
  float grad_scale = 1.0f;
};

// momentum_bufs may be empty when momentum == 0.
template <class D>
void sgd_update(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                std::vector<Tensor>& momentum_bufs, const SgdHyper& h);
template <class D>
void adam_update(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                 std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq,
                 const AdamHyper& h);

}  // namespace mg
