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

namespace {

// Element i of a float dtype, as float (f64 narrowed by the C++ conversion) / stored from float.
float load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f64: return static_cast<float>(static_cast<const double*>(p)[i]);
    case DType::bf16: return half::float_from_bf16(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return half::float_from_f16(static_cast<const uint16_t*>(p)[i]);
    default: return 0.0f;
  }
}

}  // namespace

template <> void convert<Cpu>(Tensor& dst, const Tensor& src) {
  check_convert_args(dst, src);
  const int64_t n = dst.numel();
  const DType from = src.dtype(), to = dst.dtype();
  const void* s = src.raw_data();
  void* d = dst.raw_data();
  cpu::parallel_for(n, cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
    if (from == DType::f64 && to == DType::f64) {
      for (int64_t i = i0; i < i1; ++i) static_cast<double*>(d)[i] = static_cast<const double*>(s)[i];
      return;
    }
    if (from == DType::f32 || to != DType::f64) {
      for (int64_t i = i0; i < i1; ++i) {
        // f64 -> half goes through float (one rounding to float, then one to the half type).
        const float v = load(s, from, i);
        switch (to) {
          case DType::f32: static_cast<float*>(d)[i] = v; break;
          case DType::f64: static_cast<double*>(d)[i] = v; break;
          case DType::bf16: static_cast<uint16_t*>(d)[i] = half::bf16_from_float(v); break;
          case DType::f16: static_cast<uint16_t*>(d)[i] = half::f16_from_float(v); break;
          default: break;
        }
      }
      return;
    }
    for (int64_t i = i0; i < i1; ++i) static_cast<double*>(d)[i] = load(s, from, i);  // half -> f64: exact
  });
}

}  // namespace mg
