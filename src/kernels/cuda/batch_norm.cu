// Batch normalisation on CUDA (kernels/batch_norm.h). Statistics and the backward's sums: one
// block per channel, each thread striding over the channel's M values in a fixed order and a
// fixed tree across the block, in double: deterministic. Channels last, tiles of 32 channels by 8
// rows instead (Note [channels-last sums] in channel_sums.cuh). Forward and dx: one thread per
// value.
// x, y, dx, dy, the weight, the bias and their gradients each float32, bf16 or f16 (Note [cuda
// half kernels] in storage.cuh: Elems; autocast keeps the weight and bias float32); the
// statistics float32.
#include "kernels/batch_norm.h"
#include "kernels/cuda/channel_sums.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/storage.cuh"

namespace mg {
namespace {

constexpr int kReduceThreads = 256;

// The block's sum of v over its threads, a fixed tree; every thread gets it.
__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = kReduceThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  const double s = shared[0];
  __syncthreads();
  return s;
}

// Value k of channel c: image k / s, position k % s.
__device__ int64_t at(int64_t k, int64_t c, int64_t channels, int64_t s) { return (k / s * channels + c) * s + k % s; }

// The weight or bias of channel c, or `none` for an undefined one.
__device__ float param(cuda::Elems p, int64_t c, float none) { return p.p ? cuda::load(p, c) : none; }

__global__ void stats_kernel(float* mean, float* var, cuda::Elems x, int64_t n, int64_t channels, int64_t s) {
  __shared__ double shared[kReduceThreads];
  const int64_t c = blockIdx.x, m = n * s;
  double sum = 0;
  for (int64_t k = threadIdx.x; k < m; k += kReduceThreads) sum += cuda::load(x, at(k, c, channels, s));
  const double mu = m > 0 ? block_sum(sum, shared) / m : 0.0;
  double sq = 0;
  for (int64_t k = threadIdx.x; k < m; k += kReduceThreads) {
    const double d = cuda::load(x, at(k, c, channels, s)) - mu;
    sq += d * d;
  }
  const double v = block_sum(sq, shared);
  if (threadIdx.x == 0) {
    mean[c] = static_cast<float>(mu);
    var[c] = m > 0 ? static_cast<float>(v / m) : 0.0f;
  }
}

// relu: y = max(y, 0) as the ReLU kernel gives it (a NaN becomes 0), in the same pass.
__global__ void forward_kernel(cuda::Elems y, cuda::Elems x, cuda::Elems w, cuda::Elems b, const float* mean,
                               const float* var, float eps, int64_t total, int64_t channels, int64_t s, bool relu) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i / s % channels;
    const float r = rsqrtf(var[c] + eps);
    const float v = (cuda::load(x, i) - mean[c]) * r * param(w, c, 1.0f) + param(b, c, 0.0f);
    cuda::store(y, i, !relu || v > 0.0f ? v : 0.0f);
  }
}

// Per channel: sum dy and sum dy xhat, into dw / db (= or +=), and, for dx, into sums[2 c + 0/1].
__global__ void backward_sums_kernel(cuda::Elems dw, cuda::Elems db, float* sums, cuda::Elems dy, cuda::Elems x,
                                     const float* mean, const float* var, float eps, bool accumulate, int64_t n,
                                     int64_t channels, int64_t s) {
  __shared__ double shared[kReduceThreads];
  const int64_t c = blockIdx.x, m = n * s;
  const float mu = mean[c], r = rsqrtf(var[c] + eps);
  double sb = 0, sw = 0;
  for (int64_t k = threadIdx.x; k < m; k += kReduceThreads) {
    const int64_t i = at(k, c, channels, s);
    const float g = cuda::load(dy, i);
    sb += g;
    sw += static_cast<double>(g) * ((cuda::load(x, i) - mu) * r);
  }
  const double tb = block_sum(sb, shared), tw = block_sum(sw, shared);
  if (threadIdx.x == 0) {
    if (db.p) cuda::store(db, c, static_cast<float>(accumulate ? cuda::load(db, c) + tb : tb));
    if (dw.p) cuda::store(dw, c, static_cast<float>(accumulate ? cuda::load(dw, c) + tw : tw));
    sums[2 * c] = static_cast<float>(m > 0 ? tb / m : 0.0);
    sums[2 * c + 1] = static_cast<float>(m > 0 ? tw / m : 0.0);
  }
}

