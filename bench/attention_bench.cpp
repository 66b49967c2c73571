// Causal self-attention's forward and backward kernels alone, at GPT-2's shapes, each variant timed
// on the same inputs and checked against the first (llm.c's dev/cuda habit: validate, then time).
// On CUDA two variants run: the tiles (Note [attention tiles] in src/kernels/cuda/attention.cu)
// and the row kernels, reached by giving them a qkv that starts one float past a 16-byte boundary,
// as any misaligned input would. On the CPU, the CPU kernel alone. With --dtype bf16 or f16 (CUDA):
// cuDNN's fused attention (attention_cudnn.cpp; "cudnn", where the build has it) and the fallback
// that widens to the float32 tiles ("widened", mg::cuda::set_cudnn_attention(false)), on the same
// rounded inputs; rel err is then the fallback's against cuDNN's.
//
//   build/bin/attention_bench --device cuda --batch 4 --seq-len 1024 --heads 12
//   build/bin/attention_bench --device cuda --batch 4 --seq-len 1024 --heads 12 --dtype bf16
//
// Times are medians over --reps runs, the host's clock around each run and a synchronisation
// (a run takes milliseconds, the clock's and the launch's overheads microseconds). FLOP/s count
// the products the causal math needs: forward 4 D per (query, key <= query) pair (q.k and p v),
// backward 2.5 times that (dq, dk, dv and the recomputed scores, as FlashAttention counts it).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include <minigrad/minigrad.h>

#include <minigrad/cuda.h>
#include "core/tape.h"  // rows_view
#include "kernels/attention.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/dispatch.h"
#include "rel_err.h"
#include "timing.h"

