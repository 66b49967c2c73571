// Channels-last tensors for the CPU's channels-first kernels.
//
// Note [channels last on the CPU]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The CPU kernels of conv2d, the pools and batch_norm are written for (N, C, H, W): im2col and
// oneDNN's reorders, the pools' planes and batch_norm's per-channel lanes read a channel's
// values together. A channels-last call (Layout::nhwc) runs them between copies: its inputs
// (and an accumulated gradient buffer) permuted to channels first, the kernel, its outputs
// permuted back. A permute moves values and rounds nothing, and the kernel sums in its own order,
// so a channels-last op on the CPU gives exactly the channels-first op's bits at any thread count
// (test_models checks whole VGG16 and ResNet steps), for the time of the copies and their bytes
// (tensors, which the allocator and the planner count). The layout is for CUDA's tensor cores;
// the CPU keeps its own and its results.
#pragma once

#include <minigrad/core/tensor.h>

namespace mg::cpu {

// (N, S..., C) -> (N, C, S...): the last dimension moved second.
Shape channels_first_shape(const Shape& s);
// t as channels first, a new tensor of channels_first_shape (undefined stays undefined).
Tensor channels_first_copy(const Tensor& t);
// An uninitialised channels-first tensor for a channels-last `like` (undefined stays undefined).
Tensor channels_first_empty(const Tensor& like);
// dst (N, S..., C) = src (N, C, S...) with its second dimension moved last.
void store_channels_last(Tensor& dst, const Tensor& src);

}  // namespace mg::cpu
