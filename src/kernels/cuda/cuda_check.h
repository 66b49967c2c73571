// Error checks for the CUDA runtime, cuBLAS (cuBLASLt returns cuBLAS's status: MG_CUBLAS_CHECK)
// and cuDNN, generated from MG_CHECK_GEN (minigrad/core/error.h), so every failure is an
// mg::Error carrying the expression, file, line and the library's own error string:
//
//   MG_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream));
//   relu_forward_kernel<<<grid, block, 0, stream>>>(y, x, n);
//   MG_CUDA_CHECK_LAUNCH();
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <minigrad/core/error.h>

#define MG_CUDA_CHECK_GEN(call, status_t, ok_value, error_string, library)                    \
  do {                                                                                       \
    const status_t mg_status_ = (call);                                                      \
    MG_CHECK_GEN(mg_status_ == (ok_value), #call,                                            \
                 library " error " << static_cast<int>(mg_status_) << ": "                   \
                                   << error_string(mg_status_));                             \
  } while (0)

#define MG_CUDA_CHECK(call) MG_CUDA_CHECK_GEN(call, cudaError_t, cudaSuccess, cudaGetErrorString, "CUDA")
#define MG_CUBLAS_CHECK(call) \
  MG_CUDA_CHECK_GEN(call, cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasGetStatusString, "cuBLAS")
#define MG_CUDNN_CHECK(call) \
  MG_CUDA_CHECK_GEN(call, cudnnStatus_t, CUDNN_STATUS_SUCCESS, cudnnGetErrorString, "cuDNN")

// After every kernel launch: reports a bad launch configuration at the launch site.
#define MG_CUDA_CHECK_LAUNCH() MG_CUDA_CHECK(cudaGetLastError())
