// Compiled only into builds without the CUDA backend.
#include "core/allocator.h"
#include <minigrad/core/device.h>
#include <minigrad/cuda.h>
#include "core/staging.h"
#include "core/tape.h"
#include "kernels/cuda/cublaslt.h"
#include "kernels/dispatch.h"

namespace mg {

bool cuda_available() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() { return "this libminigrad was built without CUDA"; }

Allocator& cuda_allocator(int) {
  MG_FAIL("this libminigrad was built without CUDA (configure with -DMINIGRAD_CUDA=ON on a machine "
          "with the CUDA toolkit)");
}

void* cuda_host_alloc(size_t) { return nullptr; }
void* cuda_host_alloc_on(size_t, int) { return nullptr; }
void cuda_host_free(void*) noexcept {}

namespace detail {
void no_cuda_build(const char* what) {
  MG_FAIL(what << ": this libminigrad was built without CUDA, so CUDA tensors are not available");
}
}  // namespace detail

void* cuda_offload_copy(void*, const void*, size_t, int, bool) { detail::no_cuda_build("offload"); }
void cuda_offload_wait(void*) {}
void cuda_offload_wait_quietly(void*) noexcept {}
void* cuda_stage_mark(int) { detail::no_cuda_build("staged batches"); }
void* cuda_stage_copy(int, void*, const StageCopy*, size_t) { detail::no_cuda_build("staged batches"); }
void cuda_stage_join(int, void*) { detail::no_cuda_build("staged batches"); }
bool cuda_event_done(void*) { return true; }
void cuda_event_free(void*) {}

void synchronize_cuda(int) { detail::no_cuda_build("synchronize"); }
void* cuda_mark(int) { detail::no_cuda_build("profiler"); }
double cuda_mark_ms(void*, void*) { detail::no_cuda_build("profiler"); }
void cuda_mark_free(void*) {}

namespace cuda {
std::string lt_check_descriptors() { return "this libminigrad was built without CUDA"; }
LtCounts lt_counts() { return {}; }
std::string lt_refusal() { return ""; }
}  // namespace cuda
std::vector<cuda::ConvAlgorithm> cuda::conv_algorithms() { return {}; }  // no conv2d ran on a GPU

}  // namespace mg
