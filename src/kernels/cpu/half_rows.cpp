#include "kernels/cpu/half_rows.h"

#include <algorithm>
#include <atomic>

#include "core/parallel.h"
#include "kernels/convert.h"
#include "kernels/cpu/eigen.h"

namespace mg::cpu {

namespace {

std::atomic<int64_t> g_chunk_bytes{int64_t{1} << 20};

int64_t row_numel(const Tensor& t) { return t.size(0) == 0 ? 0 : t.numel() / t.size(0); }

}  // namespace

Tensor widened(const Tensor& t) { return t.dtype() == DType::f32 ? t : t.to(DType::f32); }

Tensor widen_rows(const Tensor& t, int64_t first, int64_t rows) {
  Shape shape = t.shape();
  shape[0] = rows;
  Tensor out = Tensor::empty(shape, TensorOptions{DType::f32, Device::cpu()});
  const int64_t base = first * row_numel(t);
  const DType from = t.dtype();
  MG_CHECK(from == DType::f32 || is_half(from), "widen_rows: from " << dtype_name(from));
  float* dst = out.data<float>();
  parallel_for(out.numel(), kParallelGrain, [&](int64_t i0, int64_t i1) {
    if (from == DType::f32) {
      const float* s = t.data<float>() + base;
      std::copy(s + i0, s + i1, dst + i0);
      return;
    }
    const uint16_t* s = static_cast<const uint16_t*>(t.raw_data()) + base;
    if (from == DType::bf16) {
      for (int64_t i = i0; i < i1; ++i) dst[i] = half::float_from_bf16(s[i]);
    } else {
      for (int64_t i = i0; i < i1; ++i) dst[i] = half::float_from_f16(s[i]);
    }
  });
  return out;
}

const float* widen_row(const Tensor& out, const Tensor& t, int64_t r) {
  const int64_t n = out.numel();
  const uint16_t* s = static_cast<const uint16_t*>(t.raw_data()) + r * n;
  float* o = out.data<float>();
  if (t.dtype() == DType::bf16) {
    for (int64_t j = 0; j < n; ++j) o[j] = half::float_from_bf16(s[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) o[j] = half::float_from_f16(s[j]);
  }
  return o;
}

void store_rows(Tensor& dst, int64_t first, const Tensor& src) {
  const int64_t base = first * row_numel(dst);
  const float* s = src.data<float>();
  const DType to = dst.dtype();
  MG_CHECK(to == DType::f32 || is_half(to), "store_rows: into " << dtype_name(to));
  parallel_for(src.numel(), kParallelGrain, [&](int64_t i0, int64_t i1) {
    if (to == DType::f32) {
      std::copy(s + i0, s + i1, dst.data<float>() + base + i0);
      return;
    }
    uint16_t* d = static_cast<uint16_t*>(dst.raw_data()) + base;
    if (to == DType::bf16) {
      for (int64_t i = i0; i < i1; ++i) d[i] = half::bf16_from_float(s[i]);
    } else {
      for (int64_t i = i0; i < i1; ++i) d[i] = half::f16_from_float(s[i]);
    }
  });
}

int64_t half_chunk_bytes() { return g_chunk_bytes; }
void set_half_chunk_bytes(int64_t bytes) { g_chunk_bytes = bytes; }

int64_t half_chunk_rows(int64_t rows, int64_t bytes_per_row) {
  const int64_t fit = half_chunk_bytes() / std::max<int64_t>(bytes_per_row, 1);
  return std::clamp<int64_t>(std::max<int64_t>(fit, parallel_slots(rows)), 1, std::max<int64_t>(rows, 1));
}

}  // namespace mg::cpu
