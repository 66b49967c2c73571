// Layer normalisation on CUDA (kernels/layer_norm.h): one warp per row for y and dx (row sums in
// float per lane, then a shuffle tree: the same order on every run, not the CPU's), one block per
// 32 columns for dw and db (each column's rows in order, onto the buffer when accumulating).
// Every tensor but mean and rstd (float32) float32, bf16 or f16 (Note [cuda half kernels] in
// storage.cuh: Elems; autocast keeps the weight and bias float32), float32 math.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/layer_norm_math.h"
#include "kernels/cuda/storage.cuh"
#include "kernels/layer_norm.h"

namespace mg {
namespace {

namespace math = cuda::math;
constexpr int kWarp = 32;

__device__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The weight or bias at column j, or `none` for an undefined one.
__device__ float param(cuda::Elems p, int64_t j, float none) { return p.p ? cuda::load(p, j) : none; }

// Row r of x normalised into y, its mean and rstd kept: the body of both forward kernels, one
// warp a row (lane: the thread's lane).
__device__ void layer_norm_row(cuda::Elems y, float* mean, float* rstd, cuda::Elems x, cuda::Elems w, cuda::Elems b,
                               int64_t r, int64_t c, float eps, int lane) {
  const int64_t row = r * c;
  float s = 0;
  for (int64_t j = lane; j < c; j += kWarp) s += cuda::load(x, row + j);
  const float mu = warp_sum(s) / static_cast<float>(c);
  float sq = 0;
  for (int64_t j = lane; j < c; j += kWarp) {
    const float d = cuda::load(x, row + j) - mu;
    sq += d * d;
  }
  const float rs = rsqrtf(warp_sum(sq) / static_cast<float>(c) + eps);
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
  for (int64_t j = lane; j < c; j += kWarp)
    cuda::store(y, row + j, (cuda::load(x, row + j) - mu) * rs * param(w, j, 1.0f) + param(b, j, 0.0f));
}

__global__ void layer_norm_forward_kernel(cuda::Elems y, float* mean, float* rstd, cuda::Elems x, cuda::Elems w,
                                          cuda::Elems b, int64_t m, int64_t c, float eps) {
  const int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / kWarp;
  if (r < m) layer_norm_row(y, mean, rstd, x, w, b, r, c, eps, threadIdx.x % kWarp);
}

// s = a + b written (add_forward_kernel's values), then layer_norm_forward_kernel's row on it: each
// lane reads back, from its cache, the elements it wrote, so the bits are those of the two kernels.
__global__ void add_layer_norm_forward_kernel(cuda::Elems s, cuda::Elems y, float* mean, float* rstd, cuda::Elems a,
                                              cuda::Elems b, cuda::Elems w, cuda::Elems bias, int64_t m, int64_t c,
                                              float eps) {
  const int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= m) return;
  for (int64_t j = r * c + lane; j < (r + 1) * c; j += kWarp) cuda::store(s, j, cuda::load(a, j) + cuda::load(b, j));
  layer_norm_row(y, mean, rstd, s, w, bias, r, c, eps, lane);
}

// add_dx: dx += the value rounded to dx's dtype (kernels/layer_norm.h).
__global__ void layer_norm_dx_kernel(cuda::Elems dx, cuda::Elems dy, cuda::Elems x, cuda::Elems w, const float* mean,
                                     const float* rstd, int64_t m, int64_t c, bool add_dx) {
  const int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= m) return;
  const int64_t row = r * c;
  const float mu = mean[r], rs = rstd[r];
  float sg = 0, sgx = 0;
  for (int64_t j = lane; j < c; j += kWarp) {
    const float g = cuda::load(dy, row + j) * param(w, j, 1.0f);
    sg += g;
    sgx += g * (cuda::load(x, row + j) - mu) * rs;
  }
  const float mg = warp_sum(sg) / static_cast<float>(c), mgx = warp_sum(sgx) / static_cast<float>(c);
  for (int64_t j = lane; j < c; j += kWarp) {
    const float g = cuda::load(dy, row + j) * param(w, j, 1.0f);
    const float v = rs * (g - mg - (cuda::load(x, row + j) - mu) * rs * mgx);
    // __fadd_rn: never contracted with v's product into one FMA, so v is rounded first, as a
    // separate dx would hold it before add_inplace_kernel added it.
    cuda::store(dx, row + j, add_dx ? __fadd_rn(cuda::load(dx, row + j), half::rounded(dx.t, v)) : v);
  }
}

