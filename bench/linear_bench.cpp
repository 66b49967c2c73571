// linear forward and forward+backward at GPT-2 124M's shapes (c_attn 768->2304, attn c_proj
// 768->768, c_fc 768->3072, mlp c_proj 3072->768) for B*T rows, in fp32, tf32 and bf16, through
// cuBLASLt's fused epilogues and through cublasGemmEx on the same inputs (Note [cublaslt products]
// in src/kernels/cuda/cublaslt.h). One JSON line per (shape, precision, path) and one per
// (precision, path) for the four together (one transformer layer's linears).
//
//   build/bin/linear_bench --device cuda --rows 4096,16384              # both paths, every precision
//   build/bin/linear_bench --device cuda --paths gemmex --precision bf16
//   build/bin/linear_bench --device cpu --rows 64 --reps 2               # the CPU's kernels, a smoke run
//
// A step is what training runs: y = linear(x, w, b) through the tape, then backward into dx and
// into gradient buffers that already exist (accumulate, as under an optimizer). bf16 runs under
// an AutocastGuard with float32 weights (their bf16 copies made once) and a bf16 x and dy, so the
// weight gradients land in float32. Each timed run queues --iters steps and waits once; times are
// per step, median and minimum over --reps runs. "rel_err_vs_first": y and the weight gradient
// against the first path's on the same inputs. "lt_runs"/"lt_refused": cuBLASLt's products during
// the path's runs (a refused fusion runs unfused, and "lt_refusal" says why; "lt_invalid": those
// refused for a descriptor cuBLASLt calls invalid, not for want of an algorithm). The layer line's
// "first_path_speedup": this path's fwd+bwd time over the first path's (lt's, by default).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <minigrad/core/autocast.h>
#include <minigrad/cuda.h>
#include <minigrad/minigrad.h>

#include "kernels/cuda/cublaslt.h"
#include "rel_err.h"
#include "timing.h"

namespace {

struct Shape {
  const char* name;
  int64_t in, out;
};
constexpr Shape kGpt2[] = {{"c_attn", 768, 2304}, {"attn_c_proj", 768, 768}, {"c_fc", 768, 3072}, {"mlp_c_proj", 3072, 768}};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"libminigrad linear at GPT-2 124M's shapes: cuBLASLt's epilogues against cublasGemmEx"};
  std::string device = "cuda", rows_flag = "4096", precisions_flag = "fp32,tf32,bf16", paths_flag = "lt,gemmex";
  int reps = 5, warmup = 2, iters = 10;
  app.add_option("--device", device, "cpu | cuda");
  app.add_option("--rows", rows_flag, "rows B*T, a comma-separated list (GPT-2: 4096 = 4 x 1024, 16384 = 16 x 1024)");
  app.add_option("--precision", precisions_flag, "fp32, tf32, bf16, comma-separated");
  app.add_option("--paths", paths_flag, "lt (cuBLASLt), gemmex (cublasGemmEx), comma-separated; CUDA only");
  app.add_option("--reps", reps, "timed runs (median, minimum)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--iters", iters, "steps queued per timed run")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    const mg::Device dev = mg::Device::parse(device);
    if (dev.is_cuda() && !mg::cuda_available())
      throw mg::Error("--device cuda: no CUDA device (" + mg::cuda_unavailable_reason() +
                      "); --device cpu runs the CPU's kernels");
    std::vector<int64_t> rows;
    for (const std::string& r : split(rows_flag)) rows.push_back(std::stoll(r));
    std::vector<mg::Precision> precisions;
    for (const std::string& p : split(precisions_flag)) {
      const mg::Precision prec = mg::parse_precision(p);
      if (prec == mg::Precision::fp16) throw mg::Error("--precision fp16: this benchmark times fp32, tf32 and bf16");
      precisions.push_back(prec);
    }
    std::vector<std::string> paths = dev.is_cuda() ? split(paths_flag) : std::vector<std::string>{"cpu"};
    for (const std::string& p : paths) {
      if (p != "lt" && p != "gemmex" && p != "cpu") throw mg::Error("--paths: expected lt or gemmex, got " + p);
    }
    const bool lt_default = mg::cuda::cublaslt(), tf32_default = mg::cuda::tf32_matmul();
    mg::Generator gen(1);
    for (const int64_t n : rows) {
      for (const mg::Precision prec : precisions) {
        mg::cuda::set_tf32_matmul(prec == mg::Precision::tf32);
        const mg::DType act = prec == mg::Precision::bf16 ? mg::DType::bf16 : mg::DType::f32;
        struct Total {
          double fwd = 0, step = 0, flop = 0;
        };
        std::vector<Total> totals(paths.size());
        for (const Shape& s : kGpt2) {
          mg::Tensor x = mg::Tensor::uniform({n, s.in}, -1.0f, 1.0f, gen).to(dev).to(act).requires_grad_();
          mg::Tensor w = mg::Tensor::uniform({s.out, s.in}, -0.05f, 0.05f, gen).to(dev).requires_grad_();
          mg::Tensor b = mg::Tensor::uniform({s.out}, -0.05f, 0.05f, gen).to(dev).requires_grad_();
          const mg::Tensor dy = mg::Tensor::uniform({n, s.out}, -1.0f, 1.0f, gen).to(dev).to(act);
          const double fwd_flop = 2.0 * static_cast<double>(n) * s.in * s.out;
          mg::Tensor y_first, dw_first;
          for (size_t p = 0; p < paths.size(); ++p) {
            mg::cuda::set_cublaslt(paths[p] != "gemmex");
            w.set_grad(mg::Tensor::zeros(w.shape(), mg::TensorOptions{}.with_device(dev)));
            b.set_grad(mg::Tensor::zeros(b.shape(), mg::TensorOptions{}.with_device(dev)));
            mg::AutocastGuard autocast(prec);  // around every step: the weights' bf16 copies made once
            const mg::cuda::LtCounts before = mg::cuda::lt_counts();
            const mg::bench::Timing fwd = mg::bench::time_ms(
                [&] {
                  mg::NoGradGuard no_grad;
                  mg::linear(x, w, b);
                },
                dev, warmup, reps, iters);
            const mg::bench::Timing step = mg::bench::time_ms(
                [&] {
                  x.set_grad(mg::Tensor());
                  mg::linear(x, w, b).backward(dy);
                },
                dev, warmup, reps, iters);
            const mg::cuda::LtCounts after = mg::cuda::lt_counts();
            // One more step from zeroed buffers, for the comparison between paths.
            w.grad().fill_(0.0f);
            b.grad().fill_(0.0f);
            mg::Tensor y = mg::linear(x, w, b);
            y.backward(dy);
            nlohmann::json j = {{"framework", "libminigrad"},
                                {"workload", std::string("linear_gpt2_") + s.name},
                                {"device", dev.str()},
                                {"precision", mg::precision_name(prec)},
                                {"path", paths[p]},
                                {"rows", n},
                                {"in", s.in},
                                {"out", s.out},
                                {"median_fwd_ms", fwd.median_ms},
                                {"min_fwd_ms", fwd.min_ms},
                                {"median_fwd_bwd_ms", step.median_ms},
                                {"min_fwd_bwd_ms", step.min_ms},
                                {"fwd_bwd_tflops", 3.0 * fwd_flop / step.median_ms * 1e-9},
                                {"lt_runs", after.runs - before.runs},
                                {"lt_refused", after.refused - before.refused},
                                {"lt_invalid", after.invalid - before.invalid}};
            if (after.refused > before.refused) j["lt_refusal"] = mg::cuda::lt_refusal();
            if (!y_first.defined()) {
              y_first = y.cpu();
              dw_first = w.grad().cpu();
            } else {
              j["rel_err_vs_first"] = {{"y", mg::bench::rel_err(y, y_first)}, {"dw", mg::bench::rel_err(w.grad(), dw_first)}};
            }
            std::cout << j.dump() << std::endl;
            totals[p].fwd += fwd.median_ms;
            totals[p].step += step.median_ms;
            totals[p].flop += 3.0 * fwd_flop;
          }
        }
        for (size_t p = 0; p < paths.size(); ++p) {
          nlohmann::json j = {{"framework", "libminigrad"},
                              {"workload", "linear_gpt2_layer"},
                              {"device", dev.str()},
                              {"precision", mg::precision_name(prec)},
                              {"path", paths[p]},
                              {"rows", n},
                              {"median_fwd_ms", totals[p].fwd},
                              {"median_fwd_bwd_ms", totals[p].step},
                              {"fwd_bwd_tflops", totals[p].flop / totals[p].step * 1e-9}};
          if (p > 0) j["first_path_speedup"] = totals[p].step / totals[0].step;  // > 1: the first path is faster
          std::cout << j.dump() << std::endl;
        }
      }
    }
    mg::cuda::set_cublaslt(lt_default);
    mg::cuda::set_tf32_matmul(tf32_default);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "linear_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
