// The models of the apps and benchmarks, laid out as their PyTorch counterparts so that parameter
// names and shapes match (weights load on either side).
//
//   auto mlp = mg::nn::make_mlp({784, 512, 512, 10});      // Flatten, Linear, ReLU, ... Linear
//   auto vgg = mg::nn::make_vgg16(2, 8);                    // torchvision layout, widths / 8
//   auto resnet = mg::nn::make_resnet50(1000);               // torchvision's names: loads its weights
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/nn/module.h>

namespace mg::nn {

// Flatten, then Linear(sizes[i], sizes[i+1]) with ReLU between (not after the last).
// Parameter names: "1.weight", "1.bias", "3.weight", ... as torch.nn.Sequential gives them.
std::shared_ptr<Sequential> make_mlp(const std::vector<int64_t>& sizes);

// VGG16 as torchvision builds it (configuration D): 13 Conv2d(3x3, padding 1) + ReLU, 5
// MaxPool2d(2), AdaptiveAvgPool2d(7, 7), Flatten, Linear(512*7*7, 4096), ReLU, Dropout(0.5),
// Linear(4096, 4096), ReLU, Dropout(0.5), Linear(4096, num_classes), as ONE flat Sequential
// (a chain, which the checkpoint planner needs). Channel and hidden sizes are divided by
// width_div (>= 1) to fit a CPU. With Layout::nhwc (Note [channels last] in src/ops/conv2d.cpp) the
// input is (N, H, W, 3), the convolutions and pools channels last, and Flatten takes the features
// back to channels first: the same parameter names, the classifier's weights the same shapes.
std::shared_ptr<Sequential> make_vgg16(int64_t num_classes, int64_t width_div = 1, float dropout_p = 0.5f,
                                       Layout layout = Layout::nchw);

// ---- ResNet (He et al. 2016), as torchvision builds it (v1.5: the stride in the 3x3 conv) ----------
//
// Note [residual blocks as units]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A ResNet is a chain of blocks, and each block is a small graph: the residual branch and the
// identity (or a strided 1x1 conv + BatchNorm, "downsample") meet in an add. make_resnet* return
// ONE flat Sequential whose layers are the stem (conv1, bn1, relu, maxpool), the blocks, and the
// head (avgpool, flatten, fc), each named as torchvision's attribute path ("layer2.0"), so that
// parameter and buffer names are torchvision's ("layer2.0.downsample.1.running_mean") while the
// checkpoint planner (minigrad/nn/checkpoint_plan.h) sees blocks as units: a segment starts and
// ends between blocks, never inside one, and a block's inner tensors are its own business.

// conv3x3(stride) - bn - relu - conv3x3 - bn, + identity or downsample(x), relu.
class BasicBlock : public Module {
 public:
  static constexpr int64_t expansion = 1;
  BasicBlock(int64_t inplanes, int64_t planes, int stride = 1, Layout layout = Layout::nchw);
  Tensor forward(const Tensor& x) override;
  std::string name() const override;
  // bn1's ReLU fused into it (Note [fused relu]); the one after the add stays. Returns 1, then 0.
  size_t fuse_relu();

 private:
  std::shared_ptr<Module> conv1_, bn1_, conv2_, bn2_, downsample_;
  int64_t inplanes_, planes_;
  int stride_;
};

// conv1x1 - bn - relu - conv3x3(stride) - bn - relu - conv1x1 (4 x planes) - bn, + identity or
// downsample(x), relu.
class Bottleneck : public Module {
 public:
  static constexpr int64_t expansion = 4;
  Bottleneck(int64_t inplanes, int64_t planes, int stride = 1, Layout layout = Layout::nchw);
  Tensor forward(const Tensor& x) override;
  std::string name() const override;
  // bn1's and bn2's ReLUs fused into them (Note [fused relu]). Returns 2, then 0.
  size_t fuse_relu();

