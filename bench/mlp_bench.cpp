// MLP 784-512-512-10 training step (SGD, cross-entropy) on one device: median step time,
// samples/s (from the median step, and over the whole timed run) and peak memory from the
// allocator. One JSON line per configuration on stdout.
//
//   build/bin/mlp_bench --device cpu --batch 64 --steps 200
//   build/bin/mlp_bench --device cpu --batch 16 --accum 4
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <iostream>

#include <sys/resource.h>

#include <minigrad/cuda.h>
#include <minigrad/minigrad.h>

#include "roofline.h"

// The process's peak resident set (Linux reports ru_maxrss in KiB), beside the allocator's figure.
static int64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

int main(int argc, char** argv) {
  CLI::App app{"libminigrad MLP training-step benchmark"};
  std::string device = "cpu";
  int64_t batch = 64, accum = 1;
  int steps = 200, warmup = 20;
  uint64_t seed = 0;
  app.add_option("--device", device, "cpu | cuda");
  app.add_option("--batch", batch, "micro-batch size")->check(CLI::PositiveNumber);
  app.add_option("--accum", accum, "micro-batches accumulated per optimizer step")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed optimizer steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", seed, "seed");
  std::string tf32 = "off";
  app.add_option("--tf32", tf32, "CUDA TF32: on (matmuls and convolutions) | off (FP32) | conv (convolutions only)")
      ->check(CLI::IsMember({"on", "off", "conv"}));
  bool roofline = true;
  app.add_option("--roofline", roofline, "CPU: measure the SGEMM rate (bench/roofline.h) and report the fraction of it reached");
  CLI11_PARSE(app, argc, argv);

  try {
    const mg::Device dev = mg::Device::parse(device);
    mg::cuda::set_tf32_matmul(tf32 == "on");
    mg::cuda::set_tf32_conv(tf32 != "off");
    mg::manual_seed(seed);
    auto model = mg::nn::make_mlp({784, 512, 512, 10});
    model->to(dev);
    mg::optim::SGD opt(model->parameters(), {.lr = 0.01f, .momentum = 0.9f});
    mg::Generator gen(seed + 1);
    // A pool of distinct batches, so the timing does not ride on one cached input.
    std::vector<std::pair<mg::Tensor, mg::Tensor>> pool;
    for (int i = 0; i < 8; ++i) {
      mg::Tensor x = mg::Tensor::uniform({batch, 784}, -1.0f, 1.0f, gen).to(dev);
      std::vector<int64_t> y(batch);
      for (int64_t j = 0; j < batch; ++j) y[j] = mg::philox_u32(seed + 7, i * batch + j) % 10;
      pool.emplace_back(x, mg::Tensor::from_vector(y, {batch}).to(dev));
    }
    const float inv_samples = 1.0f / static_cast<float>(batch * accum);
    size_t k = 0;
    float last_loss = 0.0f;
    auto step = [&]() {
      opt.zero_grad();
      for (int64_t m = 0; m < accum; ++m, ++k) {
        auto& [x, y] = pool[k % pool.size()];
        mg::Tensor loss = mg::cross_entropy(model->forward(x), y, mg::Reduction::sum);
        loss.backward();
        if (m == accum - 1 && (k / accum) % 50 == 0) last_loss = loss.item() / static_cast<float>(batch);
      }
      opt.step(inv_samples);
    };
    // The device finishes each step, optimizer update included, before the clock is read.
    auto wait = [&] {
      mg::synchronize(dev);
    };
    for (int i = 0; i < warmup; ++i) step();
    wait();
    mg::reset_peak_memory_stats(dev);
    std::vector<double> times, cpu_times;
    for (int i = 0; i < steps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      const std::clock_t c0 = std::clock();  // process CPU time, all threads: steadier on shared cores
      step();
      wait();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      cpu_times.push_back(static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
    }
    // Whole-run throughput: every timed step's samples over their summed wall time. On a shared
    // machine it is the honest figure: a step shorter than the scheduler's slice often runs
    // untouched, so the median step of one thread hides the third of the core the load takes.
    double total = 0.0;
    for (double t : times) total += t;
    std::sort(times.begin(), times.end());
    std::sort(cpu_times.begin(), cpu_times.end());
    const double median = times[times.size() / 2];
    const auto mem = mg::memory_stats(dev);
    nlohmann::json j = {{"framework", "libminigrad"},
                        {"workload", accum > 1 ? "mlp_b" + std::to_string(batch) + "x" + std::to_string(accum)
                                               : "mlp_b" + std::to_string(batch)},
                        {"device", dev.str()},
                        {"batch", batch},
                        {"accum", accum},
                        {"steps", steps},
                        {"median_step_s", median},
                        {"samples_per_s", static_cast<double>(batch * accum) / median},
                        {"run_samples_per_s", static_cast<double>(batch * accum * steps) / total},
                        {"median_step_cpu_s", cpu_times[cpu_times.size() / 2]},
                        {"min_step_s", times.front()},
                        {"peak_in_use_bytes", mem.peak_in_use},
                        {"peak_reserved_bytes", mem.peak_reserved},
                        {"peak_rss_bytes", peak_rss_bytes()},
                        {"loss", last_loss},
                        {"tf32", tf32}};
    if (dev.is_cpu()) {
      // 784-512-512-10: forward 2 F, backward 4 F multiply-adds per sample, minus the first layer's
      // input gradient (not computed), F = 784 * 512 + 512 * 512 + 512 * 10.
      const double fma_per_sample = 3.0 * (784 * 512 + 512 * 512 + 512 * 10) - 784 * 512;
      const double gflops = 2.0 * fma_per_sample * static_cast<double>(batch * accum) / median / 1e9;
      j["threads"] = mg::num_threads();
      j["gemm"] = mg::cpu::gemm_backend();
      j["gflops"] = gflops;
      if (roofline) {
        const double peak = mg::bench::sgemm_gflops();
        j["sgemm_gflops"] = peak;
        j["fraction_of_sgemm"] = gflops / peak;
      }
    }
    std::cout << j.dump() << std::endl;
  } catch (const mg::Error& e) {
    std::fprintf(stderr, "mlp_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
