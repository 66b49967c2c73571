#include "kernels/cross_entropy.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/packet_math.h"

namespace mg {

namespace {

// probs = softmax(row), c classes; returns log(sum exp(row - max)) + max, the row's logsumexp.
float softmax_row(const float* row, float* prow, int64_t c) {
  // exp in Eigen's packets, the sum in a packet's lanes (kernels/cpu/packet_math.h): glibc's
  // scalar expf and the one-by-one sum over a GPT-2 head's 8192 classes were 5% of its step.
  const float mx = cpu::max_packets(row, c);
  const cpu::Packet pmx = Eigen::internal::pset1<cpu::Packet>(mx);
  cpu::map_packets(prow, row, c, [&](cpu::Packet v) { return cpu::exp_or_zero(Eigen::internal::psub(v, pmx)); });
  const float sum = cpu::sum_packets(prow, c);
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < c; ++j) prow[j] *= inv;
  return std::log(sum) + mx;
}


}  // namespace

template <>
void cross_entropy_forward<Cpu>(Tensor& loss, Tensor& probs, Tensor& count, const Tensor& logits, const Tensor& target,
                                Reduction reduction, int64_t ignore_index) {
  const int64_t n = logits.size(0), c = logits.size(1);
  const int64_t* pt = target.data<int64_t>();
  int64_t counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (pt[i] == ignore_index) continue;
    MG_CHECK(pt[i] >= 0 && pt[i] < c, "cross_entropy: target[" << i << "] = " << pt[i]
                                          << " is not a class index in [0, " << c << ")");
    ++counted;
  }
  std::vector<double> row_loss(static_cast<size_t>(n), 0.0);
  if (cpu::is_half(logits.dtype())) {
    // bf16/f16 logits (Note [half operands] in kernels/cpu/gemm.h): each row widened and its
    // probabilities made in a piece's own buffers; backward makes them again from the logits.
    cpu::parallel_for(n, cpu::items_per_piece(c), [&](int64_t i0, int64_t i1) {
      const Tensor row_buf = Tensor::empty({c}), probs_buf = Tensor::empty({c});
      for (int64_t i = i0; i < i1; ++i) {
        if (pt[i] == ignore_index) continue;
        const float* row = cpu::widen_row(row_buf, logits, i);
        row_loss[static_cast<size_t>(i)] = static_cast<double>(softmax_row(row, probs_buf.data<float>(), c) - row[pt[i]]);
      }
    });
  } else {
    const float* pl = logits.data<float>();
    float* pp = probs.data<float>();
    cpu::parallel_for(n, cpu::items_per_piece(c), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const float* row = pl + i * c;
        const float lse = softmax_row(row, pp + i * c, c);
        if (pt[i] != ignore_index) row_loss[static_cast<size_t>(i)] = static_cast<double>(lse - row[pt[i]]);
      }
    });
  }
  double total = 0.0;
  for (double v : row_loss) total += v;  // in row order
  if (reduction == Reduction::mean) total /= static_cast<double>(counted);
  *loss.data<float>() = static_cast<float>(total);
  *count.data<float>() = static_cast<float>(counted);
}

template <>
void cross_entropy_backward<Cpu>(Tensor& dlogits, const Tensor& dloss, const Tensor& probs, const Tensor& count,
                                 const Tensor& target, Reduction reduction, int64_t ignore_index) {
  const int64_t n = probs.size(0), c = probs.size(1);
  float g = *dloss.data<float>();
  if (reduction == Reduction::mean) g /= *count.data<float>();
  const int64_t* pt = target.data<int64_t>();
  if (cpu::is_half(probs.dtype())) {  // `probs` holds the logits (see forward): the probabilities again
    uint16_t* pd = static_cast<uint16_t*>(dlogits.raw_data());
    cpu::parallel_for(n, cpu::items_per_piece(c), [&](int64_t i0, int64_t i1) {
      const Tensor row_buf = Tensor::empty({c}), probs_buf = Tensor::empty({c});
      float* prow = probs_buf.data<float>();
      for (int64_t i = i0; i < i1; ++i) {
        uint16_t* drow = pd + i * c;
        if (pt[i] == ignore_index) {
          std::fill(drow, drow + c, uint16_t{0});
          continue;
        }
        softmax_row(cpu::widen_row(row_buf, probs, i), prow, c);
        for (int64_t j = 0; j < c; ++j) prow[j] = g * (prow[j] - (j == pt[i] ? 1.0f : 0.0f));
        cpu::narrow_span(drow, dlogits.dtype(), prow, c);
      }
    });
    return;
  }
  const float* pp = probs.data<float>();
  float* pd = dlogits.data<float>();
  cpu::parallel_for(n, cpu::items_per_piece(c), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      float* drow = pd + i * c;
      if (pt[i] == ignore_index) {
        std::fill(drow, drow + c, 0.0f);
        continue;
      }
      for (int64_t j = 0; j < c; ++j) drow[j] = g * (pp[i * c + j] - (j == pt[i] ? 1.0f : 0.0f));
    }
  });
}

}  // namespace mg
