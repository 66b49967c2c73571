// Conversions between the floating-point dtypes (f32, f64, bf16, f16): Tensor::to(DType) and
// copy_ between dtypes (minigrad/core/tensor.h).
//   convert:  dst = src in dst's dtype, element by element; both contiguous, of equal numel, on
//             one device; float dtypes only.
//
// Note [half conversions]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Narrowing rounds to nearest, ties to even, in integer arithmetic on the bits (no FPU rounding
// mode, no intrinsic), so that the CPU and CUDA kernels give the same bits: both call the
// functions below (or, for f16 on a CPU with F16C, instructions with the same bits: Note [f16
// conversions with F16C] in kernels/cpu/half_rows.cpp), which tests/test_dtype.cpp checks on the CPU exhaustively (every bf16 and f16
// value widened) and by property (every narrowed value is a nearest representable one, ties to
// the even one). A NaN stays a NaN of the same sign (quiet: the top mantissa bit set; widening an
// f16 NaN quiets it too, while bf16 widens by a shift and keeps its bits), infinities
// stay infinities, f16's overflow (|x| >= 65520 after rounding) becomes an infinity and its
// subnormals (down to 2^-24) are kept; bf16 has float32's range and subnormals. f64 -> f32 is the
// C++ conversion (the same rounding). A NaN to or from f64 becomes the quiet NaN of its sign with
// no payload, written as bits: the hardware's conversions differ there (x86 keeps the payload, a
// GPU's cvt gives its own canonical NaN), and the two devices must give the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#include <minigrad/core/rng.h>  // MG_HOST_DEVICE
#include <minigrad/core/tensor.h>
#include "kernels/dispatch.h"

namespace mg {

template <class D> void convert(Tensor& dst, const Tensor& src);
// The checks both devices' kernels make (one place).
void check_convert_args(const Tensor& dst, const Tensor& src);

namespace half {

MG_HOST_DEVICE uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

MG_HOST_DEVICE float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// float32 -> bfloat16 bits (Note [half conversions]).
MG_HOST_DEVICE uint16_t bf16_from_float(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN, quiet
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);  // ties to even; overflow carries into inf
  return static_cast<uint16_t>(rounded >> 16);
}

MG_HOST_DEVICE float float_from_bf16(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

// float32 -> IEEE half bits (Note [half conversions]).
MG_HOST_DEVICE uint16_t f16_from_float(float f) {
  uint32_t x = bits_of(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x03ffu));  // NaN, quiet
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 (or inf): rounds to inf
  if (x < 0x38800000u) {  // below 2^-14: f16 subnormal (or 0), a multiple of 2^-24
    if (x < 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: rounds to 0 (2^-25 is a tie: to even 0)
    const uint32_t e = x >> 23;                                // 102 .. 112
    const uint32_t m = (x & 0x007fffffu) | 0x00800000u;        // 24 bits with the implicit one
    const uint32_t shift = 126u - e;                           // 14 .. 24: m >> shift is the subnormal's mantissa
    uint32_t q = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1u), half_ulp = 1u << (shift - 1u);
    if (rest > half_ulp || (rest == half_ulp && (q & 1u))) ++q;  // may carry into the smallest normal
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias the exponent (127 -> 15), round the 13 dropped bits to nearest even.
  const uint32_t r = x - 0x38000000u;  // exponent - 112, so that (r >> 13) is exponent:mantissa of the half
  uint32_t q = r >> 13;
  const uint32_t rest = r & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (q & 1u))) ++q;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | q);
}

MG_HOST_DEVICE float float_from_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x03ffu;
  if (e == 0x1fu) {  // inf; NaN quiet, its payload kept (as x86's vcvtph2ps gives it)
    return float_of(sign | 0x7f800000u | (m << 13) | (m != 0 ? 0x00400000u : 0u));
  }
  if (e != 0) return float_of(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return float_of(sign);
  // Subnormal: m * 2^-24, normalised.
  uint32_t shift = 0, mm = m;
  while ((mm & 0x0400u) == 0) {
    mm <<= 1;
    ++shift;
  }
  return float_of(sign | ((113u - shift) << 23) | ((mm & 0x03ffu) << 13));
}

MG_HOST_DEVICE uint64_t bits_of(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
#endif
}

MG_HOST_DEVICE double double_of(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
#endif
}

// Float to and from f64, NaNs as bits (Note [half conversions]): the quiet NaN of the sign.
MG_HOST_DEVICE float float_from_f64(double d) {
  if (d != d) return float_of((bits_of(d) >> 63) != 0 ? 0xffc00000u : 0x7fc00000u);
  return static_cast<float>(d);
}
MG_HOST_DEVICE double f64_from_float(float f) {
  if (f != f) return double_of((bits_of(f) & 0x80000000u) ? 0xfff8000000000000ull : 0x7ff8000000000000ull);
  return static_cast<double>(f);
}

// v as a tensor of dtype `t` holds it: rounded to bf16 or f16 and widened back, or v itself.
MG_HOST_DEVICE float rounded(DType t, float v) {
  switch (t) {
    case DType::bf16: return float_from_bf16(bf16_from_float(v));
    case DType::f16: return float_from_f16(f16_from_float(v));
    default: return v;
  }
}

// Element i of src (dtype `from`) into element i of dst (dtype `to`), both float dtypes: the body
// of both devices' kernels. Through float, but f64 to f64 is copied, and f32 or a half type to f64
// is exact.
MG_HOST_DEVICE void convert_element(void* dst, DType to, const void* src, DType from, int64_t i) {
  if (from == DType::f64 && to == DType::f64) {
    static_cast<double*>(dst)[i] = static_cast<const double*>(src)[i];
    return;
  }
  float v = 0.0f;
  switch (from) {
    case DType::f32: v = static_cast<const float*>(src)[i]; break;
    case DType::f64: v = float_from_f64(static_cast<const double*>(src)[i]); break;
    case DType::bf16: v = float_from_bf16(static_cast<const uint16_t*>(src)[i]); break;
    case DType::f16: v = float_from_f16(static_cast<const uint16_t*>(src)[i]); break;
    default: break;
  }
  switch (to) {
    case DType::f32: static_cast<float*>(dst)[i] = v; break;
    case DType::f64: static_cast<double*>(dst)[i] = f64_from_float(v); break;
    case DType::bf16: static_cast<uint16_t*>(dst)[i] = bf16_from_float(v); break;
    case DType::f16: static_cast<uint16_t*>(dst)[i] = f16_from_float(v); break;
    default: break;
  }
}

}  // namespace half
}  // namespace mg
