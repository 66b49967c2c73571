// Optimizers with PyTorch's update formulas (src/kernels/optim.h). An optimizer owns its parameters'
// gradient buffers: it allocates them zeroed at construction, backward adds into them in place,
// and zero_grad() zeroes them in place (nothing is freed or reallocated between steps). That is
// what gradient accumulation builds on (minigrad/optim/accumulate.h).
//
//   mg::optim::SGD opt(model.parameters(), {.lr = 0.01f, .momentum = 0.9f});
//   mg::data::Batch b;
//   for (loader.start_epoch(epoch); loader.next(b);) {
//     opt.zero_grad();
//     mg::cross_entropy(model.forward(b.x), b.y).backward();
//     opt.step();
//   }
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::optim {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params);
  virtual ~Optimizer() = default;

  // One update from the current gradients, each multiplied by grad_scale first.
  void step(float grad_scale = 1.0f);
  // Zeroes the gradient buffers in place.
  void zero_grad();

  const std::vector<Tensor>& params() const { return params_; }
  std::vector<Tensor> grads() const;
  int64_t step_count() const { return step_count_; }
  virtual float lr() const = 0;
  virtual void set_lr(float lr) = 0;

  // Named state tensors (momentum buffers, moments) and the step count, for saving a run and
  // resuming it bit for bit.
  virtual std::vector<std::pair<std::string, Tensor>> state_tensors() const = 0;
  void set_step_count(int64_t n) { step_count_ = n; }

 protected:
  virtual void update(float grad_scale) = 0;
  std::vector<Tensor> params_;
  int64_t step_count_ = 0;
};

// Hyper-parameters are checked at construction (and lr by set_lr): mg::Error names the
// parameter, its value and the range, for NaN or infinite values too.
struct SGDOptions {
  float lr = 0.01f;          // finite, >= 0
  float momentum = 0.0f;     // [0, 1]
  float dampening = 0.0f;    // [0, 1]
  float weight_decay = 0.0f; // finite, >= 0
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions opts);
  float lr() const override { return opts_.lr; }
  void set_lr(float lr) override;
  const SGDOptions& options() const { return opts_; }
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;

 protected:
  void update(float grad_scale) override;

 private:
  SGDOptions opts_;
  std::vector<Tensor> momentum_;
};

struct AdamOptions {
  float lr = 1e-3f;                   // finite, >= 0
  float beta1 = 0.9f, beta2 = 0.999f; // [0, 1)
  float eps = 1e-8f;                  // finite, > 0
  float weight_decay = 0.0f;          // finite, >= 0
  // Weight decay only on parameters of 2 or more dimensions (weights and embeddings; not biases
  // or norm scales), as nanoGPT and llm.c train GPT-2 (PyTorch: two parameter groups).
  bool decay_matrices_only = false;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions opts, bool decoupled_weight_decay = false);
  float lr() const override { return opts_.lr; }
  void set_lr(float lr) override;
  const AdamOptions& options() const { return opts_; }
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;

 protected:
  void update(float grad_scale) override;

 private:
  AdamOptions opts_;
  bool decoupled_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
};

// AdamW: Adam with decoupled weight decay (default weight_decay 0.01, as in PyTorch).
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions opts = {.weight_decay = 0.01f})
      : Adam(std::move(params), opts, true) {}
};

}  // namespace mg::optim
