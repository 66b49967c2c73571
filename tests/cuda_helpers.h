// Shared setup of the GPU tests, tests/test_cuda_{tensor,ops,allocator,training,planner}.cpp:
// each includes this header first and compiles its tests only under MINIGRAD_WITH_CUDA.
//
// Without the CUDA backend, or without a CUDA device, the executable prints why and exits with
// 77 before any test runs, which ctest reports as skipped (tests/CMakeLists.txt:
// SKIP_RETURN_CODE 77); with MG_REQUIRE_GPU=1 in the environment it fails instead (exit 1), as
// test_ops' CUDA case does. scripts/gpu_verify.sh sets it, and finds these tests by this include.
//
// Tolerances: strict FP32 (the default for linear; conv2d after set_tf32_conv(false)) must
// agree with the CPU to a relative error (2-norm of the difference over 2-norm of the CPU
// result) below 1e-5. TF32 keeps 10 mantissa bits of each GEMM input, so products carry ~1e-3
// relative error: TF32 results are held to 1e-2.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "helpers.h"

namespace {
// Exit 77 (skipped), or 1 (failed) where the run requires a GPU (MG_REQUIRE_GPU=1).
[[noreturn]] inline void exit_without_gpu() {
  if (mg::test::gpu_required()) {
    std::printf(MG_TEST_NAME ": MG_REQUIRE_GPU=1: failed instead of skipped.\n");
    std::exit(1);
  }
  std::exit(77);
}
}  // namespace

#ifndef MINIGRAD_WITH_CUDA
// A build without the CUDA backend has no Cuda kernels to call: nothing to test. (A variable
// with internal linkage, so that its initializer runs in every executable that includes this.)
namespace {
const bool kSkipWithoutBackend = [] {
  std::printf(MG_TEST_NAME ": this libminigrad was built without CUDA: skipped.\n");
  exit_without_gpu();
  return true;
}();
}  // namespace
#else
#include <cmath>
#include <random>

#include <minigrad/cuda.h>

namespace {
const bool kSkipWithoutDevice = [] {
  if (!mg::cuda_available()) {
    std::printf(MG_TEST_NAME ": no CUDA device (%s): skipped. Run on a GPU machine, see docs/cuda.md.\n",
                mg::cuda_unavailable_reason().c_str());
    exit_without_gpu();
  }
  return true;
}();
}  // namespace

namespace mg::test {

constexpr double kStrict = 1e-5;
constexpr double kTf32 = 1e-2;
inline const Device kGpu = Device::cuda(0);

// Restores a math switch at scope exit.
struct Tf32Matmul {
  bool old = cuda::tf32_matmul();
  explicit Tf32Matmul(bool on) { cuda::set_tf32_matmul(on); }
  ~Tf32Matmul() { cuda::set_tf32_matmul(old); }
};
// linear and matmul through cuBLASLt (on) or cublasGemmEx (off) for a scope.
struct CublasLt {
  bool old = cuda::cublaslt();
  explicit CublasLt(bool on) { cuda::set_cublaslt(on); }
  ~CublasLt() { cuda::set_cublaslt(old); }
};
struct Tf32Conv {
  bool old = cuda::tf32_conv();
  explicit Tf32Conv(bool on) { cuda::set_tf32_conv(on); }
  ~Tf32Conv() { cuda::set_tf32_conv(old); }
};

// cuDNN benchmark mode for a scope: restored when a failed REQUIRE leaves the test case early.
struct CudnnBenchmark {
  bool old = cuda::cudnn_benchmark();
  explicit CudnnBenchmark(bool on) { cuda::set_cudnn_benchmark(on); }
  ~CudnnBenchmark() { cuda::set_cudnn_benchmark(old); }
};

inline Tensor labels(int64_t n, int64_t classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> v(n);
  for (auto& t : v) t = static_cast<int64_t>(rng() % classes);
  return Tensor::from_vector(v, {n});
}

inline Tensor poisoned(const Shape& s, Device d) { return Tensor::full(s, std::nanf(""), TensorOptions{}.with_device(d)); }

}  // namespace mg::test

#endif  // MINIGRAD_WITH_CUDA
