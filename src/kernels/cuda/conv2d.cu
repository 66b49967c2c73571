// 2-D convolution through cuDNN's legacy (frontend-free) API, NCHW or NHWC.
//   x: (N, C, H, W)   w: (O, C, KH, KW)   b: (O)   y: (N, O, OH, OW)
//   channels_last: x (N, H, W, C), w (O, KH, KW, C), y (N, OH, OW, O): cuDNN's NHWC descriptors
//   for all three (its filter layout KRSC), which its tensor-core kernels read without the
//   transposes they run around NCHW (Note [channels last] in src/ops/conv2d.cpp).
//   OH = (H + 2 pad - KH) / stride + 1, likewise OW
//   forward:  y = b (broadcast), then y = conv(x, w) + y (cudnnConvolutionForward, beta = 1)   (=)
//   backward: dx = conv_transpose(dy, w) (cudnnConvolutionBackwardData)    (=), skipped if undefined
//             dw = corr(x, dy)  (cudnnConvolutionBackwardFilter, beta = accumulate)  (= or +=)
//             db = sum_{n,i,j} dy (cudnnConvolutionBackwardBias, beta = accumulate)  (= or +=)
// Storage (Note [cuda half kernels] in src/kernels/cuda/storage.cuh): x, w, b, y and dy all
// float32, or all bf16 or all f16 (cuDNN's "pseudo half" configurations: float32 sums, tensor
// cores), rounded once. Each gradient may be float32 under bf16/f16 operands (dw and db: a
// parameter's buffer; dx: a float32 input that autocast rounded): dw and dx then come from cuDNN
// in the operands' dtype, rounded once, and are added or widened into the float32 tensor (cuDNN's
// legacy API writes its outputs in its inputs' dtype, as PyTorch's autocast gets them); db is
// summed in float32 by our own kernel, straight into the buffer.
// Algorithms: chosen once per (device, shape, stride, pad, math mode, workspace limit, mode, determinism) and
// cached. Default: cuDNN's heuristics (cudnnGet*_v7); benchmark mode (set_cudnn_benchmark)
// times them all once (cudnnFind*Ex). Only algorithms whose workspace fits
// mg::cuda::conv_workspace_limit() are used; the workspace comes from the caching allocator.
// Math (Note [cuda math modes], docs/cuda.md): TF32 allowed by default (CUDNN_DEFAULT_MATH, as
// PyTorch's allow_tf32 for cuDNN), strict FP32 after set_tf32_conv(false) (CUDNN_FMA_MATH; an
// algorithm is then used only if cuDNN reports it runs in FMA math); bf16/f16 in tensor-op math
// (search_math).
// Note [deterministic convolutions]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Determinism: by default only algorithms cuDNN reports as
// CUDNN_DETERMINISTIC are used, so the same inputs give the same bits run after run: a
// checkpointed segment's replayed backward equals the plain one, and accumulation's exactness
// tests hold on the GPU. The backward fallbacks are then ALGO_1 (deterministic) instead of
// ALGO_0 (atomics). set_cudnn_deterministic(false) admits every algorithm.
#include <algorithm>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>

#include "kernels/conv2d.h"
#include "kernels/convert.h"
#include "kernels/cuda/channel_sums.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/conv_algos.h"
#include "kernels/cuda/conv_cudnn.h"
#include "kernels/cuda/storage.cuh"
#include "kernels/elementwise.h"
#include "kernels/relu.h"

