#include "kernels/convert.h"

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"

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
  cpu::parallel_for(dst.numel(), cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) half::convert_element(d, to, s, from, i);
  });
}

}  // namespace mg
