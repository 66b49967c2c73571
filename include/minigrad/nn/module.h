// Modules: layers with parameters, composed with Sequential, as in torch.nn.
//
//   mg::manual_seed(0);
//   mg::nn::Sequential mlp;
//   mlp.add<mg::nn::Flatten>();
//   mlp.add<mg::nn::Linear>(784, 512);
//   mlp.add<mg::nn::ReLU>();
//   mlp.add<mg::nn::Linear>(512, 10);
//   mg::Tensor logits = mlp.forward(x);           // x: (N, 1, 28, 28)
//   for (auto& [name, p] : mlp.named_parameters()) std::puts(name.c_str());  // "1.weight", ...
//
// Parameter names follow PyTorch's for the same nn.Sequential, so weights saved here load there
// (minigrad/nn/serialize.h). Default initialisation is PyTorch's: kaiming_uniform(a = sqrt(5)) for
// weights, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for biases, drawn from mg::default_generator().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <minigrad/ops/ops.h>
#include <minigrad/core/rng.h>
#include <minigrad/core/tensor.h>

namespace mg::nn {

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  virtual std::string name() const = 0;  // "Linear(784, 512)"

  Tensor operator()(const Tensor& x) { return forward(x); }

  // Parameters of this module and its children, in registration order, with dotted names.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t parameter_count() const;
  // Buffers: state that is not trained but is saved and loaded (BatchNorm's running statistics),
  // with dotted names as PyTorch's.
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  // Parameters and buffers as PyTorch's state_dict orders them (a module's parameters, its
  // buffers, then its children's): what save_safetensors and load_into write and read.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  // The generators given to this module and its children (a Dropout's own; those left to the
  // default generator add nothing), each once, in registration order: what a pass that must leave
  // the random streams as it found them keeps and puts back (measure_chain does), and what a
  // training state saves.
  std::vector<Generator*> generators() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves every parameter and float buffer to `d` (they keep their identity: optimizers built
  // before stay valid). Integer buffers (num_batches_tracked) stay in host memory.
  void to(Device d);
  // Zeroes every parameter's gradient buffer in place, as Optimizer::zero_grad does (a gradient
  // that is undefined stays undefined). Nothing is freed, so the next backward adds into the
  // same buffers and a step peaks no higher than the one before.
  void zero_grad();
  // Frees every parameter's gradient (sets it undefined): memory back for evaluation or
  // inference. The next backward allocates fresh gradients. An optimizer re-creates zeroed
  // buffers at its next zero_grad().
  void release_grads();

 protected:
  Tensor& register_parameter(const std::string& name, Tensor t);
  Tensor& register_buffer(const std::string& name, Tensor t);
  void move_buffers(Device d);
  Module& register_module(const std::string& name, std::shared_ptr<Module> m);
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<Generator*> generators_;  // this module's own, not its children's
  bool training_ = true;
};

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string name() const override;
  Tensor& weight() { return params_[0].second; }
  Tensor& bias();
  int64_t in_features, out_features;
};

// Layout::nhwc (Note [channels last] in src/ops/conv2d.cpp): input (N, H, W, C), weight
// (O, KH, KW, C), holding the values the channels-first layer draws from the same generator.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int kernel_size, int stride = 1, int padding = 0,
         bool bias = true, Layout layout = Layout::nchw);
  Tensor forward(const Tensor& x) override;
  std::string name() const override;
  Tensor& weight() { return params_[0].second; }
  int64_t in_channels, out_channels;
  int kernel_size, stride, padding;
  Layout layout;
  bool relu = false;  // a ReLU after it, fused (conv2d_relu; nn::fuse_relu sets it)
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return relu(x); }
  std::string name() const override { return "ReLU()"; }
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int kernel_size, int stride = 0, int padding = 0, Layout layout = Layout::nchw)
      : kernel_size(kernel_size), stride(stride == 0 ? kernel_size : stride), padding(padding), layout(layout) {}
  Tensor forward(const Tensor& x) override { return max_pool2d(x, kernel_size, stride, padding, layout); }
  std::string name() const override;
  int kernel_size, stride, padding;
  Layout layout;
};

class AdaptiveAvgPool2d : public Module {
 public:
  AdaptiveAvgPool2d(int out_h, int out_w, Layout layout = Layout::nchw) : out_h(out_h), out_w(out_w), layout(layout) {}
  Tensor forward(const Tensor& x) override { return adaptive_avg_pool2d(x, out_h, out_w, layout); }
  std::string name() const override;
  int out_h, out_w;
  Layout layout;
};

// x.flatten(1). With Layout::nhwc, a 4-D (N, H, W, C) input is flattened in channels-first order
// (to_channels_first first, unless H W = 1), so that the linear layer after it, its weights and
// its output are the channels-first model's (Note [channels last] in src/ops/conv2d.cpp).
class Flatten : public Module {
 public:
  explicit Flatten(Layout from = Layout::nchw) : from(from) {}
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Flatten()"; }
  Layout from;
};

// Active in training mode only; masks come from `gen` or the default generator.
class Dropout : public Module {
 public:
  explicit Dropout(float p = 0.5f, Generator* gen = nullptr) : p(p), gen_(gen) {
    if (gen) generators_.push_back(gen);
  }
  Tensor forward(const Tensor& x) override { return is_training() ? dropout(x, p, gen_) : x; }
  std::string name() const override;
  float p;

