// Which column-major GEMM computes each product of linear (kernels/linear.h); linear.cu makes
// the cuBLAS and cuBLASLt calls these describe, and matmul_math.h reuses GemmCall.
// Plain C++ (no CUDA headers): tests/test_cuda_kernel_math.cpp checks the descriptions on the CPU.
#pragma once

#include <cstdint>

namespace mg::cuda::math {

// cuBLAS is column-major: a row-major (R, C) matrix is its column-major transpose (C, R). These
// say which GEMM computes each product of linear (src/kernels/cuda/linear.cu), with
// x: (N, K), w: (M, K), y and dy: (N, M), all row-major:
//   C (m x n, column-major, leading dim ldc) = op(A) op(B),  op = transpose when trans_*.
enum class GemmOperand : uint8_t { x, w, dy, ones };  // ones: a vector of N ones (the bias gradient)
struct GemmCall {
  bool trans_a, trans_b;
  int64_t m, n, k;
  GemmOperand a;
  int64_t lda;
  GemmOperand b;
  int64_t ldb, ldc;
};
// y^T (M, N) = w x^T:   A = w as (K, M) transposed, B = x as (K, N).
inline GemmCall linear_forward_gemm(int64_t n, int64_t k, int64_t m) {
  return {true, false, m, n, k, GemmOperand::w, k, GemmOperand::x, k, m};
}
// dx^T (K, N) = w^T dy^T:  A = w as (K, M), B = dy as (M, N).
inline GemmCall linear_dx_gemm(int64_t n, int64_t k, int64_t m) {
  return {false, false, k, n, m, GemmOperand::w, k, GemmOperand::dy, m, k};
}
// dw^T (K, M) = x^T dy:  A = x as (K, N), B = dy as (M, N) transposed.
inline GemmCall linear_dw_gemm(int64_t n, int64_t k, int64_t m) {
  return {false, true, k, m, n, GemmOperand::x, k, GemmOperand::dy, m, k};
}
// db (M, 1) = dy^T 1:  A = dy as (M, N), B = the ones (N, 1).
inline GemmCall linear_db_gemm(int64_t n, int64_t m) {
  return {false, false, m, 1, n, GemmOperand::dy, m, GemmOperand::ones, n, m};
}

// The stored matrices of a GemmCall as cuBLASLt's layouts describe them (column-major: rows,
// columns, leading dimension): A is (k, m) when transposed, else (m, k); B is (n, k) when
// transposed, else (k, n); C and D are (m, n). cuBLASLt's bias epilogue adds a vector of C's
// rows (m); its BGRADB epilogue writes one of C's columns (n), summed over k of op(B).
struct MatrixShape {
  int64_t rows, cols, ld;
};
inline MatrixShape gemm_a_shape(const GemmCall& g) {
  return g.trans_a ? MatrixShape{g.k, g.m, g.lda} : MatrixShape{g.m, g.k, g.lda};
}
inline MatrixShape gemm_b_shape(const GemmCall& g) {
  return g.trans_b ? MatrixShape{g.n, g.k, g.ldb} : MatrixShape{g.k, g.n, g.ldb};
}
inline MatrixShape gemm_c_shape(const GemmCall& g) { return {g.m, g.n, g.ldc}; }

}  // namespace mg::cuda::math
