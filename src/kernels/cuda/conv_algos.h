// The names of cuDNN's convolution algorithms and math types, for mg::cuda::conv_algorithms()
// (minigrad/cuda.h). Plain C++, by the values of cuDNN 9's enums (src/kernels/cuda/conv2d.cu checks
// them against cudnn.h at compile time), so that the CPU tests read them too.
#pragma once

namespace mg::cuda {

enum class ConvPass { forward, backward_data, backward_filter };

inline const char* conv_pass_name(ConvPass p) {
  switch (p) {
    case ConvPass::forward: return "forward";
    case ConvPass::backward_data: return "backward data";
    case ConvPass::backward_filter: return "backward filter";
  }
  return "?";
}

// cudnnConvolutionFwdAlgo_t, cudnnConvolutionBwdDataAlgo_t, cudnnConvolutionBwdFilterAlgo_t.
inline const char* conv_algo_name(ConvPass p, int algo) {
  static const char* const kForward[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                         "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char* const kData[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char* const kFilter[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
  switch (p) {
    case ConvPass::forward: return algo >= 0 && algo < 8 ? kForward[algo] : "?";
    case ConvPass::backward_data: return algo >= 0 && algo < 6 ? kData[algo] : "?";
    case ConvPass::backward_filter: return algo >= 0 && algo < 7 ? kFilter[algo] : "?";
  }
  return "?";
}

// cudnnMathType_t.
inline const char* cudnn_math_name(int math) {
  static const char* const kMath[] = {"default", "tensor op", "tensor op (conversion)", "fma"};
  return math >= 0 && math < 4 ? kMath[math] : "?";
}

}  // namespace mg::cuda
