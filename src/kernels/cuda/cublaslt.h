// Matrix products through cuBLASLt (cublasLtMatmul) with fused epilogues, for linear and matmul
// on CUDA (cublaslt.cu). Plain C++ (no CUDA headers): tests/test_cuda_kernel_math.cpp builds the
// descriptors on the CPU, and a build without CUDA answers from src/kernels/no_cuda.cpp.
//
//   cuda::LtProduct p{cuda::math::linear_forward_gemm(n, k, m), DType::bf16, DType::bf16};
//   p.epilogue = cuda::LtEpilogue::bias;
//   if (!cuda::lt_matmul(dev, p, w.raw_data(), x.raw_data(), 0.0f, y.raw_data(), b.raw_data()))
//     ...;  // cuBLASLt has no algorithm for it: cublasGemmEx
//
// Note [cublaslt products]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// With cuda::cublaslt() on (the default; MG_CUBLASLT=0 in the environment or
// cuda::set_cublaslt(false) turns it off, minigrad/cuda.h), linear's and matmul's products run
// through cublasLtMatmul, column-major as math::GemmCall describes them (linear_math.h), on the
// device's stream (Note [cuda stream]); off, they run cublasGemmEx as before, so one build can
// time both (bench/linear_bench.cpp).
// - Epilogues. linear's forward adds the bias in the GEMM (CUBLASLT_EPILOGUE_BIAS, a vector of
//   D's rows, which are y's columns): y = round(x w^T + b), one rounding, with no kernel writing
//   b first. cuBLASLt's bias has D's dtype for float32, bf16 and f16 outputs with float32 compute
//   (the only exceptions are integer and fp8 kernels: CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE in
//   cublasLt.h), which is what linear holds: b has y's dtype. The weight gradient's GEMM
//   (dw^T = x^T dy, D = dw^T of K rows and M columns) writes the bias gradient too
//   (CUBLASLT_EPILOGUE_BGRADB: a vector of D's columns, summed over the GEMM's k = N of op(B) =
//   dy), in C's dtype, so db needs no pass of its own over dy. BGRAD writes; it does not add.
//   When the gradient accumulates (dw with beta = 1, the usual case under an optimizer:
//   src/ops/param_grads.h), db comes out into a temporary of M values that one add_inplace adds
//   into the buffer: M values, where the separate dy^T 1 GEMM read all N x M of dy again. A 16-bit
//   db that accumulates (a bf16 parameter trained without a float32 master) is left unfused: the
//   temporary would round the sum once before the add rounds again; the dy^T 1 GEMM rounds once.
//   Under TF32 the bias gradient is the epilogue's sum of the GEMM's operand, where the separate
//   GEMM summed it in strict FP32. GELU's epilogues (GELU_AUX_BIAS, DGELU_BGRAD) would fuse gelu
//   into linear: a new op, not taken here.
// - Dtypes: A and B of one dtype (float32, bf16 or f16); C = D of its own (a weight's float32
//   gradient from bf16 operands); float32 compute (CUBLAS_COMPUTE_32F, or _FAST_TF32 for float32
//   operands under set_tf32_matmul) and float32 alpha and beta. Split-K partial sums of a 16-bit
//   output are kept in float32 (reduction schemes NONE and COMPUTE_TYPE only): INPLACE and
//   OUTPUT_TYPE would add them in the output's dtype.
// - Algorithms: cublasLtMatmulAlgoGetHeuristic's first answer, once per (device, GEMM shape and
//   leading dimensions, batch and strides, dtypes, math mode, epilogue, the alignment of every
//   pointer), cached like conv2d's choices. A key with no algorithm (or a heuristic that fails) is
//   cached as refused and lt_matmul returns false: the caller runs cublasGemmEx, so a combination
//   cuBLASLt lacks is slower, never wrong. lt_refusal() says why the last one was refused.
// - Workspace: the cuBLAS handle's (Context::workspace, from the caching allocator and counted
//   from the first op: 32 MiB on sm_90 and later, which is llm.c's cuBLASLt figure, 4 MiB
//   before), shared, since cuBLAS and cuBLASLt run on the one stream in order. The heuristic is
//   asked for algorithms within it; no call allocates.
// - Determinism: cuBLAS gives the same bits run after run for a given algorithm on one stream
//   with a workspace of the caller's (cuBLAS's guide, "Results reproducibility"); the INPLACE
//   split-K scheme orders its additions by counters. The cache fixes the algorithm per key, so
//   the same inputs give the same bits, as conv2d's deterministic algorithms do, with no
//   algorithm excluded: cuda::cudnn_deterministic() has nothing to restrict here.
// Compiled only: no GPU has run this yet (docs/gpu-queue.md, item 12).
#pragma once

#include <cstdint>
#include <string>

#include <minigrad/core/tensor.h>

#include "kernels/cuda/linear_math.h"

namespace mg::cuda {

enum class LtEpilogue : uint8_t {
  none,
  bias,       // D = op(A) op(B) + beta C + bias[row]: bias of C's dtype, C's rows long
  bias_grad,  // D as none, and bias[col] = sum over k of op(B)[k, col] (=), C's dtype, C's columns long
  // D = gelu(op(A) op(B) + bias[row]) (the tanh form), and aux = the argument of gelu, C's dtype and
  // leading dimension (linear_gelu: Note [fused gelu] in src/ops/linear.cpp); beta 0 only.
  gelu_aux_bias,
};

// One product (or a strided batch of them) as cuBLASLt runs it.
struct LtProduct {
  math::GemmCall g;
  DType ab = DType::f32;  // A and B
  DType c = DType::f32;   // C = D
  bool tf32 = false;      // float32 A and B on TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32)
  LtEpilogue epilogue = LtEpilogue::none;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;  // elements between products
};

// C = op(A) op(B) + beta C (C is D), with p's epilogue (`bias` its vector, `aux` gelu_aux_bias's
// second output), on the device's stream. Returns false, having launched nothing, where cuBLASLt
// has no algorithm for the key; throws where an accepted product fails to run.
bool lt_matmul(int device, const LtProduct& p, const void* a, const void* b, float beta, void* c,
               void* bias = nullptr, void* aux = nullptr);

// For tests without a GPU: builds the operation descriptor, the layouts and the heuristic's
// preferences of every kind of product linear and matmul ask for (each dtype pair, math mode and
// epilogue, single and batched), as lt_matmul does, and returns "" or the first failure. Host
// calls only: no device or driver needed (cublasLtCreate needs one, so no algorithm is asked for).
std::string lt_check_descriptors();

// For tests and benchmarks: products cuBLASLt ran and those it refused since the program
// started, and why the last refusal (empty when none). `invalid` counts the refusals whose
// algorithm search failed with another status than CUBLAS_STATUS_NOT_SUPPORTED (a descriptor of
// ours cuBLASLt rejects: INVALID_VALUE, say): they fall back like the others, so that a wrong
// descriptor costs speed, not a run, and the GPU tests check that there are none.
struct LtCounts {
  int64_t runs = 0, refused = 0, invalid = 0;
};
LtCounts lt_counts();
std::string lt_refusal();

}  // namespace mg::cuda
