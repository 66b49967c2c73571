// conv2d forward and forward+backward for each convolution of VGG16 (torchvision cfg D), channel
// widths divided by --width-div, on one device. Median and minimum times over --reps (the minimum
// is the steadier figure on a shared machine); one JSON line per layer and one for the sum, same
// schema as bench/reference/conv_bench_torch.py.
//
//   build/bin/conv_bench --batch 8 --width-div 8 --size 224
//   /usr/bin/python3 bench/reference/conv_bench_torch.py --batch 8 --width-div 8 --size 224
//
// Backward computes dx (except for the first layer, whose input is the image), dw and db, adding
// into existing gradient buffers as a training step would.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include <minigrad/minigrad.h>

#include "kernels/cpu/conv2d_onednn.h"
#include "roofline.h"
#include "timing.h"

namespace {

struct Layer {
  int64_t in, out, size;
};

// VGG16's 13 convolutions: 3x3, stride 1, padding 1, each stage halving the size.
std::vector<Layer> vgg16_convs(int64_t width_div, int64_t size) {
  const std::vector<std::vector<int64_t>> stages = {{64, 64}, {128, 128}, {256, 256, 256}, {512, 512, 512},
                                                    {512, 512, 512}};
  std::vector<Layer> layers;
  int64_t in = 3;
  for (const auto& stage : stages) {
    for (int64_t c : stage) {
      layers.push_back({in, c / width_div, size});
      in = c / width_div;
    }
    size /= 2;
  }
  return layers;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"libminigrad conv2d benchmark (VGG16 layers)"};
  std::string device = "cpu";
  int64_t batch = 8, width_div = 8, size = 224;
  int reps = 5, warmup = 1;
  app.add_option("--device", device, "cpu | cuda");
  app.add_option("--batch", batch, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--width-div", width_div, "divide VGG16's channel widths by this")->check(CLI::PositiveNumber);
  app.add_option("--size", size, "input height and width")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed repetitions per layer")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed repetitions first")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    const mg::Device dev = mg::Device::parse(device);
    mg::Generator gen(1);
    // Waits for all work on the device (not a copy of the result to the host, which would be timed).
    auto sync = [&](const mg::Tensor&) {
      mg::synchronize(dev);
    };
    double total_fwd = 0, total_step = 0, total_gflop = 0, total_min_fwd = 0, total_min_step = 0;
    const auto layers = vgg16_convs(width_div, size);
    for (size_t l = 0; l < layers.size(); ++l) {
      const Layer& L = layers[l];
      mg::Tensor x = mg::Tensor::uniform({batch, L.in, L.size, L.size}, -1.0f, 1.0f, gen).to(dev);
      mg::Tensor w = mg::Tensor::uniform({L.out, L.in, 3, 3}, -0.1f, 0.1f, gen).to(dev).requires_grad_();
      mg::Tensor b = mg::Tensor::uniform({L.out}, -0.1f, 0.1f, gen).to(dev).requires_grad_();
      mg::Tensor dy = mg::Tensor::uniform({batch, L.out, L.size, L.size}, -1.0f, 1.0f, gen).to(dev);
      if (l > 0) x.requires_grad_();
      // Gradient buffers exist, as under an optimizer: backward adds into them.
      w.set_grad(mg::Tensor::zeros(w.shape(), {mg::DType::f32, dev}));
      b.set_grad(mg::Tensor::zeros(b.shape(), {mg::DType::f32, dev}));

      std::vector<double> fwd, step;
      sync(x);  // the copies and fills above are done before the first clock reading
      for (int r = 0; r < warmup + reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        {
          mg::NoGradGuard ng;
          mg::Tensor y = mg::conv2d(x, w, b, 1, 1);
          sync(y);
        }
        auto t1 = std::chrono::steady_clock::now();
        mg::Tensor y = mg::conv2d(x, w, b, 1, 1);
        y.backward(dy);
        sync(w.grad());
        auto t2 = std::chrono::steady_clock::now();
        if (l > 0) x.set_grad(mg::Tensor());
        if (r < warmup) continue;
        fwd.push_back(std::chrono::duration<double>(t1 - t0).count());
        step.push_back(std::chrono::duration<double>(t2 - t1).count());
      }
      // Multiply-adds: forward 1 GEMM, backward 2 (dw, and dx except on the first layer).
      const double fwd_gflop = 2.0 * batch * L.out * L.size * L.size * L.in * 9 * 1e-9;
      const double step_gflop = fwd_gflop * (l > 0 ? 3 : 2);
      const double mf = mg::bench::median(fwd), ms = mg::bench::median(step);
      total_fwd += mf;
      total_step += ms;
      total_gflop += step_gflop;
      total_min_fwd += *std::min_element(fwd.begin(), fwd.end());
      total_min_step += *std::min_element(step.begin(), step.end());
      nlohmann::json j = {{"framework", "libminigrad"},
                          {"workload", "conv_vgg16_l" + std::to_string(l)},
                          {"device", dev.str()},
                          {"batch", batch},
                          {"in", L.in},
                          {"out", L.out},
                          {"size", L.size},
                          {"median_fwd_s", mf},
                          {"median_fwd_bwd_s", ms},
                          {"min_fwd_s", *std::min_element(fwd.begin(), fwd.end())},
                          {"min_fwd_bwd_s", *std::min_element(step.begin(), step.end())},
                          {"fwd_bwd_gflops", step_gflop / ms}};
      std::cout << j.dump() << std::endl;
    }
    nlohmann::json j = {{"framework", "libminigrad"},
                        {"workload", "conv_vgg16_total"},
                        {"device", dev.str()},
                        {"batch", batch},
                        {"width_div", width_div},
                        {"size", size},
                        {"median_fwd_s", total_fwd},
                        {"median_fwd_bwd_s", total_step},
                        {"min_fwd_s", total_min_fwd},
                        {"min_fwd_bwd_s", total_min_step},
                        {"fwd_bwd_gflops", total_gflop / total_step}};
    if (dev.is_cpu()) {  // the machine's measured limit beside the result (bench/roofline.h)
      const double peak = mg::bench::sgemm_gflops();
      j["threads"] = mg::num_threads();
      j["gemm"] = mg::cpu::gemm_backend();
      j["conv"] = mg::cpu::onednn::backend();
      j["sgemm_gflops"] = peak;
      j["fraction_of_sgemm"] = total_gflop / total_step / peak;
    }
    std::cout << j.dump() << std::endl;
  } catch (const mg::Error& e) {
    std::fprintf(stderr, "conv_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
