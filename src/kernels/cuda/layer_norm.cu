// Layer normalisation on CUDA (kernels/layer_norm.h): one warp per row for y and dx (row sums in
// float per lane, then a shuffle tree: the same order on every run, not the CPU's), one block per
// 32 columns for dw and db (each column's rows in order, onto the buffer when accumulating).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/layer_norm_math.h"
#include "kernels/layer_norm.h"

namespace mg {
namespace {

namespace math = cuda::math;
constexpr int kWarp = 32;

__device__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void layer_norm_forward_kernel(float* y, float* mean, float* rstd, const float* x, const float* w,
                                          const float* b, int64_t m, int64_t c, float eps) {
  const int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= m) return;
  const float* xr = x + r * c;
  float s = 0;
  for (int64_t j = lane; j < c; j += kWarp) s += xr[j];
  const float mu = warp_sum(s) / static_cast<float>(c);
  float sq = 0;
  for (int64_t j = lane; j < c; j += kWarp) sq += (xr[j] - mu) * (xr[j] - mu);
  const float rs = rsqrtf(warp_sum(sq) / static_cast<float>(c) + eps);
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
  float* yr = y + r * c;
  for (int64_t j = lane; j < c; j += kWarp) yr[j] = (xr[j] - mu) * rs * (w ? w[j] : 1.0f) + (b ? b[j] : 0.0f);
}

__global__ void layer_norm_dx_kernel(float* dx, const float* dy, const float* x, const float* w, const float* mean,
                                     const float* rstd, int64_t m, int64_t c) {
  const int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= m) return;
  const float *xr = x + r * c, *gr = dy + r * c;
  const float mu = mean[r], rs = rstd[r];
  float sg = 0, sgx = 0;
  for (int64_t j = lane; j < c; j += kWarp) {
    const float g = gr[j] * (w ? w[j] : 1.0f);
    sg += g;
    sgx += g * (xr[j] - mu) * rs;
  }
  const float mg = warp_sum(sg) / static_cast<float>(c), mgx = warp_sum(sgx) / static_cast<float>(c);
  float* dr = dx + r * c;
  for (int64_t j = lane; j < c; j += kWarp) {
    const float g = gr[j] * (w ? w[j] : 1.0f);
    dr[j] = rs * (g - mg - (xr[j] - mu) * rs * mgx);
  }
}

// dw and db: a block of kLnWarps warps per kLnCols columns, a tile of rows at a time through
// shared memory, each column's rows added in order (layer_norm_math.h, checked on the CPU).
__global__ void __launch_bounds__(math::kLnWarps * kWarp)
    layer_norm_dwdb_kernel(float* dw, float* db, const float* dy, const float* x, const float* mean, const float* rstd,
                           int64_t m, int64_t c, bool accumulate) {
  __shared__ float tile_g[math::kLnTileRows * math::kLnCols], tile_h[math::kLnTileRows * math::kLnCols];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t j0 = int64_t{blockIdx.x} * math::kLnCols, j = j0 + lane;
  float aw = 0.0f, ab = 0.0f;
  if (warp == 0 && j < c && accumulate) {
    aw = dw ? dw[j] : 0.0f;
    ab = db ? db[j] : 0.0f;
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
    if (dw) dw[j] = aw;
    if (db) db[j] = ab;
  }
}

const float* maybe(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }
float* maybe_mut(Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

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
      y.data<float>(), mean.data<float>(), rstd.data<float>(), x.data<float>(), maybe(w), maybe(b), m, c, eps);
  MG_CUDA_CHECK_LAUNCH();
}

template <>
void layer_norm_backward<Cuda>(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                               const Tensor& mean, const Tensor& rstd, bool accumulate) {
  const int64_t c = x.size(x.dim() - 1), m = c > 0 ? x.numel() / c : 0;
  if (c == 0) return;
  const int dev = cuda::device_of(dy);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  if (dx.defined() && m > 0) {
    layer_norm_dx_kernel<<<cuda::grid_for(m * kWarp), cuda::kThreads, 0, stream>>>(
        dx.data<float>(), dy.data<float>(), x.data<float>(), maybe(w), mean.data<float>(), rstd.data<float>(), m, c);
    MG_CUDA_CHECK_LAUNCH();
  }
  if (dw.defined() || db.defined()) {  // with no rows too: dw and db are then 0 (or kept, accumulating)
    const int64_t blocks = (c + math::kLnCols - 1) / math::kLnCols;
    MG_CHECK(blocks <= 2147483647, "layer_norm on CUDA: " << c << " columns exceed the grid limit");
    layer_norm_dwdb_kernel<<<static_cast<unsigned>(blocks), math::kLnWarps * kWarp, 0, stream>>>(
        maybe_mut(dw), maybe_mut(db), dy.data<float>(), x.data<float>(), mean.data<float>(), rstd.data<float>(), m, c,
        accumulate);
    MG_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace mg