namespace mg {
namespace {

struct ConvKey {
  int dev, n, c, h, w, o, kh, kw, stride, pad;
  DType dtype;  // of x, w, y and their gradients
  bool tf32, benchmark, deterministic, nhwc;
  size_t ws_limit;
  bool operator==(const ConvKey&) const = default;
};
struct ConvKeyHash {
  size_t operator()(const ConvKey& k) const {
    size_t hsh = 1469598103934665603ull;
    for (int v : {k.dev, k.n, k.c, k.h, k.w, k.o, k.kh, k.kw, k.stride, k.pad, static_cast<int>(k.dtype),
                  int{k.tf32}, int{k.benchmark}, int{k.deterministic}, int{k.nhwc}})
      hsh = (hsh ^ static_cast<size_t>(v)) * 1099511628211ull;
    return hsh ^ k.ws_limit;
  }
};

struct Choice {
  bool set = false;
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};
// How a choice was made, for mg::cuda::conv_algorithms() (kept beside it, not copied per call).
struct Notes {
  const char* how = "heuristic";
  int rank = -1;
  double time_ms = -1;
  std::vector<cuda::ConvAlgorithm::Skipped> skipped;
  uint64_t order = 0;  // when it was made
};
struct Entry {
  Choice choice;
  Notes notes;
};
struct ConvAlgos {
  Entry fwd, bwd_data, bwd_filter;
};

std::mutex g_cache_mu;
std::unordered_map<ConvKey, ConvAlgos, ConvKeyHash> g_cache;
uint64_t g_choices = 0;  // under g_cache_mu

// conv_algos.h names the algorithms and math types by these values.
static_assert(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM == 0 && CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED == 7 &&
              CUDNN_CONVOLUTION_FWD_ALGO_COUNT == 8 && CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING == 5);
static_assert(CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 == 1 && CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING == 3 &&
              CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT == 6);
static_assert(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 == 3 && CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING == 6 &&
              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT == 7);
static_assert(CUDNN_DEFAULT_MATH == 0 && CUDNN_TENSOR_OP_MATH == 1 && CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION == 2 &&
              CUDNN_FMA_MATH == 3);

cudnnDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    case DType::f16: return CUDNN_DATA_HALF;
    default: MG_FAIL("conv2d on CUDA: expected float32, bfloat16 or float16, got " << dtype_name(dtype));
  }
}

// Float32 operands in strict FP32 (FMA math only). bf16/f16 operands run on tensor cores whatever
// the TF32 switch: their products are exact in float32 either way.
bool strict_fp32(const ConvKey& k) { return k.dtype == DType::f32 && !k.tf32; }

