// Pooling.  x: (N, C, H, W)   y: (N, C, OH, OW)   P = N*C planes; or channels last, (N, H, W, C)
// and (N, OH, OW, C), each plane's pixels C apart (one thread still per output or input element,
// in memory order, so neighbouring threads read neighbouring channels)
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

// Where the planes lie: (N, C, H, W), or channels last (N, H, W, C), where a plane's pixels are
// `channels` apart (its cs in pooling_math.h).
struct Planes {
  int64_t channels;
  bool nhwc;
  MG_HOST_DEVICE int64_t cs() const { return nhwc ? channels : 1; }
};

// Element e of a tensor of h x w planes: its image, channel, row and column.
struct At {
  int64_t n, c;
  int row, col;
};
__device__ At locate(int64_t e, int h, int w, Planes p) {
  if (!p.nhwc) {
    const int64_t plane = e / (int64_t{h} * w);
    return {plane / p.channels, plane % p.channels, static_cast<int>((e / w) % h), static_cast<int>(e % w)};
  }
  const int64_t pixel = e / p.channels;
  return {pixel / (int64_t{h} * w), e % p.channels, static_cast<int>((pixel / w) % h), static_cast<int>(pixel % w)};
}
// The offset of plane (a.n, a.c)'s first value in a tensor of h x w planes.
__device__ int64_t plane_start(At a, int h, int w, Planes p) {
  return p.nhwc ? a.n * h * w * p.channels + a.c : (a.n * p.channels + a.c) * h * w;
}

template <class T>
__global__ void max_pool2d_forward_kernel(T* y, int64_t* idx, const T* x, int64_t total, Planes p, int h, int w, int oh,
                                          int ow, int k, int s, int pad) {
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < total; o += int64_t{gridDim.x} * blockDim.x) {
    const At a = locate(o, oh, ow, p);
    float best = 0.0f;
    cuda::math::max_pool_window(x + plane_start(a, h, w, p), h, w, k, s, pad, a.row, a.col, &best, idx + o, p.cs());
    cuda::store(y, o, best);
  }
}

template <class T>
__global__ void max_pool2d_backward_kernel(T* dx, const T* dy, const int64_t* idx, int64_t total, Planes p, int h, int w,
                                           int oh, int ow, int k, int s, int pad) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const At a = locate(e, h, w, p);
    const int64_t out = plane_start(a, oh, ow, p);
    cuda::store(dx, e, cuda::math::max_pool_grad(dy + out, idx + out, w, oh, ow, k, s, pad, a.row, a.col, p.cs()));
  }
}

template <class T>
__global__ void adaptive_avg_pool2d_forward_kernel(T* y, const T* x, int64_t total, Planes p, int h, int w, int oh, int ow) {
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < total; o += int64_t{gridDim.x} * blockDim.x) {
    const At a = locate(o, oh, ow, p);
    cuda::store(y, o, cuda::math::adaptive_avg_window(x + plane_start(a, h, w, p), h, w, oh, ow, a.row, a.col, p.cs()));
  }
}

template <class T>
__global__ void adaptive_avg_pool2d_backward_kernel(T* dx, const T* dy, int64_t total, Planes p, int h, int w, int oh, int ow) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total; e += int64_t{gridDim.x} * blockDim.x) {
    const At a = locate(e, h, w, p);
    cuda::store(dx, e, cuda::math::adaptive_avg_grad(dy + plane_start(a, oh, ow, p), h, w, oh, ow, a.row, a.col, p.cs()));
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

// t's planes, height and width: (N, C, H, W) or (N, H, W, C).
struct Dims {
  Planes planes;
  int h, w;
};
Dims dims_of(const Tensor& t, bool nhwc) {
  return {Planes{t.size(nhwc ? 3 : 1), nhwc}, as_int(t.size(nhwc ? 1 : 2), "H"), as_int(t.size(nhwc ? 2 : 3), "W")};
}

}  // namespace

