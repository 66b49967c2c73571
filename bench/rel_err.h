// The relative error the benchmarks print beside their times: the 2-norm of the difference over
// the 2-norm of the reference (the absolute 2-norm where the reference is zero), on float32 copies
// of tensors of any float dtype and device.
#pragma once

#include <cmath>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::bench {

inline double rel_err(const Tensor& a, const Tensor& ref) {
  const std::vector<float> va = a.to(DType::f32).to_vector<float>(), vb = ref.to(DType::f32).to_vector<float>();
  double num = 0, den = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    num += (static_cast<double>(va[i]) - vb[i]) * (static_cast<double>(va[i]) - vb[i]);
    den += static_cast<double>(vb[i]) * vb[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace mg::bench
