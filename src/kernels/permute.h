// permute: y = x with its dimensions reordered, copied (torch.permute(x, dims).contiguous()).
//   x: rank r (1 <= r <= kMaxPermuteRank), dims: a permutation of 0 .. r-1,
//   y.shape[i] = x.shape[dims[i]],  y[i_0, ..., i_{r-1}] = x[j] with j[dims[k]] = i_k     (=)
// Any dtype: values are moved, never rounded, so both devices give the same bits. The gradient
// is the same kernel with the inverse permutation. The CPU's channels-last kernels run their
// channels-first ones between two of these (Note [channels last on the CPU] in
// src/kernels/cpu/channels_last.h).
#pragma once

#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {
constexpr int kMaxPermuteRank = 8;
template <class D> void permute_forward(Tensor& y, const Tensor& x, const Shape& dims);
}  // namespace mg
