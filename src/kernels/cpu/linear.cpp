// Linear on the CPU (kernels/cpu/gemm.h): y and dx are SGEMMs cut into pieces fixed by the shapes;
// dw and db are summed one sample at a time, in order (Note [sums in sample order]), so that
// micro-batches accumulated in order give the bits of one big batch. The bias is written into y
// first and the product added onto it, so it costs no extra pass.
#include "kernels/linear.h"

#include <algorithm>

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/gelu.h"

namespace mg {

template <> void linear_forward<Cpu>(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  cpu::GemmArgs g{.trans_b = true, .m = n, .n = m, .k = k, .a = x.raw_data(), .lda = k, .b = w.raw_data(), .ldb = k,
                  .c = y.raw_data(), .ldc = m, .sample_rows = true, .a_type = x.dtype(), .b_type = w.dtype(),
                  .c_type = y.dtype()};
  const Tensor bias = b.defined() ? cpu::widened(b) : Tensor();
  if (b.defined() && y.dtype() != DType::f32) {
    g.c_init = bias.data<float>();  // each row starts as the bias in float32, rounded with the product
  } else if (b.defined()) {
    float* yp = y.data<float>();
    const float* bp = bias.data<float>();
    cpu::parallel_for(n, cpu::items_per_piece(m), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) std::copy(bp, bp + m, yp + r * m);
    });
    g.accumulate = true;
  }
  cpu::gemm(g);
}

template <>
void linear_backward<Cpu>(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x,
                          const Tensor& w, bool accumulate) {
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  if (dx.defined()) {
    cpu::gemm({.m = n, .n = k, .k = m, .a = dy.raw_data(), .lda = m, .b = w.raw_data(), .ldb = k, .c = dx.raw_data(),
               .ldc = k, .sample_rows = true, .a_type = dy.dtype(), .b_type = w.dtype(), .c_type = dx.dtype()});
  }
  // A bf16 weight's own gradient (not a float32 buffer's sum) is summed in float32, then rounded.
  if (dw.defined()) {  // in sample order (Note [sums in sample order] in kernels/cpu/gemm.h)
    Tensor sum = cpu::float32_sum(dw);
    cpu::sum_outer_products(n, m, k, dy.raw_data(), dy.dtype(), m, x.raw_data(), x.dtype(), k, sum.data<float>(), k,
                            accumulate);
    cpu::store_sum(dw, sum);
  }
  if (db.defined()) {  // likewise: db = ((db + dy_0) + dy_1) + ...
    Tensor sum = cpu::float32_sum(db);
    float* dbp = sum.data<float>();
    if (!accumulate) std::fill(dbp, dbp + m, 0.0f);
    const bool wide = dy.dtype() == DType::f32;
    const Tensor row = wide ? Tensor() : Tensor::empty({m});
    for (int64_t r = 0; r < n; ++r) {
      const float* dyr = wide ? dy.data<float>() + r * m : cpu::widen_row(row, dy, r);
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) dbp[j] += dyr[j];
    }
    cpu::store_sum(db, sum);
  }
}

template <>
void linear_gelu_forward<Cpu>(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& w, const Tensor& b) {
  linear_forward<Cpu>(pre, x, w, b);
  gelu_forward<Cpu>(y, pre);
}

}  // namespace mg
