// Compiled only into builds without the CUDA backend.
#include "core/allocator.h"
#include <minigrad/core/device.h>
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
void cuda_host_free(void*) {}

namespace detail {
void no_cuda_build(const char* what) {
  MG_FAIL(what << ": this libminigrad was built without CUDA, so CUDA tensors are not available");
}
}  // namespace detail

void* cuda_offload_copy(void*, const void*, size_t, int, bool) { detail::no_cuda_build("offload"); }
void cuda_offload_wait(void*) {}

void synchronize_cuda(int) { detail::no_cuda_build("synchronize"); }
void* cuda_mark(int) { detail::no_cuda_build("profiler"); }
double cuda_mark_ms(void*, void*) { detail::no_cuda_build("profiler"); }
void cuda_mark_free(void*) {}

namespace cuda {
std::string lt_check_descriptors() { return "this libminigrad was built without CUDA"; }
LtCounts lt_counts() { return {}; }
std::string lt_refusal() { return ""; }
}  // namespace cuda

}  // namespace mg
