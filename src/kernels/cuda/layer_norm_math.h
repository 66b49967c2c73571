// The tile loads and sums of layer_norm.cu's dw and db kernel (kernels/layer_norm.h).
// Plain C++ (no CUDA headers; MG_HOST_DEVICE comes from minigrad/core/rng.h): layer_norm.cu
// calls them on the GPU, tests/test_cuda_kernel_math.cpp checks them on the CPU.
#pragma once

#include <cstdint>

#include <minigrad/core/rng.h>

#include "kernels/cuda/element_math.h"  // value(p, i): dy and x of any storage type

namespace mg::cuda::math {

// A block owns kLnCols columns, a lane each. Its kLnWarps warps copy a tile of kLnTileRows rows of
// dy and xhat into shared memory, then warp 0 adds the tile's rows in order onto its columns'
// sums: the CPU kernel's order of additions (each column's rows in order), so dw and db of
// micro-batches accumulated in order equal the big batch's, with the loads of eight warps in
// flight where one thread per column had its own.
constexpr int kLnCols = 32, kLnWarps = 8, kLnTileRows = 128;

// Row rr of the tile whose first row is r0, column j0 + lane: dy and xhat, 0 outside the matrix.
template <class G, class X>
MG_HOST_DEVICE void layer_norm_tile_load(float* tile_g, float* tile_h, G dy, X x, const float* mean, const float* rstd,
                                         int64_t m, int64_t c, int64_t r0, int64_t j0, int rr, int lane) {
  const int64_t r = r0 + rr, j = j0 + lane;
  const bool inside = r < m && j < c;
  tile_g[rr * kLnCols + lane] = inside ? value(dy, r * c + j) : 0.0f;
  tile_h[rr * kLnCols + lane] = inside ? (value(x, r * c + j) - mean[r]) * rstd[r] : 0.0f;
}

// The lane's column adds the tile's first `rows` rows in order: dw += dy xhat, db += dy.
MG_HOST_DEVICE void layer_norm_tile_add(float* aw, float* ab, const float* tile_g, const float* tile_h, int rows,
                                        int lane) {
  for (int rr = 0; rr < rows; ++rr) {
    const float g = tile_g[rr * kLnCols + lane];
    *aw += g * tile_h[rr * kLnCols + lane];
    *ab += g;
  }
}

}  // namespace mg::cuda::math
