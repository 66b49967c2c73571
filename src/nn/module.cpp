#include <minigrad/nn/module.h>

#include <algorithm>
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

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out = buffers_;
  for (const auto& [cname, child] : children_) {
    for (auto& [bname, b] : child->named_buffers()) out.emplace_back(cname + "." + bname, b);
  }
  return out;
}

std::vector<Generator*> Module::generators() const {
  std::vector<Generator*> out = generators_;
  for (const auto& [cname, child] : children_) {
    for (Generator* g : child->generators()) {
      if (std::find(out.begin(), out.end(), g) == out.end()) out.push_back(g);
    }
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out = params_;
  out.insert(out.end(), buffers_.begin(), buffers_.end());
  for (const auto& [cname, child] : children_) {
    for (auto& [name, t] : child->state_dict()) out.emplace_back(cname + "." + name, t);
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
  move_buffers(d);
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

void Module::move_buffers(Device d) {
  for (auto& [name, b] : buffers_) {
    if (b.device() == d || b.dtype() != DType::f32) continue;
    b.impl().storage = b.to(d).impl().storage;
    b.impl().offset = 0;
  }
  for (auto& [n, c] : children_) c->move_buffers(d);
}

void Module::zero_grad() {
  for (Tensor& p : parameters()) {
    if (Tensor g = p.grad(); g.defined()) g.zero_();
  }
}

void Module::release_grads() {
  for (Tensor& p : parameters()) p.set_grad(Tensor());
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  buffers_.emplace_back(name, std::move(t));
  return buffers_.back().second;
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

Conv2d::Conv2d(int64_t in, int64_t out, int k, int stride, int padding, bool bias, Layout layout)
    : in_channels(in), out_channels(out), kernel_size(k), stride(stride), padding(padding), layout(layout) {
  MG_CHECK(in > 0 && out > 0 && k > 0 && stride > 0 && padding >= 0,
           "Conv2d: bad arguments (in " << in << ", out " << out << ", kernel " << k << ", stride "
                                        << stride << ", padding " << padding << ")");
  const int64_t fan_in = in * k * k;
  Tensor w = init_uniform({out, in, k, k}, fan_in);  // the same draws in either layout
  register_parameter("weight", layout == Layout::nhwc ? permute(w, {0, 2, 3, 1}) : w);
  if (bias) register_parameter("bias", init_uniform({out}, fan_in));
}

Tensor Conv2d::forward(const Tensor& x) {
  const Tensor b = params_.size() > 1 ? params_[1].second : Tensor();
  return relu ? conv2d_relu(x, params_[0].second, b, stride, padding, layout)
              : conv2d(x, params_[0].second, b, stride, padding, layout);
}

std::string Conv2d::name() const {
  std::ostringstream os;
  os << "Conv2d(" << in_channels << ", " << out_channels << ", kernel_size=" << kernel_size
     << ", stride=" << stride << ", padding=" << padding << (layout == Layout::nhwc ? ", channels_last" : "") << ")"
     << (relu ? " + ReLU" : "");
  return os.str();
}

std::string MaxPool2d::name() const {
  return "MaxPool2d(kernel_size=" + std::to_string(kernel_size) + ", stride=" + std::to_string(stride) +
         (layout == Layout::nhwc ? ", channels_last" : "") + ")";
}

std::string AdaptiveAvgPool2d::name() const {
  return "AdaptiveAvgPool2d((" + std::to_string(out_h) + ", " + std::to_string(out_w) + ")" +
         (layout == Layout::nhwc ? ", channels_last" : "") + ")";
}

Tensor Flatten::forward(const Tensor& x) {
  const bool planes = from == Layout::nhwc && x.dim() == 4 && x.size(1) * x.size(2) != 1;
  return (planes ? to_channels_first(x) : x).flatten(1);
}

std::string Dropout::name() const {
  std::ostringstream os;
  os << "Dropout(p=" << p << ")";
  return os.str();
}

// After an erase, positions no longer match names: the next number is past every numbered layer.
void Sequential::push_back(std::shared_ptr<Module> m) {
  size_t next = children_.size();
  for (const auto& [n, c] : children_) {
    if (!n.empty() && n.size() < 19 && n.find_first_not_of("0123456789") == std::string::npos)
      next = std::max(next, static_cast<size_t>(std::stoull(n)) + 1);
  }
  push_back(std::to_string(next), std::move(m));
}

void Sequential::push_back(const std::string& name, std::shared_ptr<Module> m) {
  MG_CHECK(m, "Sequential: layer '" << name << "' is null");
  MG_CHECK(!name.empty(), "Sequential: a layer needs a name, got an empty one");
  for (const auto& [n, c] : children_) {
    MG_CHECK(n != name, "Sequential: a layer named '" << name << "' is already there");
  }
  m->train(is_training());
  register_module(name, std::move(m));
}

void Sequential::erase(size_t i) {
  MG_CHECK(i < children_.size(), "Sequential::erase: layer " << i << " of " << children_.size());
  children_.erase(children_.begin() + static_cast<std::ptrdiff_t>(i));
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


Embedding::Embedding(int64_t num, int64_t dim) : num(num), dim(dim) {
  MG_CHECK(num > 0 && dim > 0, "Embedding: sizes must be positive, got (" << num << ", " << dim << ")");
  register_parameter("weight", Tensor::randn({num, dim}, default_generator()));
}

std::string Embedding::name() const { return "Embedding(" + std::to_string(num) + ", " + std::to_string(dim) + ")"; }

LayerNorm::LayerNorm(int64_t dim, float eps) : dim(dim), eps(eps) {
  MG_CHECK(dim > 0, "LayerNorm: dim must be positive, got " << dim);
  MG_CHECK(eps >= 0.0f && std::isfinite(eps), "LayerNorm: eps must be >= 0, got " << eps);
  register_parameter("weight", Tensor::ones({dim}));
  register_parameter("bias", Tensor::zeros({dim}));
}

std::string LayerNorm::name() const {
  std::ostringstream os;
  os << "LayerNorm((" << dim << ",), eps=" << eps << ")";
  return os.str();
}

// ---- BatchNorm ----------------------------------------------------------------------------------

BatchNorm::BatchNorm(int64_t n, int64_t dims, float eps, float momentum, bool affine, Layout layout)
    : num_features(n), eps(eps), momentum(momentum), layout(layout), dims_(dims), affine_(affine) {
  MG_CHECK(n > 0, "BatchNorm: num_features must be > 0, got " << n);
  MG_CHECK(eps >= 0.0f && std::isfinite(eps), "BatchNorm: eps must be >= 0, got " << eps);
  MG_CHECK(momentum >= 0.0f && momentum <= 1.0f, "BatchNorm: momentum must be in [0, 1], got " << momentum);
  if (affine) {
    register_parameter("weight", Tensor::ones({n}));
    register_parameter("bias", Tensor::zeros({n}));
  }
  register_buffer("running_mean", Tensor::zeros({n}));
  register_buffer("running_var", Tensor::ones({n}));
  register_buffer("num_batches_tracked", Tensor::from_vector(std::vector<int64_t>{0}, Shape{}));
}

int64_t BatchNorm::num_batches_tracked() const { return buffers_[2].second.data<int64_t>()[0]; }

Tensor BatchNorm::forward(const Tensor& x) {
  const bool last = layout == Layout::nhwc;
  MG_CHECK(dims_ == 4 ? x.dim() == 4 : (x.dim() == 2 || x.dim() == 3),
           name() << ": expected input "
                  << (dims_ == 4 ? (last ? "(N, H, W, C)" : "(N, C, H, W)") : (last ? "(N, C) or (N, L, C)" : "(N, C) or (N, C, L)"))
                  << ", got shape " << shape_str(x.shape()));
  const int64_t channels = x.size(last ? x.dim() - 1 : 1);
  MG_CHECK(channels == num_features,
           name() << ": input has " << channels << " channels (shape " << shape_str(x.shape()) << "), expected " << num_features);
  const Tensor w = affine_ ? params_[0].second : Tensor(), b = affine_ ? params_[1].second : Tensor();
  if (!is_training() || frozen_) return batch_norm(x, w, b, running_mean(), running_var(), false, eps, nullptr, layout, relu);
  const int64_t c = num_features, m = x.numel() / std::max<int64_t>(c, 1);
  MG_CHECK(m > 1, name() << ": training needs more than one value per channel, got input " << shape_str(x.shape()));
  BatchStats batch;
  Tensor y = batch_norm(x, w, b, Tensor(), Tensor(), true, eps, &batch, layout, relu);
  {
    // The running statistics, outside the tape (Note [batch norm and the step] in module.h), from
    // the batch statistics the op used: running = (1 - momentum) running + momentum batch, the
    // variance unbiased, as PyTorch's.
    NoGradGuard no_grad;
    const float keep = 1.0f - momentum;
    running_mean().copy_(running_mean() * keep + batch.mean * momentum);
    running_var().copy_(running_var() * keep +
                        batch.var * static_cast<float>(momentum * static_cast<double>(m) / static_cast<double>(m - 1)));
    buffers_[2].second.data<int64_t>()[0] += 1;
  }
  return y;
}

std::string BatchNorm::name() const {
  std::ostringstream os;
  os << "BatchNorm" << (dims_ == 4 ? "2d(" : "1d(") << num_features << ", eps=" << eps << ", momentum=" << momentum
     << ", affine=" << (affine_ ? "True" : "False") << (layout == Layout::nhwc ? ", channels_last" : "") << ")"
     << (relu ? " + ReLU" : "");
  return os.str();
}

}  // namespace mg::nn
