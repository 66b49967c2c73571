// Fused optimizer updates: one launch updates every parameter of a step (for up to
// kMaxTensors parameters; longer lists take one launch per kMaxTensors), through the
// multi-tensor launch of src/kernels/cuda/multi_tensor.cuh. Formulas are PyTorch's, written exactly as the CPU kernels (src/kernels/cpu/optim.cpp), in
// src/kernels/cuda/optim_math.h (tested on the CPU against them):
//
// SGD:   g = s*grad + wd*p;  buf = first ? g : mu*buf + (1-dampening)*g;
//        g = nesterov ? g + mu*buf : buf (when mu != 0);  p -= lr*g                       (=)
// Adam:  g = s*grad (+ wd*p unless decoupled);  decoupled (AdamW): p *= 1 - lr*wd
//        m += (g - m)(1 - b1);  v = b2*v + (1-b2)*g^2
//        p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)                    (=)
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/optim_math.h"
#include "kernels/cuda/multi_tensor.cuh"
#include "kernels/optim.h"

namespace mg {
namespace {

// 96 tensors make the argument list 4.6 KB: over the classic 4 KB kernel-parameter limit,
// within the 32764 bytes that CUDA 12.1+ allows on sm_70 and newer (our targets: sm_80, sm_90).
// Pointer rows: 0 param, 1 grad, 2 SGD momentum / Adam exp_avg, 3 Adam exp_avg_sq.
constexpr int kMaxTensors = 96;
using TensorList = cuda::ChunkList<4, kMaxTensors>;

// The largest argument list (Adam's) must fit CUDA 12.1's kernel-parameter limit.
static_assert(sizeof(TensorList) + sizeof(AdamHyper) + 2 * sizeof(float) + 16 <= 32764,
              "fused optimizer arguments exceed the 32764-byte kernel parameter limit");

__global__ void sgd_update_kernel(const __grid_constant__ TensorList l, SgdHyper h) {
  const cuda::Chunk c = cuda::chunk_of_block(l);
  float* p = l.ptr[0][c.tensor];
  const float* g = l.ptr[1][c.tensor];
  float* buf = l.ptr[2][c.tensor];
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x)
    cuda::math::sgd_element(p + i, g[i], buf ? buf + i : nullptr, h);
}

__global__ void adam_update_kernel(const __grid_constant__ TensorList l, AdamHyper h, float step_size,
                                   float bias_c2_sqrt) {
  const cuda::Chunk c = cuda::chunk_of_block(l);
  float* p = l.ptr[0][c.tensor];
  const float* g = l.ptr[1][c.tensor];
  float* m = l.ptr[2][c.tensor];
  float* v = l.ptr[3][c.tensor];
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x)
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

}  // namespace

template <>
void sgd_update<Cuda>(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      std::vector<Tensor>& momentum_bufs, const SgdHyper& h) {
  const bool use_momentum = h.momentum != 0.0f;
  check_lists("sgd_update", params, grads, use_momentum ? &momentum_bufs : nullptr, nullptr);
  if (params.empty()) return;
  const int dev = cuda::device_of(params[0]);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::for_each_chunk_list<4, kMaxTensors>({&params, &grads, use_momentum ? &momentum_bufs : nullptr},
                                            [&](const TensorList& l, int64_t blocks) {
                                              const auto grid = static_cast<unsigned>(blocks);
                                              sgd_update_kernel<<<grid, cuda::kThreads, 0, stream>>>(l, h);
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
  const int dev = cuda::device_of(params[0]);
  cuda::DeviceGuard guard(dev);
  const cudaStream_t stream = cuda::stream(dev);
  cuda::for_each_chunk_list<4, kMaxTensors>({&params, &grads, &exp_avg, &exp_avg_sq}, [&](const TensorList& l,
                                                                                         int64_t blocks) {
    adam_update_kernel<<<static_cast<unsigned>(blocks), cuda::kThreads, 0, stream>>>(l, h, step_size, bias_c2_sqrt);
    MG_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mg