// The math type a search (and a fallback) starts from: FMA only for strict FP32; the default for
// float32 with TF32 (which lets TF32 tensor cores in); tensor-op math for bf16/f16. cuDNN's default
// lets tensor cores in for TF32 only (cudnnMathType_t), so bf16/f16 searches under it would rank
// FMA kernels alone; PyTorch sets tensor-op math for half and bfloat16 data for the same reason.
cudnnMathType_t search_math(const ConvKey& k) {
  if (k.dtype != DType::f32) return CUDNN_TENSOR_OP_MATH;
  return k.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

// The key and the choice in words, for an error from cuDNN when a chosen algorithm runs.
std::string describe(const ConvKey& k, cuda::ConvPass pass, int algo, cudnnMathType_t math) {
  std::ostringstream os;
  os << "conv2d " << cuda::conv_pass_name(pass) << " of x (" << k.n << ", " << k.c << ", " << k.h << ", " << k.w
     << "), w (" << k.o << ", " << k.c << ", " << k.kh << ", " << k.kw << "), stride " << k.stride << ", pad " << k.pad
     << ", " << dtype_name(k.dtype) << (k.nhwc ? ", channels last" : "") << ": algorithm "
     << cuda::conv_algo_name(pass, algo) << ", " << cuda::cudnn_math_name(static_cast<int>(math)) << " math";
  return os.str();
}

// A chosen algorithm's run: cuDNN's status, with the case named where it fails.
#define MG_CUDNN_RUN(call, k, pass, choice)                                                                  \
  do {                                                                                                       \
    const cudnnStatus_t mg_run_ = (call);                                                                    \
    MG_CHECK(mg_run_ == CUDNN_STATUS_SUCCESS, describe(k, pass, (choice).algo, (choice).math)                 \
                                                  << ": cuDNN error " << static_cast<int>(mg_run_) << ": "   \
                                                  << cudnnGetErrorString(mg_run_));                          \
  } while (0)

// The descriptors of one call (creating them is a few host microseconds).
struct Descs {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, b = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  Descs(const ConvKey& k, int oh, int ow) {
    try {  // a throwing constructor runs no destructor: release what was created
      MG_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
      MG_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
      MG_CUDNN_CHECK(cudnnCreateTensorDescriptor(&b));
      MG_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
      MG_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
      const cudnnDataType_t type = data_type(k.dtype);
      // The sizes are always given as (n, c, h, w); the format says where they lie in memory.
      const cudnnTensorFormat_t format = k.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
      MG_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, format, type, k.n, k.c, k.h, k.w));
      MG_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, format, type, k.n, k.o, oh, ow));
      MG_CUDNN_CHECK(cudnnSetTensor4dDescriptor(b, CUDNN_TENSOR_NCHW, type, 1, k.o, 1, 1));
      MG_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, type, format, k.o, k.c, k.kh, k.kw));
      MG_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, k.pad, k.pad, k.stride, k.stride, 1, 1,
                                                     CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
      reset_math(k);
      // Our output size (src/ops/) and cuDNN's must agree, or cuDNN reads or writes out of shape.
      int cn = 0, co = 0, ch = 0, cw = 0;
      MG_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv, x, w, &cn, &co, &ch, &cw));
      MG_CHECK(cn == k.n && co == k.o && ch == oh && cw == ow,
               "conv2d on CUDA: output (" << k.n << ", " << k.o << ", " << oh << ", " << ow << ") but cuDNN expects ("
                                          << cn << ", " << co << ", " << ch << ", " << cw << ")");
    } catch (...) {
      release();
      throw;
    }
  }
  ~Descs() { release(); }
  // Back to the key's math type: a choice made for one direction sets its own on `conv`, and the
  // next direction's search must not inherit it.
  void reset_math(const ConvKey& k) {
    MG_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, search_math(k)));
  }
  void release() noexcept {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (b) cudnnDestroyTensorDescriptor(b);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
  Descs(const Descs&) = delete;
  Descs& operator=(const Descs&) = delete;
};

// The first usable result of a cuDNN ranking (they come fastest first); `notes` gets its place and
// the runnable ones before it that were passed over. `timed`: the ranking is Find's, with times.
template <class Perf>
Choice pick(const Perf* perf, int count, const ConvKey& k, cuda::ConvPass pass, bool timed, Notes& notes) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;  // not for this shape: not worth a line
    const char* why = perf[i].memory > k.ws_limit                                        ? "workspace over the limit"
                      : strict_fp32(k) && perf[i].mathType != CUDNN_FMA_MATH             ? "not FMA math (strict FP32)"
                      : k.deterministic && perf[i].determinism != CUDNN_DETERMINISTIC    ? "not deterministic"
                                                                                         : nullptr;
    const double ms = timed ? static_cast<double>(perf[i].time) : -1.0;
    if (why != nullptr) {
      notes.skipped.push_back({cuda::conv_algo_name(pass, static_cast<int>(perf[i].algo)), perf[i].memory, ms, why});
      continue;
    }
    notes.rank = i;
    notes.time_ms = ms;
    return Choice{true, static_cast<int>(perf[i].algo), perf[i].mathType, perf[i].memory};
  }
  return Choice{};
}

// Where nothing fits the workspace limit: the ranked algorithm that needs the least workspace, of
// those the math and determinism allow (the limit is exceeded, as docs/cuda.md says it may be).
template <class Perf> Choice least_workspace(const Perf* perf, int count, const ConvKey& k, Notes& notes) {
  int best = -1;
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (strict_fp32(k) && perf[i].mathType != CUDNN_FMA_MATH) continue;
    if (k.deterministic && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
    if (best < 0 || perf[i].memory < perf[best].memory) best = i;
  }
  if (best < 0) return Choice{};
  notes.how = "least workspace, over the limit";
  notes.rank = best;
  return Choice{true, static_cast<int>(perf[best].algo), perf[best].mathType, perf[best].memory};
}

