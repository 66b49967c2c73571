#include "kernels/cpu/channels_last.h"

#include "kernels/permute.h"

namespace mg::cpu {

namespace {

// The permutations between (N, S..., C) and (N, C, S...) of rank r.
Shape to_first(size_t r) {
  Shape dims{0, static_cast<int64_t>(r) - 1};
  for (size_t d = 1; d + 1 < r; ++d) dims.push_back(static_cast<int64_t>(d));
  return dims;
}

Shape to_last(size_t r) {
  Shape dims{0};
  for (size_t d = 2; d < r; ++d) dims.push_back(static_cast<int64_t>(d));
  dims.push_back(1);
  return dims;
}

}  // namespace

Shape channels_first_shape(const Shape& s) {
  MG_CHECK(s.size() >= 2, "channels last: expected (N, ..., C), got shape " << shape_str(s));
  Shape out;
  for (int64_t d : to_first(s.size())) out.push_back(s[static_cast<size_t>(d)]);
  return out;
}

Tensor channels_first_empty(const Tensor& like) {
  if (!like.defined()) return Tensor();
  return Tensor::empty(channels_first_shape(like.shape()), TensorOptions{like.dtype(), like.device()});
}

Tensor channels_first_copy(const Tensor& t) {
  Tensor out = channels_first_empty(t);
  if (out.defined()) permute_forward<Cpu>(out, t, to_first(static_cast<size_t>(t.dim())));
  return out;
}

void store_channels_last(Tensor& dst, const Tensor& src) {
  MG_CHECK(channels_first_shape(dst.shape()) == src.shape(),
           "channels last: cannot store " << shape_str(src.shape()) << " as " << shape_str(dst.shape()));
  permute_forward<Cpu>(dst, src, to_last(static_cast<size_t>(dst.dim())));
}

}  // namespace mg::cpu