 private:
  Generator* gen_;
};

// Rows of a (num, dim) table by int64 index: (idx's shape..., dim), as torch.nn.Embedding. The
// weight starts N(0, 1) as PyTorch's (GPT-2 re-initialises it: make_gpt2).
class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim);
  Tensor forward(const Tensor& idx) override { return embedding(idx, params_[0].second); }
  std::string name() const override;
  Tensor& weight() { return params_[0].second; }
  int64_t num, dim;
};

// Normalises over the last dimension (size dim), weight 1 and bias 0 to start, as
// torch.nn.LayerNorm(dim, eps).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f);
  Tensor forward(const Tensor& x) override { return layer_norm(x, params_[0].second, params_[1].second, eps); }
  // {a + b, forward(a + b)} (add_layer_norm: one pass on CUDA, Note [fused residual layer_norm]).
  std::pair<Tensor, Tensor> forward_residual(const Tensor& a, const Tensor& b) {
    return add_layer_norm(a, b, params_[0].second, params_[1].second, eps);
  }
  std::string name() const override;
  int64_t dim;
  float eps;
};

// GELU, tanh form (torch.nn.GELU(approximate="tanh")).
class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return gelu(x); }
  std::string name() const override { return "GELU(approximate='tanh')"; }
};

// Batch normalisation over the channels of (N, C) (BatchNorm1d) or (N, C, H, W) (BatchNorm2d),
// as PyTorch's: in training, each call normalises by its batch's statistics and updates
// running_mean and running_var (unbiased) by `momentum`; in eval mode it uses them. Parameters
// weight and bias (affine), buffers running_mean, running_var, num_batches_tracked.
// Note [batch norm and the step]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under gradient accumulation each micro-batch normalises by its
// own statistics (as in PyTorch), so N micro-batches are not the big batch's step; set_frozen(true)
// normalises by the running statistics while training (weight and bias still learn), which makes
// the step independent of the split. Under checkpointing the running statistics are updated once
// per forward, not again in the replay (the update is not on the tape).
// BatchNorm2d with Layout::nhwc takes (N, H, W, C).
class BatchNorm : public Module {
 public:
  BatchNorm(int64_t num_features, int64_t dims, float eps = 1e-5f, float momentum = 0.1f, bool affine = true,
            Layout layout = Layout::nchw);
  Tensor forward(const Tensor& x) override;
  std::string name() const override;
  void set_frozen(bool frozen) { frozen_ = frozen; }
  bool frozen() const { return frozen_; }
  Tensor& running_mean() { return buffers_[0].second; }
  Tensor& running_var() { return buffers_[1].second; }
  int64_t num_batches_tracked() const;
  int64_t num_features;
  float eps, momentum;
  Layout layout;
  bool relu = false;  // a ReLU after it, fused (Note [fused relu]; nn::fuse_relu sets it)

 private:
  int64_t dims_;  // 2 for BatchNorm1d, 4 for BatchNorm2d
  bool affine_, frozen_ = false;
};

class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t n, float eps = 1e-5f, float momentum = 0.1f, bool affine = true)
      : BatchNorm(n, 2, eps, momentum, affine) {}
};

class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t n, float eps = 1e-5f, float momentum = 0.1f, bool affine = true,
                       Layout layout = Layout::nchw)
      : BatchNorm(n, 4, eps, momentum, affine, layout) {}
};

class Sequential : public Module {
 public:
  Sequential() = default;
  template <typename M, typename... Args> M& add(Args&&... args) {
    auto m = std::make_shared<M>(std::forward<Args>(args)...);
    M& ref = *m;
    push_back(std::move(m));
    return ref;
  }
  // A layer named as PyTorch would name the attribute holding it ("conv1", "layer1.0"), so that
  // a flat chain of blocks carries the parameter names of a nested torchvision model
  // ("layer1.0.conv1.weight"). Names must be unique and not empty.
  template <typename M, typename... Args> M& add_named(const std::string& name, Args&&... args) {
    auto m = std::make_shared<M>(std::forward<Args>(args)...);
    M& ref = *m;
    push_back(name, std::move(m));
    return ref;
  }
  // Named by its position, "0", "1", ...; after an erase, one past the largest number in use.
  void push_back(std::shared_ptr<Module> m);
  void push_back(const std::string& name, std::shared_ptr<Module> m);
  const std::string& child_name(size_t i) const { return children_.at(i).first; }
  Tensor forward(const Tensor& x) override;
  // Runs layers [begin, end) only.
  Tensor forward_range(const Tensor& x, size_t begin, size_t end);
  std::string name() const override;
  size_t size() const { return children_.size(); }
  Module& operator[](size_t i) { return *children_.at(i).second; }
  std::shared_ptr<Module> at(size_t i) const { return children_.at(i).second; }
  // Removes layer i; the others keep their names (so their parameters keep theirs).
  void erase(size_t i);
};

// Mean (or summed) cross-entropy of logits (N, C) against int64 targets (N).
class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(Reduction reduction = Reduction::mean) : reduction(reduction) {}
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return cross_entropy(logits, target, reduction);
  }
  Reduction reduction;
};

}  // namespace mg::nn