// dw and db: a block of kLnWarps warps per kLnCols columns, a tile of rows at a time through
// shared memory, each column's rows added in order (layer_norm_math.h, checked on the CPU).
__global__ void __launch_bounds__(math::kLnWarps * kWarp)
    layer_norm_dwdb_kernel(cuda::Elems dw, cuda::Elems db, cuda::Elems dy, cuda::Elems x, const float* mean,
                           const float* rstd, int64_t m, int64_t c, bool accumulate) {
  __shared__ float tile_g[math::kLnTileRows * math::kLnCols], tile_h[math::kLnTileRows * math::kLnCols];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t j0 = int64_t{blockIdx.x} * math::kLnCols, j = j0 + lane;
  float aw = 0.0f, ab = 0.0f;
  if (warp == 0 && j < c && accumulate) {
    aw = param(dw, j, 0.0f);
    ab = param(db, j, 0.0f);
  }
  for (int64_t r0 = 0; r0 < m; r0 += math::kLnTileRows) {
    for (int rr = warp; rr < math::kLnTileRows; rr += math::kLnWarps)
      math::layer_norm_tile_load(tile_g, tile_h, dy, x, mean, rstd, m, c, r0, j0, rr, lane);
    __syncthreads();
    if (warp == 0) {
      const int rows = static_cast<int>(m - r0 < math::kLnTileRows ? m - r0 : math::kLnTileRows);
      math::layer_norm_tile_add(&aw, &ab, tile_g, tile_h, rows, lane);
    }
    __syncthreads();
  }
  if (warp == 0 && j < c) {
    if (dw.p) cuda::store(dw, j, aw);
    if (db.p) cuda::store(db, j, ab);
  }
}

}  // namespace

template <>
void layer_norm_forward<Cuda>(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                              float eps) {
  const int64_t c = x.size(x.dim() - 1), m = c > 0 ? x.numel() / c : 0;
  if (m == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  layer_norm_forward_kernel<<<cuda::grid_for(m * kWarp), cuda::kThreads, 0, stream>>>(
      cuda::elems_of(y), mean.data<float>(), rstd.data<float>(), cuda::elems_of(x), cuda::elems_of(w),
      cuda::elems_of(b), m, c, eps);
  MG_CUDA_CHECK_LAUNCH();
}

template <>
void add_layer_norm_forward<Cuda>(Tensor& s, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                                  const Tensor& w, const Tensor& bias, float eps) {
  cuda::check_same_dtype("add", {&s, &a, &b});  // as add_forward takes them
  const int64_t c = a.size(a.dim() - 1), m = c > 0 ? a.numel() / c : 0;
  if (m == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  add_layer_norm_forward_kernel<<<cuda::grid_for(m * kWarp), cuda::kThreads, 0, stream>>>(
      cuda::elems_of(s), cuda::elems_of(y), mean.data<float>(), rstd.data<float>(), cuda::elems_of(a),
      cuda::elems_of(b), cuda::elems_of(w), cuda::elems_of(bias), m, c, eps);
  MG_CUDA_CHECK_LAUNCH();
}

template <>
void layer_norm_backward<Cuda>(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                               const Tensor& mean, const Tensor& rstd, bool accumulate, bool add_dx) {
  const int64_t c = x.size(x.dim() - 1), m = c > 0 ? x.numel() / c : 0;
  if (c == 0) return;
  const int dev = cuda::device_of(dy);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  if (dx.defined() && m > 0) {
    layer_norm_dx_kernel<<<cuda::grid_for(m * kWarp), cuda::kThreads, 0, stream>>>(
        cuda::elems_of(dx), cuda::elems_of(dy), cuda::elems_of(x), cuda::elems_of(w), mean.data<float>(),
        rstd.data<float>(), m, c, add_dx);
    MG_CUDA_CHECK_LAUNCH();
  }
  if (dw.defined() || db.defined()) {  // with no rows too: dw and db are then 0 (or kept, accumulating)
    const int64_t blocks = (c + math::kLnCols - 1) / math::kLnCols;
    MG_CHECK(blocks <= 2147483647, "layer_norm on CUDA: " << c << " columns exceed the grid limit");
    layer_norm_dwdb_kernel<<<static_cast<unsigned>(blocks), math::kLnWarps * kWarp, 0, stream>>>(
        cuda::elems_of(dw), cuda::elems_of(db), cuda::elems_of(dy), cuda::elems_of(x), mean.data<float>(),
        rstd.data<float>(), m, c, accumulate);
    MG_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace mg
