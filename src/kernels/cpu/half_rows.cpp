#include "kernels/cpu/half_rows.h"

#include <algorithm>
#include <atomic>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "core/parallel.h"
#include "kernels/convert.h"
#include "kernels/cpu/eigen.h"

namespace mg::cpu {

namespace {

std::atomic<int64_t> g_chunk_bytes{int64_t{1} << 20};

int64_t row_numel(const Tensor& t) { return t.size(0) == 0 ? 0 : t.numel() / t.size(0); }

// Note [f16 conversions with F16C]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// x86's F16C instructions convert 8 values at a time: vcvtph2ps widens exactly and vcvtps2ph with
// an immediate rounding of "nearest" rounds to nearest, ties to even, whatever MXCSR says. Both
// give the bits of half::float_from_f16 / half::f16_from_float (Note [half conversions]), which
// tests/test_dtype.cpp checks on every f16 value and every float32 bit pattern. Whether the CPU
// has F16C is asked at run time, so a build for plain x86-64 still takes the scalar loop.
#if defined(__x86_64__)
// CPUID leaf 1 (F16C, AVX, and the OS's XSAVE), then XGETBV: the OS saves the YMM registers.
// (clang's __builtin_cpu_supports knows no "f16c".)
bool cpu_has_f16c() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(1, &a, &b, &c, &d) == 0) return false;
    const unsigned f16c = 1u << 29, avx = 1u << 28, osxsave = 1u << 27;
    if ((c & (f16c | avx | osxsave)) != (f16c | avx | osxsave)) return false;
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0x6u) == 0x6u;
  }();
  return has;
}

__attribute__((target("avx,f16c"))) int64_t widen_f16_f16c(float* dst, const uint16_t* src, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  return i;
}

__attribute__((target("avx,f16c"))) int64_t narrow_f16_f16c(uint16_t* dst, const float* src, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  return i;
}
#else
bool cpu_has_f16c() { return false; }
int64_t widen_f16_f16c(float*, const uint16_t*, int64_t) { return 0; }
int64_t narrow_f16_f16c(uint16_t*, const float*, int64_t) { return 0; }
#endif

std::atomic<bool> g_f16c_allowed{true};

}  // namespace

bool f16c_in_use() { return g_f16c_allowed.load(std::memory_order_relaxed) && cpu_has_f16c(); }

bool allow_f16c(bool allowed) { return g_f16c_allowed.exchange(allowed); }

void widen_span(float* dst, const void* src, DType from, int64_t n) {
  MG_CHECK(from == DType::f32 || is_half(from), "widen: from " << dtype_name(from));
  if (from == DType::f32) {
    std::copy_n(static_cast<const float*>(src), n, dst);
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  if (from == DType::bf16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = half::float_from_bf16(s[i]);
  } else {
    const int64_t done = f16c_in_use() ? widen_f16_f16c(dst, s, n) : 0;  // Note [f16 conversions with F16C]
    for (int64_t i = done; i < n; ++i) dst[i] = half::float_from_f16(s[i]);
  }
}

void narrow_span(void* dst, DType to, const float* src, int64_t n) {
  MG_CHECK(to == DType::f32 || is_half(to), "narrow: into " << dtype_name(to));
  if (to == DType::f32) {
    std::copy_n(src, n, static_cast<float*>(dst));
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (to == DType::bf16) {
    for (int64_t i = 0; i < n; ++i) d[i] = half::bf16_from_float(src[i]);
  } else {
    const int64_t done = f16c_in_use() ? narrow_f16_f16c(d, src, n) : 0;  // Note [f16 conversions with F16C]
    for (int64_t i = done; i < n; ++i) d[i] = half::f16_from_float(src[i]);
  }
}

Tensor widened(const Tensor& t) { return t.dtype() == DType::f32 ? t : t.to(DType::f32); }

Tensor widen_rows(const Tensor& t, int64_t first, int64_t rows) {
  Shape shape = t.shape();
  shape[0] = rows;
  Tensor out = Tensor::empty(shape, TensorOptions{DType::f32, Device::cpu()});
  const size_t size = dtype_size(t.dtype());
  const char* src = static_cast<const char*>(t.raw_data()) + static_cast<size_t>(first * row_numel(t)) * size;
  float* dst = out.data<float>();
  parallel_for(out.numel(), kParallelGrain, [&](int64_t i0, int64_t i1) {
    widen_span(dst + i0, src + static_cast<size_t>(i0) * size, t.dtype(), i1 - i0);
  });
  return out;
}

const float* widen_row(const Tensor& out, const Tensor& t, int64_t r) {
  const int64_t n = out.numel();
  widen_span(out.data<float>(), static_cast<const char*>(t.raw_data()) + static_cast<size_t>(r * n) * dtype_size(t.dtype()),
             t.dtype(), n);
  return out.data<float>();
}

void store_rows(Tensor& dst, int64_t first, const Tensor& src) {
  const size_t size = dtype_size(dst.dtype());
  char* d = static_cast<char*>(dst.raw_data()) + static_cast<size_t>(first * row_numel(dst)) * size;
  const float* s = src.data<float>();
  parallel_for(src.numel(), kParallelGrain, [&](int64_t i0, int64_t i1) {
    narrow_span(d + static_cast<size_t>(i0) * size, dst.dtype(), s + i0, i1 - i0);
  });
}

Tensor float32_sum(const Tensor& g) {
  return !g.defined() || g.dtype() == DType::f32 ? g : Tensor::empty(g.shape(), TensorOptions{DType::f32, g.device()});
}

void store_sum(Tensor& g, const Tensor& sum) {
  if (g.defined() && sum.impl_ptr() != g.impl_ptr()) g.copy_(sum);
}

FloatRowRoom::FloatRowRoom(int slots, std::initializer_list<std::pair<const Tensor*, int64_t>> rows) {
  for (const auto& [t, n] : rows) {
    const bool half = t->defined() && is_half(t->dtype());
    rows_.push_back({t, n, half ? per_slot_ : -1});
    if (half) per_slot_ += n;
  }
  if (per_slot_ > 0) room_ = Tensor::empty({std::max(slots, 1), per_slot_});
}

FloatRows FloatRowRoom::rows(int slot, size_t k) const {
  const Row& r = rows_.at(k);
  MG_CHECK(slot >= 0 && (!room_.defined() || slot < room_.size(0)),
           "FloatRowRoom: slot " << slot << " of a room made for " << (room_.defined() ? room_.size(0) : 0) << " slots");
  // A half tensor's rows of 0 values (an empty batch or plane) need no room: nothing is read or written.
  float* buf = r.offset < 0 || !room_.defined() ? nullptr : room_.data<float>() + static_cast<int64_t>(slot) * per_slot_ + r.offset;
  return FloatRows(*r.t, r.n, buf);
}

int64_t half_chunk_bytes() { return g_chunk_bytes; }
void set_half_chunk_bytes(int64_t bytes) { g_chunk_bytes = bytes; }

int64_t half_chunk_rows(int64_t rows, int64_t bytes_per_row) {
  const int64_t fit = half_chunk_bytes() / std::max<int64_t>(bytes_per_row, 1);
  return std::clamp<int64_t>(std::max<int64_t>(fit, parallel_slots(rows)), 1, std::max<int64_t>(rows, 1));
}

}  // namespace mg::cpu
