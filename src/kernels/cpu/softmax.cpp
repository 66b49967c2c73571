// Softmax over the last dimension on the CPU (kernels/softmax.h): rows in fixed pieces, each row's
// sums in double in column order. x, y, dy and dx may be bf16 or f16 (Note [half operands] in
// kernels/cpu/gemm.h): a row at a time widened into, or rounded from, a buffer of the piece's
// (cpu::FloatRows), the same float32 code on it.
#include "kernels/softmax.h"

#include <cmath>
#include <limits>

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"
#include "kernels/cpu/half_rows.h"

namespace mg {

template <> void softmax_forward<Cpu>(Tensor& y, const Tensor& x, int64_t rows, int64_t cols) {
  const int64_t grain = cpu::items_per_piece(cols);
  const cpu::FloatRowRoom room(cpu::parallel_for_slots(rows, grain), {{&x, cols}, {&y, cols}});
  cpu::parallel_for_slot(rows, grain, [&](int64_t r0, int64_t r1, int slot) {
    const cpu::FloatRows xs = room.rows(slot, 0), ys = room.rows(slot, 1);
    for (int64_t r = r0; r < r1; ++r) {
      const float* in = xs.read(r);
      float* out = ys.write(r);
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < cols; ++c) m = std::max(m, in[c]);
      double sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(static_cast<double>(in[c]) - m);
      const double inv = 1.0 / sum;
      for (int64_t c = 0; c < cols; ++c) out[c] = static_cast<float>(std::exp(static_cast<double>(in[c]) - m) * inv);
      ys.store(r);
    }
  });
}

template <> void softmax_backward<Cpu>(Tensor& dx, const Tensor& dy, const Tensor& y, int64_t rows, int64_t cols) {
  const int64_t grain = cpu::items_per_piece(cols);
  const cpu::FloatRowRoom room(cpu::parallel_for_slots(rows, grain), {{&dy, cols}, {&y, cols}, {&dx, cols}});
  cpu::parallel_for_slot(rows, grain, [&](int64_t r0, int64_t r1, int slot) {
    const cpu::FloatRows dys = room.rows(slot, 0), ys = room.rows(slot, 1), dxs = room.rows(slot, 2);
    for (int64_t r = r0; r < r1; ++r) {
      const float *g = dys.read(r), *yr = ys.read(r);
      double dot = 0;
      for (int64_t c = 0; c < cols; ++c) dot += static_cast<double>(g[c]) * yr[c];
      const float e = static_cast<float>(dot);
      float* out = dxs.write(r);
      for (int64_t c = 0; c < cols; ++c) out[c] = yr[c] * (g[c] - e);
      dxs.store(r);
    }
  });
}

}  // namespace mg
