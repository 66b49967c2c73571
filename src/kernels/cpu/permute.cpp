// permute on the CPU (kernels/permute.h): one piece per block of output rows (every dimension
// but the last), each row gathered from x with the stride of the input dimension it walks.
#include "kernels/permute.h"

#include <algorithm>
#include <array>

#include "core/parallel.h"

namespace mg {

namespace {

constexpr int64_t kGrain = 1 << 15;  // elements a piece moves, at least

template <class T> void permute_rows(T* y, const T* x, const Shape& out, const std::array<int64_t, kMaxPermuteRank>& step) {
  const int r = static_cast<int>(out.size());
  const int64_t inner = out[r - 1], rows = inner == 0 ? 0 : shape_numel(out) / inner, walk = step[r - 1];
  cpu::parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      int64_t src = 0;
      for (int64_t d = r - 2, rest = row; d >= 0; --d) {  // the row's index, last dimension first
        src += (rest % out[d]) * step[d];
        rest /= out[d];
      }
      T* dst = y + row * inner;
      for (int64_t i = 0; i < inner; ++i) dst[i] = x[src + i * walk];
    }
  });
}

}  // namespace

template <> void permute_forward<Cpu>(Tensor& y, const Tensor& x, const Shape& dims) {
  const int r = static_cast<int>(dims.size());
  MG_CHECK(r >= 1 && r <= kMaxPermuteRank && x.dim() == r && y.dim() == r && y.dtype() == x.dtype(),
           "permute: kernel called with dims of " << r << " for shapes " << shape_str(x.shape()) << " and "
                                                  << shape_str(y.shape()));
  if (y.numel() == 0) return;
  // step[i]: how far x moves when output index i grows by one.
  std::array<int64_t, kMaxPermuteRank> stride{}, step{};
  stride[r - 1] = 1;
  for (int d = r - 2; d >= 0; --d) stride[d] = stride[d + 1] * x.size(d + 1);
  for (int i = 0; i < r; ++i) step[i] = stride[dims[i]];
  switch (dtype_size(x.dtype())) {
    case 2: return permute_rows(static_cast<uint16_t*>(y.raw_data()), static_cast<const uint16_t*>(x.raw_data()), y.shape(), step);
    case 4: return permute_rows(static_cast<uint32_t*>(y.raw_data()), static_cast<const uint32_t*>(x.raw_data()), y.shape(), step);
    case 8: return permute_rows(static_cast<uint64_t*>(y.raw_data()), static_cast<const uint64_t*>(x.raw_data()), y.shape(), step);
    default: MG_FAIL("permute: no kernel for " << dtype_name(x.dtype()));
  }
}

}  // namespace mg
