// Element types. float32 is the only type ops compute in today; i64 carries class labels and
// pooling indices; f64 holds statistics read back once per optimizer step (losses, the squared
// gradient norm: minigrad/optim/accumulate.h). bf16 (bfloat16: float32's 8 exponent bits, 7
// mantissa bits) and f16 (IEEE half: 5 and 10) are storage types: tensors of them are made,
// converted (Tensor::to(DType), copy_, rounding to nearest even, the same bits on every device:
// Note [half conversions] in src/kernels/convert.h), printed, saved and loaded as they are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mg {

enum class DType : uint8_t { f32, bf16, i64, f64, f16 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i64: return 8;
    case DType::f64: return 8;
    case DType::f16: return 2;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::i64: return "int64";
    case DType::f64: return "float64";
    case DType::f16: return "float16";
  }
  return "?";
}

// A floating-point type: f32, f64, bf16 or f16.
constexpr bool is_floating(DType t) { return t != DType::i64; }

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }

}  // namespace mg
