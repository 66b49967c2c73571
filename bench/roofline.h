// The machine's measured limit for the CPU benchmarks: the sustained SGEMM rate of a large square
// product (2048^3) on all the threads the kernels use, through the same GEMM path and thread pool
// the kernels use (kernels/cpu/gemm.h). A workload's achieved GFLOP/s divided by it is the
// fraction of the machine it reaches; BENCHMARKS.md prints both.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

#include <minigrad/core/rng.h>
#include <minigrad/core/tensor.h>

#include "kernels/cpu/gemm.h"

namespace mg::bench {

// Best of `reps` timed products (after one untimed), in GFLOP/s.
inline double sgemm_gflops(int64_t n = 2048, int reps = 3) {
  Generator gen(1);
  const Tensor a = Tensor::uniform({n, n}, -1.0f, 1.0f, gen), b = Tensor::uniform({n, n}, -1.0f, 1.0f, gen);
  Tensor c = Tensor::empty({n, n});
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::gemm({.m = n, .n = n, .k = n, .a = a.data<float>(), .lda = n, .b = b.data<float>(), .ldb = n,
               .c = c.data<float>(), .ldc = n});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best / 1e9;
}

}  // namespace mg::bench
