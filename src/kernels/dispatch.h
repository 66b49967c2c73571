// One dispatch point per device. A kernel is declared once, as a function template over a device
// tag, in src/kernels/<op>.h; src/kernels/cpu/<op>.cpp specialises it for Cpu (Eigen) and
// src/kernels/cuda/<op>.cu for Cuda. MG_DISPATCH picks the specialisation from a device at run time:
//
//   MG_DISPATCH(x.device(), relu_forward, y, x);
//
// In a build without CUDA the Cuda branch throws instead of referring to code that is not there;
// the comma keeps the expression's type that of the Cpu call, so kernels that return a value
// (sum_squares) dispatch the same way.
#pragma once

#include <minigrad/core/error.h>
#include <minigrad/core/device.h>

namespace mg {

struct Cpu {};
struct Cuda {};

namespace detail {
[[noreturn]] void no_cuda_build(const char* what);
}

}  // namespace mg

#ifdef MINIGRAD_WITH_CUDA
#define MG_DISPATCH(device, fn, ...)                                  \
  ((device).is_cuda() ? ::mg::fn<::mg::Cuda>(__VA_ARGS__) : ::mg::fn<::mg::Cpu>(__VA_ARGS__))
#else
#define MG_DISPATCH(device, fn, ...)                                  \
  ((device).is_cuda() ? (::mg::detail::no_cuda_build(#fn), ::mg::fn<::mg::Cpu>(__VA_ARGS__)) \
                      : ::mg::fn<::mg::Cpu>(__VA_ARGS__))
#endif
