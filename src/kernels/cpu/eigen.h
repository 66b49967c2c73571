// Eigen views of contiguous row-major float32 tensors, shared by the CPU kernels.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cstdint>

#include <minigrad/core/tensor.h>

namespace mg::cpu {

using MatrixRM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<MatrixRM>;
using ConstMatMap = Eigen::Map<const MatrixRM>;
using VecMap = Eigen::Map<Eigen::VectorXf>;
using ConstVecMap = Eigen::Map<const Eigen::VectorXf>;
using ArrMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrMap = Eigen::Map<const Eigen::ArrayXf>;

inline MatMap mat(const Tensor& t, int64_t rows, int64_t cols) { return MatMap(t.data<float>(), rows, cols); }
inline ConstMatMap cmat(const Tensor& t, int64_t rows, int64_t cols) {
  return ConstMatMap(t.data<float>(), rows, cols);
}
inline ArrMap arr(const Tensor& t) { return ArrMap(t.data<float>(), t.numel()); }
inline ConstArrMap carr(const Tensor& t) { return ConstArrMap(t.data<float>(), t.numel()); }

// Element-wise loops go parallel only past this many elements; below it threads cost more
// than they save.
constexpr int64_t kParallelGrain = 1 << 15;

// The grain of a loop over items (rows, planes, samples) of `per_item` elements each: about
// kParallelGrain elements per piece, at least one item.
inline int64_t items_per_piece(int64_t per_item) {
  return std::max<int64_t>(kParallelGrain / std::max<int64_t>(per_item, 1), 1);
}

}  // namespace mg::cpu
