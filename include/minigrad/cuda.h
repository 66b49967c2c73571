// Run-time switches of the CUDA backend (plain C++: include it from any program; waiting for a
// device is mg::synchronize in <minigrad/core/device.h>).
//
//   mg::cuda::set_tf32_matmul(true);        // linear may use TF32 tensor cores (default: off)
//   mg::cuda::set_tf32_conv(false);         // conv2d in strict FP32 (default: TF32 allowed)
//   mg::cuda::set_cudnn_benchmark(true);    // time cuDNN's algorithms once per shape
//   mg::cuda::set_cudnn_deterministic(false); // admit non-deterministic cuDNN algorithms
//
// In a build without CUDA the setters only record the value.
//
// Note [cuda math modes]
// ~~~~~~~~~~~~~~~~~~~~~~
// The defaults follow PyTorch: matmuls (linear, matmul) in strict FP32, convolutions allowed
// TF32 on tensor cores; both switches above change them, and docs/cuda.md has what each costs.
#pragma once

#include <cstddef>

namespace mg::cuda {

void set_tf32_matmul(bool allow);
bool tf32_matmul();
void set_tf32_conv(bool allow);
bool tf32_conv();
// Benchmark mode: the first conv2d of each shape times every cuDNN algorithm (cudnnFind*) and
// caches the fastest; otherwise cuDNN's heuristics choose (cudnnGet*_v7), also cached per shape.
void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();
// Deterministic convolutions (default: on): only cuDNN algorithms that give the same bits for
// the same inputs, so replayed checkpoint segments and accumulation stay exact on the GPU
// (Note [deterministic convolutions] in src/kernels/cuda/conv2d.cu). Off: the fastest of all.
void set_cudnn_deterministic(bool on);
bool cudnn_deterministic();
// Upper bound on one cuDNN workspace (bytes, default 1 GiB); algorithms needing more are skipped.
void set_conv_workspace_limit(size_t bytes);
size_t conv_workspace_limit();

}  // namespace mg::cuda