template <>
void max_pool2d_forward<Cuda>(Tensor& y, Tensor& idx, const Tensor& x, int kernel, int stride, int pad,
                              bool channels_last) {
  const Dims in = dims_of(x, channels_last), out = dims_of(y, channels_last);
  as_int(int64_t{in.h} * in.w, "H*W");
  if (y.numel() == 0) return;
  const int dev = cuda::device_of(x);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("max_pool2d", cuda::check_same_dtype("max_pool2d", {&y, &x}), [&](auto tag) {
    using T = decltype(tag);
    max_pool2d_forward_kernel<<<grid_capped(y.numel()), cuda::kThreads, 0, stream>>>(
        cuda::elems<T>(y), idx.data<int64_t>(), cuda::elems<T>(x), y.numel(), in.planes, in.h, in.w, out.h, out.w, kernel,
        stride, pad);
  });
  MG_CUDA_CHECK_LAUNCH();
}

template <>
void max_pool2d_backward<Cuda>(Tensor& dx, const Tensor& dy, const Tensor& idx, int kernel, int stride, int pad,
                               bool channels_last) {
  const Dims in = dims_of(dx, channels_last), out = dims_of(dy, channels_last);
  as_int(int64_t{in.h} * in.w, "H*W");
  MG_CHECK(kernel >= 1 && stride >= 1 && pad >= 0, "max_pool2d backward: kernel " << kernel << ", stride " << stride
                                                       << ", padding " << pad);
  if (dx.numel() == 0) return;
  const int dev = cuda::device_of(dx);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("max_pool2d", cuda::check_same_dtype("max_pool2d", {&dx, &dy}), [&](auto tag) {
    using T = decltype(tag);
    max_pool2d_backward_kernel<<<grid_capped(dx.numel()), cuda::kThreads, 0, stream>>>(
        cuda::elems<T>(dx), cuda::elems<T>(dy), idx.data<int64_t>(), dx.numel(), in.planes, in.h, in.w, out.h, out.w,
        kernel, stride, pad);
  });
  MG_CUDA_CHECK_LAUNCH();
}

namespace {
void check_adaptive(const Dims& in, const Dims& out) {
  as_int(int64_t{in.h} * out.h, "H*OH");
  as_int(int64_t{in.w} * out.w, "W*OW");
  as_int(int64_t{in.h} * in.w, "H*W");
  as_int(int64_t{out.h} * out.w, "OH*OW");
}
}  // namespace

template <> void adaptive_avg_pool2d_forward<Cuda>(Tensor& y, const Tensor& x, bool channels_last) {
  const Dims in = dims_of(x, channels_last), out = dims_of(y, channels_last);
  check_adaptive(in, out);
  if (y.numel() == 0) return;
  MG_CHECK(in.h > 0 && in.w > 0, "adaptive_avg_pool2d: empty input plane " << shape_str(x.shape()));
  const int dev = cuda::device_of(x);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("adaptive_avg_pool2d", cuda::check_same_dtype("adaptive_avg_pool2d", {&y, &x}), [&](auto tag) {
    using T = decltype(tag);
    adaptive_avg_pool2d_forward_kernel<<<grid_capped(y.numel()), cuda::kThreads, 0, stream>>>(
        cuda::elems<T>(y), cuda::elems<T>(x), y.numel(), in.planes, in.h, in.w, out.h, out.w);
  });
  MG_CUDA_CHECK_LAUNCH();
}

template <> void adaptive_avg_pool2d_backward<Cuda>(Tensor& dx, const Tensor& dy, bool channels_last) {
  const Dims in = dims_of(dx, channels_last), out = dims_of(dy, channels_last);
  check_adaptive(in, out);
  if (dx.numel() == 0) return;
  const int dev = cuda::device_of(dx);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("adaptive_avg_pool2d", cuda::check_same_dtype("adaptive_avg_pool2d", {&dx, &dy}), [&](auto tag) {
    using T = decltype(tag);
    adaptive_avg_pool2d_backward_kernel<<<grid_capped(dx.numel()), cuda::kThreads, 0, stream>>>(
        cuda::elems<T>(dx), cuda::elems<T>(dy), dx.numel(), in.planes, in.h, in.w, out.h, out.w);
  });
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg
