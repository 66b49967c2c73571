// Compiled only into builds without the CUDA backend.
#include "core/allocator.h"
#include "core/device.h"
#include "kernels/cuda/settings.h"
#include "kernels/dispatch.h"

namespace mg {

bool cuda_available() { return false; }
int cuda_device_count() { return 0; }

Allocator& cuda_allocator(int) {
  MG_FAIL("this libminigrad was built without CUDA (configure with -DMINIGRAD_CUDA=ON on a machine "
          "with the CUDA toolkit)");
}

namespace detail {
void no_cuda_build(const char* what) {
  MG_FAIL(what << ": this libminigrad was built without CUDA, so CUDA tensors are not available");
}
}  // namespace detail

// The CUDA settings only record their value here (so a --tf32 flag costs a CPU build nothing).
namespace cuda {
namespace {
bool g_tf32_matmul = false, g_tf32_conv = true, g_benchmark = false;
size_t g_ws_limit = size_t{1} << 30;
}  // namespace
void set_tf32_matmul(bool allow) { g_tf32_matmul = allow; }
bool tf32_matmul() { return g_tf32_matmul; }
void set_tf32_conv(bool allow) { g_tf32_conv = allow; }
bool tf32_conv() { return g_tf32_conv; }
void set_cudnn_benchmark(bool on) { g_benchmark = on; }
bool cudnn_benchmark() { return g_benchmark; }
void set_conv_workspace_limit(size_t bytes) { g_ws_limit = bytes; }
size_t conv_workspace_limit() { return g_ws_limit; }
void synchronize(int) { detail::no_cuda_build("cuda::synchronize"); }
}  // namespace cuda

}  // namespace mg
