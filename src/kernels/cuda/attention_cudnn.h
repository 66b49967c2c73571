// cuDNN's fused attention (SDPA) for causal self-attention of bf16/f16 qkv: the math of
// kernels/attention.h without dropout, run by cuDNN's flash-attention graph
// (attention_cudnn.cpp, the one file that includes the cuDNN frontend). attention.cu calls these
// first for bf16/f16 and runs its own kernels on float32 copies when they return false.
// Plain C++ (no CUDA headers).
#pragma once

#include <cstdint>
#include <string>

#include <minigrad/core/tensor.h>

namespace mg::cuda {

// Whether this build has cuDNN's fused attention (the cuDNN frontend's headers were found:
// MINIGRAD_WITH_CUDNN_FRONTEND on attention_cudnn.cpp).
bool sdpa_built();

// y (B, T, C) = the causal attention of qkv (B, T, 3C), `heads` heads, and lse (B, H, T) float32
// its log-sum-exps (cuDNN's "Stats": max + log(sum exp), natural log, of the scaled scores).
// qkv and y bf16, or both f16, contiguous, on one device. Returns false, having launched nothing,
// where cuDNN's graph does not take the case (math::sdpa_takes, alignment, the graph's support
// check or its build; sdpa_refusal() says why); throws where an accepted graph fails to run.
bool sdpa_forward(Tensor& y, Tensor& lse, const Tensor& qkv, int heads);
// dqkv (=) from dy, qkv, y and lse of sdpa_forward; the same dtypes. With
// cuda::cudnn_deterministic() the graph asks for cuDNN's deterministic algorithm, and a case
// where cuDNN has none is refused (false), not run non-deterministically.
bool sdpa_backward(Tensor& dqkv, const Tensor& dy, const Tensor& qkv, const Tensor& y, const Tensor& lse, int heads);

// For tests without a GPU: describes the graph for (B, H, T, D, dtype, direction, determinism) as
// sdpa_forward/sdpa_backward do, for a device given as cuDNN's JSON device description (cuDNN 9.8
// and later, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION) and compute capability, and runs the
// frontend's validation (its SDPA support checks on dims, strides, head size, mask, determinism)
// and the operation graph's build in cuDNN. No engine is built (that needs a driver). Returns ""
// when both pass, else the step and the message.
std::string sdpa_check_description(const std::string& device_json, int sm_version, int64_t b, int64_t h, int64_t t,
                                   int64_t d, DType dtype, bool backward, bool deterministic);

// For tests and benchmarks: the calls cuDNN ran since the program started, and the reason of the
// last refusal (empty when there was none).
struct SdpaCounts {
  int64_t forward = 0, backward = 0, refused = 0;
};
SdpaCounts sdpa_counts();
std::string sdpa_refusal();

}  // namespace mg::cuda
