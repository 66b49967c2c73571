#include "kernels/optim.h"
#include "kernels/cuda/common.cuh"
namespace mg {
template <> void sgd_update<Cuda>(std::vector<Tensor>&, const std::vector<Tensor>&, std::vector<Tensor>&, const SgdHyper&) { MG_FAIL("CUDA kernel not yet written"); }
template <> void adam_update<Cuda>(std::vector<Tensor>&, const std::vector<Tensor>&, std::vector<Tensor>&, std::vector<Tensor>&, const AdamHyper&) { MG_FAIL("CUDA kernel not yet written"); }
}