 private:
  std::shared_ptr<Module> conv1_, bn1_, conv2_, bn2_, conv3_, bn3_, downsample_;
  int64_t inplanes_, planes_;
  int stride_;
};

// torchvision's resnet18/34/50 (Note [residual blocks as units]): conv1 7x7/2 (no bias), bn1, relu,
// maxpool 3x3/2, layer1..layer4 of BasicBlock (18: 2,2,2,2; 34: 3,4,6,3) or Bottleneck (50: 3,4,6,3)
// with 64, 128, 256, 512 planes (divided by width_div, at least 1), avgpool to 1x1, flatten, and a
// Dropout(dropout_p) before fc when dropout_p > 0 (torchvision has none; it has no parameters, so
// names do not change). Weights start as our Conv2d/Linear defaults (PyTorch's layer defaults), BN
// at weight 1, bias 0; load torchvision's initialisation or trained weights with load_into. With
// Layout::nhwc every convolution, BatchNorm and pool is channels last (input (N, H, W, 3); the
// convolutions' weights (O, KH, KW, C)).
std::shared_ptr<Sequential> make_resnet18(int64_t num_classes, int64_t width_div = 1, float dropout_p = 0.0f,
                                          Layout layout = Layout::nchw);
std::shared_ptr<Sequential> make_resnet34(int64_t num_classes, int64_t width_div = 1, float dropout_p = 0.0f,
                                          Layout layout = Layout::nchw);
std::shared_ptr<Sequential> make_resnet50(int64_t num_classes, int64_t width_div = 1, float dropout_p = 0.0f,
                                          Layout layout = Layout::nchw);

// ---- GPT-2 (Radford et al. 2019), laid out as Hugging Face's GPT2LMHeadModel and nanoGPT ---------
//
// Note [GPT-2 as a chain]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// make_gpt2 returns ONE flat Sequential: "transformer" (token + position embeddings, wte and wpe),
// the blocks "transformer.h.0" ... (x + attn(ln_1(x)), then x + mlp(ln_2(x))), "transformer.ln_f"
// and "lm_head". Parameter names are Hugging Face's ("transformer.h.0.attn.c_attn.weight"); the
// linear weights are (out, in) as torch.nn.Linear (nanoGPT's layout; Hugging Face's Conv1D stores
// the transpose, which load_gpt2_hf handles). lm_head is tied to wte: it uses wte's tensor and has
// no parameter of its own, so wte's gradient sums both uses. The planner's units are the blocks.
// The input is int64 tokens (B, T) with T <= block_size; the output the logits (B, T, vocab_size):
//
//   auto gpt = mg::nn::make_gpt2({.vocab_size = 512, .block_size = 64, .n_layer = 2, .n_head = 4, .n_embd = 64});
//   Tensor logits = gpt->forward(tokens);                                  // (B, T, 512)
//   Tensor loss = mg::cross_entropy(logits.reshape({-1, 512}), targets.reshape({-1}));
struct GPTConfig {
  int64_t vocab_size = 50257, block_size = 1024, n_layer = 12, n_head = 12, n_embd = 768;
  // nanoGPT's one rate, in training mode only: after the embeddings, on the attention
  // probabilities (inside causal_self_attention), and after each block's two c_proj. GPT-2 124M
  // was pretrained with 0.1; llm.c and nanoGPT pretrain with 0.
  float dropout = 0.0f;
  // false: no "lm_head"; the model ends at ln_f and returns the hidden states (B, T, n_embd), for
  // a loss that is the head too: linear_cross_entropy(h.reshape({-1, n_embd}), wte, targets)
  // (Note [chunked classifier] in src/ops/linear_cross_entropy.cpp; gpt_train --fused-head on).
  bool lm_head = true;
  // Each block's c_fc and GELU as one op, linear_gelu (Note [fused gelu] in src/ops/linear.cpp):
  // on CUDA one cuBLASLt product with the GELU in its epilogue; the same bits on the CPU.
  bool fused_gelu = false;
  // Each block's first residual add and ln_2 as one op, add_layer_norm (Note [fused residual
  // layer_norm] in src/ops/layer_norm.cpp): on CUDA one pass that writes both; the same bits.
  bool fused_residual = false;
};

class GPTEmbeddings : public Module {  // wte(tokens) + wpe(positions)
 public:
  GPTEmbeddings(int64_t vocab_size, int64_t block_size, int64_t n_embd, float dropout = 0.0f);
  Tensor forward(const Tensor& tokens) override;
  std::string name() const override;
  Tensor& wte() { return wte_->weight(); }

 private:
  std::shared_ptr<Embedding> wte_, wpe_;
  float dropout_;
};

class CausalSelfAttention : public Module {  // c_attn (C -> 3C), causal_self_attention, c_proj
 public:
  CausalSelfAttention(int64_t n_embd, int64_t n_head, float dropout = 0.0f);
  Tensor forward(const Tensor& x) override;
  std::string name() const override;

 private:
  std::shared_ptr<Linear> c_attn_, c_proj_;
  int64_t n_embd_, n_head_;
  float dropout_;
};

class GPTBlock : public Module {  // ln_1, attn, ln_2, mlp (c_fc, GELU, c_proj), two residual adds
 public:
  GPTBlock(int64_t n_embd, int64_t n_head, float dropout = 0.0f, bool fused_gelu = false, bool fused_residual = false);
  Tensor forward(const Tensor& x) override;
  std::string name() const override;

 private:
  std::shared_ptr<Module> ln_1_, attn_, mlp_;
  std::shared_ptr<LayerNorm> ln_2_;
  bool fused_residual_;
};

class GPTHead : public Module {  // logits = x wte^T, tied: no parameter of its own
 public:
  explicit GPTHead(Tensor wte) : wte_(std::move(wte)) {}
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "GPTHead(tied to wte)"; }

 private:
  Tensor wte_;
};

// GPT-2 initialised as nanoGPT and llm.c do: weights N(0, 0.02), the residual projections
// (c_proj) N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm 1 and 0, from the default generator.
std::shared_ptr<Sequential> make_gpt2(const GPTConfig& config);

// ---- Hugging Face's GPT-2 checkpoints (gpt2, gpt2-medium, ..., or a save_pretrained folder) ------
//
// Note [loading Hugging Face's GPT-2]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A folder as the hub holds it or save_pretrained writes it: config.json and model.safetensors.
// The file's names are ours with or without the "transformer." prefix (GPT2LMHeadModel writes it,
// GPT2Model and the hub's gpt2 file do not). Its four Conv1D weights per block (attn.c_attn,
// attn.c_proj, mlp.c_fc, mlp.c_proj) are stored (in, out) and are transposed into our (out, in).
// The causal-mask buffers older files carry ("h.N.attn.bias", "h.N.attn.masked_bias") are
// skipped: our attention masks by construction. "lm_head.weight", when present, must equal
// wte (GPT-2 ties them; an untied head is refused). F32, BF16 and F64 tensors load as f32. Nothing
// is written before everything was checked: a refused file leaves the model as it was.
//
//   auto gpt = mg::nn::load_gpt2_hf("models/gpt2");     // config.json + model.safetensors: GPT-2 124M
//
// The config must describe this model: activation "gelu_new" (tanh GELU), layer_norm_epsilon
// 1e-5, n_inner 4 n_embd (or null), scaled attention not scaled by layer index, tied embeddings.
// Its dropout rates are not used: GPTConfig::dropout is 0 unless set (gpt_train --dropout).
GPTConfig read_gpt2_hf_config(const std::string& config_json);
// Copies a GPT-2 safetensors file (as above) into a make_gpt2 model of the same sizes; the error
// lists every tensor missing, unexpected or of the wrong shape.
void load_gpt2_hf_weights(Sequential& gpt, const std::string& safetensors_path);
// make_gpt2(read_gpt2_hf_config(folder/config.json)) with folder/model.safetensors loaded.
std::shared_ptr<Sequential> load_gpt2_hf(const std::string& folder);

// Every ReLU fused into the Conv2d or BatchNorm before it (Note [fused relu] in src/ops/conv2d.cpp):
// in m's chain (and the Sequentials inside it) a Conv2d or BatchNorm directly followed by a ReLU
// layer becomes one layer and the ReLU layer goes; inside BasicBlock and Bottleneck the ReLUs
// after bn1 (and bn2). Parameter names, the state dict and the math are unchanged (on the CPU, the
// bits); the checkpoint planner's units are the fused layers. Returns how many ReLUs it fused.
//   auto vgg = mg::nn::make_vgg16(1000);
//   mg::nn::fuse_relu(*vgg);   // 13: "0" is Conv2d(3, 64, ...) + ReLU, "1" is gone
//   auto resnet = mg::nn::make_resnet50(1000);
//   mg::nn::fuse_relu(*resnet);   // 33: bn1 + relu of the stem, two in each of the 16 blocks
size_t fuse_relu(Sequential& m);

// "vgg16", "resnet18", "resnet34", "resnet50": the apps' --model (and --layout).
std::shared_ptr<Sequential> make_model(const std::string& name, int64_t num_classes, int64_t width_div = 1,
                                       Layout layout = Layout::nchw);

}  // namespace mg::nn
