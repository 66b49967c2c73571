// Linear.   x: (N, K)   w: (M, K)   b: (M)   y: (N, M)      all row-major
//   forward:  y  = x w^T + b                         (=)
//   backward: dx = dy w                              (=)    skipped when dx is undefined
//             dw = dy^T x                            (= or += when accumulate: GEMM beta = 1)
//             db = sum_n dy[n, :] = dy^T 1           (= or += when accumulate)
// cuBLAS is column-major: the GEMMs are described by src/kernels/cuda/linear_math.h
// (linear_*_gemm), which tests/test_cuda_kernel_math.cpp checks on the CPU.
// Two paths (Note [cublaslt products] in src/kernels/cuda/cublaslt.h):
//   cuBLASLt (the default): three cublasLtMatmul; forward adds b in the GEMM's epilogue (BIAS),
//     dw's GEMM writes db in its epilogue (BGRADB), into a temporary added to db when
//     accumulating; dx a plain product.
//   cublasGemmEx (MG_CUBLASLT=0, cuda::set_cublaslt(false), or a case cuBLASLt has no algorithm
//     for): our kernel writes b into y and the forward GEMM adds the product to it (beta = 1);
//     db is a fourth GEMM, dy^T against a vector of ones, in strict FP32 whatever the math mode.
// Storage (Note [cuda half kernels] in src/kernels/cuda/storage.cuh): x, w, b, y and dy all
// float32, or all bf16 or all f16; each gradient float32 or the operands' dtype: dw and db float32
// are a parameter's buffer (the product summed into it in float32, as issue 35 asks), dx float32
// is the gradient of a float32 input that autocast rounded. A bf16/f16 product runs on
// tensor cores with float32 sums (CUBLAS_COMPUTE_32F) and rounds once: y = round(x w^T + b).
// Math mode of float32 products (Note [cuda math modes], docs/cuda.md): strict FP32
// (CUBLAS_COMPUTE_32F on a handle left in CUBLAS_DEFAULT_MATH) unless mg::cuda::set_tf32_matmul(true)
// (CUBLAS_COMPUTE_32F_FAST_TF32).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublaslt.h"
#include "kernels/cuda/linear_math.h"
#include "kernels/cuda/storage.cuh"
#include "kernels/elementwise.h"
#include "kernels/gelu.h"
#include "kernels/linear.h"

namespace mg {
namespace {

// y[r, c] = b[c]: the bias, before the product is added to it.
template <class T> __global__ void bias_rows_kernel(T* y, const T* b, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = b[i % cols];
}

// The tensors a GemmCall's operands name.
struct Operands {
  const Tensor &x, &w, &dy, &ones;
  const Tensor& of(cuda::math::GemmOperand o) const {
    using cuda::math::GemmOperand;
    return o == GemmOperand::x ? x : o == GemmOperand::w ? w : o == GemmOperand::dy ? dy : ones;
  }
};

// Runs one GEMM of linear: C = op(A) op(B) + beta C (see cuda::math::GemmCall); A and B of one
// dtype, C of its own. With an epilogue, only through cuBLASLt: returns false where cuBLASLt is off
// or has no algorithm for it, and the caller runs the unfused products. Without one, through
// cuBLASLt when it is on and takes the case, else cublasGemmEx; `strict` keeps float32 operands
// off TF32.
bool gemm(cuda::Context& ctx, const cuda::math::GemmCall& g, const Operands& in, float beta, Tensor& c,
          cuda::LtEpilogue epilogue = cuda::LtEpilogue::none, void* bias = nullptr, bool strict = false,
          void* aux = nullptr) {
  const Tensor &a = in.of(g.a), &b = in.of(g.b);
  const DType ab = cuda::check_same_dtype("linear", {&a, &b});
  const bool tf32 = !strict && cuda::tf32_product(ab);
  const cuda::LtProduct p{g, ab, c.dtype(), tf32, epilogue};
  if (cuda::cublaslt() && cuda::lt_matmul(ctx.device, p, a.raw_data(), b.raw_data(), beta, c.raw_data(), bias, aux))
    return true;
  if (epilogue != cuda::LtEpilogue::none) return false;
  const float alpha = 1.0f;
  MG_CUBLAS_CHECK(cublasGemmEx(ctx.cublas, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                               static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), &alpha,
                               a.raw_data(), cuda::cuda_type(ab), static_cast<int>(g.lda), b.raw_data(),
                               cuda::cuda_type(ab), static_cast<int>(g.ldb), &beta, c.raw_data(),
                               cuda::cuda_type(c.dtype()), static_cast<int>(g.ldc), cuda::compute_type(tf32),
                               CUBLAS_GEMM_DEFAULT));
  return true;
}

void check_int_sizes(int64_t n, int64_t k, int64_t m) {
  constexpr int64_t kMax = 2147483647;
  MG_CHECK(n <= kMax && k <= kMax && m <= kMax,
           "linear on CUDA: sizes (N=" << n << ", K=" << k << ", M=" << m << ") exceed cuBLAS's int range");
}

// dw (= or +=) and db from dw's GEMM with cuBLASLt's BGRADB epilogue (Note [cublaslt products]).
// BGRAD writes db; accumulating, it writes a temporary of M values that one kernel adds into db.
// A 16-bit db that accumulates is left to the unfused path, which adds in one rounding. Returns
// false, having written nothing, where the fusion is not taken.
bool weight_and_bias_grads(cuda::Context& ctx, Tensor& dw, Tensor& db, const Operands& in, int64_t n, int64_t k,
                           int64_t m, bool accumulate) {
  if (n == 0 || k == 0 || m == 0 || db.dtype() != dw.dtype() || (accumulate && db.dtype() != DType::f32)) return false;
  Tensor out = accumulate ? Tensor::empty(db.shape(), TensorOptions{db.dtype(), db.device()}) : db;
  if (!gemm(ctx, cuda::math::linear_dw_gemm(n, k, m), in, accumulate ? 1.0f : 0.0f, dw, cuda::LtEpilogue::bias_grad,
            out.raw_data()))
    return false;
  if (accumulate) add_inplace<Cuda>(db, out);
  return true;
}

}  // namespace