__global__ void backward_dx_kernel(cuda::Elems dx, cuda::Elems dy, cuda::Elems x, cuda::Elems w, const float* mean,
                                   const float* var, const float* sums, float eps, bool batch_stats, int64_t total,
                                   int64_t channels, int64_t s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i / s % channels;
    const float r = rsqrtf(var[c] + eps), k = r * param(w, c, 1.0f);
    if (!batch_stats) {
      cuda::store(dx, i, k * cuda::load(dy, i));
    } else {
      const float xhat = (cuda::load(x, i) - mean[c]) * r;
      cuda::store(dx, i, k * (cuda::load(dy, i) - sums[2 * c] - xhat * sums[2 * c + 1]));
    }
  }
}

// What is summed per value i = m C + c: x; (x - mean)^2; dy and dy xhat.
struct SumX {
  cuda::Elems x;
  __device__ double2 operator()(int64_t i, int64_t) const { return {cuda::load(x, i), 0.0}; }
};
struct SumSquaredDev {
  cuda::Elems x;
  const double* mu;
  __device__ double2 operator()(int64_t i, int64_t c) const {
    const double d = cuda::load(x, i) - mu[c];
    return {d * d, 0.0};
  }
};
struct SumGrads {
  cuda::Elems dy, x;
  const float *mean, *var;
  float eps;
  __device__ double2 operator()(int64_t i, int64_t c) const {
    const float g = cuda::load(dy, i), r = rsqrtf(var[c] + eps);
    return {g, static_cast<double>(g) * ((cuda::load(x, i) - mean[c]) * r)};
  }
};

// Per channel: the mean (double for the second pass, float32 for the kernels), the biased
// variance, and the backward's sums as backward_sums_kernel writes them.
__global__ void mean_kernel(double* mu, float* mean, const double2* totals, int64_t channels, int64_t m) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x) {
    mu[c] = m > 0 ? totals[c].x / m : 0.0;
    mean[c] = static_cast<float>(mu[c]);
  }
}
__global__ void var_kernel(float* var, const double2* totals, int64_t channels, int64_t m) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x)
    var[c] = m > 0 ? static_cast<float>(totals[c].x / m) : 0.0f;
}
__global__ void grad_sums_kernel(cuda::Elems dw, cuda::Elems db, float* sums, const double2* totals, bool accumulate,
                                 int64_t channels, int64_t m) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x) {
    const double tb = totals[c].x, tw = totals[c].y;
    if (db.p) cuda::store(db, c, static_cast<float>(accumulate ? cuda::load(db, c) + tb : tb));
    if (dw.p) cuda::store(dw, c, static_cast<float>(accumulate ? cuda::load(dw, c) + tw : tw));
    sums[2 * c] = static_cast<float>(m > 0 ? tb / m : 0.0);
    sums[2 * c + 1] = static_cast<float>(m > 0 ? tw / m : 0.0);
  }
}

struct Shape3 {
  int64_t n, c, s;
};
// x as (N, C, S); channels last, (N S..., C) is (M, C, 1): the same kernels, a channel's values C apart.
Shape3 shape3(const Tensor& x, bool channels_last) {
  if (channels_last) {
    const int64_t c = x.size(x.dim() - 1);
    return {c > 0 ? x.numel() / c : 0, c, 1};
  }
  const int64_t n = x.size(0), c = x.size(1);
  return {n, c, n * c > 0 ? x.numel() / (n * c) : 0};
}

}  // namespace

