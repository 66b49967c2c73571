// Element-wise kernels. All tensors contiguous float32 of n elements, on one device.
//   add:          y = a + b            (=)
//   add_inplace:  y += x               (+=)  the gradient add-in-place used by accumulation
//   scale:        y = s * x            (=)   y may be x
//   fill:         y = v                (=)
//   sum_squares:  sum(x^2), accumulated in double: per-block partial sums, then one block adds
//                 the partials in a fixed order (deterministic); the host waits for the value.
//   copy_bytes:   cudaMemcpy(Async) between any two devices (host waits only when the host reads).
#include "kernels/cuda/common.cuh"
#include "kernels/elementwise.h"

namespace mg {
namespace {

__global__ void add_forward_kernel(float* y, const float* a, const float* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = a[i] + b[i];
}

__global__ void add_inplace_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] += x[i];
}

__global__ void scale_forward_kernel(float* y, const float* x, float s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = s * x[i];
}

__global__ void fill_kernel(float* y, float v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = v;
}

// Block-wide sum in shared memory; every thread gets the result.
__device__ double block_sum(double v) {
  __shared__ double sh[cuda::kThreads];
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}

__global__ void sum_squares_partial_kernel(double* partial, const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    s += static_cast<double>(x[i]) * x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(double* out, const double* partial, int count) {
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

// Grids of at most this many blocks; the loops above stride over the rest.
constexpr int64_t kMaxBlocks = 4096;

unsigned grid_capped(int64_t n) { return cuda::grid_for(n < kMaxBlocks * cuda::kThreads ? n : kMaxBlocks * cuda::kThreads); }

void check_same_numel(const char* op, const Tensor& y, const Tensor& x) {
  MG_CHECK(y.numel() == x.numel(), op << ": " << shape_str(y.shape()) << " and " << shape_str(x.shape())
                                      << " differ in size");
}

}  // namespace

template <> void add_forward<Cuda>(Tensor& y, const Tensor& a, const Tensor& b) {
  check_same_numel("add", y, a);
  check_same_numel("add", y, b);
  const int64_t n = y.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(cuda::device_of(y));
  add_forward_kernel<<<grid_capped(n), cuda::kThreads>>>(y.data<float>(), a.data<float>(), b.data<float>(), n);
  MG_CUDA_CHECK_LAUNCH();
}

template <> void add_inplace<Cuda>(Tensor& y, const Tensor& x) {
  check_same_numel("add_inplace", y, x);
  const int64_t n = y.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(cuda::device_of(y));
  add_inplace_kernel<<<grid_capped(n), cuda::kThreads>>>(y.data<float>(), x.data<float>(), n);
  MG_CUDA_CHECK_LAUNCH();
}

template <> void scale_forward<Cuda>(Tensor& y, const Tensor& x, float s) {
  check_same_numel("scale", y, x);
  const int64_t n = y.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(cuda::device_of(y));
  scale_forward_kernel<<<grid_capped(n), cuda::kThreads>>>(y.data<float>(), x.data<float>(), s, n);
  MG_CUDA_CHECK_LAUNCH();
}

template <> void fill<Cuda>(Tensor& y, float v) {
  const int64_t n = y.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(cuda::device_of(y));
  fill_kernel<<<grid_capped(n), cuda::kThreads>>>(y.data<float>(), v, n);
  MG_CUDA_CHECK_LAUNCH();
}

template <> double sum_squares<Cuda>(const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  const int dev = cuda::device_of(x);
  cuda::DeviceGuard guard(dev);
  const unsigned blocks = grid_capped(n);
  cuda::Workspace partial(dev, (blocks + 1) * sizeof(double));
  double* p = static_cast<double*>(partial.get());
  sum_squares_partial_kernel<<<blocks, cuda::kThreads>>>(p, x.data<float>(), n);
  MG_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, cuda::kThreads>>>(p + blocks, p, static_cast<int>(blocks));
  MG_CUDA_CHECK_LAUNCH();
  double result = 0.0;
  MG_CUDA_CHECK(cudaMemcpy(&result, p + blocks, sizeof(double), cudaMemcpyDeviceToHost));
  return result;
}

template <> void copy_bytes<Cuda>(Tensor& dst, const Tensor& src) {
  MG_CHECK(dst.nbytes() == src.nbytes(), "copy: " << src.nbytes() << " bytes into a tensor of "
                                                  << dst.nbytes() << " bytes");
  if (dst.nbytes() == 0) return;
  const bool to_host = dst.device().is_cpu();
  const int dev = to_host ? cuda::device_of(src) : cuda::device_of(dst);
  cuda::DeviceGuard guard(dev);
  // Unified addressing lets the driver tell the directions apart (and route between GPUs).
  if (to_host) {
    MG_CUDA_CHECK(cudaMemcpy(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDefault));
    // The host waited for the device here anyway: report what kernels flagged meanwhile.
    cuda::check_error_flag(dev);
  } else {
    // Into the device: the async copy stages pageable host memory before returning, so the
    // source may go at once, and the host does not wait for earlier kernels (cudaMemcpy would).
    MG_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDefault, cuda::kStream));
  }
}

}  // namespace mg
