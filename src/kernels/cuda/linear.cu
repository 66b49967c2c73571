// Linear.   x: (N, K)   w: (M, K)   b: (M)   y: (N, M)      all row-major float32
//   forward:  y  = x w^T + b                         (=)    GEMM, then the bias kernel
//   backward: dx = dy w                              (=)    skipped when dx is undefined
//             dw = dy^T x                            (= or += when accumulate: GEMM beta = 1)
//             db = sum_n dy[n, :] = dy^T 1           (= or += when accumulate: GEMM beta = 1)
// cuBLAS is column-major: the four GEMMs are described by src/kernels/cuda/linear_math.h
// (linear_*_gemm), which tests/test_cuda_kernel_math.cpp checks on the CPU.
// Math mode (Note [cuda math modes], docs/cuda.md): strict FP32 (CUBLAS_COMPUTE_32F on a handle
// left in CUBLAS_DEFAULT_MATH) unless mg::cuda::set_tf32_matmul(true) (CUBLAS_COMPUTE_32F_FAST_TF32).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/linear_math.h"
#include "kernels/linear.h"

namespace mg {
namespace {

__global__ void add_bias_rows_kernel(float* y, const float* b, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] += b[i % cols];
}

cublasComputeType_t compute_type() {
  return cuda::tf32_matmul() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

// Runs one GEMM of linear: C = op(A) op(B) + beta C, all float32 (see cuda::math::GemmCall).
void gemm(cublasHandle_t h, const cuda::math::GemmCall& g, const Tensor& x, const Tensor& w, const Tensor& dy,
          float beta, float* c, const Tensor& ones = Tensor(), cublasComputeType_t compute = compute_type()) {
  using cuda::math::GemmOperand;
  auto operand = [&](GemmOperand o) {
    return (o == GemmOperand::x ? x : o == GemmOperand::w ? w : o == GemmOperand::dy ? dy : ones).data<float>();
  };
  const float alpha = 1.0f;
  MG_CUBLAS_CHECK(cublasGemmEx(h, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                               static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), &alpha,
                               operand(g.a), CUDA_R_32F, static_cast<int>(g.lda), operand(g.b), CUDA_R_32F,
                               static_cast<int>(g.ldb), &beta, c, CUDA_R_32F, static_cast<int>(g.ldc),
                               compute, CUBLAS_GEMM_DEFAULT));
}

void check_int_sizes(int64_t n, int64_t k, int64_t m) {
  constexpr int64_t kMax = 2147483647;
  MG_CHECK(n <= kMax && k <= kMax && m <= kMax,
           "linear on CUDA: sizes (N=" << n << ", K=" << k << ", M=" << m << ") exceed cuBLAS's int range");
}

}  // namespace

template <> void linear_forward<Cuda>(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  check_int_sizes(n, k, m);
  if (y.numel() == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  cuda::Context& ctx = cuda::context(dev);
  if (k == 0) {
    MG_CUDA_CHECK(cudaMemsetAsync(y.raw_data(), 0, y.nbytes(), ctx.stream));
  } else {
    gemm(ctx.cublas, cuda::math::linear_forward_gemm(n, k, m), x, w, Tensor(), 0.0f, y.data<float>());
  }
  if (b.defined()) {
    add_bias_rows_kernel<<<cuda::grid_for(n * m), cuda::kThreads, 0, ctx.stream>>>(y.data<float>(), b.data<float>(), n, m);
    MG_CUDA_CHECK_LAUNCH();
  }
}

template <>
void linear_backward<Cuda>(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x,
                           const Tensor& w, bool accumulate) {
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  check_int_sizes(n, k, m);
  const int dev = cuda::device_of(dy);
  cuda::DeviceGuard guard(dev);
  cuda::Context& ctx = cuda::context(dev);
  if (dx.defined() && dx.numel() > 0) {
    if (m == 0) MG_CUDA_CHECK(cudaMemsetAsync(dx.raw_data(), 0, dx.nbytes(), ctx.stream));
    else gemm(ctx.cublas, cuda::math::linear_dx_gemm(n, k, m), x, w, dy, 0.0f, dx.data<float>());
  }
  if (dw.defined() && dw.numel() > 0) {
    if (n == 0) {
      if (!accumulate) MG_CUDA_CHECK(cudaMemsetAsync(dw.raw_data(), 0, dw.nbytes(), ctx.stream));
    } else {
      gemm(ctx.cublas, cuda::math::linear_dw_gemm(n, k, m), x, w, dy, accumulate ? 1.0f : 0.0f, dw.data<float>());
    }
  }
  if (db.defined() && m > 0) {
    if (n == 0) {
      if (!accumulate) MG_CUDA_CHECK(cudaMemsetAsync(db.raw_data(), 0, db.nbytes(), ctx.stream));
    } else {  // a GEMM against ones, in strict FP32 whatever the math mode, as PyTorch sums it
      const Tensor ones = Tensor::full({n}, 1.0f, TensorOptions{}.with_device(dy.device()));
      gemm(ctx.cublas, cuda::math::linear_db_gemm(n, m), x, w, dy, accumulate ? 1.0f : 0.0f, db.data<float>(), ones,
           CUBLAS_COMPUTE_32F);
    }
  }
}

}  // namespace mg
