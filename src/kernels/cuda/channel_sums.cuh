// Per-channel sums of a channels-last tensor (M, C) on CUDA, deterministic and coalesced
// (Note [channels-last sums]): batch_norm.cu's statistics and backward sums, conv2d.cu's bias
// gradient. Included by .cu files only.
#pragma once

#include <cstdint>

#include <minigrad/core/tensor.h>
#include "kernels/cuda/common.cuh"

namespace mg::cuda {

// Note [channels-last sums]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Channels last, x is (M, C): a channel's values lie C apart. One block per channel (the
// channels-first kernels) would send a warp's 32 loads to 32 rows, a memory sector each. Here a
// block covers 32 channels by 8 rows, so a warp reads 32 neighbouring channels of one row; the M rows are dealt
// into `shares` fixed slices (blockIdx.y; the slice of row m is m / 8 mod shares), each slice's
// sums in double written apart, then added per channel in slice order. The shares depend on M
// only, so the sums are the same bits run after run and on any device.
constexpr int kTileC = 32, kTileRows = 8;

inline int64_t channel_shares(int64_t rows) {
  const int64_t s = (rows + 127) / 128;
  return s < 1 ? 1 : (s > 256 ? 256 : s);
}

template <class F>
__global__ void channel_slices_kernel(double2* slices, int64_t rows, int64_t channels, F f) {
  __shared__ double2 sh[kTileRows][kTileC];
  const int64_t c = int64_t{blockIdx.x} * kTileC + threadIdx.x;
  double2 s{0.0, 0.0};
  if (c < channels) {
    for (int64_t m = int64_t{blockIdx.y} * kTileRows + threadIdx.y; m < rows; m += int64_t{gridDim.y} * kTileRows) {
      const double2 v = f(m * channels + c, c);
      s.x += v.x;
      s.y += v.y;
    }
  }
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < channels) {
    for (int r = 1; r < kTileRows; ++r) {
      s.x += sh[r][threadIdx.x].x;
      s.y += sh[r][threadIdx.x].y;
    }
    slices[int64_t{blockIdx.y} * channels + c] = s;
  }
}

// totals[c]: channel c's slices added in slice order.
static __global__ void channel_totals_kernel(double2* totals, const double2* slices, int64_t shares, int64_t channels) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x) {
    double2 t{0.0, 0.0};
    for (int64_t r = 0; r < shares; ++r) {
      t.x += slices[r * channels + c].x;
      t.y += slices[r * channels + c].y;
    }
    totals[c] = t;
  }
}

// Channel c's sums of f over the rows, into totals[c] (Note [channels-last sums]); `slices` holds
// channel_shares(rows) * channels double2.
template <class F>
void channel_sums(double2* totals, double2* slices, int64_t rows, int64_t channels, F f, cudaStream_t stream) {
  const int64_t shares = channel_shares(rows);
  const dim3 grid(static_cast<unsigned>((channels + kTileC - 1) / kTileC), static_cast<unsigned>(shares));
  channel_slices_kernel<<<grid, dim3(kTileC, kTileRows), 0, stream>>>(slices, rows, channels, f);
  MG_CUDA_CHECK_LAUNCH();
  channel_totals_kernel<<<cuda::grid_for(channels), cuda::kThreads, 0, stream>>>(totals, slices, shares, channels);
  MG_CUDA_CHECK_LAUNCH();
}

// Scratch for channel_sums: the slices, the totals and the double means, in one float64 tensor.
struct ChannelScratch {
  Tensor t;
  double2 *slices, *totals;
  double* mu;
  ChannelScratch(int64_t rows, int64_t channels, Device d)
      : t(Tensor::empty({2 * channel_shares(rows) * channels + 3 * channels}, TensorOptions{DType::f64, d})) {
    double* p = t.data<double>();
    slices = reinterpret_cast<double2*>(p);
    totals = reinterpret_cast<double2*>(p + 2 * channel_shares(rows) * channels);
    mu = p + 2 * channel_shares(rows) * channels + 2 * channels;
  }
};

}  // namespace mg::cuda
