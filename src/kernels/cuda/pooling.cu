// Pooling.  x: (N, C, H, W)   y: (N, C, OH, OW)   P = N*C planes
// max_pool2d: y = max over each KxK window (stride s, implicit -inf padding p); the first
//             maximum in row-major window order wins, NaN propagates (as PyTorch);
//             idx (int64, shape of y) = argmax as h * W + w within the plane.       (=)
//   backward: dx[plane, e] = sum of dy over the windows whose argmax is e: one thread per
//             input element gathers from the at most ceil(K/s)^2 windows that can hold it, in
//             output order: no atomics, bit-identical to the CPU's scatter.             (=)
// adaptive_avg_pool2d: window i spans rows [floor(i H / OH), ceil((i+1) H / OH)), likewise
//             columns (PyTorch's rule); y = mean over the window.                     (=)
//   backward: dx[h, w] = sum over windows containing (h, w) of dy / window size: one thread
//             per input element gathers from the few windows that contain it (no atomics).  (=)
// x, y, dx and dy float32, or all bf16 or all f16 (Note [cuda half kernels] in storage.cuh).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/storage.cuh"
#include "kernels/cuda/pooling_math.h"
#include "kernels/pooling.h"

namespace mg {
namespace {

template <class T>
__global__ void max_pool2d_forward_kernel(T* y, int64_t* idx, const T* x, int64_t planes, int h, int w, int oh, int ow,
                                          int k, int s, int pad) {
  const int64_t total = planes * oh * ow;
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < total; o += int64_t{gridDim.x} * blockDim.x) {
    const int j = static_cast<int>(o % ow);
    const int i = static_cast<int>((o / ow) % oh);
    const int64_t plane = o / (int64_t{oh} * ow);
    float best = 0.0f;
    cuda::math::max_pool_window(x + plane * h * w, h, w, k, s, pad, i, j, &best, idx + o);
    cuda::store(y, o, best);
  }
}

template <class T>
__global__ void max_pool2d_backward_kernel(T* dx, const T* dy, const int64_t* idx, int64_t planes, int h, int w,
                                           int oh, int ow, int k, int s, int pad) {
  const int64_t total = planes * h * w;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int ww = static_cast<int>(e % w);
    const int hh = static_cast<int>((e / w) % h);
    const int64_t out = (e / (int64_t{h} * w)) * oh * ow;
    cuda::store(dx, e, cuda::math::max_pool_grad(dy + out, idx + out, w, oh, ow, k, s, pad, hh, ww));
  }
}

template <class T>
__global__ void adaptive_avg_pool2d_forward_kernel(T* y, const T* x, int64_t planes, int h, int w, int oh, int ow) {
  const int64_t total = planes * oh * ow;
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < total; o += int64_t{gridDim.x} * blockDim.x) {
    const int j = static_cast<int>(o % ow);
    const int i = static_cast<int>((o / ow) % oh);
    cuda::store(y, o, cuda::math::adaptive_avg_window(x + (o / (int64_t{oh} * ow)) * h * w, h, w, oh, ow, i, j));
  }
}

template <class T>
__global__ void adaptive_avg_pool2d_backward_kernel(T* dx, const T* dy, int64_t planes, int h, int w, int oh, int ow) {
  const int64_t total = planes * h * w;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const int ww = static_cast<int>(e % w);
    const int hh = static_cast<int>((e / w) % h);
    cuda::store(dx, e, cuda::math::adaptive_avg_grad(dy + (e / (int64_t{h} * w)) * oh * ow, h, w, oh, ow, hh, ww));
  }
}

constexpr int64_t kMaxBlocks = 1 << 16;
unsigned grid_capped(int64_t n) {
  return cuda::grid_for(n < kMaxBlocks * cuda::kThreads ? n : kMaxBlocks * cuda::kThreads);
}

int as_int(int64_t v, const char* what) {
  MG_CHECK(v <= 2147483647 / 2, "pooling on CUDA: " << what << " = " << v << " is too large");
  return static_cast<int>(v);
}

}  // namespace

