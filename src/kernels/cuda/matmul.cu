// Batched matrix products on CUDA (kernels/matmul.h): one strided batch of products per product
// kind, through cuBLASLt (cublasLtMatmul, Note [cublaslt products] in src/kernels/cuda/cublaslt.h)
// when it is on and has an algorithm for the case, else cublasGemmStridedBatchedEx. cuBLAS is
// column-major: the three calls are described by src/kernels/cuda/matmul_math.h (matmul_*_gemm,
// matmul_strides), which tests/test_cuda_kernel_math.cpp checks on the CPU. Math mode as linear's
// (Note [cuda math modes]): strict FP32 unless mg::cuda::set_tf32_matmul(true). Storage as
// linear's (Note [cuda half kernels] in src/kernels/cuda/storage.cuh): a, b and dy float32, or all
// bf16 or all f16, with float32 sums; each product's C in its own dtype (a parameter's gradient
// may be float32 from bf16 operands).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublaslt.h"
#include "kernels/cuda/matmul_math.h"
#include "kernels/cuda/storage.cuh"
#include "kernels/matmul.h"

namespace mg {
namespace {

void check_int_sizes(const MatmulDims& d) {
  constexpr int64_t kMax = 2147483647;
  MG_CHECK(d.batch <= kMax && d.m <= kMax && d.k <= kMax && d.n <= kMax,
           "matmul on CUDA: sizes (batch " << d.batch << ", M " << d.m << ", K " << d.k << ", N " << d.n
                                           << ") exceed cuBLAS's int range");
}

// C_i = op(A_i) op(B_i) for every product i of the batch.
void batched_gemm(const cuda::math::GemmCall& g, const MatmulDims& d, const Tensor& a, const Tensor& b,
                  const Tensor& dy, Tensor& c) {
  using cuda::math::GemmOperand;
  auto operand = [&](GemmOperand o) -> const Tensor& { return o == GemmOperand::x ? a : o == GemmOperand::w ? b : dy; };
  const cuda::math::BatchStrides s = cuda::math::matmul_strides(g, d.m, d.k, d.n);
  const Tensor &ta = operand(g.a), &tb = operand(g.b);
  const DType ab = cuda::check_same_dtype("matmul", {&ta, &tb});
  const bool tf32 = cuda::tf32_product(ab);
  const float alpha = 1.0f, beta = 0.0f;
  const int dev = cuda::device_of(dy.defined() ? dy : a);
  const cuda::LtProduct p{g, ab, c.dtype(), tf32, cuda::LtEpilogue::none, d.batch, s.a, s.b, s.c};
  // An empty sum (k = 0) stays with GemmEx, which writes C = 0 for it.
  if (g.k > 0 && cuda::cublaslt() && cuda::lt_matmul(dev, p, ta.raw_data(), tb.raw_data(), beta, c.raw_data())) return;
  MG_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cuda::context(dev).cublas, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), &alpha, ta.raw_data(), cuda::cuda_type(ab),
      static_cast<int>(g.lda), s.a, tb.raw_data(), cuda::cuda_type(ab), static_cast<int>(g.ldb), s.b, &beta,
      c.raw_data(), cuda::cuda_type(c.dtype()), static_cast<int>(g.ldc), s.c, static_cast<int>(d.batch),
      cuda::compute_type(tf32), CUBLAS_GEMM_DEFAULT));
}

}  // namespace

template <> void matmul_forward<Cuda>(Tensor& y, const Tensor& a, const Tensor& b, const MatmulDims& d) {
  check_int_sizes(d);
  if (y.numel() == 0) return;
  cuda::DeviceGuard guard(cuda::device_of(y));
  batched_gemm(cuda::math::matmul_forward_gemm(d.m, d.k, d.n), d, a, b, Tensor(), y);
}

template <>
void matmul_backward<Cuda>(Tensor& da, Tensor& db, const Tensor& dy, const Tensor& a, const Tensor& b,
                           const MatmulDims& d) {
  check_int_sizes(d);
  cuda::DeviceGuard guard(cuda::device_of(dy));
  if (da.defined() && da.numel() > 0) batched_gemm(cuda::math::matmul_da_gemm(d.m, d.k, d.n), d, a, b, dy, da);
  if (db.defined() && db.numel() > 0) batched_gemm(cuda::math::matmul_db_gemm(d.m, d.k, d.n), d, a, b, dy, db);
}

}  // namespace mg