template <> void linear_forward<Cuda>(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  check_int_sizes(n, k, m);
  cuda::check_same_dtype("linear", {&y, &x, &w, &b});
  if (y.numel() == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  cuda::Context& ctx = cuda::context(dev);
  const Tensor none;
  const Operands in{x, w, none, none};
  const cuda::math::GemmCall g = cuda::math::linear_forward_gemm(n, k, m);
  if (b.defined() && k > 0 && gemm(ctx, g, in, 0.0f, y, cuda::LtEpilogue::bias, b.raw_data())) return;
  if (b.defined()) {
    cuda::with_storage("linear", y.dtype(), [&](auto tag) {
      using T = decltype(tag);
      bias_rows_kernel<<<cuda::grid_for(n * m), cuda::kThreads, 0, ctx.stream>>>(cuda::elems<T>(y), cuda::elems<T>(b),
                                                                                 n, m);
    });
    MG_CUDA_CHECK_LAUNCH();
  } else if (k == 0) {
    MG_CUDA_CHECK(cudaMemsetAsync(y.raw_data(), 0, y.nbytes(), ctx.stream));
  }
  if (k > 0) gemm(ctx, g, in, b.defined() ? 1.0f : 0.0f, y);
}

template <>
void linear_gelu_forward<Cuda>(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  check_int_sizes(n, k, m);
  cuda::check_same_dtype("linear", {&y, &pre, &x, &w, &b});
  if (y.numel() == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  cuda::Context& ctx = cuda::context(dev);
  const Tensor none;
  // Note [fused gelu]: y and pre from one product's epilogue, where cuBLASLt takes it (its aux
  // matrix's leading dimension, m, must be a multiple of 8: cublasLt.h, EPILOGUE_AUX_LD).
  if (b.defined() && k > 0 && m % 8 == 0 &&
      gemm(ctx, cuda::math::linear_forward_gemm(n, k, m), Operands{x, w, none, none}, 0.0f, y,
           cuda::LtEpilogue::gelu_aux_bias, b.raw_data(), false, pre.raw_data()))
    return;
  linear_forward<Cuda>(pre, x, w, b);
  gelu_forward<Cuda>(y, pre);
}

template <>
void linear_backward<Cuda>(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x,
                           const Tensor& w, bool accumulate) {
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  check_int_sizes(n, k, m);
  const DType dtype = cuda::check_same_dtype("linear", {&dy, &x, &w});
  for (const Tensor* g : {&dx, &dw, &db}) {
    MG_CHECK(!g->defined() || g->dtype() == DType::f32 || g->dtype() == dtype,
             "linear on CUDA: a gradient must be float32 or " << dtype_name(dtype) << ", got " << dtype_name(g->dtype()));
  }
  const int dev = cuda::device_of(dy);
  cuda::DeviceGuard guard(dev);
  cuda::Context& ctx = cuda::context(dev);
  const Tensor none;
  const Operands in{x, w, dy, none};
  if (dx.defined() && dx.numel() > 0) {
    if (m == 0) MG_CUDA_CHECK(cudaMemsetAsync(dx.raw_data(), 0, dx.nbytes(), ctx.stream));
    else gemm(ctx, cuda::math::linear_dx_gemm(n, k, m), in, 0.0f, dx);
  }
  const bool want_dw = dw.defined() && dw.numel() > 0, want_db = db.defined() && m > 0;
  if (want_dw && want_db && weight_and_bias_grads(ctx, dw, db, in, n, k, m, accumulate)) return;
  if (want_dw) {
    if (n == 0) {
      if (!accumulate) MG_CUDA_CHECK(cudaMemsetAsync(dw.raw_data(), 0, dw.nbytes(), ctx.stream));
    } else {
      gemm(ctx, cuda::math::linear_dw_gemm(n, k, m), in, accumulate ? 1.0f : 0.0f, dw);
    }
  }
  if (want_db) {
    if (n == 0) {
      if (!accumulate) MG_CUDA_CHECK(cudaMemsetAsync(db.raw_data(), 0, db.nbytes(), ctx.stream));
    } else {  // a GEMM against ones (in dy's dtype), in strict FP32 whatever the math mode, as PyTorch sums it
      Tensor ones = Tensor::full({n}, 1.0f, TensorOptions{}.with_device(dy.device()));
      if (dy.dtype() != DType::f32) ones = ones.to(dy.dtype());
      gemm(ctx, cuda::math::linear_db_gemm(n, m), {x, w, dy, ones}, accumulate ? 1.0f : 0.0f, db,
           cuda::LtEpilogue::none, nullptr, /*strict*/ true);
    }
  }
}

}  // namespace mg
