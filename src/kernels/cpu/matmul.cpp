// Batched matrix products on the CPU (kernels/matmul.h): one product is cut into fixed pieces of C
// (cpu::gemm); a batch runs one product per piece (cpu::gemm_serial).
#include "kernels/matmul.h"

#include "core/parallel.h"
#include "kernels/cpu/gemm.h"

namespace mg {

namespace {

// C_i = op(A_i) op(B_i) for every i; strides are elements between consecutive matrices. Any
// operand may be bf16 or f16 (Note [half operands] in kernels/cpu/gemm.h).
void batched(const MatmulDims& d, cpu::GemmArgs g, int64_t stride_a, int64_t stride_b, int64_t stride_c) {
  if (g.m == 0 || g.n == 0) return;
  if (d.batch == 1) return cpu::gemm(g);
  const auto offset = [](const void* p, DType t, int64_t i) {
    return static_cast<const char*>(p) + i * static_cast<int64_t>(dtype_size(t));
  };
  cpu::parallel_for(d.batch, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      cpu::GemmArgs one = g;
      one.a = offset(g.a, g.a_type, i * stride_a);
      one.b = offset(g.b, g.b_type, i * stride_b);
      one.c = const_cast<char*>(offset(g.c, g.c_type, i * stride_c));
      cpu::gemm_serial(one);
    }
  });
}

}  // namespace

template <> void matmul_forward<Cpu>(Tensor& y, const Tensor& a, const Tensor& b, const MatmulDims& d) {
  batched(d, {.m = d.m, .n = d.n, .k = d.k, .a = a.raw_data(), .lda = d.k, .b = b.raw_data(), .ldb = d.n,
              .c = y.raw_data(), .ldc = d.n, .a_type = a.dtype(), .b_type = b.dtype(), .c_type = y.dtype()},
          d.m * d.k, d.k * d.n, d.m * d.n);
}

template <>
void matmul_backward<Cpu>(Tensor& da, Tensor& db, const Tensor& dy, const Tensor& a, const Tensor& b,
                          const MatmulDims& d) {
  if (da.defined()) {  // (M, N) (K, N)^T
    batched(d, {.trans_b = true, .m = d.m, .n = d.k, .k = d.n, .a = dy.raw_data(), .lda = d.n,
                .b = b.raw_data(), .ldb = d.n, .c = da.raw_data(), .ldc = d.k, .a_type = dy.dtype(),
                .b_type = b.dtype(), .c_type = da.dtype()},
            d.m * d.n, d.k * d.n, d.m * d.k);
  }
  if (db.defined()) {  // (M, K)^T (M, N)
    batched(d, {.trans_a = true, .m = d.k, .n = d.n, .k = d.m, .a = a.raw_data(), .lda = d.k,
                .b = dy.raw_data(), .ldb = d.n, .c = db.raw_data(), .ldc = d.n, .a_type = a.dtype(),
                .b_type = dy.dtype(), .c_type = db.dtype()},
            d.m * d.k, d.m * d.n, d.k * d.n);
  }
}

}  // namespace mg