// Find's ranking replaced the heuristic's in `perf`: true; no room to time them: false (the
// heuristic's stands, Note [timing needs room]). `find` throws OutOfMemoryError for want of room.
template <class Find>
bool try_find(const ConvKey& k, Notes& notes, Find find) {
  if (!k.benchmark) return false;
  try {
    find();
    notes.how = "find";
    return true;
  } catch (const OutOfMemoryError&) {
    notes.how = "heuristic, no room to find";
    return false;
  }
}

// The largest workspace among the ranked algorithms that fit the limit (what Find needs).
template <class Perf>
size_t find_workspace(const Perf* perf, int count, const ConvKey& k) {
  size_t m = 0;
  for (int i = 0; i < count; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= k.ws_limit && perf[i].memory > m) m = perf[i].memory;
  return m;
}

constexpr int kMaxAlgos = 16;

// Note [timing needs room]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// With cudnn benchmark on, Find times every ranked algorithm in a
// workspace as large as the hungriest one needs (up to the workspace limit). On a full device, or
// under mg::set_memory_limit, that allocation can fail where running the convolution would not:
// the choice then falls back to cuDNN's heuristic ranking (cudnnGet*_v7), as with benchmark off.

Entry choose_forward(cudnnHandle_t h, Descs& d, const ConvKey& k, const void* x, const void* w, void* y) {
  d.reset_math(k);
  cudnnConvolutionFwdAlgoPerf_t perf[kMaxAlgos];
  int count = 0;
  MG_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, kMaxAlgos, &count, perf));
  Notes notes;
  const bool timed = try_find(k, notes, [&] {  // Note [timing needs room]
    cuda::Workspace ws(k.dev, find_workspace(perf, count, k));
    MG_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, d.x, x, d.w, w, d.conv, d.y, y, kMaxAlgos, &count,
                                                          perf, ws.get(), ws.size()));
  });
  Choice c = pick(perf, count, k, cuda::ConvPass::forward, timed, notes);
  if (!c.set) c = least_workspace(perf, count, k, notes);
  if (!c.set) {  // implicit GEMM needs no workspace, for every shape
    notes.how = "fallback";
    c = Choice{true, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, search_math(k), 0};
    MG_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, c.math));
    MG_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y,
                                                           CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, &c.workspace));
  }
  return {c, std::move(notes)};
}

Entry choose_backward_data(cudnnHandle_t h, Descs& d, const ConvKey& k, const void* w, const void* dy, void* dx) {
  d.reset_math(k);
  cudnnConvolutionBwdDataAlgoPerf_t perf[kMaxAlgos];
  int count = 0;
  MG_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, kMaxAlgos, &count, perf));
  Notes notes;
  const bool timed = try_find(k, notes, [&] {  // Note [timing needs room]
    cuda::Workspace ws(k.dev, find_workspace(perf, count, k));
    MG_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w, w, d.y, dy, d.conv, d.x, dx, kMaxAlgos,
                                                               &count, perf, ws.get(), ws.size()));
  });
  Choice c = pick(perf, count, k, cuda::ConvPass::backward_data, timed, notes);
  if (!c.set) c = least_workspace(perf, count, k, notes);
  if (!c.set) {  // the last resort; its workspace (none, or little) is asked, not assumed
    notes.how = "fallback";
    // ALGO_0 adds with atomics (not deterministic); ALGO_1 is.
    const auto algo = k.deterministic ? CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 : CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
    c = Choice{true, algo, search_math(k), 0};
    MG_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, c.math));
    MG_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, algo, &c.workspace));
  }
  return {c, std::move(notes)};
}

