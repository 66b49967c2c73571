// GPT-2 (minigrad/nn/models.h, Note [GPT-2 as a chain]).
#include <minigrad/nn/models.h>

#include <cmath>
#include <sstream>

namespace mg::nn {

GPTEmbeddings::GPTEmbeddings(int64_t vocab_size, int64_t block_size, int64_t n_embd, float dropout)
    : dropout_(dropout) {
  register_module("wte", wte_ = std::make_shared<Embedding>(vocab_size, n_embd));
  register_module("wpe", wpe_ = std::make_shared<Embedding>(block_size, n_embd));
}

Tensor GPTEmbeddings::forward(const Tensor& tokens) {
  MG_CHECK(tokens.defined() && tokens.dtype() == DType::i64 && tokens.dim() == 2,
           "GPT: expected int64 tokens (B, T), got " << (tokens.defined() ? dtype_name(tokens.dtype()) : "undefined")
                                                     << " " << shape_str(tokens.defined() ? tokens.shape() : Shape{}));
  const int64_t b = tokens.size(0), t = tokens.size(1);
  MG_CHECK(t <= wpe_->num, "GPT: a sequence of " << t << " tokens is longer than the context of " << wpe_->num);
  std::vector<int64_t> pos(static_cast<size_t>(b * t));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int64_t>(i) % t;
  const Tensor positions = Tensor::from_vector(pos, {b, t}).to(tokens.device());
  const Tensor x = add(wte_->forward(tokens), wpe_->forward(positions));
  return is_training() ? dropout(x, dropout_) : x;
}

std::string GPTEmbeddings::name() const {
  return "GPTEmbeddings(wte=" + wte_->name() + ", wpe=" + wpe_->name() + ")";
}

CausalSelfAttention::CausalSelfAttention(int64_t n_embd, int64_t n_head, float dropout)
    : n_embd_(n_embd), n_head_(n_head), dropout_(dropout) {
  MG_CHECK(n_embd > 0 && n_head > 0 && n_embd % n_head == 0,
           "CausalSelfAttention: " << n_head << " heads must divide the width " << n_embd);
  register_module("c_attn", c_attn_ = std::make_shared<Linear>(n_embd, 3 * n_embd));
  register_module("c_proj", c_proj_ = std::make_shared<Linear>(n_embd, n_embd));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  MG_CHECK(x.dim() == 3 && x.size(2) == n_embd_,
           "CausalSelfAttention: expected (B, T, " << n_embd_ << "), got " << shape_str(x.shape()));
  const int64_t b = x.size(0), t = x.size(1);
  const Tensor qkv = c_attn_->forward(x.reshape({b * t, n_embd_})).reshape({b, t, 3 * n_embd_});
  const float p = is_training() ? dropout_ : 0.0f;
  const Tensor y = causal_self_attention(qkv, static_cast<int>(n_head_), p);
  return dropout(c_proj_->forward(y.reshape({b * t, n_embd_})).reshape({b, t, n_embd_}), p);
}

std::string CausalSelfAttention::name() const {
  return "CausalSelfAttention(" + std::to_string(n_embd_) + ", heads=" + std::to_string(n_head_) + ")";
}

namespace {

// c_fc (C -> 4C), GELU, c_proj (4C -> C) on (B, T, C).
class GPTMLP : public Module {
 public:
  GPTMLP(int64_t n_embd, float dropout, bool fused_gelu) : n_embd_(n_embd), dropout_(dropout), fused_gelu_(fused_gelu) {
    register_module("c_fc", c_fc_ = std::make_shared<Linear>(n_embd, 4 * n_embd));
    register_module("c_proj", c_proj_ = std::make_shared<Linear>(4 * n_embd, n_embd));
  }
  Tensor forward(const Tensor& x) override {
    const int64_t b = x.size(0), t = x.size(1);
    const Tensor h = x.reshape({b * t, n_embd_});
    // Note [fused gelu] in src/ops/linear.cpp: c_fc and its GELU as one op.
    const Tensor a = fused_gelu_ ? linear_gelu(h, c_fc_->weight(), c_fc_->bias()) : gelu(c_fc_->forward(h));
    const Tensor y = c_proj_->forward(a).reshape({b, t, n_embd_});
    return is_training() ? dropout(y, dropout_) : y;
  }
  std::string name() const override { return "GPTMLP(" + std::to_string(n_embd_) + ")"; }

 private:
  std::shared_ptr<Linear> c_fc_, c_proj_;
  int64_t n_embd_;
  float dropout_;
  bool fused_gelu_;
};

}  // namespace

GPTBlock::GPTBlock(int64_t n_embd, int64_t n_head, float dropout, bool fused_gelu, bool fused_residual)
    : fused_residual_(fused_residual) {
  register_module("ln_1", ln_1_ = std::make_shared<LayerNorm>(n_embd));
  register_module("attn", attn_ = std::make_shared<CausalSelfAttention>(n_embd, n_head, dropout));
  register_module("ln_2", ln_2_ = std::make_shared<LayerNorm>(n_embd));
  register_module("mlp", mlp_ = std::make_shared<GPTMLP>(n_embd, dropout, fused_gelu));
}

Tensor GPTBlock::forward(const Tensor& x) {
  if (fused_residual_) {
    const auto [h, n] = ln_2_->forward_residual(x, attn_->forward(ln_1_->forward(x)));
    return add(h, mlp_->forward(n));
  }
  const Tensor h = add(x, attn_->forward(ln_1_->forward(x)));
  return add(h, mlp_->forward(ln_2_->forward(h)));
}

std::string GPTBlock::name() const { return "GPTBlock(" + attn_->name() + ")"; }

Tensor GPTHead::forward(const Tensor& x) {
  MG_CHECK(x.dim() == 3 && x.size(2) == wte_.size(1),
           "GPTHead: expected (B, T, " << wte_.size(1) << "), got " << shape_str(x.shape()));
  const int64_t b = x.size(0), t = x.size(1);
  return linear(x.reshape({b * t, x.size(2)}), wte_).reshape({b, t, wte_.size(0)});
}

std::shared_ptr<Sequential> make_gpt2(const GPTConfig& c) {
  MG_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0,
           "make_gpt2: every size must be positive (vocab_size " << c.vocab_size << ", block_size " << c.block_size
                                                                 << ", n_layer " << c.n_layer << ", n_head " << c.n_head
                                                                 << ", n_embd " << c.n_embd << ")");
  MG_CHECK(c.n_embd % c.n_head == 0, "make_gpt2: n_head " << c.n_head << " must divide n_embd " << c.n_embd);
  MG_CHECK(c.dropout >= 0.0f && c.dropout < 1.0f, "make_gpt2: dropout must be in [0, 1), got " << c.dropout);
  auto m = std::make_shared<Sequential>();
  auto& emb = m->add_named<GPTEmbeddings>("transformer", c.vocab_size, c.block_size, c.n_embd, c.dropout);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    m->add_named<GPTBlock>("transformer.h." + std::to_string(i), c.n_embd, c.n_head, c.dropout, c.fused_gelu,
                                 c.fused_residual);
  }
  m->add_named<LayerNorm>("transformer.ln_f", c.n_embd);
  if (c.lm_head) m->add_named<GPTHead>("lm_head", emb.wte());
  // nanoGPT's and llm.c's initialisation.
  NoGradGuard no_grad;
  Generator& gen = default_generator();
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(c.n_layer));
  for (auto& [name, p] : m->named_parameters()) {
    const bool is_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    const bool is_ln = name.find(".ln_") != std::string::npos;
    if (is_ln) continue;  // 1 and 0 already
    if (is_bias) {
      p.copy_(Tensor::zeros(p.shape()));
      continue;
    }
    const bool proj = name.size() > 14 && name.compare(name.size() - 14, 14, ".c_proj.weight") == 0;
    p.copy_(Tensor::randn(p.shape(), gen) * (proj ? proj_std : 0.02f));
  }
  return m;
}

}  // namespace mg::nn
