// Linear on the CPU (kernels/cpu/gemm.h): y and dx are SGEMMs cut into pieces fixed by the shapes;
// dw and db are summed one sample at a time, in order (Note [sums in sample order]), so that
// micro-batches accumulated in order give the bits of one big batch. The bias is written into y
// first and the product added onto it, so it costs no extra pass.
#include "kernels/linear.h"

#include <algorithm>

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"
#include "kernels/cpu/gemm.h"

namespace mg {

template <> void linear_forward<Cpu>(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  float* yp = y.data<float>();
  if (b.defined()) {
    const float* bp = b.data<float>();
    cpu::parallel_for(n, cpu::items_per_piece(m), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) std::copy(bp, bp + m, yp + r * m);
    });
  }
  cpu::gemm({.trans_b = true, .m = n, .n = m, .k = k, .a = x.data<float>(), .lda = k, .b = w.data<float>(),
             .ldb = k, .c = yp, .ldc = m, .accumulate = b.defined(), .sample_rows = true});
}

template <>
void linear_backward<Cpu>(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x,
                          const Tensor& w, bool accumulate) {
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  const float* dyp = dy.data<float>();
  if (dx.defined()) {
    cpu::gemm({.m = n, .n = k, .k = m, .a = dyp, .lda = m, .b = w.data<float>(), .ldb = k, .c = dx.data<float>(),
               .ldc = k, .sample_rows = true});
  }
  if (dw.defined()) {  // in sample order (Note [sums in sample order] in kernels/cpu/gemm.h)
    cpu::sum_outer_products(n, m, k, dyp, m, x.data<float>(), k, dw.data<float>(), k, accumulate);
  }
  if (db.defined()) {  // likewise: db = ((db + dy_0) + dy_1) + ...
    float* dbp = db.data<float>();
    if (!accumulate) std::fill(dbp, dbp + m, 0.0f);
    for (int64_t r = 0; r < n; ++r) {
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) dbp[j] += dyp[r * m + j];
    }
  }
}

}  // namespace mg