namespace {

// A copy of `t` on `dev` whose data starts 4 bytes past an aligned block.
mg::Tensor misaligned_copy(const mg::Tensor& t, mg::Device dev) {
  const int64_t n = t.numel();
  mg::Tensor v = mg::rows_view(mg::Tensor::empty({n + 1}, mg::TensorOptions{}.with_device(dev)), 1, n);
  v.impl().shape = t.shape();
  v.copy_(t);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"libminigrad causal self-attention kernels, forward and backward"};
  std::string device = "cuda";
  int64_t batch = 4, seq_len = 1024, heads = 12, head_size = 64;
  int reps = 20, warmup = 3;
  float dropout = 0.0f;
  std::string dtype_flag = "f32";
  app.add_option("--device", device, "cpu | cuda");
  app.add_option("--batch", batch, "samples")->check(CLI::PositiveNumber);
  app.add_option("--seq-len", seq_len, "positions T")->check(CLI::PositiveNumber);
  app.add_option("--heads", heads, "heads H")->check(CLI::PositiveNumber);
  app.add_option("--head-size", head_size, "channels per head D (the tiles take 64)")->check(CLI::PositiveNumber);
  app.add_option("--dropout", dropout, "attention dropout")->check(CLI::Range(0.0f, 0.99f));
  app.add_option("--dtype", dtype_flag, "f32 | bf16 | f16 (bf16/f16: cuDNN's fused attention and the fallback, CUDA)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  app.add_option("--reps", reps, "timed runs (median)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed runs first")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    const mg::Device dev = mg::Device::parse(device);
    const mg::DType dtype = dtype_flag == "bf16" ? mg::DType::bf16 : dtype_flag == "f16" ? mg::DType::f16 : mg::DType::f32;
    if (dtype != mg::DType::f32 && !dev.is_cuda()) throw mg::Error("--dtype " + dtype_flag + " needs --device cuda");
    const int64_t c = heads * head_size;
    mg::Generator gen(1);
    const mg::Tensor qkv_host = mg::Tensor::randn({batch, seq_len, 3 * c}, gen);
    const mg::Tensor dy_host = mg::Tensor::randn({batch, seq_len, c}, gen);
    const mg::AttentionDropout drop{dropout, 7, 0, 0};
    const mg::TensorOptions on{mg::TensorOptions{}.with_device(dev)};
    const double pairs = static_cast<double>(batch * heads) * static_cast<double>(seq_len) * (seq_len + 1) / 2;
    const double fwd_flop = 4.0 * head_size * pairs, bwd_flop = 2.5 * fwd_flop;
    std::printf("causal self-attention on %s: B %lld, T %lld, H %lld, D %lld, %s, dropout %g; median of %d runs\n",
                dev.str().c_str(), static_cast<long long>(batch), static_cast<long long>(seq_len),
                static_cast<long long>(heads), static_cast<long long>(head_size), mg::dtype_name(dtype),
                static_cast<double>(dropout), reps);
    std::printf("%-8s %12s %12s %14s %14s %12s\n", "variant", "forward ms", "backward ms", "fwd TFLOP/s",
                "bwd TFLOP/s", "rel err");
    struct Variant {
      const char* name;
      mg::Tensor qkv;
      bool cudnn = true;  // mg::cuda::cudnn_attention() while it runs
    };
    std::vector<Variant> variants;
    if (dtype != mg::DType::f32) {
      const mg::Tensor low = qkv_host.to(dtype).to(dev);
      if (mg::cuda::sdpa_built()) variants.push_back({"cudnn", low, true});
      else std::printf("this build has no cuDNN frontend: no cudnn variant\n");
      variants.push_back({"widened", low, false});
    } else {
      variants.push_back({dev.is_cuda() ? "tiles" : "cpu", qkv_host.to(dev)});
      if (dev.is_cuda()) variants.push_back({"rows", misaligned_copy(qkv_host, dev)});
    }
    const mg::Tensor dy = dy_host.to(dtype).to(dev);
    const mg::TensorOptions stored{mg::TensorOptions{dtype, dev}};
    mg::Tensor y0, dqkv0;
    const int h = static_cast<int>(heads);
    const bool cudnn_default = mg::cuda::cudnn_attention();
    for (const Variant& v : variants) {
      mg::cuda::set_cudnn_attention(v.cudnn);
      mg::Tensor y = mg::Tensor::empty({batch, seq_len, c}, stored), lse = mg::Tensor::empty({batch, heads, seq_len}, on);
      mg::Tensor dqkv = mg::Tensor::empty({batch, seq_len, 3 * c}, stored);
      bool wants_y = false;
      const mg::cuda::SdpaCounts before = mg::cuda::sdpa_counts();
      const double fwd =
          mg::bench::time_ms([&] { wants_y = MG_DISPATCH(dev, attention_forward, y, lse, v.qkv, h, drop); }, dev, warmup, reps)
              .median_ms;
      const mg::Tensor y_arg = wants_y ? y : mg::Tensor();
      const double bwd =
          mg::bench::time_ms([&] { MG_DISPATCH(dev, attention_backward, dqkv, dy, v.qkv, y_arg, lse, h, drop); }, dev, warmup, reps)
              .median_ms;
      const mg::cuda::SdpaCounts after = mg::cuda::sdpa_counts();
      if (v.cudnn && dtype != mg::DType::f32 && (after.forward == before.forward || after.backward == before.backward))
        std::printf("%s: cuDNN refused (forward %lld, backward %lld runs): %s\n", v.name,
                    static_cast<long long>(after.forward - before.forward),
                    static_cast<long long>(after.backward - before.backward), mg::cuda::sdpa_refusal().c_str());
      std::string err = "-";
      if (!y0.defined()) {
        y0 = y.cpu();
        dqkv0 = dqkv.cpu();
      } else {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.1e, %.1e", mg::bench::rel_err(y, y0), mg::bench::rel_err(dqkv, dqkv0));
        err = buf;
      }
      std::printf("%-8s %12.3f %12.3f %14.2f %14.2f %12s\n", v.name, fwd, bwd, fwd_flop / fwd / 1e9,
                  bwd_flop / bwd / 1e9, err.c_str());
    }
    mg::cuda::set_cudnn_attention(cudnn_default);
    if (variants.size() > 1) std::printf("rel err: y and dqkv against the first variant (2-norm of the difference over the first's)\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 1;
  }
}