template <> void batch_norm_stats<Cuda>(Tensor& mean, Tensor& var, const Tensor& x, bool channels_last) {
  const Shape3 d = shape3(x, channels_last);
  if (d.c == 0) return;
  const int dev = cuda::device_of(x);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  if (channels_last) {  // Note [channels-last sums]: the mean, then the squared deviations from it
    cuda::ChannelScratch scratch(d.n, d.c, x.device());
    cuda::channel_sums(scratch.totals, scratch.slices, d.n, d.c, SumX{cuda::elems_of(x)}, stream);
    mean_kernel<<<cuda::grid_for(d.c), cuda::kThreads, 0, stream>>>(scratch.mu, mean.data<float>(), scratch.totals, d.c, d.n);
    MG_CUDA_CHECK_LAUNCH();
    cuda::channel_sums(scratch.totals, scratch.slices, d.n, d.c, SumSquaredDev{cuda::elems_of(x), scratch.mu}, stream);
    var_kernel<<<cuda::grid_for(d.c), cuda::kThreads, 0, stream>>>(var.data<float>(), scratch.totals, d.c, d.n);
    MG_CUDA_CHECK_LAUNCH();
    return;
  }
  stats_kernel<<<static_cast<unsigned>(d.c), kReduceThreads, 0, stream>>>(
      mean.data<float>(), var.data<float>(), cuda::elems_of(x), d.n, d.c, d.s);
  MG_CUDA_CHECK_LAUNCH();
}

template <>
void batch_norm_forward<Cuda>(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& mean,
                              const Tensor& var, float eps, bool channels_last, bool relu) {
  const Shape3 d = shape3(x, channels_last);
  const int64_t total = y.numel();
  if (total == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  forward_kernel<<<cuda::grid_for(total), cuda::kThreads, 0, stream>>>(
      cuda::elems_of(y), cuda::elems_of(x), cuda::elems_of(w), cuda::elems_of(b), mean.data<float>(),
      var.data<float>(), eps, total, d.c, d.s, relu);
  MG_CUDA_CHECK_LAUNCH();
}

template <>
void batch_norm_backward<Cuda>(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                               const Tensor& mean, const Tensor& var, float eps, bool batch_stats, bool accumulate,
                               bool channels_last) {
  const Shape3 d = shape3(x, channels_last);
  if (d.c == 0) return;
  const int dev = cuda::device_of(x);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  Tensor sums = Tensor::empty({2 * d.c}, TensorOptions{DType::f32, x.device()});
  if (channels_last) {  // Note [channels-last sums]
    cuda::ChannelScratch scratch(d.n, d.c, x.device());
    cuda::channel_sums(scratch.totals, scratch.slices, d.n, d.c,
                       SumGrads{cuda::elems_of(dy), cuda::elems_of(x), mean.data<float>(), var.data<float>(), eps}, stream);
    grad_sums_kernel<<<cuda::grid_for(d.c), cuda::kThreads, 0, stream>>>(
        cuda::elems_of(dw), cuda::elems_of(db), sums.data<float>(), scratch.totals, accumulate, d.c, d.n);
  } else {
    backward_sums_kernel<<<static_cast<unsigned>(d.c), kReduceThreads, 0, stream>>>(
        cuda::elems_of(dw), cuda::elems_of(db), sums.data<float>(), cuda::elems_of(dy), cuda::elems_of(x),
        mean.data<float>(), var.data<float>(), eps, accumulate, d.n, d.c, d.s);
  }
  MG_CUDA_CHECK_LAUNCH();
  if (!dx.defined() || dx.numel() == 0) return;
  backward_dx_kernel<<<cuda::grid_for(dx.numel()), cuda::kThreads, 0, stream>>>(
      cuda::elems_of(dx), cuda::elems_of(dy), cuda::elems_of(x), cuda::elems_of(w), mean.data<float>(),
      var.data<float>(), sums.data<float>(), eps, batch_stats, dx.numel(), d.c, d.s);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg
