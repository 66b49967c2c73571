// Run-time switches of the CUDA backend (plain C++: include it from any program; waiting for a
// device is mg::synchronize in <minigrad/core/device.h>).
//
//   mg::cuda::set_tf32_matmul(true);        // linear may use TF32 tensor cores (default: off)
//   mg::cuda::set_tf32_conv(false);         // conv2d in strict FP32 (default: TF32 allowed)
//   mg::cuda::set_cudnn_benchmark(true);    // time cuDNN's algorithms once per shape
//   mg::cuda::set_cudnn_deterministic(false); // admit non-deterministic cuDNN algorithms
//   mg::cuda::set_cudnn_attention(false);   // bf16/f16 attention on our kernels, not cuDNN's SDPA
//   mg::cuda::set_cublaslt(false);          // linear and matmul through cublasGemmEx, not cuBLASLt
//   mg::cuda::set_cudnn_conv_fusion(false); // conv2d with a fused ReLU as two kernels, not one graph
//   mg::cuda::set_cudnn_dgrad_fusion(true);  // a data gradient masked by a ReLU as one graph (off)
//   auto choices = mg::cuda::conv_algorithms(); // what conv2d chose, per shape and pass
//
// In a build without CUDA the setters only record the value.
//
// Note [cuda math modes]
// ~~~~~~~~~~~~~~~~~~~~~~
// The defaults follow PyTorch: matmuls (linear, matmul) in strict FP32, convolutions allowed
// TF32 on tensor cores; both switches above change them, and docs/cuda.md has what each costs.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace mg::cuda {

void set_tf32_matmul(bool allow);
bool tf32_matmul();
void set_tf32_conv(bool allow);
bool tf32_conv();
// Benchmark mode: the first conv2d of each shape times every cuDNN algorithm (cudnnFind*) and
// caches the fastest; otherwise cuDNN's heuristics choose (cudnnGet*_v7), also cached per shape.
void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();
// Deterministic convolutions (default: on): only cuDNN algorithms that give the same bits for
// the same inputs, so replayed checkpoint segments and accumulation stay exact on the GPU
// (Note [deterministic convolutions] in src/kernels/cuda/conv2d.cu). Off: the fastest of all.
void set_cudnn_deterministic(bool on);
bool cudnn_deterministic();
// cuDNN's fused attention (SDPA) for causal_self_attention on bf16/f16 tensors (default: on, where
// the build has the cuDNN frontend; the environment's MG_CUDNN_ATTENTION=0 turns it off at start).
// Off, or where cuDNN does not take a case, the attention runs our float32 kernels on widened
// copies (docs/cuda.md, "Fused attention"). Under set_cudnn_deterministic (the default) cuDNN's
// backward is asked for its deterministic algorithm.
void set_cudnn_attention(bool on);
bool cudnn_attention();
// cuBLASLt for linear and matmul (default: on; the environment's MG_CUBLASLT=0 turns it off at
// start): linear's bias is added, and its gradient summed, in the epilogues of its GEMMs. Off,
// the products run cublasGemmEx as before (Note [cublaslt products] in src/kernels/cuda/cublaslt.h).
void set_cublaslt(bool on);
bool cublaslt();
// cuDNN's conv+bias+relu graph for conv2d with its ReLU fused (nn::fuse_relu; default: on,
// where the build has the cuDNN frontend; the environment's MG_CUDNN_CONV_FUSION=0 turns it off at
// start). Off, or where cuDNN does not take a case, the convolution runs as unfused and the ReLU
// kernel after it, in place (docs/cuda.md, "Fused ReLUs").
void set_cudnn_conv_fusion(bool on);
bool cudnn_conv_fusion();
// cuDNN's dgrad+drelu graph for the data gradient of a conv2d whose input is a ReLU's output
// (default: OFF until a GPU has run it; the environment's MG_CUDNN_DGRAD_FUSION=1 turns it on at
// start). On, every such conv2d masks its data gradient, in every checkpoint plan alike, and
// cuDNN's fused engine sums in its own order (docs/cuda.md, "Fused ReLUs").
void set_cudnn_dgrad_fusion(bool on);
bool cudnn_dgrad_fusion();
// The fused graphs cuDNN ran since the program started and the cases it refused, and the last
// refusal's reason (empty when there was none), of the forward graph or of the dgrad graph: what
// vgg_ckpt reports.
struct ConvFusionCounts {
  long long ran = 0, refused = 0;              // conv + bias + ReLU forward
  long long dgrad_ran = 0, dgrad_refused = 0;  // the data gradient masked by a ReLU (dgrad + dReLU)
};
ConvFusionCounts conv_fusion_counts();
std::string conv_fusion_refusal(bool dgrad = false);
// Upper bound on one cuDNN workspace (bytes, default 1 GiB); algorithms needing more are skipped.
void set_conv_workspace_limit(size_t bytes);
size_t conv_workspace_limit();

// What conv2d chose for one shape and pass, as its cache holds it (src/kernels/cuda/conv2d.cu):
// the algorithm, its workspace and math, how it was chosen, and the algorithms cuDNN ranked before
// it that were passed over, and why (a workspace over the limit, say: issue 36's batch-64 cliff).
struct ConvAlgorithm {
  int device = 0;
  int n = 0, c = 0, h = 0, w = 0;     // x: (n, c, h, w)
  int o = 0, kh = 0, kw = 0;          // w: (o, c, kh, kw)
  int stride = 1, pad = 0;
  std::string dtype;                  // of x, w and y: float32, bfloat16, float16
  std::string layout;                 // nchw | nhwc (then x (n, h, w, c) and w (o, kh, kw, c) in memory)
  std::string pass;                   // forward | backward data | backward filter
  int algo = 0;                       // cuDNN's enum value for the pass
  std::string algo_name;              // IMPLICIT_PRECOMP_GEMM, ALGO_1, WINOGRAD_NONFUSED, ...
  std::string math;                   // default | tensor op | tensor op (conversion) | fma
  size_t workspace_bytes = 0;
  // heuristic (cudnnGet*_v7) | find (cudnnFind*Ex timed them) | heuristic, no room to find (Note
  // [timing needs room]) | least workspace, over the limit (none fit the workspace limit) |
  // fallback (cuDNN ranked none that the math and determinism allow)
  std::string how;
  int rank = -1;                      // its place in cuDNN's ranking (0: first); -1: the fallback
  double time_ms = -1;                // cuDNN's time for it when Find ran; -1 otherwise
  struct Skipped {
    std::string algo_name;
    size_t workspace_bytes = 0;
    double time_ms = -1;              // when Find ran
    std::string why;                  // workspace over the limit | not deterministic | not FMA math
  };
  std::vector<Skipped> skipped;       // ranked before it, in order
  // The switches it was chosen under (part of the cache's key).
  bool tf32 = false, benchmark = false, deterministic = true;
  size_t workspace_limit = 0;
};
// Every choice made so far, in the order they were first made (forward layers in order, then the
// backward passes). Empty in a build without CUDA, and before any conv2d ran on a GPU.
std::vector<ConvAlgorithm> conv_algorithms();

}  // namespace mg::cuda