template <>
void max_pool2d_forward<Cuda>(Tensor& y, Tensor& idx, const Tensor& x, int kernel, int stride, int pad) {
  const int64_t planes = x.size(0) * x.size(1);
  const int h = as_int(x.size(2), "H"), w = as_int(x.size(3), "W");
  const int oh = as_int(y.size(2), "OH"), ow = as_int(y.size(3), "OW");
  as_int(int64_t{h} * w, "H*W");
  if (y.numel() == 0) return;
  const int dev = cuda::device_of(x);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("max_pool2d", cuda::check_same_dtype("max_pool2d", {&y, &x}), [&](auto tag) {
    using T = decltype(tag);
    max_pool2d_forward_kernel<<<grid_capped(y.numel()), cuda::kThreads, 0, stream>>>(
        cuda::elems<T>(y), idx.data<int64_t>(), cuda::elems<T>(x), planes, h, w, oh, ow, kernel, stride, pad);
  });
  MG_CUDA_CHECK_LAUNCH();
}

template <>
void max_pool2d_backward<Cuda>(Tensor& dx, const Tensor& dy, const Tensor& idx, int kernel, int stride, int pad) {
  const int64_t planes = dx.size(0) * dx.size(1);
  const int h = as_int(dx.size(2), "H"), w = as_int(dx.size(3), "W");
  const int oh = as_int(dy.size(2), "OH"), ow = as_int(dy.size(3), "OW");
  as_int(int64_t{h} * w, "H*W");
  MG_CHECK(kernel >= 1 && stride >= 1 && pad >= 0, "max_pool2d backward: kernel " << kernel << ", stride " << stride
                                                       << ", padding " << pad);
  if (dx.numel() == 0) return;
  const int dev = cuda::device_of(dx);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("max_pool2d", cuda::check_same_dtype("max_pool2d", {&dx, &dy}), [&](auto tag) {
    using T = decltype(tag);
    max_pool2d_backward_kernel<<<grid_capped(dx.numel()), cuda::kThreads, 0, stream>>>(
        cuda::elems<T>(dx), cuda::elems<T>(dy), idx.data<int64_t>(), planes, h, w, oh, ow, kernel, stride, pad);
  });
  MG_CUDA_CHECK_LAUNCH();
}

template <> void adaptive_avg_pool2d_forward<Cuda>(Tensor& y, const Tensor& x) {
  const int64_t planes = x.size(0) * x.size(1);
  const int h = as_int(x.size(2), "H"), w = as_int(x.size(3), "W");
  const int oh = as_int(y.size(2), "OH"), ow = as_int(y.size(3), "OW");
  as_int(int64_t{h} * oh, "H*OH");
  as_int(int64_t{w} * ow, "W*OW");
  as_int(int64_t{h} * w, "H*W");
  as_int(int64_t{oh} * ow, "OH*OW");
  if (y.numel() == 0) return;
  MG_CHECK(h > 0 && w > 0, "adaptive_avg_pool2d: empty input plane " << shape_str(x.shape()));
  const int dev = cuda::device_of(x);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("adaptive_avg_pool2d", cuda::check_same_dtype("adaptive_avg_pool2d", {&y, &x}), [&](auto tag) {
    using T = decltype(tag);
    adaptive_avg_pool2d_forward_kernel<<<grid_capped(y.numel()), cuda::kThreads, 0, stream>>>(
        cuda::elems<T>(y), cuda::elems<T>(x), planes, h, w, oh, ow);
  });
  MG_CUDA_CHECK_LAUNCH();
}

template <> void adaptive_avg_pool2d_backward<Cuda>(Tensor& dx, const Tensor& dy) {
  const int64_t planes = dx.size(0) * dx.size(1);
  const int h = as_int(dx.size(2), "H"), w = as_int(dx.size(3), "W");
  const int oh = as_int(dy.size(2), "OH"), ow = as_int(dy.size(3), "OW");
  as_int(int64_t{h} * oh, "H*OH");
  as_int(int64_t{w} * ow, "W*OW");
  as_int(int64_t{h} * w, "H*W");
  as_int(int64_t{oh} * ow, "OH*OW");
  if (dx.numel() == 0) return;
  const int dev = cuda::device_of(dx);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("adaptive_avg_pool2d", cuda::check_same_dtype("adaptive_avg_pool2d", {&dx, &dy}), [&](auto tag) {
    using T = decltype(tag);
    adaptive_avg_pool2d_backward_kernel<<<grid_capped(dx.numel()), cuda::kThreads, 0, stream>>>(
        cuda::elems<T>(dx), cuda::elems<T>(dy), planes, h, w, oh, ow);
  });
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg
