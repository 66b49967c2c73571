// Which column-major GEMM computes each product of matmul (kernels/matmul.h), one product of a
// batch: a (M, K) = x, b (K, N) = w. matmul.cu makes the cuBLAS calls these describe.
// Plain C++ (no CUDA headers): tests/test_cuda_kernel_math.cpp checks the descriptions on the CPU.
#pragma once

#include <cstdint>

#include "kernels/cuda/linear_math.h"

namespace mg::cuda::math {

// y^T (N, M) = b^T a^T:  A = b as (N, K), B = a as (K, M).
inline GemmCall matmul_forward_gemm(int64_t m, int64_t k, int64_t n) {
  return {false, false, n, m, k, GemmOperand::w, n, GemmOperand::x, k, n};
}
// da^T (K, M) = b dy^T:  A = b as (N, K) transposed, B = dy as (N, M).
inline GemmCall matmul_da_gemm(int64_t m, int64_t k, int64_t n) {
  return {true, false, k, m, n, GemmOperand::w, n, GemmOperand::dy, n, k};
}
// db^T (N, K) = dy^T a:  A = dy as (N, M), B = a as (K, M) transposed.
inline GemmCall matmul_db_gemm(int64_t m, int64_t k, int64_t n) {
  return {false, true, n, k, m, GemmOperand::dy, n, GemmOperand::x, k, n};
}

// Elements from one product's matrices to the next's in a batch of products (a: M x K, b: K x N,
// y and dy: M x N each), for the call's A, B and C.
struct BatchStrides {
  int64_t a, b, c;
};
inline BatchStrides matmul_strides(const GemmCall& g, int64_t m, int64_t k, int64_t n) {
  const auto of = [&](GemmOperand o) { return o == GemmOperand::x ? m * k : o == GemmOperand::w ? k * n : m * n; };
  return {of(g.a), of(g.b), g.m * g.n};
}

}  // namespace mg::cuda::math
