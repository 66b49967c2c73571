// Embedding on CUDA (kernels/embedding.h). Forward: one thread per output element. Backward, with
// no wait for the host: the positions are sorted by row on the device (CUB's radix sort, which is
// stable, so each row's positions stay in increasing order), each row's start is found by a
// binary search (embedding_math.h), then one thread per (row, channel) adds its row's positions in
// order: deterministic, no atomics, the CPU kernel's order of additions. The table, y, dy and dw
// each float32, bf16 or f16 (Note [cuda half kernels] in storage.cuh: Elems; autocast keeps the
// table float32 and makes y low), the sums float32.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/storage.cuh"
#include "kernels/cuda/embedding_math.h"
#include "kernels/embedding.h"

namespace mg {
namespace {

// The first bad index a kernel meets is the one synchronize() reports.
__device__ void flag_bad_index(long long* error_flag, int64_t p, int64_t t) {
  if (atomicCAS(reinterpret_cast<unsigned long long*>(error_flag), 0ull,
                static_cast<unsigned long long>(cuda::kFlagBadIndex)) == 0ull) {
    error_flag[1] = p;
    error_flag[2] = t;
  }
}

__global__ void embedding_forward_kernel(cuda::Elems y, const int64_t* idx, cuda::Elems w, int64_t n, int64_t v,
                                         int64_t c, long long* error_flag) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * c; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = i / c, j = i % c, t = idx[p];
    if (t < 0 || t >= v) {
      flag_bad_index(error_flag, p, t);
      cuda::store(y, i, 0.0f);
      continue;
    }
    cuda::store(y, i, cuda::load(w, t * c + j));
  }
}

__global__ void embedding_backward_kernel(cuda::Elems dw, cuda::Elems dy, const int64_t* offset, const int64_t* pos,
                                          int64_t v, int64_t c, bool accumulate) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < v * c; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / c, j = i % c;
    cuda::store(dw, i, cuda::math::embedding_grad(accumulate ? cuda::load(dw, i) : 0.0f, dy, offset, pos, r, j, c));
  }
}

// Sort keys (the rows; out-of-range indices flagged and keyed past every row) and positions.
__global__ void embedding_keys_kernel(uint64_t* key, int64_t* pos, const int64_t* idx, int64_t n, int64_t v,
                                      long long* error_flag) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < n; p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = idx[p];
    if (t < 0 || t >= v) flag_bad_index(error_flag, p, t);
    key[p] = cuda::math::embedding_key(t, v);
    pos[p] = p;
  }
}

// offset[r] for r in [0, v]: where row r's positions start in the sorted keys.
__global__ void embedding_offsets_kernel(int64_t* offset, const uint64_t* sorted, int64_t n, int64_t v) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r <= v; r += int64_t{gridDim.x} * blockDim.x)
    offset[r] = cuda::math::embedding_offset(sorted, n, r);
}

}  // namespace

template <> void embedding_forward<Cuda>(Tensor& y, const Tensor& idx, const Tensor& w) {
  const int64_t n = idx.numel(), v = w.size(0), c = w.size(1);
  if (n * c == 0) return;
  const int dev = cuda::device_of(y);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  embedding_forward_kernel<<<cuda::grid_for(n * c), cuda::kThreads, 0, stream>>>(
      cuda::elems_of(y), idx.data<int64_t>(), cuda::elems_of(w), n, v, c, cuda::context(dev).error_flag);
  MG_CUDA_CHECK_LAUNCH();
}

template <> void embedding_backward<Cuda>(Tensor& dw, const Tensor& dy, const Tensor& idx, bool accumulate) {
  const int64_t n = idx.numel(), v = dw.size(0), c = dw.size(1);
  if (v * c == 0) return;
  const int dev = cuda::device_of(dw);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  // Keys and positions in two buffers each, which the sort uses in turn (CUB's DoubleBuffer: no
  // copies of its own); the sorted ones are in whichever it names current at the end.
  const size_t keys_bytes = static_cast<size_t>(n) * sizeof(uint64_t), pos_bytes = static_cast<size_t>(n) * sizeof(int64_t);
  cuda::Workspace key_a(dev, keys_bytes), key_b(dev, keys_bytes), pos_a(dev, pos_bytes), pos_b(dev, pos_bytes);
  cuda::Workspace offset(dev, static_cast<size_t>(v + 1) * sizeof(int64_t));
  cub::DoubleBuffer<uint64_t> keys(static_cast<uint64_t*>(key_a.get()), static_cast<uint64_t*>(key_b.get()));
  cub::DoubleBuffer<int64_t> pos(static_cast<int64_t*>(pos_a.get()), static_cast<int64_t*>(pos_b.get()));
  if (n > 0) {
    embedding_keys_kernel<<<cuda::grid_for(n), cuda::kThreads, 0, stream>>>(
        keys.Current(), pos.Current(), idx.data<int64_t>(), n, v, cuda::context(dev).error_flag);
    MG_CUDA_CHECK_LAUNCH();
    const int bits = cuda::math::embedding_key_bits(v);
    size_t temp_bytes = 0;
    MG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, pos, n, 0, bits, stream));
    cuda::Workspace temp(dev, temp_bytes);
    MG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, keys, pos, n, 0, bits, stream));
  }
  const uint64_t* sorted_keys = keys.Current();
  const int64_t* sorted_pos = pos.Current();
  auto* off = static_cast<int64_t*>(offset.get());
  embedding_offsets_kernel<<<cuda::grid_for(v + 1), cuda::kThreads, 0, stream>>>(off, sorted_keys, n, v);
  MG_CUDA_CHECK_LAUNCH();
  embedding_backward_kernel<<<cuda::grid_for(v * c), cuda::kThreads, 0, stream>>>(
      cuda::elems_of(dw), cuda::elems_of(dy), off, sorted_pos, v, c, accumulate);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg
