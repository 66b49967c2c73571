// Kernels over any floating storage type: float32, bf16 or f16 elements, float32 math.
//
// Note [cuda half kernels]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// An op whose CUDA kernels read bf16 and f16 themselves (OpDef::cuda_half_kernels) is launched on
// the low-precision tensors as they are, where other ops get float32 copies (Note [autocast] in
// minigrad/core/autocast.h). Its kernels are templates over the storage type T (float, Bf16 or
// F16): each element is widened on load (load<T>), the math runs in float32, and the result is
// rounded on store (store<T>) with the same functions as the conversion kernels (Note [half
// conversions] in src/kernels/convert.h). So an element-wise kernel gives the bits of the float32
// kernel on widened copies, as the CPU's half kernels do (Note [half operands] in
// src/kernels/cpu/gemm.h); a product or a reduction gives cuBLAS's or cuDNN's bits, which differ
// from the CPU's by the order of their float32 sums, as in float32.
// apply() takes this path on CUDA only when every floating input has one dtype (Note
// [autocast]), so a kernel here sees one storage type for all its tensors, and says so with
// check_same_dtype when it does not.
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

// The same as overloads, for bodies shared with the CPU (kernels/cuda/pooling_math.h).
MG_HOST_DEVICE float widen(Bf16 v) { return half::float_from_bf16(v.bits); }
MG_HOST_DEVICE float widen(F16 v) { return half::float_from_f16(v.bits); }

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
