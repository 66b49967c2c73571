// Embedding on CUDA (kernels/embedding.h). Forward: one thread per output element. Backward: the
// positions are bucketed by row on the host (the indices are copied there: a synchronisation,
// as llm.c's deterministic encoder backward also buckets on the host), then one thread per
// (row, channel) adds its row's positions in order: deterministic, no atomics.
#include "kernels/cuda/common.cuh"
#include "kernels/embedding.h"

namespace mg {
namespace {

__global__ void embedding_forward_kernel(float* y, const int64_t* idx, const float* w, int64_t n, int64_t v,
                                         int64_t c, long long* error_flag) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * c; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = i / c, j = i % c, t = idx[p];
    if (t < 0 || t >= v) {
      if (atomicCAS(reinterpret_cast<unsigned long long*>(error_flag), 0ull,
                    static_cast<unsigned long long>(cuda::kFlagBadIndex)) == 0ull) {
        error_flag[1] = p;
        error_flag[2] = t;
      }
      y[i] = 0.0f;
      continue;
    }
    y[i] = w[t * c + j];
  }
}

__global__ void embedding_backward_kernel(float* dw, const float* dy, const int64_t* offset, const int64_t* pos,
                                          int64_t v, int64_t c, bool accumulate) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < v * c; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / c, j = i % c;
    float acc = accumulate ? dw[i] : 0.0f;
    for (int64_t k = offset[r]; k < offset[r + 1]; ++k) acc += dy[pos[k] * c + j];
    dw[i] = acc;
  }
}

}  // namespace

template <> void embedding_forward<Cuda>(Tensor& y, const Tensor& idx, const Tensor& w) {
  const int64_t n = idx.numel(), v = w.size(0), c = w.size(1);
  if (n * c == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  embedding_forward_kernel<<<cuda::grid_for(n * c), cuda::kThreads>>>(y.data<float>(), idx.data<int64_t>(),
                                                                       w.data<float>(), n, v, c,
                                                                       cuda::context(dev).error_flag);
  MG_CUDA_CHECK_LAUNCH();
}

template <> void embedding_backward<Cuda>(Tensor& dw, const Tensor& dy, const Tensor& idx, bool accumulate) {
  const int64_t v = dw.size(0), c = dw.size(1);
  if (v * c == 0) return;
  const Tensor idx_host = idx.to(Device::cpu());
  const EmbeddingBuckets b = embedding_buckets(idx_host.data<int64_t>(), idx_host.numel(), v);
  const Tensor offset = Tensor::from_vector(b.offset, {static_cast<int64_t>(b.offset.size())}).to(dw.device());
  const Tensor pos = Tensor::from_vector(b.pos.empty() ? std::vector<int64_t>{0} : b.pos,
                                         {std::max<int64_t>(1, static_cast<int64_t>(b.pos.size()))})
                         .to(dw.device());
  cuda::DeviceGuard guard(cuda::device_of(dw));
  embedding_backward_kernel<<<cuda::grid_for(v * c), cuda::kThreads>>>(
      dw.data<float>(), dy.data<float>(), offset.data<int64_t>(), pos.data<int64_t>(), v, c, accumulate);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg
