#include "kernels/convert.h"

#include <algorithm>

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"
#include "kernels/cpu/half_rows.h"

namespace mg {

void check_convert_args(const Tensor& dst, const Tensor& src) {
  MG_CHECK(is_floating(dst.dtype()) && is_floating(src.dtype()),
           "convert: " << dtype_name(src.dtype()) << " -> " << dtype_name(dst.dtype())
                       << ": only float32, float64, bfloat16 and float16 convert");
  MG_CHECK(dst.numel() == src.numel() && dst.device() == src.device(),
           "convert: " << src.numel() << " elements on " << src.device().str() << " into " << dst.numel()
                       << " on " << dst.device().str());
}

template <> void convert<Cpu>(Tensor& dst, const Tensor& src) {
  check_convert_args(dst, src);
  const DType from = src.dtype(), to = dst.dtype();
  const void* s = src.raw_data();
  void* d = dst.raw_data();
  if (from == DType::f64 || to == DType::f64) {
    cpu::parallel_for(dst.numel(), cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) half::convert_element(d, to, s, from, i);
    });
    return;
  }
  // Between float32, bf16 and f16: through float32 a block at a time, with the span functions'
  // vector paths (the same bits as convert_element).
  const size_t from_size = dtype_size(from), to_size = dtype_size(to);
  cpu::parallel_for(dst.numel(), cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
    constexpr int64_t kBlock = 1024;
    float buf[kBlock];
    for (int64_t b = i0; b < i1; b += kBlock) {
      const int64_t n = std::min(kBlock, i1 - b);
      const void* from_at = static_cast<const char*>(s) + static_cast<size_t>(b) * from_size;
      void* to_at = static_cast<char*>(d) + static_cast<size_t>(b) * to_size;
      if (from == DType::f32) {
        cpu::narrow_span(to_at, to, static_cast<const float*>(from_at), n);
      } else if (to == DType::f32) {
        cpu::widen_span(static_cast<float*>(to_at), from_at, from, n);
      } else {
        cpu::widen_span(buf, from_at, from, n);
        cpu::narrow_span(to_at, to, buf, n);
      }
    }
  });
}

}  // namespace mg