Entry choose_backward_filter(cudnnHandle_t h, Descs& d, const ConvKey& k, const void* x, const void* dy,
                             size_t dw_bytes) {
  d.reset_math(k);
  cudnnConvolutionBwdFilterAlgoPerf_t perf[kMaxAlgos];
  int count = 0;
  MG_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, kMaxAlgos, &count, perf));
  Notes notes;
  const bool timed = try_find(k, notes, [&] {  // Note [timing needs room]
    // Find writes its output: time into scratch, since dw may hold gradients being accumulated.
    cuda::Workspace scratch(k.dev, dw_bytes);
    cuda::Workspace ws(k.dev, find_workspace(perf, count, k));
    MG_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d.x, x, d.y, dy, d.conv, d.w,
                                                                 scratch.get(), kMaxAlgos,
                                                                 &count, perf, ws.get(), ws.size()));
  });
  Choice c = pick(perf, count, k, cuda::ConvPass::backward_filter, timed, notes);
  if (!c.set) c = least_workspace(perf, count, k, notes);
  if (!c.set) {  // as for backward data: ALGO_0 (and ALGO_3) use atomics, ALGO_1 does not
    notes.how = "fallback";
    const auto algo = k.deterministic ? CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 : CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0;
    c = Choice{true, algo, search_math(k), 0};
    MG_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, c.math));
    MG_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, algo, &c.workspace));
  }
  return {c, std::move(notes)};
}

// Where the values of one channel lie in y or dy: `inner` consecutive ones (a plane, OH OW, in
// NCHW; one, in NHWC), every `channels * inner`.
struct ChannelRuns {
  int64_t channels, inner;
};
ChannelRuns channel_runs(const Tensor& y, bool nhwc) {
  return nhwc ? ChannelRuns{y.size(3), 1} : ChannelRuns{y.size(1), y.size(2) * y.size(3)};
}

// y[.., o, ..] = b[o]: the bias, before the convolution is added to it (one rounding in bf16/f16).
template <class T> __global__ void bias_channels_kernel(T* y, const T* b, int64_t total, ChannelRuns r) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = b[(i / r.inner) % r.channels];
}

// db[o] (+)= sum of channel o's `count` values in dy, in float32: one block per channel, each
// thread a fixed share and a fixed tree (deterministic).
template <class T, class G>
__global__ void bias_grad_kernel(G* db, const T* dy, int64_t count, ChannelRuns r, bool accumulate) {
  __shared__ float sh[cuda::kThreads];
  const int64_t o = blockIdx.x;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x)
    s += cuda::load(dy, (i / r.inner) * r.channels * r.inner + o * r.inner + i % r.inner);
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step >>= 1) {
    if (threadIdx.x < step) sh[threadIdx.x] += sh[threadIdx.x + step];
    __syncthreads();
  }
  if (threadIdx.x == 0) cuda::store(db, o, (accumulate ? cuda::load(db, o) : 0.0f) + sh[0]);
}

// Channels last: db (+)= the sums of dy's channels (Note [channels-last sums]), rounded once.
struct SumDy {
  cuda::Elems dy;
  __device__ double2 operator()(int64_t i, int64_t) const { return {cuda::load(dy, i), 0.0}; }
};
__global__ void bias_grad_store_kernel(cuda::Elems db, const double2* totals, int64_t channels, bool accumulate) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x)
    cuda::store(db, c, static_cast<float>(accumulate ? cuda::load(db, c) + totals[c].x : totals[c].x));
}

int as_int(int64_t v) {
  MG_CHECK(v >= 0 && v <= 2147483647, "conv2d on CUDA: size " << v << " exceeds cuDNN's int range");
  return static_cast<int>(v);
}

