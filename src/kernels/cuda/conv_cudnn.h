// A convolution, its bias and a ReLU in one cuDNN graph (conv_cudnn.cpp, through the cuDNN
// frontend's graph API: conv_fprop, a pointwise add of the bias, RELU_FWD, which cuDNN's runtime
// fusion compiles into one kernel). conv2d.cu calls it first for conv2d with the ReLU fused
// (Note [fused relu] in src/ops/conv2d.cpp) and runs the convolution and then the ReLU
// kernel in place when it returns false. Plain C++ (no CUDA headers).
#pragma once

#include <cstdint>
#include <string>

#include <minigrad/core/tensor.h>
#include <minigrad/cuda.h>  // conv_fusion_counts, conv_fusion_refusal

namespace mg::cuda {

// Whether this build has the fused graph (the cuDNN frontend's headers were found).
bool conv_fusion_built();

// y = relu(conv(x, w) + b) (b may be undefined) as conv2d_forward's kernels define it, NCHW or
// channels last; x, w, b and y of one dtype. Returns false, having launched nothing, where the
// graph does not take the case (the build, the math mode, alignment, cuDNN's support check, the
// workspace limit; conv_fusion_refusal() says why); throws where an accepted graph fails to run.
// Strict FP32 (set_tf32_conv(false)) takes only engines without tensor-core math notes; with
// cudnn_deterministic() (the default) none with the non-deterministic note.
bool conv_bias_relu_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, int stride, int pad,
                            bool channels_last);

// For tests without a GPU: the forward graph of this shape described as conv_bias_relu_forward
// does, for a device given as cuDNN's JSON description and compute capability, through the
// frontend's validation and cuDNN's operation-graph build (no engine: that needs a driver). ""
// when both pass, else the step and the message.
std::string conv_fusion_check_description(const std::string& device_json, int sm_version, const Shape& x, const Shape& w,
                                          int stride, int pad, DType dtype, bool channels_last, bool bias);

}  // namespace mg::cuda
