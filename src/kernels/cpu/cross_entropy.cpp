#include "kernels/cross_entropy.h"

#include <cmath>

#include "kernels/cpu/eigen.h"

namespace mg {

template <>
void cross_entropy_forward<Cpu>(Tensor& loss, Tensor& probs, const Tensor& logits, const Tensor& target,
                                Reduction reduction) {
  const int64_t n = logits.size(0), c = logits.size(1);
  const float* pl = logits.data<float>();
  const int64_t* pt = target.data<int64_t>();
  float* pp = probs.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    MG_CHECK(pt[i] >= 0 && pt[i] < c, "cross_entropy: target[" << i << "] = " << pt[i]
                                          << " is not a class index in [0, " << c << ")");
  }
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = pl + i * c;
    float* prow = pp + i * c;
    float mx = row[0];
    for (int64_t j = 1; j < c; ++j) mx = std::max(mx, row[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < c; ++j) sum += (prow[j] = std::exp(row[j] - mx));
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < c; ++j) prow[j] *= inv;
    total += static_cast<double>(std::log(sum) + mx - row[pt[i]]);  // -log_softmax[target]
  }
  if (reduction == Reduction::mean) total /= static_cast<double>(n);
  *loss.data<float>() = static_cast<float>(total);
}

template <>
void cross_entropy_backward<Cpu>(Tensor& dlogits, const Tensor& dloss, const Tensor& probs,
                                 const Tensor& target, Reduction reduction) {
  const int64_t n = probs.size(0), c = probs.size(1);
  float g = *dloss.data<float>();
  if (reduction == Reduction::mean) g /= static_cast<float>(n);
  const float* pp = probs.data<float>();
  const int64_t* pt = target.data<int64_t>();
  float* pd = dlogits.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < c; ++j) pd[i * c + j] = g * (pp[i * c + j] - (j == pt[i] ? 1.0f : 0.0f));
  }
}

}  // namespace mg
