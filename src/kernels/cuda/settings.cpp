// The CUDA backend's run-time switches (minigrad/cuda.h). Plain C++, compiled into every
// build: without CUDA the setters only record the value, so a --tf32 flag costs a CPU build nothing.
#include <minigrad/cuda.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace mg::cuda {

namespace {
std::atomic<bool> g_tf32_matmul{false};
std::atomic<bool> g_tf32_conv{true};
std::atomic<bool> g_benchmark{false};
std::atomic<bool> g_deterministic{true};
std::atomic<size_t> g_ws_limit{size_t{1} << 30};
// A switch that is on unless the environment variable is "0", read once at start.
bool on_unless_zero(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}
std::atomic<bool> g_cudnn_attention{on_unless_zero("MG_CUDNN_ATTENTION")};
std::atomic<bool> g_cublaslt{on_unless_zero("MG_CUBLASLT")};
std::atomic<bool> g_conv_fusion{on_unless_zero("MG_CUDNN_CONV_FUSION")};
std::atomic<bool> g_dgrad_fusion{[] {
  const char* v = std::getenv("MG_CUDNN_DGRAD_FUSION");  // off unless "1"
  return v != nullptr && std::strcmp(v, "1") == 0;
}()};
}  // namespace

void set_tf32_matmul(bool allow) { g_tf32_matmul = allow; }
bool tf32_matmul() { return g_tf32_matmul; }
void set_tf32_conv(bool allow) { g_tf32_conv = allow; }
bool tf32_conv() { return g_tf32_conv; }
void set_cudnn_benchmark(bool on) { g_benchmark = on; }
bool cudnn_benchmark() { return g_benchmark; }
void set_cudnn_deterministic(bool on) { g_deterministic = on; }
bool cudnn_deterministic() { return g_deterministic; }
void set_conv_workspace_limit(size_t bytes) { g_ws_limit = bytes; }
size_t conv_workspace_limit() { return g_ws_limit; }
void set_cudnn_attention(bool on) { g_cudnn_attention = on; }
bool cudnn_attention() { return g_cudnn_attention; }
void set_cublaslt(bool on) { g_cublaslt = on; }
bool cublaslt() { return g_cublaslt; }
void set_cudnn_conv_fusion(bool on) { g_conv_fusion = on; }
bool cudnn_conv_fusion() { return g_conv_fusion; }
void set_cudnn_dgrad_fusion(bool on) { g_dgrad_fusion = on; }
bool cudnn_dgrad_fusion() { return g_dgrad_fusion; }

}  // namespace mg::cuda
