// Fused optimizer updates: one launch updates every parameter of a step (for up to
// kMaxTensors parameters; longer lists take one launch per kMaxTensors). The tensor list travels
// as a kernel argument (pointers, sizes, and each tensor's first block), so nothing is copied
// to the device first and the host never waits. Each block updates kChunk elements of one
// tensor. Formulas are PyTorch's, written exactly as the CPU kernels (kernels/cpu/optim.cpp), in
// kernels/cuda/kernel_math.h (tested on the CPU against them):
//
// SGD:   g = s*grad + wd*p;  buf = first ? g : mu*buf + (1-dampening)*g;
//        g = nesterov ? g + mu*buf : buf (when mu != 0);  p -= lr*g                       (=)
// Adam:  g = s*grad (+ wd*p unless decoupled);  decoupled (AdamW): p *= 1 - lr*wd
//        m += (g - m)(1 - b1);  v = b2*v + (1-b2)*g^2
//        p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)                    (=)
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_math.h"
#include "kernels/optim.h"

namespace mg {
namespace {

// 96 tensors make the argument struct 4.6 KB: over the classic 4 KB kernel-parameter limit,
// within the 32764 bytes that CUDA 12.1+ allows on sm_70 and newer (our targets: sm_80, sm_90).
constexpr int kMaxTensors = 96;
constexpr int kChunk = 4096;     // elements per block

struct TensorList {
  int count;
  float* p[kMaxTensors];
  const float* g[kMaxTensors];
  float* s1[kMaxTensors];  // SGD momentum / Adam exp_avg
  float* s2[kMaxTensors];  // Adam exp_avg_sq
  int64_t n[kMaxTensors];
  int64_t first_block[kMaxTensors + 1];
};

// The largest argument list (Adam's) must fit CUDA 12.1's kernel-parameter limit.
static_assert(sizeof(TensorList) + sizeof(AdamHyper) + 2 * sizeof(float) + 16 <= 32764,
              "fused optimizer arguments exceed the 32764-byte kernel parameter limit");

__global__ void sgd_update_kernel(const __grid_constant__ TensorList l, SgdHyper h) {
  const int t = cuda::math::tensor_of_block(l.first_block, l.count, blockIdx.x);
  const int64_t begin = (blockIdx.x - l.first_block[t]) * int64_t{kChunk};
  const int64_t end = min(begin + kChunk, l.n[t]);
  float* p = l.p[t];
  const float* g = l.g[t];
  float* buf = l.s1[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    cuda::math::sgd_element(p + i, g[i], buf ? buf + i : nullptr, h);
}

__global__ void adam_update_kernel(const __grid_constant__ TensorList l, AdamHyper h, float step_size,
                                   float bias_c2_sqrt) {
  const int t = cuda::math::tensor_of_block(l.first_block, l.count, blockIdx.x);
  const int64_t begin = (blockIdx.x - l.first_block[t]) * int64_t{kChunk};
  const int64_t end = min(begin + kChunk, l.n[t]);
  float* p = l.p[t];
  const float* g = l.g[t];
  float* m = l.s1[t];
  float* v = l.s2[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    cuda::math::adam_element(p + i, g[i], m + i, v + i, h, step_size, bias_c2_sqrt);
}

void check_lists(const char* op, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                 const std::vector<Tensor>* s1, const std::vector<Tensor>* s2) {
  MG_CHECK(grads.size() == params.size(), op << ": " << params.size() << " parameters but " << grads.size()
                                             << " gradients");
  if (s1) MG_CHECK(s1->size() == params.size(), op << ": " << s1->size() << " state buffers for "
                                                   << params.size() << " parameters");
  if (s2) MG_CHECK(s2->size() == params.size(), op << ": " << s2->size() << " state buffers for "
                                                   << params.size() << " parameters");
  const Device d = params.empty() ? Device::cuda() : params[0].device();
  for (size_t i = 0; i < params.size(); ++i) {
    auto same = [&](const Tensor& t, const char* what) {
      MG_CHECK(t.device() == d && t.numel() == params[i].numel(),
               op << ": " << what << " " << i << " is " << shape_str(t.shape()) << " on " << t.device().str()
                  << ", parameter " << i << " is " << shape_str(params[i].shape()) << " on " << d.str());
    };
    same(params[i], "parameter");
    same(grads[i], "gradient");
    if (s1) same((*s1)[i], "state");
    if (s2) same((*s2)[i], "state");
  }
}

// Calls launch(list, blocks) once per group of at most kMaxTensors non-empty tensors.
template <class Launch>
void for_each_group(std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<Tensor>* s1,
                    std::vector<Tensor>* s2, Launch launch) {
  TensorList l{};
  int64_t blocks = 0;
  auto flush = [&] {
    if (l.count == 0) return;
    l.first_block[l.count] = blocks;
    launch(l, blocks);
    l = TensorList{};
    blocks = 0;
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel();
    if (n == 0) continue;
    const int k = l.count++;
    l.p[k] = params[i].data<float>();
    l.g[k] = grads[i].data<float>();
    l.s1[k] = s1 ? (*s1)[i].data<float>() : nullptr;
    l.s2[k] = s2 ? (*s2)[i].data<float>() : nullptr;
    l.n[k] = n;
    l.first_block[k] = blocks;
    blocks += (n + kChunk - 1) / kChunk;
    if (l.count == kMaxTensors) flush();
  }
  flush();
}

}  // namespace

template <>
void sgd_update<Cuda>(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      std::vector<Tensor>& momentum_bufs, const SgdHyper& h) {
  const bool use_momentum = h.momentum != 0.0f;
  check_lists("sgd_update", params, grads, use_momentum ? &momentum_bufs : nullptr, nullptr);
  if (params.empty()) return;
  cuda::DeviceGuard guard(cuda::device_of(params[0]));
  for_each_group(params, grads, use_momentum ? &momentum_bufs : nullptr, nullptr,
                 [&](const TensorList& l, int64_t blocks) {
                   MG_CHECK(blocks < (int64_t{1} << 31), "sgd_update: too many elements for one launch");
                   sgd_update_kernel<<<static_cast<unsigned>(blocks), cuda::kThreads>>>(l, h);
                   MG_CUDA_CHECK_LAUNCH();
                 });
}

template <>
void adam_update<Cuda>(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                       std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq, const AdamHyper& h) {
  check_lists("adam_update", params, grads, &exp_avg, &exp_avg_sq);
  if (params.empty()) return;
  // The step-dependent scalars in double on the host, exactly as the CPU kernel.
  const double t = static_cast<double>(h.step);
  const float bias_c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta1), t));
  const float bias_c2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), t)));
  const float step_size = h.lr / bias_c1;
  cuda::DeviceGuard guard(cuda::device_of(params[0]));
  for_each_group(params, grads, &exp_avg, &exp_avg_sq, [&](const TensorList& l, int64_t blocks) {
    MG_CHECK(blocks < (int64_t{1} << 31), "adam_update: too many elements for one launch");
    adam_update_kernel<<<static_cast<unsigned>(blocks), cuda::kThreads>>>(l, h, step_size, bias_c2_sqrt);
    MG_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mg
