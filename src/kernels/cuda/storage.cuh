// Kernels over any floating storage type: float32, bf16 or f16 elements, float32 math.
//
// Note [cuda half kernels]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// An op whose CUDA kernels read bf16 and f16 themselves (OpDef::cuda_half) is launched on
// the low-precision tensors as they are, where other ops get float32 copies (Note [autocast] in
// minigrad/core/autocast.h). Each element is widened on load, the math runs in float32, and the
// result is rounded on store with the same functions as the conversion kernels (Note [half
// conversions] in src/kernels/convert.h). So an element-wise kernel gives the bits of the float32
// kernel on widened copies, as the CPU's half kernels do (Note [half operands] in
// src/kernels/cpu/gemm.h); a product or a reduction gives cuBLAS's, cuDNN's or our float32
// kernel's order of sums, as in float32. Two kinds (OpDef::cuda_half):
//   one_dtype   every floating input of one low dtype (apply() widens other mixes): templates
//               over the storage type T (float, Bf16 or F16), load<T> and store<T>; the products
//               (cuBLAS, cuDNN take one type for A and B), and the element-wise ops;
//   any_dtypes  each tensor in its own float dtype (Elems: a pointer and its dtype, the switch
//               uniform across a launch): the statistics ops, whose parameters autocast keeps
//               float32 and whose output it makes low from float32 inputs too.
#pragma once

#include <cstdint>
#include <initializer_list>

#include <library_types.h>

#include <minigrad/core/error.h>
#include <minigrad/core/tensor.h>

#include "kernels/convert.h"

namespace mg::cuda {

// The 16-bit storage types, as their bits.
struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

template <class T> __device__ __forceinline__ float load(const T* p, int64_t i);
template <> __device__ __forceinline__ float load<float>(const float* p, int64_t i) { return p[i]; }
template <> __device__ __forceinline__ float load<Bf16>(const Bf16* p, int64_t i) {
  return half::float_from_bf16(p[i].bits);
}
template <> __device__ __forceinline__ float load<F16>(const F16* p, int64_t i) {
  return half::float_from_f16(p[i].bits);
}

template <class T> __device__ __forceinline__ void store(T* p, int64_t i, float v);
template <> __device__ __forceinline__ void store<float>(float* p, int64_t i, float v) { p[i] = v; }
template <> __device__ __forceinline__ void store<Bf16>(Bf16* p, int64_t i, float v) {
  p[i].bits = half::bf16_from_float(v);
}
template <> __device__ __forceinline__ void store<F16>(F16* p, int64_t i, float v) {
  p[i].bits = half::f16_from_float(v);
}


// A tensor's elements in their own dtype (any_dtypes kernels); p is null for an undefined tensor.
struct Elems {
  void* p = nullptr;
  DType t = DType::f32;
};
inline Elems elems_of(const Tensor& t) {
  if (!t.defined()) return Elems{};
  MG_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16,
           "CUDA kernel: expected float32, bfloat16 or float16, got " << dtype_name(t.dtype()));
  return Elems{t.raw_data(), t.dtype()};
}
MG_HOST_DEVICE float load(Elems e, int64_t i) {
  switch (e.t) {
    case DType::bf16: return half::float_from_bf16(static_cast<const uint16_t*>(e.p)[i]);
    case DType::f16: return half::float_from_f16(static_cast<const uint16_t*>(e.p)[i]);
    default: return static_cast<const float*>(e.p)[i];
  }
}
MG_HOST_DEVICE void store(Elems e, int64_t i, float v) {
  switch (e.t) {
    case DType::bf16: static_cast<uint16_t*>(e.p)[i] = half::bf16_from_float(v); break;
    case DType::f16: static_cast<uint16_t*>(e.p)[i] = half::f16_from_float(v); break;
    default: static_cast<float*>(e.p)[i] = v; break;
  }
}

// Elements as float32 for the bodies shared with the CPU tests (value in
// src/kernels/cuda/element_math.h).
MG_HOST_DEVICE float value(const Bf16* p, int64_t i) { return half::float_from_bf16(p[i].bits); }
MG_HOST_DEVICE float value(const F16* p, int64_t i) { return half::float_from_f16(p[i].bits); }
MG_HOST_DEVICE float value(Elems e, int64_t i) { return load(e, i); }

// The storage type's dtype.
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<Bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<F16>() { return DType::f16; }

// A tensor's elements as T (checked against its dtype).
template <class T> T* elems(const Tensor& t) {
  MG_CHECK(t.dtype() == dtype_of<T>(), "CUDA kernel: expected a " << dtype_name(dtype_of<T>()) << " tensor, got "
                                                                   << dtype_name(t.dtype()));
  return static_cast<T*>(t.raw_data());
}

// Calls f(T{}) with T the storage type of `dtype`: float32, bf16 or f16.
template <class F> void with_storage(const char* op, DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(Bf16{}); return;
    case DType::f16: f(F16{}); return;
    default: MG_FAIL(op << " on CUDA: expected float32, bfloat16 or float16, got " << dtype_name(dtype));
  }
}

// The dtype as cuBLAS and cuBLASLt name it.
inline cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: MG_FAIL("cuBLAS: expected float32, bfloat16 or float16, got " << dtype_name(dtype));
  }
}

// Every defined tensor of `ts` has the first's dtype (Note [cuda half kernels]).
inline DType check_same_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  DType first = DType::f32;
  bool seen = false;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!seen) {
      first = t->dtype();
      seen = true;
    }
    MG_CHECK(t->dtype() == first, op << " on CUDA: tensors of one dtype expected, got " << dtype_name(first)
                                     << " and " << dtype_name(t->dtype()));
  }
  return first;
}

}  // namespace mg::cuda
