// Convolution graphs through the cuDNN frontend's graph API (conv_cudnn.cpp), each compiled by
// cuDNN's runtime fusion into one kernel: a convolution, its bias and a ReLU (conv_fprop, a
// pointwise add of the bias, RELU_FWD), and a data gradient masked by the ReLU that made the
// convolution's input (conv_dgrad, RELU_BWD). conv2d.cu calls them first (Note [fused relu] in
// src/ops/conv2d.cpp; Note [relu mask in the consumer] in src/core/autograd.cpp) and runs the
// legacy convolution and then the ReLU kernel in place when they return false. Plain C++ (no CUDA
// headers).
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

// dx = conv_transpose(dy, w) * (x > 0) as conv2d_backward's kernels define it with mask_dx (Note
// [relu mask in the consumer] in src/core/autograd.cpp): cuDNN's data gradient and RELU_BWD as one
// graph; dx, dy, w and x of one dtype, NCHW or channels last. Returns false, having launched
// nothing, where the graph does not take the case (conv_fusion_refusal(true) says why), under the
// same rules as conv_bias_relu_forward. conv2d.cu asks only under set_cudnn_dgrad_fusion.
bool conv_dgrad_relu_backward(Tensor& dx, const Tensor& dy, const Tensor& w, const Tensor& x, int stride, int pad,
                              bool channels_last);

enum class ConvGraph : uint8_t { bias_relu_forward, dgrad_relu };

// For tests without a GPU: the graph of this shape described as conv_bias_relu_forward (or
// conv_dgrad_relu_backward, whose graph has no bias) does, for a device given as cuDNN's JSON
// description and compute capability, through the frontend's validation and cuDNN's
// operation-graph build (no engine: that needs a driver). "" when both pass, else the step and
// the message.
std::string conv_fusion_check_description(const std::string& device_json, int sm_version, const Shape& x, const Shape& w,
                                          int stride, int pad, DType dtype, bool channels_last, bool bias,
                                          ConvGraph graph = ConvGraph::bias_relu_forward);

}  // namespace mg::cuda
