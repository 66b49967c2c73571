#include <minigrad/optim/optimizer.h>

#include <cmath>

#include <minigrad/core/autocast.h>
#include <minigrad/core/profiler.h>

#include "kernels/elementwise.h"
#include "kernels/optim.h"

namespace mg::optim {

Optimizer::Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {
  MG_CHECK(!params_.empty(), "optimizer: empty parameter list");
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    MG_CHECK(p.defined() && p.requires_grad() && p.is_leaf(),
             "optimizer: parameter " << i << " must be a leaf tensor that requires grad");
    MG_CHECK(p.device() == params_[0].device(), "optimizer: parameters on different devices ("
                                                    << params_[0].device().str() << " and "
                                                    << p.device().str() << ")");
    if (!p.grad().defined()) p.set_grad(Tensor::zeros(p.shape(), TensorOptions{DType::f32, p.device()}));
  }
}

std::vector<Tensor> Optimizer::grads() const {
  std::vector<Tensor> g;
  for (const Tensor& p : params_) {
    Tensor gi = p.grad();
    if (!gi.defined()) {  // someone cleared it (Module::release_grads): restore the buffer
      gi = Tensor::zeros(p.shape(), TensorOptions{DType::f32, p.device()});
      p.set_grad(gi);
    }
    g.push_back(gi);
  }
  return g;
}

namespace {
// Module::to(d) moves parameters and their gradient buffers in place, not an optimizer's state
// (momentum, moments) allocated at construction: bring it along, values kept, so an optimizer
// built before model.to(cuda) stays valid (as minigrad/nn/module.h promises) instead of handing host
// pointers to a device kernel (or device pointers to the CPU one).
void state_follows_params(const Optimizer& opt) {
  const std::vector<Tensor>& params = opt.params();
  const Device d = params[0].device();
  for (size_t i = 0; i < params.size(); ++i) {
    MG_CHECK(params[i].device() == d, "optimizer step: parameter " << i << " is on " << params[i].device().str()
                                          << ", parameter 0 on " << d.str()
                                          << " (was only part of the model moved with to()?)");
  }
  for (const auto& [name, t] : opt.state_tensors()) {
    if (t.device() == d) continue;
    t.impl().storage = t.to(d).impl().storage;
    t.impl().offset = 0;
  }
}
}  // namespace

void Optimizer::step(float grad_scale) {
  MG_CHECK(std::isfinite(grad_scale), "optimizer step: gradient scale is " << grad_scale);
  state_follows_params(*this);
  ++step_count_;
  const profiler::Scope timed("optimizer.step", params_[0].device());
  update(grad_scale);
  refresh_autocast_cache();  // the masters moved: their low-precision copies follow (Note [autocast])
}

void Optimizer::zero_grad() {
  const std::vector<Tensor> g = grads();
  const profiler::Scope timed("optimizer.zero_grad", g[0].device());
  MG_DISPATCH(g[0].device(), zero_many, g);  // one launch on CUDA
}

namespace {

// Hyper-parameter checks: each names the optimizer, the parameter, the value and the range.
// Every comparison with NaN is false, so each is written as "value in range", never as
// "value out of range".
void check_at_least(const char* who, const char* name, float v, float lo, bool open) {
  MG_CHECK(std::isfinite(v) && (open ? v > lo : v >= lo),
           who << ": " << name << " = " << v << ", expected a finite number " << (open ? "> " : ">= ") << lo);
}

void check_unit(const char* who, const char* name, float v, bool open_above) {
  MG_CHECK(v >= 0.0f && (open_above ? v < 1.0f : v <= 1.0f),
           who << ": " << name << " = " << v << ", expected a number in [0, 1" << (open_above ? ")" : "]"));
}

void check_lr(const char* who, float lr) { check_at_least(who, "lr", lr, 0.0f, false); }

}  // namespace

void SGD::set_lr(float lr) {
  check_lr("SGD", lr);
  opts_.lr = lr;
}

void Adam::set_lr(float lr) {
  check_lr(decoupled_ ? "AdamW" : "Adam", lr);
  opts_.lr = lr;
}