// y: the output (forward) or its gradient (backward).
ConvKey key_for(const Tensor& x, const Tensor& w, const Tensor& y, int stride, int pad, bool nhwc) {
  // cuDNN's legacy API indexes a tensor with int: at most 2^31 - 1 elements each.
  for (const Tensor* t : {&x, &y}) {
    MG_CHECK(t->numel() <= 2147483647, "conv2d on CUDA: a tensor of shape " << shape_str(t->shape()) << " has "
                                            << t->numel() << " elements, more than cuDNN's 2^31 - 1 "
                                            << "(split the batch, e.g. with gradient accumulation)");
  }
  MG_CHECK(x.numel() > 0 && w.numel() > 0, "conv2d on CUDA: input " << shape_str(x.shape()) << " and weight "
                                               << shape_str(w.shape()) << " must not be empty (cuDNN rejects "
                                               << "zero channels, rows, columns or kernel size)");
  // Dimension i of x (N, C, H, W) is dimension at[i] of the tensors; likewise for w.
  const int at[4] = {0, nhwc ? 3 : 1, nhwc ? 1 : 2, nhwc ? 2 : 3};
  ConvKey k{};
  k.dev = cuda::device_of(x);
  k.n = as_int(x.size(0));
  k.c = as_int(x.size(at[1]));
  k.h = as_int(x.size(at[2]));
  k.w = as_int(x.size(at[3]));
  k.o = as_int(w.size(0));
  k.kh = as_int(w.size(at[2]));
  k.kw = as_int(w.size(at[3]));
  k.nhwc = nhwc;
  k.stride = stride;
  k.pad = pad;
  k.dtype = x.dtype();
  k.tf32 = cuda::tf32_conv();
  k.benchmark = cuda::cudnn_benchmark();
  k.deterministic = cuda::cudnn_deterministic();
  k.ws_limit = cuda::conv_workspace_limit();
  return k;
}

// Looks up (or chooses and stores) one of the three algorithms of a key.
template <class Choose>
Choice cached(const ConvKey& k, Entry ConvAlgos::*which, Choose choose) {
  {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    auto it = g_cache.find(k);
    if (it != g_cache.end() && (it->second.*which).choice.set) return (it->second.*which).choice;
  }
  Entry e = choose();
  const Choice c = e.choice;
  std::lock_guard<std::mutex> lock(g_cache_mu);
  e.notes.order = g_choices++;
  g_cache[k].*which = std::move(e);
  return c;
}

}  // namespace

