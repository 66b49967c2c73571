#include <minigrad/nn/module.h>

#include <cmath>
#include <sstream>

namespace mg::nn {

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out = params_;
  for (const auto& [cname, child] : children_) {
    for (auto& [pname, p] : child->named_parameters()) out.emplace_back(cname + "." + pname, p);
  }
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, p] : named_parameters()) out.push_back(p);
  return out;
}

int64_t Module::parameter_count() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::to(Device d) {
  for (Tensor& p : parameters()) {
    if (p.device() == d) continue;
    p.impl().storage = p.to(d).impl().storage;
    p.impl().offset = 0;
    if (Tensor g = p.grad(); g.defined()) {
      g.impl().storage = g.to(d).impl().storage;
      g.impl().offset = 0;
    }
  }
}

void Module::zero_grad() {
  for (Tensor& p : parameters()) {
    if (Tensor g = p.grad(); g.defined()) g.zero_();
  }
}

void Module::release_grads() {
  for (Tensor& p : parameters()) p.set_grad(Tensor());
}

Tensor& Module::register_parameter(const std::string& name, Tensor t) {
  t.requires_grad_(true);
  params_.emplace_back(name, std::move(t));
  return params_.back().second;
}

Module& Module::register_module(const std::string& name, std::shared_ptr<Module> m) {
  children_.emplace_back(name, std::move(m));
  return *children_.back().second;
}

namespace {
// kaiming_uniform_(a = sqrt(5)) and PyTorch's bias init both reduce to U(-1/sqrt(fan_in), +).
Tensor init_uniform(const Shape& shape, int64_t fan_in) {
  const float bound = fan_in > 0 ? 1.0f / std::sqrt(static_cast<float>(fan_in)) : 0.0f;
  return Tensor::uniform(shape, -bound, bound, default_generator());
}
}  // namespace

Linear::Linear(int64_t in, int64_t out, bool bias) : in_features(in), out_features(out) {
  MG_CHECK(in > 0 && out > 0, "Linear: features must be positive, got (" << in << ", " << out << ")");
  register_parameter("weight", init_uniform({out, in}, in));
  if (bias) register_parameter("bias", init_uniform({out}, in));
}

Tensor& Linear::bias() {
  MG_CHECK(params_.size() > 1, "Linear: this layer has no bias");
  return params_[1].second;
}

Tensor Linear::forward(const Tensor& x) {
  return linear(x, params_[0].second, params_.size() > 1 ? params_[1].second : Tensor());
}

std::string Linear::name() const {
  return "Linear(" + std::to_string(in_features) + ", " + std::to_string(out_features) + ")";
}

Conv2d::Conv2d(int64_t in, int64_t out, int k, int stride, int padding, bool bias)
    : in_channels(in), out_channels(out), kernel_size(k), stride(stride), padding(padding) {
  MG_CHECK(in > 0 && out > 0 && k > 0 && stride > 0 && padding >= 0,
           "Conv2d: bad arguments (in " << in << ", out " << out << ", kernel " << k << ", stride "
                                        << stride << ", padding " << padding << ")");
  const int64_t fan_in = in * k * k;
  register_parameter("weight", init_uniform({out, in, k, k}, fan_in));
  if (bias) register_parameter("bias", init_uniform({out}, fan_in));
}

Tensor Conv2d::forward(const Tensor& x) {
  return conv2d(x, params_[0].second, params_.size() > 1 ? params_[1].second : Tensor(), stride, padding);
}

std::string Conv2d::name() const {
  std::ostringstream os;
  os << "Conv2d(" << in_channels << ", " << out_channels << ", kernel_size=" << kernel_size
     << ", stride=" << stride << ", padding=" << padding << ")";
  return os.str();
}

std::string MaxPool2d::name() const {
  return "MaxPool2d(kernel_size=" + std::to_string(kernel_size) + ", stride=" + std::to_string(stride) + ")";
}

std::string AdaptiveAvgPool2d::name() const {
  return "AdaptiveAvgPool2d((" + std::to_string(out_h) + ", " + std::to_string(out_w) + "))";
}

std::string Dropout::name() const {
  std::ostringstream os;
  os << "Dropout(p=" << p << ")";
  return os.str();
}

void Sequential::push_back(std::shared_ptr<Module> m) {
  m->train(is_training());
  register_module(std::to_string(children_.size()), std::move(m));
}

Tensor Sequential::forward(const Tensor& x) { return forward_range(x, 0, children_.size()); }

Tensor Sequential::forward_range(const Tensor& x, size_t begin, size_t end) {
  MG_CHECK(begin <= end && end <= children_.size(),
           "Sequential: range [" << begin << ", " << end << ") out of " << children_.size() << " layers");
  Tensor h = x;
  for (size_t i = begin; i < end; ++i) h = children_[i].second->forward(h);
  return h;
}

std::string Sequential::name() const {
  std::string s = "Sequential(\n";
  for (const auto& [n, c] : children_) s += "  (" + n + "): " + c->name() + "\n";
  return s + ")";
}

}  // namespace mg::nn
