// Softmax over the last dimension on the CPU (kernels/softmax.h): rows in fixed pieces, each row's
// sums in double in column order.
#include "kernels/softmax.h"

#include <cmath>
#include <limits>

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"

namespace mg {

template <> void softmax_forward<Cpu>(Tensor& y, const Tensor& x, int64_t rows, int64_t cols) {
  const float* px = x.data<float>();
  float* py = y.data<float>();
  cpu::parallel_for(rows, cpu::items_per_piece(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* in = px + r * cols;
      float* out = py + r * cols;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < cols; ++c) m = std::max(m, in[c]);
      double sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(static_cast<double>(in[c]) - m);
      const double inv = 1.0 / sum;
      for (int64_t c = 0; c < cols; ++c) out[c] = static_cast<float>(std::exp(static_cast<double>(in[c]) - m) * inv);
    }
  });
}

template <> void softmax_backward<Cpu>(Tensor& dx, const Tensor& dy, const Tensor& y, int64_t rows, int64_t cols) {
  const float *pdy = dy.data<float>(), *py = y.data<float>();
  float* pdx = dx.data<float>();
  cpu::parallel_for(rows, cpu::items_per_piece(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *g = pdy + r * cols, *yr = py + r * cols;
      double dot = 0;
      for (int64_t c = 0; c < cols; ++c) dot += static_cast<double>(g[c]) * yr[c];
      const float e = static_cast<float>(dot);
      float* out = pdx + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = yr[c] * (g[c] - e);
    }
  });
}

}  // namespace mg