std::vector<cuda::ConvAlgorithm> cuda::conv_algorithms() {
  std::vector<std::pair<uint64_t, ConvAlgorithm>> out;
  std::lock_guard<std::mutex> lock(g_cache_mu);
  for (const auto& [k, algos] : g_cache) {
    for (const auto& [pass, e] : {std::pair{ConvPass::forward, &algos.fwd}, std::pair{ConvPass::backward_data, &algos.bwd_data},
                                  std::pair{ConvPass::backward_filter, &algos.bwd_filter}}) {
      if (!e->choice.set) continue;
      ConvAlgorithm a;
      a.device = k.dev;
      a.n = k.n, a.c = k.c, a.h = k.h, a.w = k.w, a.o = k.o, a.kh = k.kh, a.kw = k.kw, a.stride = k.stride, a.pad = k.pad;
      a.dtype = dtype_name(k.dtype);
      a.layout = k.nhwc ? "nhwc" : "nchw";
      a.pass = conv_pass_name(pass);
      a.algo = e->choice.algo;
      a.algo_name = conv_algo_name(pass, e->choice.algo);
      a.math = cudnn_math_name(static_cast<int>(e->choice.math));
      a.workspace_bytes = e->choice.workspace;
      a.how = e->notes.how;
      a.rank = e->notes.rank;
      a.time_ms = e->notes.time_ms;
      a.skipped = e->notes.skipped;
      a.tf32 = k.tf32, a.benchmark = k.benchmark, a.deterministic = k.deterministic, a.workspace_limit = k.ws_limit;
      out.emplace_back(e->notes.order, std::move(a));
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ConvAlgorithm> list;
  for (auto& [order, a] : out) list.push_back(std::move(a));
  return list;
}

template <>
void conv2d_forward<Cuda>(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, int stride, int pad,
                          bool channels_last, bool relu) {
  cuda::check_same_dtype("conv2d", {&y, &x, &w, &b});
  if (y.numel() == 0) return;
  // Note [fused relu]: cuDNN's conv+bias+relu graph where it takes the case; else the
  // convolution below and the ReLU kernel in place.
  if (relu && cuda::cudnn_conv_fusion() && cuda::conv_bias_relu_forward(y, x, w, b, stride, pad, channels_last)) return;
  const ConvKey k = key_for(x, w, y, stride, pad, channels_last);
  cuda::DeviceGuard guard(k.dev);
  cudnnHandle_t h = cuda::cudnn_handle(k.dev);
  Descs d(k, as_int(y.size(channels_last ? 1 : 2)), as_int(y.size(channels_last ? 2 : 3)));
  const Choice c = cached(k, &ConvAlgos::fwd, [&] { return choose_forward(h, d, k, x.raw_data(), w.raw_data(), y.raw_data()); });
  if (b.defined()) {  // after the choice: benchmark mode's timing writes y
    cuda::with_storage("conv2d", y.dtype(), [&](auto tag) {
      using T = decltype(tag);
      bias_channels_kernel<<<cuda::grid_for(y.numel()), cuda::kThreads, 0, cuda::stream(k.dev)>>>(
          cuda::elems<T>(y), cuda::elems<T>(b), y.numel(), channel_runs(y, channels_last));
    });
    MG_CUDA_CHECK_LAUNCH();
  }
  MG_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, c.math));
  cuda::Workspace ws(k.dev, c.workspace);
  const float one = 1.0f, beta = b.defined() ? 1.0f : 0.0f;
  MG_CUDNN_RUN(cudnnConvolutionForward(h, &one, d.x, x.raw_data(), d.w, w.raw_data(), d.conv,
                                       static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), ws.get(), ws.size(), &beta,
                                       d.y, y.raw_data()),
               k, cuda::ConvPass::forward, c);
  if (relu) relu_forward<Cuda>(y, y);
}

