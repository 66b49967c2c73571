// Element-wise kernels. All tensors contiguous of n elements, on one device; add, mul, scale and
// add_inplace in float32, bf16 or f16 (Note [cuda half kernels] in src/kernels/cuda/storage.cuh),
// the others float32.
//   add:          y = a + b            (=)
//   mul:          y = a * b            (=)
//   add_inplace:  y += x               (+=)  the gradient add-in-place used by accumulation
//   scale:        y = s * x            (=)   y may be x
//   fill:         y = v                (=)
//   sum_squares_into: out[slot] = sum over xs of sum(x^2), accumulated in double: one launch
//                 for a whole list of tensors (each block sums kChunk elements of one tensor into
//                 a partial), then one block adds the partials in a fixed order (deterministic).
//                 Nothing comes back to the host: the caller reads `out` when it needs the value.
//   store_scalar: out[slot] = x[0] as double, on the device (no host read)
//   zero_many:    zeroes a list of tensors in one launch (a block per kChunk elements)
//   copy_bytes:   cudaMemcpy(Async) between any two devices (host waits only when the host reads).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/multi_tensor.cuh"
#include "kernels/cuda/storage.cuh"
#include "kernels/elementwise.h"

namespace mg {
namespace {

template <class T> __global__ void add_forward_kernel(T* y, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    cuda::store(y, i, cuda::load(a, i) + cuda::load(b, i));
}

template <class T> __global__ void mul_forward_kernel(T* y, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    cuda::store(y, i, cuda::load(a, i) * cuda::load(b, i));
}

// y and x may differ in storage type (a float32 buffer taking a bf16 gradient).
template <class Y, class X> __global__ void add_inplace_kernel(Y* y, const X* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    cuda::store(y, i, cuda::load(y, i) + cuda::load(x, i));
}

template <class T> __global__ void scale_forward_kernel(T* y, const T* x, float s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    cuda::store(y, i, s * cuda::load(x, i));
}

template <class T> __global__ void fill_kernel(T* y, float v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    cuda::store(y, i, v);  // bf16/f16: the CPU's rounding of v
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

// Multi-tensor launches (src/kernels/cuda/multi_tensor.cuh): 256 tensors of one pointer each, ~6 KB.
constexpr int kMaxTensors = 256;
using ChunkList = cuda::ChunkList<1, kMaxTensors>;
static_assert(sizeof(ChunkList) <= 32764, "kernel arguments are limited to 32764 bytes");

__global__ void zero_many_kernel(const __grid_constant__ ChunkList l) {
  const cuda::Chunk c = cuda::chunk_of_block(l);
  float* x = l.ptr[0][c.tensor];
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) x[i] = 0.0f;
}

// partial[block_offset + b] = sum of squares of block b's chunk.
__global__ void sum_squares_partial_kernel(double* partial, const __grid_constant__ ChunkList l) {
  const cuda::Chunk c = cuda::chunk_of_block(l);
  const float* x = l.ptr[0][c.tensor];
  double s = 0.0;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) s += static_cast<double>(x[i]) * x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(double* out, const double* partial, int64_t count) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

__global__ void store_scalar_kernel(double* out, const float* x) { *out = static_cast<double>(*x); }

// Grids of at most this many blocks; the loops above stride over the rest.
constexpr int64_t kMaxBlocks = 4096;

unsigned grid_capped(int64_t n) { return cuda::grid_for(n < kMaxBlocks * cuda::kThreads ? n : kMaxBlocks * cuda::kThreads); }

// An event without timing on `device`, destroyed at scope exit: at once even if its work is
// still pending (the driver frees it when that work is done).
class OrderEvent {
 public:
  explicit OrderEvent(int device) {
    cuda::DeviceGuard on(device);
    MG_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming));
  }
  ~OrderEvent() { (void)cudaEventDestroy(e_); }
  OrderEvent(const OrderEvent&) = delete;
  OrderEvent& operator=(const OrderEvent&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// Between two GPUs, each with its own stream: the copy runs on the destination's stream after the
// work queued on the source's (the kernels writing src), and the source's stream waits for the
// copy before its next work (src's block may be freed and reused there while the copy reads it).
// Each record and wait runs on its stream's device: the legacy stream (null) is the current
// device's.
void copy_between_devices(Tensor& dst, int dst_dev, const Tensor& src, int src_dev) {
  const cudaStream_t dst_stream = cuda::stream(dst_dev), src_stream = cuda::stream(src_dev);
  OrderEvent written(src_dev), copied(dst_dev);
  {
    cuda::DeviceGuard on(src_dev);
    MG_CUDA_CHECK(cudaEventRecord(written.get(), src_stream));
  }
  cuda::DeviceGuard on(dst_dev);
  MG_CUDA_CHECK(cudaStreamWaitEvent(dst_stream, written.get(), 0));
  MG_CUDA_CHECK(cudaMemcpyPeerAsync(dst.raw_data(), dst_dev, src.raw_data(), src_dev, dst.nbytes(), dst_stream));
  MG_CUDA_CHECK(cudaEventRecord(copied.get(), dst_stream));
  cuda::DeviceGuard back(src_dev);
  MG_CUDA_CHECK(cudaStreamWaitEvent(src_stream, copied.get(), 0));
}

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
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("add", cuda::check_same_dtype("add", {&y, &a, &b}), [&](auto tag) {
    using T = decltype(tag);
    add_forward_kernel<<<grid_capped(n), cuda::kThreads, 0, stream>>>(cuda::elems<T>(y), cuda::elems<T>(a),
                                                                        cuda::elems<T>(b), n);
  });
  MG_CUDA_CHECK_LAUNCH();
}

template <> void mul_forward<Cuda>(Tensor& y, const Tensor& a, const Tensor& b) {
  check_same_numel("mul", y, a);
  check_same_numel("mul", y, b);
  const int64_t n = y.numel();
  if (n == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("mul", cuda::check_same_dtype("mul", {&y, &a, &b}), [&](auto tag) {
    using T = decltype(tag);
    mul_forward_kernel<<<grid_capped(n), cuda::kThreads, 0, stream>>>(cuda::elems<T>(y), cuda::elems<T>(a),
                                                                        cuda::elems<T>(b), n);
  });
  MG_CUDA_CHECK_LAUNCH();
}

template <> void add_inplace<Cuda>(Tensor& y, const Tensor& x) {
  check_same_numel("add_inplace", y, x);
  const int64_t n = y.numel();
  if (n == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("add_inplace", y.dtype(), [&](auto y_tag) {
    cuda::with_storage("add_inplace", x.dtype(), [&](auto x_tag) {
      using Y = decltype(y_tag);
      using X = decltype(x_tag);
      add_inplace_kernel<<<grid_capped(n), cuda::kThreads, 0, stream>>>(cuda::elems<Y>(y), cuda::elems<X>(x), n);
    });
  });
  MG_CUDA_CHECK_LAUNCH();
}

template <> void scale_forward<Cuda>(Tensor& y, const Tensor& x, float s) {
  check_same_numel("scale", y, x);
  const int64_t n = y.numel();
  if (n == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("scale", cuda::check_same_dtype("scale", {&y, &x}), [&](auto tag) {
    using T = decltype(tag);
    scale_forward_kernel<<<grid_capped(n), cuda::kThreads, 0, stream>>>(cuda::elems<T>(y), cuda::elems<T>(x), s, n);
  });
  MG_CUDA_CHECK_LAUNCH();
}

template <> void fill<Cuda>(Tensor& y, float v) {
  const int64_t n = y.numel();
  if (n == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::with_storage("fill", y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    fill_kernel<<<grid_capped(n), cuda::kThreads, 0, stream>>>(cuda::elems<T>(y), v, n);
  });
  MG_CUDA_CHECK_LAUNCH();
}

template <> void zero_many<Cuda>(const std::vector<Tensor>& ys) {
  if (ys.empty()) return;
  check_float_list("zero_many", ys, ys[0].device());
  const int dev = cuda::device_of(ys[0]);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::for_each_chunk_list<1, kMaxTensors>({&ys}, [&](const ChunkList& l, int64_t blocks) {
    zero_many_kernel<<<static_cast<unsigned>(blocks), cuda::kThreads, 0, stream>>>(l);
    MG_CUDA_CHECK_LAUNCH();
  });
}

template <> void sum_squares_into<Cuda>(const std::vector<Tensor>& xs, Tensor& out, int64_t slot) {
  check_stats_args("sum_squares_into", xs, out, slot);
  const int dev = cuda::device_of(out);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  int64_t total_blocks = 0;
  for (const Tensor& x : xs) total_blocks += (x.numel() + cuda::kChunk - 1) / cuda::kChunk;
  double* result = out.data<double>() + slot;
  if (total_blocks == 0) {
    MG_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(double), stream));
    return;
  }
  cuda::Workspace partial(dev, static_cast<size_t>(total_blocks) * sizeof(double));
  double* p = static_cast<double*>(partial.get());
  // One launch per kMaxTensors tensors, each writing its own range of the partials.
  int64_t offset = 0;
  cuda::for_each_chunk_list<1, kMaxTensors>({&xs}, [&](const ChunkList& l, int64_t blocks) {
    sum_squares_partial_kernel<<<static_cast<unsigned>(blocks), cuda::kThreads, 0, stream>>>(p + offset, l);
    MG_CUDA_CHECK_LAUNCH();
    offset += blocks;
  });
  sum_partials_kernel<<<1, cuda::kThreads, 0, stream>>>(result, p, total_blocks);
  MG_CUDA_CHECK_LAUNCH();
}

template <> void store_scalar<Cuda>(Tensor& out, int64_t slot, const Tensor& x) {
  check_store_scalar_args(out, slot, x);
  const int dev = cuda::device_of(out);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  store_scalar_kernel<<<1, 1, 0, stream>>>(out.data<double>() + slot, x.data<float>());
  MG_CUDA_CHECK_LAUNCH();
}

template <> void copy_bytes<Cuda>(Tensor& dst, const Tensor& src) {
  MG_CHECK(dst.nbytes() == src.nbytes(), "copy: " << src.nbytes() << " bytes into a tensor of "
                                                  << dst.nbytes() << " bytes");
  if (dst.nbytes() == 0) return;
  const bool to_host = dst.device().is_cpu();
  const int dev = to_host ? cuda::device_of(src) : cuda::device_of(dst);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  // Unified addressing lets the driver tell the directions apart (and route between GPUs).
  if (to_host) {
    // The host reads dst when this returns: wait for the copy, queued after the kernels writing src.
    MG_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDefault, stream));
    MG_CUDA_CHECK(cudaStreamSynchronize(stream));
    // The host waited for the stream here anyway: report what kernels flagged meanwhile.
    cuda::check_error_flag(dev);
  } else if (src.device().is_cuda() && cuda::device_of(src) != dev) {
    copy_between_devices(dst, dev, src, cuda::device_of(src));
  } else {
    // Into the device: the async copy stages pageable host memory before returning, so the
    // source may go at once, and the host does not wait for earlier kernels (cudaMemcpy would).
    MG_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDefault, stream));
  }
}

}  // namespace mg
