// The differentiable ops. Each runs its forward on the inputs' device and, when an input requires
// grad, records itself on the tape; each is one entry of the op table (src/ops/op.h), defined in
// src/ops/<op>.cpp with its gradient rule.
//
//   mg::Tensor h = mg::relu(mg::linear(x, w1, b1));            // x: (N, 784), w1: (512, 784)
//   mg::Tensor loss = mg::cross_entropy(mg::linear(h, w2, b2), labels);   // mean over N
//   loss.backward();
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include <minigrad/core/autograd.h>
#include <minigrad/core/checkpoint.h>
#include <minigrad/core/tensor.h>

namespace mg {

// x: (N, K), w: (M, K), b: (M) or undefined  ->  (N, M)
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = {});
// gelu(linear(x, w, b)) as one op: on CUDA one cuBLASLt product whose epilogue applies the GELU
// where cuBLASLt takes it (Note [fused gelu] in src/ops/linear.cpp); the unfused ops' bits on the CPU.
Tensor linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b = {});
// Where an image batch keeps its channels: (N, C, H, W), or channels last, (N, H, W, C), the
// layout cuDNN's tensor-core convolutions read (PyTorch's channels_last memory format). A layer
// takes its layout as an argument; the shapes say it (Note [channels last] in src/ops/conv2d.cpp).
// The same math either way: on the CPU, the same bits.
enum class Layout : uint8_t { nchw, nhwc };
const char* layout_name(Layout layout);  // "nchw", "nhwc"

// x: (N, C, H, W), w: (O, C, KH, KW), b: (O) or undefined  ->  (N, O, OH, OW); with Layout::nhwc
// x: (N, H, W, C), w: (O, KH, KW, C)  ->  (N, OH, OW, O).
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b = {}, int stride = 1,
              int padding = 0, Layout layout = Layout::nchw);
// relu(conv2d(x, w, b, ...)) as one op: on CUDA one cuDNN kernel where cuDNN takes it, y written
// once (Note [fused relu] in src/ops/conv2d.cpp); the unfused ops' bits on the CPU.
Tensor conv2d_relu(const Tensor& x, const Tensor& w, const Tensor& b = {}, int stride = 1, int padding = 0,
                   Layout layout = Layout::nchw);
Tensor relu(const Tensor& x);
// stride 0 means stride = kernel, as in PyTorch. x and y (N, C, H, W), or (N, H, W, C) with nhwc.
Tensor max_pool2d(const Tensor& x, int kernel, int stride = 0, int padding = 0, Layout layout = Layout::nchw);
Tensor adaptive_avg_pool2d(const Tensor& x, int out_h, int out_w, Layout layout = Layout::nchw);
// y = x with its dimensions in the order `dims` (y.shape[i] = x.shape[dims[i]]), copied:
// torch.permute(x, dims).contiguous(). Any dtype; the gradient is permuted back.
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
// (N, C, H, W) -> (N, H, W, C), and back: permute(x, {0, 2, 3, 1}) and permute(x, {0, 3, 1, 2}).
Tensor to_channels_last(const Tensor& x);
Tensor to_channels_first(const Tensor& x);
// x: (N, C, ...) normalised per channel: y = (x - mean) / sqrt(var + eps) * weight + bias (weight,
// bias: (C) or undefined). batch_stats: mean and biased variance of x (training); otherwise
// running_mean and running_var (C), which get no gradient. Updating running statistics is the
// caller's (nn::BatchNorm2d does it).
// With batch_stats and `stats`, the mean and biased variance it normalised by are returned there
// (for the running update, without another pass over x).
struct BatchStats {
  Tensor mean, var;
};
// With Layout::nhwc the channels are x's last dimension: x (N, ..., C). With relu, y = max(y, 0)
// in the same op (Note [fused relu] in src/ops/conv2d.cpp): a ResNet's BatchNorm + ReLU.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool batch_stats, float eps = 1e-5f, BatchStats* stats = nullptr,
                  Layout layout = Layout::nchw, bool relu = false);
// x: (..., C) normalised over the last dimension (biased variance), then * weight + bias (C, or
// undefined): torch.nn.functional.layer_norm(x, (C,), weight, bias, eps).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f);
// {a + b, layer_norm(a + b, weight, bias, eps)}: a residual add and the layer_norm after it, as
// those two ops record them, made in one pass on CUDA (Note [fused residual layer_norm]).
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& a, const Tensor& b, const Tensor& weight, const Tensor& bias,
                                         float eps = 1e-5f);
// idx: any shape, int64 in [0, V); weight: (V, C)  ->  (idx's shape..., C): weight's rows by index
// (torch.nn.functional.embedding). Token and position embeddings; the weight's gradient is summed
// per row in position order (deterministic).
Tensor embedding(const Tensor& idx, const Tensor& weight);
// qkv: (B, T, 3C), the concatenation [q | k | v] of GPT-2's c_attn  ->  (B, T, C): per head of
// C/heads, softmax(q k^T / sqrt(C/heads)) with each position seeing itself and those before it,
// times v (torch's scaled_dot_product_attention(q, k, v, is_causal=True) with heads split and
// merged). The T x T attention matrix is not kept for backward; it is recomputed. dropout_p > 0
// drops attention probabilities as torch's dropout_p does (kept ones scaled by 1/(1-p)), the mask
// drawn from `gen` as dropout() draws (Note [dropout by sample] included) and redrawn in backward.
Tensor causal_self_attention(const Tensor& qkv, int heads, float dropout_p = 0.0f, Generator* gen = nullptr);
// a: (..., M, K), b: (..., K, N) with the same leading dimensions (or none)  ->  (..., M, N): one
// product per leading index (torch.matmul without broadcasting). Deterministic: the same bits at
// any thread count.
Tensor matmul(const Tensor& a, const Tensor& b);
// Softmax over the last dimension (torch.softmax(x, -1)). Mask by adding -inf (a row of only
// -inf gives NaN, as in PyTorch).
Tensor softmax(const Tensor& x);
// GELU in its tanh form (GPT-2's; PyTorch's gelu(x, approximate="tanh")).
Tensor gelu(const Tensor& x);
// Zeroes each element with probability p and scales the rest by 1/(1-p). The mask is drawn from
// `gen` (the default generator when null) and is a pure function of (seed, offset).
Tensor dropout(const Tensor& x, float p, Generator* gen = nullptr);
// logits: (N, C), target: (N) int64 class indices  ->  scalar (mean or sum over N). Rows whose
// target is ignore_index (PyTorch's default, -100: padding, positions without a next token) count
// for nothing: no loss, no gradient, and mean divides by the other rows (NaN if there are none,
// as in PyTorch).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction = Reduction::mean,
                     int64_t ignore_index = -100);
// cross_entropy(linear(x, w), target, Reduction::sum) without the (N, V) logits: they are made a
// chunk of chunk_rows rows at a time (0: at most 32 MiB of them, at least four chunks) in forward, and again in backward
// (Note [chunked classifier] in src/ops/linear_cross_entropy.cpp). x: (N, K), w: (V, K), target: (N).
//   mg::Tensor loss = mg::linear_cross_entropy(h, wte, targets);   // a GPT's tied head, summed
Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& target, int64_t ignore_index = -100,
                            int64_t chunk_rows = 0);
Tensor add(const Tensor& a, const Tensor& b);
// a, b: equal shapes  ->  a * b element by element
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, float s);

// mg::checkpoint (minigrad/core/checkpoint.h) for a function with several outputs, e.g. a block's
// feature map and its skip connection (Note [segments with several outputs] in src/ops/pack.cpp):
//
//   std::vector<Tensor> out = mg::checkpoint_multi([&](const std::vector<Tensor>& in) {
//     Tensor skip = down.forward(in[0]);
//     return std::vector<Tensor>{up.forward(skip), skip};
//   }, {x});                                  // out[0]: the block's output, out[1]: the skip
//
// The outputs are views of one packed tensor; whole segments only (tile_rows must be 0).
using MultiSegmentFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
std::vector<Tensor> checkpoint_multi(const MultiSegmentFn& fn, const std::vector<Tensor>& inputs,
                                     const CheckpointOptions& opts = {});

}  // namespace mg