SGD::SGD(std::vector<Tensor> params, SGDOptions opts) : Optimizer(std::move(params)), opts_(opts) {
  check_lr("SGD", opts.lr);
  check_unit("SGD", "momentum", opts.momentum, false);
  check_unit("SGD", "dampening", opts.dampening, false);
  check_at_least("SGD", "weight_decay", opts.weight_decay, 0.0f, false);
  MG_CHECK(!opts.nesterov || (opts.momentum > 0.0f && opts.dampening == 0.0f),
           "SGD: nesterov needs momentum > 0 and dampening 0");
  if (opts.momentum != 0.0f) {
    for (const Tensor& p : params_) momentum_.push_back(Tensor::zeros(p.shape(), TensorOptions{DType::f32, p.device()}));
  }
}

void SGD::update(float grad_scale) {
  SgdHyper h;
  h.lr = opts_.lr;
  h.momentum = opts_.momentum;
  h.dampening = opts_.dampening;
  h.weight_decay = opts_.weight_decay;
  h.nesterov = opts_.nesterov;
  h.first_step = step_count_ == 1;
  h.grad_scale = grad_scale;
  std::vector<Tensor> g = grads();
  MG_DISPATCH(params_[0].device(), sgd_update, params_, g, momentum_, h);
}

std::vector<std::pair<std::string, Tensor>> SGD::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> s;
  for (size_t i = 0; i < momentum_.size(); ++i) s.emplace_back(std::to_string(i) + ".momentum_buffer", momentum_[i]);
  return s;
}

Adam::Adam(std::vector<Tensor> params, AdamOptions opts, bool decoupled)
    : Optimizer(std::move(params)), opts_(opts), decoupled_(decoupled) {
  const char* who = decoupled ? "AdamW" : "Adam";
  check_lr(who, opts.lr);
  check_unit(who, "beta1", opts.beta1, true);
  check_unit(who, "beta2", opts.beta2, true);
  check_at_least(who, "eps", opts.eps, 0.0f, true);
  check_at_least(who, "weight_decay", opts.weight_decay, 0.0f, false);
  for (const Tensor& p : params_) {
    exp_avg_.push_back(Tensor::zeros(p.shape(), TensorOptions{DType::f32, p.device()}));
    exp_avg_sq_.push_back(Tensor::zeros(p.shape(), TensorOptions{DType::f32, p.device()}));
  }
}

void Adam::update(float grad_scale) {
  AdamHyper h;
  h.lr = opts_.lr;
  h.beta1 = opts_.beta1;
  h.beta2 = opts_.beta2;
  h.eps = opts_.eps;
  h.weight_decay = opts_.weight_decay;
  h.decoupled = decoupled_;
  h.step = step_count_;
  h.grad_scale = grad_scale;
  std::vector<Tensor> g = grads();
  if (!opts_.decay_matrices_only || opts_.weight_decay == 0.0f) {
    MG_DISPATCH(params_[0].device(), adam_update, params_, g, exp_avg_, exp_avg_sq_, h);
    return;
  }
  // Two groups, one update each: matrices with weight decay, the rest without.
  for (bool matrices : {true, false}) {
    std::vector<Tensor> p, pg, m, v;
    for (size_t i = 0; i < params_.size(); ++i) {
      if ((params_[i].dim() >= 2) != matrices) continue;
      p.push_back(params_[i]);
      pg.push_back(g[i]);
      m.push_back(exp_avg_[i]);
      v.push_back(exp_avg_sq_[i]);
    }
    if (p.empty()) continue;
    h.weight_decay = matrices ? opts_.weight_decay : 0.0f;
    MG_DISPATCH(p[0].device(), adam_update, p, pg, m, v, h);
  }
}

std::vector<std::pair<std::string, Tensor>> Adam::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> s;
  for (size_t i = 0; i < exp_avg_.size(); ++i) {
    s.emplace_back(std::to_string(i) + ".exp_avg", exp_avg_[i]);
    s.emplace_back(std::to_string(i) + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  return s;
}

}  // namespace mg::optim
