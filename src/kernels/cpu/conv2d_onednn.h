// 2-D convolutions of one image at a time in oneDNN (Debian: libdnnl-dev), on the calling thread.
//
// oneDNN's JIT kernels run VGG16's convolutions in 0.61x to 0.87x the time of our im2col + SGEMM
// (BENCHMARKS.md, "Convolutions in oneDNN"); PyTorch uses the same library. It
// is called inside our own pieces (Note [fixed pieces] in core/parallel.h), one image per call and
// one thread per call, so the threads and the order of every sum stay ours:
//   - each call's oneDNN parallel region is held to one thread (its OpenMP runtime is told so on
//     the calling thread, and told back afterwards), so a call's bits do not depend on the thread
//     count;
//   - a weight gradient is one image's term, added into dW by the caller in image order (Note
//     [weight gradients in sample order] in kernels/cpu/conv2d.cpp), so micro-batches and tiles
//     leave the same bits as the whole batch.
// Images are NCHW in our tensors and in the blocked layouts oneDNN picks inside it; every call
// reorders its image in and its result out, as PyTorch's does. The weights are
// reordered once per call of the kernel, before its pieces. All scratch is ours (allocated as
// tensors, so the CPU allocator and the memory planner count it).
#pragma once

#include <compare>
#include <cstdint>
#include <memory>

namespace mg::cpu::onednn {

struct ConvShape {
  int64_t c = 0, h = 0, w = 0;    // one input image
  int64_t o = 0, kh = 0, kw = 0;  // filters
  int64_t oh = 0, ow = 0;         // output
  int64_t stride = 1, pad = 0;
  bool bias = false;
  auto operator<=>(const ConvShape&) const = default;
};

// Whether this build has oneDNN, MG_CPU_CONV is not "gemm" (read once), and the shape is one it
// runs faster than the im2col kernels: as many input or output channels as oneDNN's channel block.
bool applies(const ConvShape& s);

// The channels oneDNN's layouts put in one block on this CPU: 16 where it runs AVX-512, 8 on
// AVX2. A convolution with fewer channels on both sides is padded to a block and wastes part of
// its work. Measured on VGG16/8's layers (BENCHMARKS.md, "Convolutions in oneDNN"; one thread,
// forward and backward, every layer in oneDNN against im2col + SGEMM): with AVX-512, 0.61x to
// 0.85x the time from 16 channels on either side, but 1.26x from 8 to 8 channels; with oneDNN
// and our build held to AVX2 on the same machine, 0.66x to 0.87x on every layer, 3 -> 8 and 8 -> 8
// included.
int64_t channel_block();

// The primitives of one shape, made once and kept for the process (made under a lock; running
// them is thread-safe). Sizes are in floats.
class Conv {
 public:
  static const Conv& get(const ConvShape& s);

  // Forward: prepare the weights w (O, C, KH, KW) once (into weights_floats() floats), then per
  // image y (O, OH, OW) = conv(x (C, H, W)) + b (b: (O), when the shape has a bias).
  int64_t forward_weights_floats() const;
  void prepare_forward_weights(float* dst, const float* w) const;
  int64_t forward_scratch_floats() const;
  void forward(float* y, const float* x, const float* weights, const float* b, float* scratch) const;

  // Backward: dx (C, H, W) = the input gradient of one image from dy (O, OH, OW), with weights
  // prepared for it; dw (O, C, KH, KW) = one image's weight gradient (=, not +=).
  int64_t backward_weights_floats() const;
  void prepare_backward_weights(float* dst, const float* w) const;
  // Scratch of one call: of backward_data, and of backward_weights.
  int64_t backward_data_scratch_floats() const;
  int64_t backward_weights_scratch_floats() const;
  void backward_data(float* dx, const float* dy, const float* weights, float* scratch) const;
  void backward_weights(float* dw, const float* x, const float* dy, float* scratch) const;

  ~Conv();
  struct Impl;

 private:
  explicit Conv(const ConvShape& s);
  std::unique_ptr<Impl> impl_;
};

// What runs the CPU convolutions, printed beside benchmark results: "onednn 2.6.3 (avx512_core)
// from 16 channels, im2col + sgemm below", or "im2col + sgemm" (no oneDNN, or MG_CPU_CONV=gemm).
// Either way, images of at most 16 output pixels take dW in chains, and of at most 4 forward and
// dx as products over the batch (Note [dW of small images] in kernels/cpu/conv2d.cpp).
const char* backend();

}  // namespace mg::cpu::onednn
