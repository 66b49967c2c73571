// Cross-entropy, fused log-softmax + negative log-likelihood.
//   logits: (N, C)   target: (N) int64 in [0, C) or ignore_index   loss: () scalar   probs: (N, C)
//   forward:  probs = softmax(logits) per row (saved for backward)                    (=)
//             row_loss[n] = log(sum_j exp(l[n,j] - max_n)) + max_n - l[n, target[n]]  (0 if ignored)
//             loss = sum_n row_loss[n]  (/ count for mean), summed in double in row order  (=)
//   backward: dlogits = dloss * (probs - onehot(target))  (/ count for mean; 0 if ignored) (=)
// One block per row (max, then sum of exponentials, block-wide). A target outside [0, C)
// cannot throw from a kernel: the kernel records the first bad (row, value) in the device's
// error flag and the next host synchronisation (a copy to the host, mg::synchronize)
// throws mg::Error naming them (src/kernels/cuda/context.cu). dloss stays on the device: backward
// reads it there, so a training step does not wait for the loss.
// bf16/f16 logits (Note [cuda half kernels] in src/kernels/cuda/storage.cuh), as on the CPU: no
// float32 probabilities are kept (`probs` is undefined in forward); backward gets the logits in
// their place and makes the probabilities again, one block per row; dlogits in the logits' dtype.
#include <cfloat>

#include "kernels/cross_entropy.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/storage.cuh"

namespace mg {
namespace {

template <class Op>
__device__ float block_reduce(float v, Op op, float* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] = op(sh[threadIdx.x], sh[threadIdx.x + s]);
    __syncthreads();
  }
  const float r = sh[0];
  __syncthreads();
  return r;
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// The row's maximum and sum of exp(l - max), block-wide.
template <class T> __device__ float2 row_max_sum(const T* l, int64_t c, float* sh) {
  float mx = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) mx = fmaxf(mx, cuda::load(l, j));
  mx = block_reduce(mx, MaxOp{}, sh);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) sum += expf(cuda::load(l, j) - mx);
  return {mx, block_reduce(sum, SumOp{}, sh)};
}

// probs may be null (bf16/f16 logits: backward makes them again).
template <class T>
__global__ void cross_entropy_forward_kernel(float* row_loss, float* probs, const T* logits, const int64_t* target,
                                             int64_t c, int64_t ignore_index, long long* error_flag) {
  __shared__ float sh[cuda::kThreads];
  const int64_t row = blockIdx.x;
  const T* l = logits + row * c;
  const float2 ms = row_max_sum(l, c, sh);
  const float mx = ms.x, sum = ms.y;
  if (probs != nullptr) {
    float* p = probs + row * c;
    const float inv = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) p[j] = expf(cuda::load(l, j) - mx) * inv;
  }
  if (threadIdx.x == 0) {
    const int64_t t = target[row];
    if (t == ignore_index) {
      row_loss[row] = 0.0f;
    } else if (t < 0 || t >= c) {
      if (atomicCAS(reinterpret_cast<unsigned long long*>(error_flag), 0ull,
                    static_cast<unsigned long long>(cuda::kFlagBadTarget)) == 0ull) {
        error_flag[1] = row;
        error_flag[2] = t;
      }
      row_loss[row] = 0.0f;
    } else {
      row_loss[row] = logf(sum) + mx - cuda::load(l, t);
    }
  }
}

__global__ void sum_rows_kernel(float* loss, float* count, const float* row_loss, const int64_t* target, int64_t n,
                                bool mean, int64_t ignore_index) {
  // Each thread sums a contiguous stretch of rows; the stretches are then added in order.
  __shared__ double sh[cuda::kThreads];
  __shared__ long long shc[cuda::kThreads];
  const int64_t per = (n + blockDim.x - 1) / blockDim.x;
  double s = 0.0;
  long long k = 0;
  for (int64_t i = threadIdx.x * per; i < n && i < (threadIdx.x + 1) * per; ++i) {
    s += row_loss[i];
    k += target[i] != ignore_index;
  }
  sh[threadIdx.x] = s;
  shc[threadIdx.x] = k;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    long long counted = 0;
    for (int j = 0; j < blockDim.x; ++j) {
      total += sh[j];
      counted += shc[j];
    }
    if (mean) total /= static_cast<double>(counted);
    *loss = static_cast<float>(total);
    *count = static_cast<float>(counted);
  }
}

__global__ void cross_entropy_backward_kernel(float* dlogits, const float* dloss, const float* probs, const float* count,
                                              const int64_t* target, int64_t n, int64_t c, bool mean,
                                              int64_t ignore_index) {
  const float g = mean ? *dloss / *count : *dloss;
  const int64_t total = n * c;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / c, j = i - row * c;
    dlogits[i] = target[row] == ignore_index ? 0.0f : g * (probs[i] - (j == target[row] ? 1.0f : 0.0f));
  }
}

// The same from the logits (bf16/f16): one block per row makes the row's probabilities again.
template <class T>
__global__ void cross_entropy_backward_logits_kernel(T* dlogits, const float* dloss, const T* logits,
                                                     const float* count, const int64_t* target, int64_t c, bool mean,
                                                     int64_t ignore_index) {
  __shared__ float sh[cuda::kThreads];
  const int64_t row = blockIdx.x;
  const T* l = logits + row * c;
  T* d = dlogits + row * c;
  const int64_t t = target[row];
  if (t == ignore_index) {
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) cuda::store(d, j, 0.0f);
    return;
  }
  const float g = mean ? *dloss / *count : *dloss;
  const float2 ms = row_max_sum(l, c, sh);
  const float inv = 1.0f / ms.y;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
    cuda::store(d, j, g * (expf(cuda::load(l, j) - ms.x) * inv - (j == t ? 1.0f : 0.0f)));
}

}  // namespace

template <>
void cross_entropy_forward<Cuda>(Tensor& loss, Tensor& probs, Tensor& count, const Tensor& logits,
                                 const Tensor& target, Reduction reduction, int64_t ignore_index) {
  const int64_t n = logits.size(0), c = logits.size(1);
  MG_CHECK(target.device() == logits.device(), "cross_entropy: target on " << target.device().str()
                                                   << ", logits on " << logits.device().str());
  MG_CHECK(c > 0, "cross_entropy: logits " << shape_str(logits.shape()) << " have no classes");
  MG_CHECK(n <= 2147483647, "cross_entropy on CUDA: " << n << " rows exceed the grid limit");
  const int dev = cuda::device_of(logits);
  cuda::DeviceGuard guard(dev);
  cuda::Context& ctx = cuda::context(dev);
  cuda::Workspace row_loss(dev, static_cast<size_t>(n) * sizeof(float));
  MG_CHECK(probs.defined() == (logits.dtype() == DType::f32),
           "cross_entropy on CUDA: float32 probabilities are kept for float32 logits only, got "
               << dtype_name(logits.dtype()) << " logits " << (probs.defined() ? "with" : "without") << " them");
  cuda::with_storage("cross_entropy", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_forward_kernel<<<static_cast<unsigned>(n), cuda::kThreads, 0, ctx.stream>>>(
        static_cast<float*>(row_loss.get()), probs.defined() ? probs.data<float>() : nullptr, cuda::elems<T>(logits),
        target.data<int64_t>(), c, ignore_index, ctx.error_flag);
  });
  MG_CUDA_CHECK_LAUNCH();
  sum_rows_kernel<<<1, cuda::kThreads, 0, ctx.stream>>>(loss.data<float>(), count.data<float>(),
                                                       static_cast<float*>(row_loss.get()), target.data<int64_t>(),
                                                       n, reduction == Reduction::mean, ignore_index);
  MG_CUDA_CHECK_LAUNCH();
}

template <>
void cross_entropy_backward<Cuda>(Tensor& dlogits, const Tensor& dloss, const Tensor& probs, const Tensor& count,
                                  const Tensor& target, Reduction reduction, int64_t ignore_index) {
  const int64_t n = probs.size(0), c = probs.size(1);
  MG_CHECK(dloss.device() == probs.device(), "cross_entropy backward: dloss on " << dloss.device().str()
                                                 << ", probs on " << probs.device().str());
  if (n * c == 0) return;
  const int dev = cuda::device_of(probs);
  cuda::DeviceGuard guard(dev);
  cuda::Context& ctx = cuda::context(dev);
  if (probs.dtype() != DType::f32) {  // `probs` holds the logits (see forward)
    cuda::with_storage("cross_entropy", cuda::check_same_dtype("cross_entropy", {&dlogits, &probs}), [&](auto tag) {
      using T = decltype(tag);
      cross_entropy_backward_logits_kernel<<<static_cast<unsigned>(n), cuda::kThreads, 0, ctx.stream>>>(
          cuda::elems<T>(dlogits), dloss.data<float>(), cuda::elems<T>(probs), count.data<float>(),
          target.data<int64_t>(), c, reduction == Reduction::mean, ignore_index);
    });
  } else {
    cross_entropy_backward_kernel<<<cuda::grid_for(n * c), cuda::kThreads, 0, ctx.stream>>>(
        dlogits.data<float>(), dloss.data<float>(), probs.data<float>(), count.data<float>(), target.data<int64_t>(),
        n, c, reduction == Reduction::mean, ignore_index);
  }
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg
