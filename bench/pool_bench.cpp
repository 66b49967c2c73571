// max_pool2d's CPU kernels on one shape: the forward (values and indices) and the backward, each
// timed over --reps calls after --warmup, median and minimum (the minimum is the steadier figure on
// a shared machine). One JSON line. The shape of ResNet's stem pool at 32 x 32, batch 64:
//
//   MG_NUM_THREADS=2 build/bin/pool_bench --batch 64 --channels 64 --size 16 --kernel 3 --stride 2 --pad 1
//
// (BENCHMARKS.md, "max-pool by rows", measured the row-at-a-time forward with this shape.)
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <iostream>
#include <vector>

#include <minigrad/minigrad.h>

#include "kernels/pooling.h"
#include "timing.h"

int main(int argc, char** argv) {
  int64_t batch = 64, channels = 64, size = 16;
  int kernel = 3, stride = 2, pad = 1, reps = 20, warmup = 3;
  CLI::App app{"libminigrad max_pool2d benchmark (CPU kernels)"};
  app.add_option("--batch", batch, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--channels", channels, "channels")->check(CLI::PositiveNumber);
  app.add_option("--size", size, "input height and width")->check(CLI::PositiveNumber);
  app.add_option("--kernel", kernel, "window")->check(CLI::PositiveNumber);
  app.add_option("--stride", stride, "stride")->check(CLI::PositiveNumber);
  app.add_option("--pad", pad, "padding")->check(CLI::NonNegativeNumber);
  app.add_option("--reps", reps, "timed calls")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed calls first")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    const int64_t out = (size + 2 * pad - kernel) / stride + 1;
    MG_CHECK(out > 0 && 2 * pad <= kernel, "pool_bench: a window of " << kernel << " with stride " << stride
                                                                       << " and padding " << pad << " on " << size
                                                                       << " pixels has no output");
    mg::Generator gen(1);
    const mg::Tensor x = mg::Tensor::randn({batch, channels, size, size}, gen);
    mg::Tensor y = mg::Tensor::empty({batch, channels, out, out});
    mg::Tensor idx = mg::Tensor::empty({batch, channels, out, out}, mg::TensorOptions{mg::DType::i64, mg::Device::cpu()});
    mg::Tensor dx = mg::Tensor::empty(x.shape());
    const mg::Tensor dy = mg::Tensor::randn(y.shape(), gen);
    const mg::Device cpu = mg::Device::cpu();
    const auto fwd = mg::bench::time_ms([&] { mg::max_pool2d_forward<mg::Cpu>(y, idx, x, kernel, stride, pad, false); }, cpu,
                                        warmup, reps);
    const auto bwd = mg::bench::time_ms([&] { mg::max_pool2d_backward<mg::Cpu>(dx, dy, idx, kernel, stride, pad, false); },
                                        cpu, warmup, reps);
    const nlohmann::json j = {{"framework", "libminigrad"},     {"op", "max_pool2d"},
                              {"threads", mg::num_threads()},   {"shape", {batch, channels, size, size}},
                              {"kernel", kernel},               {"stride", stride},
                              {"pad", pad},                     {"median_fwd_ms", fwd.median_ms},
                              {"min_fwd_ms", fwd.min_ms},       {"median_bwd_ms", bwd.median_ms},
                              {"min_bwd_ms", bwd.min_ms}};
    std::cout << j.dump() << "\n";
  } catch (const mg::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