template <>
void conv2d_backward<Cuda>(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x,
                           const Tensor& w, int stride, int pad, bool accumulate, bool channels_last,
                           bool mask_dx) {
  const DType dtype = cuda::check_same_dtype("conv2d", {&dy, &x, &w});
  for (const Tensor* g : {&dx, &dw, &db}) {
    MG_CHECK(!g->defined() || g->dtype() == DType::f32 || g->dtype() == dtype,
             "conv2d on CUDA: a gradient must be float32 or " << dtype_name(dtype) << ", got " << dtype_name(g->dtype()));
  }
  const float one = 1.0f, zero = 0.0f;
  if (dy.numel() == 0) {  // an empty batch or no output channels: plain (=) outputs become zero
    if (dx.defined() && dx.numel() > 0) dx.fill_(0.0f);  // O = 0: dx sums over no channel
    if (!accumulate) {
      if (dw.defined()) dw.fill_(0.0f);
      if (db.defined()) db.fill_(0.0f);
    }
    return;
  }
  const ConvKey k = key_for(x, w, dy, stride, pad, channels_last);
  cuda::DeviceGuard guard(k.dev);
  cudnnHandle_t h = cuda::cudnn_handle(k.dev);
  Descs d(k, as_int(dy.size(channels_last ? 1 : 2)), as_int(dy.size(channels_last ? 2 : 3)));
  if (dx.defined()) {
    // A float32 dx under bf16/f16 operands (a float32 input autocast rounded) comes from a rounded
    // copy, as dw below.
    Tensor out = dx.dtype() != dtype ? Tensor::empty(dx.shape(), TensorOptions{dtype, dx.device()}) : dx;
    // Note [relu mask in the consumer]: cuDNN's dgrad+drelu graph where it is on and takes the
    // case; else the data gradient below and the ReLU's backward kernel in place, masking by x > 0.
    if (!mask_dx || !cuda::cudnn_dgrad_fusion() ||
        !cuda::conv_dgrad_relu_backward(out, dy, w, x, stride, pad, channels_last)) {
      const Choice c = cached(k, &ConvAlgos::bwd_data, [&] {
        return choose_backward_data(h, d, k, w.raw_data(), dy.raw_data(), out.raw_data());
      });
      MG_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, c.math));
      cuda::Workspace ws(k.dev, c.workspace);
      MG_CUDNN_RUN(cudnnConvolutionBackwardData(h, &one, d.w, w.raw_data(), d.y, dy.raw_data(), d.conv,
                                                static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), ws.get(),
                                                ws.size(), &zero, d.x, out.raw_data()),
                   k, cuda::ConvPass::backward_data, c);
      if (mask_dx) relu_backward<Cuda>(out, out, x);
    }
    if (dx.dtype() != dtype) convert<Cuda>(dx, out);
  }
  if (dw.defined()) {
    // cuDNN writes the operands' dtype: a float32 buffer under bf16/f16 operands takes the result
    // of a rounded copy (Note at the top).
    const bool widen = dw.dtype() != dtype;
    Tensor out = widen ? Tensor::empty(dw.shape(), TensorOptions{dtype, dw.device()}) : dw;
    const Choice c = cached(k, &ConvAlgos::bwd_filter, [&] {
      return choose_backward_filter(h, d, k, x.raw_data(), dy.raw_data(), out.nbytes());
    });
    MG_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, c.math));
    cuda::Workspace ws(k.dev, c.workspace);
    const float beta_w = accumulate && !widen ? 1.0f : 0.0f;
    MG_CUDNN_RUN(cudnnConvolutionBackwardFilter(h, &one, d.x, x.raw_data(), d.y, dy.raw_data(), d.conv,
                                                static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), ws.get(),
                                                ws.size(), &beta_w, d.w, out.raw_data()),
                 k, cuda::ConvPass::backward_filter, c);
    if (widen && accumulate) add_inplace<Cuda>(dw, out);
    else if (widen) convert<Cuda>(dw, out);
  }
  if (db.defined() && dtype == DType::f32 && !channels_last) {
    const float beta_b = accumulate ? 1.0f : 0.0f;
    MG_CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &one, d.y, dy.raw_data(), &beta_b, d.b, db.raw_data()));
  } else if (db.defined() && channels_last) {  // coalesced, over tiles of channels
    const int64_t rows = dy.numel() / k.o;
    cuda::ChannelScratch scratch(rows, k.o, dy.device());
    const cudaStream_t stream = cuda::stream(k.dev);
    cuda::channel_sums(scratch.totals, scratch.slices, rows, k.o, SumDy{cuda::elems_of(dy)}, stream);
    bias_grad_store_kernel<<<cuda::grid_for(k.o), cuda::kThreads, 0, stream>>>(cuda::elems_of(db), scratch.totals, k.o,
                                                                              accumulate);
    MG_CUDA_CHECK_LAUNCH();
  } else if (db.defined()) {  // in float32 from 16-bit dy
    cuda::with_storage("conv2d", dtype, [&](auto dy_tag) {
      cuda::with_storage("conv2d", db.dtype(), [&](auto db_tag) {
        using T = decltype(dy_tag);
        using G = decltype(db_tag);
        bias_grad_kernel<<<static_cast<unsigned>(k.o), cuda::kThreads, 0, cuda::stream(k.dev)>>>(
            cuda::elems<G>(db), cuda::elems<T>(dy), dy.numel() / k.o, channel_runs(dy, channels_last), accumulate);
      });
    });
    MG_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace mg
