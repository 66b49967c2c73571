// Matrix products for the CPU kernels, row-major, computed in float32:
//   C (m x n) = op(A) op(B)        (accumulate: C += op(A) op(B); with c_init: C = 1 c_init^T + op(A) op(B))
// op(A) is A (m x k, leading dimension lda) or, with trans_a, the transpose of A stored (k x m);
// likewise B. A, B and C are float32, or bf16 or f16 (Note [half operands]). The product runs in OpenBLAS's single-threaded SGEMM when the build found OpenBLAS
// (MINIGRAD_BLAS; Eigen otherwise), called by our own threads (core/parallel.h).
//
//   gemm(...)         C is cut into pieces of rows or columns fixed by (m, n, k) and the pieces run
//                     in parallel (Note [fixed pieces]); the bits do not depend on the thread count.
//   gemm_serial(...)  one call on this thread, for products inside a piece (a conv block).
#pragma once

#include <cstdint>

#include <minigrad/core/dtype.h>

namespace mg::cpu {

struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
  // The rows of C are samples (Note [rows that do not depend on the batch]): each row comes out
  // with the same bits whatever m is and wherever the row lies.
  bool sample_rows = false;
  DType a_type = DType::f32, b_type = DType::f32, c_type = DType::f32;
  // Each row of C starts as this float32 row (n values: a bias) and the product is added to it.
  const float* c_init = nullptr;
};

// Note [half operands]
// ~~~~~~~~~~~~~~~~~~~~
// A bf16 or f16 operand is widened to float32 a block at a time, inside the piece that reads it:
// each piece (the same pieces, fixed by the shape, as in float32) widens the rows or columns of A
// and B it multiplies into buffers of its own, runs the float32 product on them, and rounds its
// block of C to C's type on the way out. So the bits are those of widening the whole operands,
// multiplying in float32 and rounding the result (what an op does with float32 kernels, Note
// [autocast] in minigrad/core/autocast.h), while the float32 bytes held at once are a piece's,
// not the operands': a 3136 x 512 weight in bf16 is never widened whole. The buffers are tensors,
// so the CPU allocator (and the planner's measurement) counts them.

void gemm(const GemmArgs& g);

// Note [rows that do not depend on the batch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A layer's output for one sample should not depend on which other samples share its batch:
// otherwise micro-batches of 16 round differently from a batch of 32, and over an epoch a ReLU kink
// can turn that rounding into a visible difference (the data-parallel epoch tests measured 1.3e-4
// on an AVX-512 machine, tests/mpi_training.cpp). Eigen's SGEMM gives a row of C the same bits in
// any call whose row count is a multiple of 4 (its register block), but rows past the last full
// group of 4 take other paths (a single row: a matrix-vector product that sums in another order),
// and the bits also depend on an element's column position within the call. With sample_rows,
// gemm cuts C into column pieces whose width depends on (n, k) only and row blocks of fixed size,
// and runs the last rows of a block (fewer than 4) as the first rows of a zero-padded group of 4,
// so every row takes the same path whatever the batch (tests/test_threads.cpp cuts batches every
// way and compares bits).
void gemm_serial(const GemmArgs& g);

// Note [sums in sample order]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A weight gradient is a sum over samples: dW = sum_s a_s^T b_s (a_s: the sample's output
// gradient, b_s: its input). An SGEMM adds each C element's terms in blocks of its choosing and
// only then onto C, so accumulating 4 micro-batches of 8 into dW rounds differently from one batch
// of 32, and over an epoch a ReLU kink can turn that rounding into a visible difference (Note
// [kinks over an epoch] in tests/mpi_training.cpp). sum_outer_products adds the terms onto C one
// sample at a time, in sample order, starting from C itself:
//   C = (((C + a_0^T b_0) + a_1^T b_1) + ...)        (C = 0 first unless accumulate)
// so a batch split into micro-batches and accumulated in order adds the same terms in the same
// order as the whole batch: given the same per-sample terms, the same bits (whether the terms
// themselves are, depends on the forward and input-gradient products, which are SGEMMs). Every
// element is one chain of fused multiply-adds; the pieces (fixed by the shape) only say which
// elements a thread computes. Measured effect: the data-parallel epoch tests
// (tests/mpi_training.cpp) ended 3e-4 to 1e-3 from one process with SGEMM sums, at a kink, and
// stay near 2e-7 with these.
//   a: (n x m), row-major, leading dimension lda      C: (m x k), ldc
//   b: (n x k), row-major, leading dimension ldb
void sum_outer_products(int64_t n, int64_t m, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                        float* c, int64_t ldc, bool accumulate);
// The same with a and b of any of float32, bf16 and f16 (Note [half operands]): each piece widens
// the columns of a and the rows of b it reads, a chunk of samples at a time; the bits of the
// float32 call on widened copies.
void sum_outer_products(int64_t n, int64_t m, int64_t k, const void* a, DType a_type, int64_t lda, const void* b,
                        DType b_type, int64_t ldb, float* c, int64_t ldc, bool accumulate);

// "openblas 0.3.21" or "eigen 3.4.0": what gemm runs on (printed beside benchmark results).
const char* gemm_backend();

}  // namespace mg::cpu
