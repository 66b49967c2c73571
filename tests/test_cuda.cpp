// The CUDA backend against the CPU backend: every op forward and backward, every kernel and
// optimizer update, on random odd-sized inputs (ggml's test-backend-ops idea), a whole MLP
// training step, and the caching allocator on a real device.
//
// Tolerances: strict FP32 (the default for linear; conv2d after set_tf32_conv(false)) must
// agree with the CPU to a relative error (2-norm of the difference over 2-norm of the CPU
// result) below 1e-5. TF32 keeps 10 mantissa bits of each GEMM input, so products carry ~1e-3
// relative error: TF32 results are held to 1e-2.
//
// Without a CUDA device the whole binary is skipped: it prints why and exits with 77, which
// ctest reports as skipped (tests/CMakeLists.txt: SKIP_RETURN_CODE 77).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#ifndef MINIGRAD_WITH_CUDA
// A build without the CUDA backend has no Cuda kernels to call: nothing to test.
namespace {
const bool kSkipWithoutBackend = [] {
  std::printf("test_cuda: this libminigrad was built without CUDA: skipped.\n");
  std::exit(77);
  return true;
}();
}  // namespace
#else
#include <cstring>
#include <functional>
#include <random>

#include "helpers.h"
#include "kernels/conv2d.h"
#include "kernels/dropout.h"
#include "kernels/pooling.h"
#include <minigrad/cuda.h>
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/optim.h"
#include <minigrad/core/checkpoint.h>
#include <minigrad/data/idx.h>
#include <minigrad/data/loader.h>
#include <minigrad/nn/checkpoint_plan.h>
#include <minigrad/nn/models.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/optim/accumulate.h>
#include <minigrad/optim/optimizer.h>
#include <minigrad/optim/train_state.h>

using namespace mg;
using test::rand_tensor;
using test::rel_err;

namespace {

const bool kSkipWithoutDevice = [] {
  if (!cuda_available()) {
    std::printf("test_cuda: no CUDA device (cuda_device_count() = %d): skipped. "
                "Run on a GPU machine, see docs/cuda.md.\n", cuda_device_count());
    std::exit(77);
  }
  return true;
}();

constexpr double kStrict = 1e-5;
constexpr double kTf32 = 1e-2;
const Device kGpu = Device::cuda(0);

// Restores a math switch at scope exit.
struct Tf32Matmul {
  bool old = cuda::tf32_matmul();
  explicit Tf32Matmul(bool on) { cuda::set_tf32_matmul(on); }
  ~Tf32Matmul() { cuda::set_tf32_matmul(old); }
};
struct Tf32Conv {
  bool old = cuda::tf32_conv();
  explicit Tf32Conv(bool on) { cuda::set_tf32_conv(on); }
  ~Tf32Conv() { cuda::set_tf32_conv(old); }
};

Tensor to_gpu(const Tensor& t) {
  Tensor g = t.to(kGpu);
  if (t.requires_grad()) g.requires_grad_();
  return g;
}

Tensor labels(int64_t n, int64_t classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> v(n);
  for (auto& t : v) t = static_cast<int64_t>(rng() % classes);
  return Tensor::from_vector(v, {n});
}

// Runs f on the CPU inputs and on CUDA copies; compares the outputs, then the gradients of
// sum(f(inputs) * probe) for every input that requires grad.
void compare_op(const char* what, const std::function<Tensor(const std::vector<Tensor>&)>& f,
                const std::vector<Tensor>& cpu_in, double tol) {
  INFO(what);
  std::vector<Tensor> gpu_in;
  for (const Tensor& t : cpu_in) gpu_in.push_back(to_gpu(t));
  Tensor y_cpu = f(cpu_in), y_gpu = f(gpu_in);
  REQUIRE(y_gpu.is_cuda());
  REQUIRE(y_gpu.shape() == y_cpu.shape());
  INFO("output rel err " << rel_err(y_gpu, y_cpu));
  CHECK(rel_err(y_gpu, y_cpu) < tol);
  if (!y_cpu.requires_grad()) return;
  Tensor probe = rand_tensor(y_cpu.shape(), 4242);
  y_cpu.backward(probe);
  y_gpu.backward(probe.to(kGpu));
  for (size_t i = 0; i < cpu_in.size(); ++i) {
    if (!cpu_in[i].requires_grad()) continue;
    REQUIRE(gpu_in[i].grad().defined());
    REQUIRE(gpu_in[i].grad().is_cuda());
    INFO("grad of input " << i << " rel err " << rel_err(gpu_in[i].grad(), cpu_in[i].grad()));
    CHECK(rel_err(gpu_in[i].grad(), cpu_in[i].grad()) < tol);
  }
}

Tensor poisoned(const Shape& s, Device d) { return Tensor::full(s, std::nanf(""), TensorOptions{}.with_device(d)); }

}  // namespace

TEST_CASE("cuda: copies between host and device are exact, for float and int64") {
  Tensor x = rand_tensor({7, 131}, 1);
  Tensor g = x.to(kGpu);
  CHECK(g.is_cuda());
  Tensor g2 = g.clone();  // device to device
  CHECK(!g2.shares_storage(g));
  CHECK(test::bit_equal(g2.cpu(), x));
  Tensor idx = labels(1001, 1 << 30, 2);
  CHECK(idx.to(kGpu).to_vector<int64_t>() == idx.to_vector<int64_t>());
}

TEST_CASE("cuda: element-wise kernels and the step statistics") {
  Tensor a = rand_tensor({17, 19}, 3, true), b = rand_tensor({17, 19}, 4, true);
  compare_op("add", [](const std::vector<Tensor>& in) { return add(in[0], in[1]); }, {a, b}, kStrict);
  compare_op("scale", [](const std::vector<Tensor>& in) { return scale(in[0], -1.75f); },
             {rand_tensor({3, 5, 7}, 5, true)}, kStrict);

  Tensor y = rand_tensor({1001, 3}, 6), x = rand_tensor({1001, 3}, 7);
  Tensor yg = y.to(kGpu), xg = x.to(kGpu);
  add_inplace<Cpu>(y, x);
  add_inplace<Cuda>(yg, xg);
  CHECK(test::bit_equal(yg.cpu(), y));  // one rounding each: identical

  Tensor f = poisoned({333, 3}, kGpu);
  fill<Cuda>(f, 3.25f);
  for (float v : f.to_vector<float>()) CHECK(v == 3.25f);

  // The step statistics (optim/accumulate.h): squared norms of many tensors of odd sizes, in
  // more than one launch (over 256 tensors), and a stored loss.
  std::vector<Tensor> xs, xs_gpu;
  for (int i = 0; i < 300; ++i) xs.push_back(rand_tensor({i % 7 == 0 ? 1000003 : 1 + 37 * i}, 100 + i));
  for (const Tensor& t : xs) xs_gpu.push_back(t.to(kGpu));
  Tensor st = Tensor::full({3}, -1.0f, TensorOptions{DType::f64});
  Tensor st_gpu = st.to(kGpu);
  sum_squares_into<Cpu>(xs, st, 1);
  sum_squares_into<Cuda>(xs_gpu, st_gpu, 1);
  Tensor loss = rand_tensor({1}, 9);
  Tensor loss_gpu = loss.to(kGpu);
  store_scalar<Cpu>(st, 2, loss);
  store_scalar<Cuda>(st_gpu, 2, loss_gpu);
  const std::vector<double> cpu = st.to_vector<double>(), gpu = st_gpu.to_vector<double>();
  CHECK(gpu[0] == -1.0);  // untouched
  CHECK(std::abs(gpu[1] - cpu[1]) / cpu[1] < 1e-12);  // both accumulate in double
  CHECK(gpu[2] == cpu[2]);
  CHECK(gpu[2] == static_cast<double>(loss.item()));
  sum_squares_into<Cuda>({}, st_gpu, 0);
  CHECK(st_gpu.to_vector<double>()[0] == 0.0);
  // zero_many (Optimizer::zero_grad) over the same 300 tensors: two launches, every element.
  zero_many<Cuda>(xs_gpu);
  sum_squares_into<Cuda>(xs_gpu, st_gpu, 1);
  CHECK(st_gpu.to_vector<double>()[1] == 0.0);
  for (size_t i = 0; i < xs_gpu.size(); i += 37) CHECK(test::max_abs_diff(xs_gpu[i].cpu(), Tensor::zeros(xs[i].shape())) == 0.0);
}

TEST_CASE("cuda: linear forward and backward, strict FP32 by default") {
  REQUIRE(!cuda::tf32_matmul());
  Tensor x = rand_tensor({37, 53}, 11, true), w = rand_tensor({29, 53}, 12, true), b = rand_tensor({29}, 13, true);
  compare_op("linear", [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, {x, w, b}, kStrict);
  Tensor x2 = rand_tensor({1, 257}, 14, true), w2 = rand_tensor({3, 257}, 15, true);
  compare_op("linear, no bias, one row", [](const std::vector<Tensor>& in) { return linear(in[0], in[1]); },
             {x2, w2}, kStrict);
}

TEST_CASE("cuda: linear backward accumulates into existing gradients") {
  Tensor x = rand_tensor({23, 41}, 21), w = rand_tensor({13, 41}, 22), dy = rand_tensor({23, 13}, 23);
  Tensor dw = rand_tensor({13, 41}, 24), db = rand_tensor({13}, 25);
  Tensor dwg = dw.to(kGpu), dbg = db.to(kGpu), dxg = poisoned({23, 41}, kGpu), dx = poisoned({23, 41}, Device::cpu());
  Tensor xg = x.to(kGpu), wg = w.to(kGpu), dyg = dy.to(kGpu);
  linear_backward<Cpu>(dx, dw, db, dy, x, w, /*accumulate=*/true);
  linear_backward<Cuda>(dxg, dwg, dbg, dyg, xg, wg, /*accumulate=*/true);
  CHECK(rel_err(dxg, dx) < kStrict);
  CHECK(rel_err(dwg, dw) < kStrict);
  CHECK(rel_err(dbg, db) < kStrict);
}

TEST_CASE("cuda: linear in TF32 when asked (tolerance 1e-2)") {
  Tf32Matmul on(true);
  Tensor x = rand_tensor({65, 257}, 31, true), w = rand_tensor({33, 257}, 32, true), b = rand_tensor({33}, 33, true);
  compare_op("linear tf32", [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, {x, w, b}, kTf32);
}

TEST_CASE("cuda: conv2d forward and backward in strict FP32") {
  Tf32Conv off(false);
  for (bool bench : {false, true}) {
    cuda::set_cudnn_benchmark(bench);
    Tensor x = rand_tensor({3, 5, 13, 11}, 41, true), w = rand_tensor({7, 5, 3, 3}, 42, true), b = rand_tensor({7}, 43, true);
    compare_op("conv2d 3x3 stride 2 pad 1",
               [](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], 2, 1); }, {x, w, b}, kStrict);
    Tensor x2 = rand_tensor({2, 3, 9, 17}, 44, true), w2 = rand_tensor({5, 3, 5, 3}, 45, true);
    compare_op("conv2d 5x3 no bias", [](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], {}, 1, 0); },
               {x2, w2}, kStrict);
  }
  cuda::set_cudnn_benchmark(false);
}

TEST_CASE("cuda: conv2d with TF32 allowed, the default (tolerance 1e-2)") {
  REQUIRE(cuda::tf32_conv());
  Tensor x = rand_tensor({4, 16, 15, 15}, 51, true), w = rand_tensor({24, 16, 3, 3}, 52, true), b = rand_tensor({24}, 53, true);
  compare_op("conv2d tf32", [](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], 1, 1); }, {x, w, b},
             kTf32);
}

TEST_CASE("cuda: conv2d backward accumulates into existing gradients") {
  Tf32Conv off(false);
  Tensor x = rand_tensor({2, 3, 8, 7}, 61), w = rand_tensor({4, 3, 3, 3}, 62), dy = rand_tensor({2, 4, 8, 7}, 63);
  Tensor dw = rand_tensor({4, 3, 3, 3}, 64), db = rand_tensor({4}, 65), dx;  // dx undefined: skipped
  Tensor dwg = dw.to(kGpu), dbg = db.to(kGpu), dxg;
  conv2d_backward<Cpu>(dx, dw, db, dy, x, w, 1, 1, true);
  conv2d_backward<Cuda>(dxg, dwg, dbg, dy.to(kGpu), x.to(kGpu), w.to(kGpu), 1, 1, true);
  CHECK(rel_err(dwg, dw) < kStrict);
  CHECK(rel_err(dbg, db) < kStrict);
}

TEST_CASE("cuda: relu, pooling") {
  compare_op("relu", [](const std::vector<Tensor>& in) { return relu(in[0]); },
             {test::away_from_zero(rand_tensor({9, 37}, 71, true))}, kStrict);
  compare_op("max_pool2d k3 s2 p1", [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 3, 2, 1); },
             {rand_tensor({3, 4, 15, 13}, 72, true)}, kStrict);
  compare_op("max_pool2d k2", [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 2); },
             {rand_tensor({2, 5, 11, 9}, 73, true)}, kStrict);
  compare_op("adaptive_avg_pool2d 13x11 -> 7x5",
             [](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], 7, 5); },
             {rand_tensor({2, 3, 13, 11}, 74, true)}, kStrict);
  compare_op("adaptive_avg_pool2d 5x4 -> 7x7 (windows overlap)",
             [](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], 7, 7); },
             {rand_tensor({2, 3, 5, 4}, 75, true)}, kStrict);
}

TEST_CASE("cuda: dropout masks are the same on both devices") {
  for (float p : {0.1f, 0.5f}) {
    Tensor x = rand_tensor({5, 1003}, 81, true);
    Tensor xg = to_gpu(x);
    Generator g1(77), g2(77);
    g1.advance(13);  // an offset that is not 0
    g2.advance(13);
    Tensor y = dropout(x, p, &g1), yg = dropout(xg, p, &g2);
    CHECK(test::bit_equal(yg.cpu(), y));
    Tensor probe = rand_tensor(y.shape(), 82);
    y.backward(probe);
    yg.backward(probe.to(kGpu));
    CHECK(test::bit_equal(xg.grad().cpu(), x.grad()));
  }
}

TEST_CASE("cuda: dropout kernels at offsets that are not a multiple of 4") {
  // Generator::advance keeps offsets block-aligned; a (seed, offset) set by hand need not be, and
  // then each element draws on its own (kernels/cuda/kernel_math.h dropout4).
  for (uint64_t offset : {uint64_t{13}, uint64_t{6}, (uint64_t{1} << 35) + 3}) {
    CAPTURE(offset);
    Tensor x = rand_tensor({3, 1001}, 83);
    Tensor y = poisoned({3, 1001}, Device::cpu()), yg = poisoned({3, 1001}, kGpu);
    dropout_forward<Cpu>(y, x, 0.3f, 99, offset);
    dropout_forward<Cuda>(yg, x.to(kGpu), 0.3f, 99, offset);
    CHECK(test::bit_equal(yg.cpu(), y));
    Tensor dx = poisoned({3, 1001}, Device::cpu()), dxg = poisoned({3, 1001}, kGpu);
    dropout_backward<Cpu>(dx, x, 0.3f, 99, offset);
    dropout_backward<Cuda>(dxg, x.to(kGpu), 0.3f, 99, offset);
    CHECK(test::bit_equal(dxg.cpu(), dx));
  }
}

TEST_CASE("cuda: cross-entropy, mean and sum, small and many classes") {
  for (Reduction r : {Reduction::mean, Reduction::sum}) {
    Tensor logits = rand_tensor({37, 11}, 91, true);
    Tensor t = labels(37, 11, 92);
    compare_op("cross_entropy 37x11",
               [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], r); }, {logits, t}, kStrict);
    Tensor wide = rand_tensor({9, 1000}, 93, true);
    compare_op("cross_entropy 9x1000", [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], r); },
               {wide, labels(9, 1000, 94)}, kStrict);
    // Logits in (-90, 90): exp overflows float without the max subtraction; 300 classes leave
    // threads of the 256-wide block with one and with two columns.
    std::vector<float> big = rand_tensor({13, 300}, 96).to_vector<float>();
    for (float& v : big) v *= 90.0f;
    Tensor large = Tensor::from_vector(big, {13, 300});
    large.requires_grad_();
    compare_op("cross_entropy 13x300, large logits",
               [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], r); },
               {large, labels(13, 300, 97)}, kStrict);
  }
}

TEST_CASE("cuda: an out-of-range target is reported at the next synchronisation") {
  Tensor logits = rand_tensor({4, 5}, 95).to(kGpu);
  Tensor t = Tensor::from_vector(std::vector<int64_t>{0, 7, 1, 2}, {4}).to(kGpu);
  Tensor loss = cross_entropy(logits, t);
  CHECK_THROWS_WITH_AS(loss.item(), doctest::Contains("target[1] = 7"), Error);
  // The flag is cleared: a good call works again.
  Tensor ok = cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{0, 4, 1, 2}, {4}).to(kGpu));
  CHECK(std::isfinite(ok.item()));
}

namespace {
struct OptimCase {
  std::vector<Tensor> p, g, s1, s2;
};
// Parameters of odd sizes; `count` above 96 exercises the grouping into several launches.
OptimCase make_optim_case(int count, uint64_t seed, Device d) {
  OptimCase c;
  for (int i = 0; i < count; ++i) {
    const int64_t n = 1 + (i * 389 + 17) % 5003;
    c.p.push_back(rand_tensor({n}, seed + 4 * i).to(d));
    c.g.push_back(rand_tensor({n}, seed + 4 * i + 1).to(d));
    c.s1.push_back(rand_tensor({n}, seed + 4 * i + 2).to(d));
    std::vector<float> v = rand_tensor({n}, seed + 4 * i + 3).to_vector<float>();
    for (float& e : v) e *= e;  // exp_avg_sq is non-negative
    c.s2.push_back(Tensor::from_vector(v, {n}).to(d));
  }
  return c;
}
void check_lists_close(const std::vector<Tensor>& gpu, const std::vector<Tensor>& cpu, const char* what) {
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO(what << " " << i);
    CHECK(rel_err(gpu[i], cpu[i]) < kStrict);
  }
}
}  // namespace

TEST_CASE("cuda: fused SGD update matches the CPU (momentum, nesterov, weight decay, groups)") {
  for (int count : {5, 101}) {
    for (bool nesterov : {false, true}) {
      OptimCase c = make_optim_case(count, 100, Device::cpu()), g = make_optim_case(count, 100, kGpu);
      SgdHyper h;
      h.lr = 0.05f;
      h.momentum = 0.9f;
      h.weight_decay = 1e-3f;
      h.nesterov = nesterov;
      h.dampening = nesterov ? 0.0f : 0.1f;  // PyTorch allows nesterov only without dampening
      h.grad_scale = 0.25f;
      for (int step = 0; step < 3; ++step) {
        h.first_step = step == 0;
        sgd_update<Cpu>(c.p, c.g, c.s1, h);
        sgd_update<Cuda>(g.p, g.g, g.s1, h);
      }
      check_lists_close(g.p, c.p, "param");
      check_lists_close(g.s1, c.s1, "momentum");
    }
  }
  // No momentum: no buffers.
  OptimCase c = make_optim_case(3, 300, Device::cpu()), g = make_optim_case(3, 300, kGpu);
  std::vector<Tensor> none_c, none_g;
  SgdHyper h;
  sgd_update<Cpu>(c.p, c.g, none_c, h);
  sgd_update<Cuda>(g.p, g.g, none_g, h);
  check_lists_close(g.p, c.p, "param");
}

TEST_CASE("cuda: fused Adam and AdamW updates match the CPU") {
  for (bool decoupled : {false, true}) {
    OptimCase c = make_optim_case(101, 500, Device::cpu()), g = make_optim_case(101, 500, kGpu);
    std::vector<Tensor> p0;
    for (const Tensor& t : c.p) p0.push_back(t.clone());
    AdamHyper h;
    h.lr = 1e-2f;
    h.weight_decay = 0.01f;
    h.decoupled = decoupled;
    h.grad_scale = 0.5f;
    for (int step = 1; step <= 3; ++step) {
      h.step = step;
      adam_update<Cpu>(c.p, c.g, c.s1, c.s2, h);
      adam_update<Cuda>(g.p, g.g, g.s1, g.s2, h);
    }
    // Compare the updates, not only the parameters (the update is small next to p).
    for (size_t i = 0; i < p0.size(); ++i) {
      INFO("adam param " << i);
      Tensor du_c = add(c.p[i], scale(p0[i], -1.0f)), du_g = add(g.p[i].cpu(), scale(p0[i], -1.0f));
      CHECK(rel_err(du_g, du_c) < kStrict);
    }
    check_lists_close(g.s1, c.s1, "exp_avg");
    check_lists_close(g.s2, c.s2, "exp_avg_sq");
  }
}

TEST_CASE("cuda: MLP training steps (SGD with momentum) match the CPU") {
  manual_seed(2024);
  auto cpu_model = nn::make_mlp({37, 64, 29, 10});
  manual_seed(2024);
  auto gpu_model = nn::make_mlp({37, 64, 29, 10});
  gpu_model->to(kGpu);
  optim::SGD cpu_opt(cpu_model->parameters(), {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f});
  optim::SGD gpu_opt(gpu_model->parameters(), {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f});
  for (int step = 0; step < 4; ++step) {
    Tensor x = rand_tensor({23, 37}, 600 + step), y = labels(23, 10, 700 + step);
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
    Tensor loss_c = cross_entropy(cpu_model->forward(x), y);
    Tensor loss_g = cross_entropy(gpu_model->forward(x.to(kGpu)), y.to(kGpu));
    loss_c.backward();
    loss_g.backward();
    cpu_opt.step();
    gpu_opt.step();
    INFO("step " << step << " loss cpu " << loss_c.item() << " cuda " << loss_g.item());
    CHECK(std::abs(loss_g.item() - loss_c.item()) <= kStrict * std::abs(loss_c.item()));
  }
  auto pc = cpu_model->named_parameters(), pg = gpu_model->named_parameters();
  REQUIRE(pc.size() == pg.size());
  for (size_t i = 0; i < pc.size(); ++i) {
    INFO(pc[i].first);
    CHECK(pg[i].second.is_cuda());
    CHECK(rel_err(pg[i].second, pc[i].second) < kStrict);
  }
}

TEST_CASE("cuda allocator: a freed block is reused without a new cudaMalloc") {
  empty_cache(kGpu);
  void* first = nullptr;
  {
    Tensor a = Tensor::empty({1000}, TensorOptions{}.with_device(kGpu));
    first = a.raw_data();
  }
  const MemoryStats s0 = memory_stats(kGpu);
  Tensor b = Tensor::empty({1000}, TensorOptions{}.with_device(kGpu));
  CHECK(b.raw_data() == first);
  CHECK(memory_stats(kGpu).system_alloc_count == s0.system_alloc_count);
  CHECK(memory_stats(kGpu).in_use == s0.in_use + 4000);
}

TEST_CASE("cuda allocator: small tensors split one segment; stats and empty_cache") {
  empty_cache(kGpu);
  const MemoryStats s0 = memory_stats(kGpu);
  reset_peak_memory_stats(kGpu);
  {
    std::vector<Tensor> ts;
    for (int i = 0; i < 5; ++i) ts.push_back(Tensor::empty({1000 + 7 * i}, TensorOptions{}.with_device(kGpu)));
    const MemoryStats s1 = memory_stats(kGpu);
    CHECK(s1.system_alloc_count <= s0.system_alloc_count + 1);
    CHECK(s1.reserved <= s0.reserved + (size_t{2} << 20));
    CHECK(s1.in_use == s0.in_use + 4 * (5 * 1000 + 7 * 10));
    Tensor large = Tensor::empty({3 << 18}, TensorOptions{}.with_device(kGpu));  // 3 MiB: a large segment
    CHECK(memory_stats(kGpu).peak_in_use == s1.in_use + (size_t{3} << 20));
  }
  CHECK(memory_stats(kGpu).in_use == s0.in_use);
  CHECK(memory_stats(kGpu).reserved > s0.reserved);  // cached
  empty_cache(kGpu);
  CHECK(memory_stats(kGpu).reserved <= s0.reserved);
}

TEST_CASE("cuda allocator: out of memory names the stats and the remedies, and recovers") {
  const MemoryStats s0 = memory_stats(kGpu);
  std::string msg;
  try {
    Tensor huge = Tensor::empty({int64_t{1} << 40}, TensorOptions{}.with_device(kGpu));  // 4 TiB
  } catch (const Error& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.find("cuda:0 out of memory: tried to allocate 4.00 TiB") != std::string::npos);
  CHECK(msg.find("in use by tensors") != std::string::npos);
  CHECK(msg.find("reserved") != std::string::npos);
  CHECK(msg.find("free of") != std::string::npos);
  CHECK(msg.find("gradient accumulation") != std::string::npos);
  CHECK(msg.find("mg::checkpoint") != std::string::npos);
  CHECK(memory_stats(kGpu).in_use == s0.in_use);
  Tensor after = rand_tensor({257}, 9).to(kGpu);  // the allocator and the device still work
  CHECK(test::bit_equal(after.cpu(), rand_tensor({257}, 9)));
}

TEST_CASE("cuda allocator: on a full device the cache is released and the request retried once") {
  empty_cache(kGpu);
  constexpr int64_t kGiBFloats = int64_t{1} << 28;  // 1 GiB: a segment of its own
  std::vector<Tensor> hold;
  std::string msg;
  try {
    for (int i = 0; i < 4096; ++i) hold.push_back(Tensor::empty({kGiBFloats}, TensorOptions{}.with_device(kGpu)));
  } catch (const Error& e) {
    msg = e.what();
  }
  INFO(msg);
  REQUIRE(msg.find("out of memory") != std::string::npos);
  REQUIRE(hold.size() >= 2);
  const size_t held = hold.size();
  hold.clear();  // every 1 GiB segment is now cached, none returned
  const MemoryStats s0 = memory_stats(kGpu);
  CHECK(s0.reserved >= held * (size_t{1} << 30));
  // 1.5 GiB: no cached block is large enough and the device has less than 1 GiB free, so the
  // first cudaMalloc fails; the free segments go back and the retry succeeds.
  Tensor big = Tensor::empty({kGiBFloats * 3 / 2}, TensorOptions{}.with_device(kGpu));
  const MemoryStats s1 = memory_stats(kGpu);
  CHECK(s1.system_alloc_count == s0.system_alloc_count + 1);
  CHECK(s1.reserved < s0.reserved);
  CHECK(s1.in_use == s0.in_use + (size_t{3} << 29));
  big = Tensor();
  empty_cache(kGpu);
}

// ---- the host side of training on the device: model.to, optimizers, accumulation, checkpointing,
// saving and resuming -------------------------------------------------------------------------------

TEST_CASE("cuda: tensors of every dtype on the device; device strings; what is not supported says so") {
  CHECK(Device::parse("cuda") == Device::cuda(0));
  CHECK(Device::parse("cuda:0") == kGpu);
  CHECK(Device::parse("cuda:1") == Device::cuda(1));
  CHECK_THROWS_WITH_AS(Device::parse("gpu"), doctest::Contains("expected cpu, cuda or cuda:N"), Error);
  CHECK_THROWS_WITH_AS(Device::parse("cuda:-1"), doctest::Contains("expected cpu, cuda or cuda:N"), Error);
  const int n = cuda_device_count();
  CHECK_THROWS_WITH_AS(Tensor::empty({3}, TensorOptions{}.with_device(Device::cuda(n))),
                       doctest::Contains("does not exist"), Error);
  // int64 and float64 tensors live on the device (labels, pooling indices, step statistics), but
  // fill_ has a float32 kernel only: a clear error, not a kernel reading the wrong width.
  Tensor i = Tensor::empty({5}, TensorOptions{DType::i64, kGpu});
  CHECK_THROWS_WITH_AS(i.fill_(1.0f), doctest::Contains("int64"), Error);
  Tensor d = Tensor::empty({5}, TensorOptions{DType::f64, kGpu});
  CHECK_THROWS_WITH_AS(d.zero_(), doctest::Contains("float64"), Error);
  Tensor dh = Tensor::full({1}, 0.5f, TensorOptions{DType::f64});
  CHECK(dh.to(kGpu).item() == 0.5f);
  CHECK(Tensor::from_vector(std::vector<int64_t>{-3}, {1}).to(kGpu).item() == -3.0f);
  Tensor f = rand_tensor({1}, 5);
  CHECK(f.to(kGpu).item() == f.item());
  CHECK_THROWS_WITH_AS(rand_tensor({2}, 5).to(kGpu).item(), doctest::Contains("one element"), Error);
  // clone and copy_ on the device, and copy_ across devices in both directions.
  Tensor a = rand_tensor({3, 7}, 6).to(kGpu), b = poisoned({3, 7}, kGpu);
  b.copy_(a);
  CHECK(test::bit_equal(b.cpu(), a.cpu()));
  Tensor host = poisoned({3, 7}, Device::cpu());
  host.copy_(a);
  CHECK(test::bit_equal(host, a.cpu()));
  Tensor c = a.clone();
  CHECK(c.is_cuda());
  CHECK(!c.shares_storage(a));
}

namespace {
std::shared_ptr<nn::Sequential> mlp_for_moves(uint64_t seed) {
  manual_seed(seed);
  return nn::make_mlp({29, 33, 10});
}

// Three steps of `opt` on `model` (on `d`), the same data whatever the device.
void three_steps(nn::Module& model, optim::Optimizer& opt, Device d, uint64_t seed) {
  for (int s = 0; s < 3; ++s) {
    Tensor x = rand_tensor({11, 29}, seed + s).to(d), y = labels(11, 10, seed + 10 + s).to(d);
    opt.zero_grad();
    cross_entropy(model.forward(x), y).backward();
    opt.step();
  }
}
}  // namespace

TEST_CASE("cuda: an optimizer built before model.to(cuda) follows the model, state and gradients") {
  for (int kind = 0; kind < 2; ++kind) {
    INFO((kind == 0 ? "SGD with momentum" : "Adam"));
    auto make = [&](const nn::Module& m) -> std::unique_ptr<optim::Optimizer> {
      if (kind == 0) return std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.1f, .momentum = 0.9f});
      return std::make_unique<optim::Adam>(m.parameters(), optim::AdamOptions{.lr = 1e-2f});
    };
    // Built on the host, one step there, then the model moves: momentum/moments must come along.
    auto before = mlp_for_moves(7);
    auto opt_before = make(*before);
    three_steps(*before, *opt_before, Device::cpu(), 100);
    before->to(kGpu);
    for (const Tensor& g : opt_before->grads()) CHECK(g.is_cuda());
    three_steps(*before, *opt_before, kGpu, 200);
    for (const auto& [name, t] : opt_before->state_tensors()) {
      INFO(name);
      CHECK(t.is_cuda());
    }
    // Reference: the same three host steps, then the state copied by hand to a device optimizer.
    auto ref = mlp_for_moves(7);
    auto opt_cpu = make(*ref);
    three_steps(*ref, *opt_cpu, Device::cpu(), 100);
    ref->to(kGpu);
    auto opt_ref = make(*ref);
    auto sc = opt_cpu->state_tensors(), sr = opt_ref->state_tensors();
    REQUIRE(sc.size() == sr.size());
    for (size_t i = 0; i < sc.size(); ++i) {
      Tensor dst = sr[i].second;
      dst.copy_(sc[i].second);
    }
    opt_ref->set_step_count(opt_cpu->step_count());
    three_steps(*ref, *opt_ref, kGpu, 200);
    auto pb = before->parameters(), pr = ref->parameters();
    for (size_t i = 0; i < pb.size(); ++i) {
      CHECK(pb[i].is_cuda());
      CHECK(test::bit_equal(pb[i].cpu(), pr[i].cpu()));  // the same kernels on the same values
    }
    // And back to the host: the state follows again (the CPU kernel would read device pointers).
    before->to(Device::cpu());
    three_steps(*before, *opt_before, Device::cpu(), 300);
    ref->to(Device::cpu());
    three_steps(*ref, *opt_ref, Device::cpu(), 300);
    for (const auto& [name, t] : opt_before->state_tensors()) CHECK(!t.is_cuda());
    pb = before->parameters();
    pr = ref->parameters();
    for (size_t i = 0; i < pb.size(); ++i) CHECK(test::bit_equal(pb[i], pr[i]));
  }
  // Only part of a model moved: a clear error at the step, not a kernel on mixed pointers.
  auto m = mlp_for_moves(8);
  optim::SGD opt(m->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  (*m)[1].to(kGpu);
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("only part of the model"), Error);
}

namespace {
// Note [batch-size independent order] and Note [accumulation normalises by samples]: the
// setting of tests/test_accumulate.cpp (7,992 samples: a short last window of 3 x 16 + 8), on `d`.
std::vector<Tensor> train_one_epoch(Device d, int64_t batch, int64_t accum, optim::Normalize norm, int64_t* steps) {
  static const data::IdxDataset data = data::make_synthetic(7992, 7);
  manual_seed(3);
  auto model = nn::make_mlp({784, 64, 10});
  model->to(d);
  optim::SGD opt(model->parameters(), {.lr = 0.05f});
  optim::Accumulator acc(opt, {.steps = accum, .normalize = norm});
  data::DataLoader loader(data, {.batch_size = batch, .seed = 11, .device = d});
  optim::TrainCallbacks cb;
  int64_t on_device = 0, micro = 0;
  cb.on_micro_batch = [&](const data::Batch& b) {
    ++micro;
    on_device += b.x.device() == d && b.y.device() == d && b.y.dtype() == DType::i64;
  };
  const optim::EpochStats st = optim::train_epoch(*model, loader, acc, 0, {}, cb);
  CHECK(on_device == micro);
  CHECK(st.samples == 7992);
  CHECK(std::isfinite(st.loss_sum));
  *steps = st.optimizer_steps;
  std::vector<Tensor> w;
  for (const Tensor& p : model->parameters()) {
    CHECK(p.device() == d);
    w.push_back(p.cpu());
  }
  return w;
}

double max_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, test::max_abs_diff(a[i], b[i]));
  return m;
}
}  // namespace

TEST_CASE("cuda: accumulation 16x4 equals 64 on the device and matches the CPU") {
  int64_t s64 = 0, s16 = 0, scpu = 0, swrong = 0;
  const std::vector<Tensor> big = train_one_epoch(kGpu, 64, 1, optim::Normalize::samples, &s64);
  const std::vector<Tensor> acc = train_one_epoch(kGpu, 16, 4, optim::Normalize::samples, &s16);
  const std::vector<Tensor> cpu = train_one_epoch(Device::cpu(), 64, 1, optim::Normalize::samples, &scpu);
  const std::vector<Tensor> wrong = train_one_epoch(kGpu, 16, 4, optim::Normalize::micro_batches, &swrong);
  CHECK(s64 == 125);  // 124 full windows and the short one
  CHECK(s16 == 125);
  CHECK(scpu == 125);
  manual_seed(3);
  auto init = nn::make_mlp({784, 64, 10})->parameters();
  std::vector<Tensor> init_w(init.begin(), init.end());
  CHECK(max_diff(big, init_w) > 1e-2);  // the weights did move
  for (size_t i = 0; i < big.size(); ++i) {
    INFO("parameter " << i << ": rel err 16x4 vs 64 (device) " << rel_err(acc[i], big[i]) << ", device vs CPU "
                      << rel_err(big[i], cpu[i]));
    CHECK(rel_err(acc[i], big[i]) < kStrict);
    CHECK(rel_err(big[i], cpu[i]) < kStrict);
  }
  // The usual recipe (mean per micro-batch / N) is off on the short last window: well above
  // rounding (on the CPU, tests/test_accumulate.cpp measures ~650x its 1e-6 bound).
  MESSAGE("device: |64 - 16x4| = " << max_diff(big, acc) << ", |64 - 16x4 divided by N| = " << max_diff(big, wrong));
  CHECK(max_diff(big, wrong) > 20e-6);
}

TEST_CASE("cuda: the step statistics stay on the device and a NaN loss is named at the step") {
  manual_seed(4);
  auto model = nn::make_mlp({6, 8, 3});
  model->to(kGpu);
  optim::SGD opt(model->parameters(), {.lr = 0.1f});
  optim::Accumulator acc(opt, {.steps = 2, .clip_norm = 0.5f});
  double want = 0;
  for (int m = 0; m < 3; ++m) {  // three micro-batches with N = 2: the window outgrows it once
    Tensor x = rand_tensor({5, 6}, 40 + m).to(kGpu);
    Tensor loss = cross_entropy(model->forward(x), labels(5, 3, 50 + m).to(kGpu), Reduction::sum);
    want += loss.item();
    acc.backward(loss, 5);
  }
  const optim::StepInfo info = acc.step();
  CHECK(info.samples == 15);
  CHECK(info.micro_batches == 3);
  CHECK(std::abs(info.loss_sum - want) <= 1e-6 * std::abs(want));
  CHECK(std::isfinite(info.grad_norm));
  CHECK(info.clip_coef <= 1.0f);
  Tensor x = rand_tensor({5, 6}, 60).to(kGpu);
  Tensor loss = scale(cross_entropy(model->forward(x), labels(5, 3, 61).to(kGpu), Reduction::sum), std::nanf(""));
  acc.backward(loss, 5);
  CHECK_THROWS_WITH_AS(acc.step(), doctest::Contains("at micro-batch 1 of 1"), Error);
  CHECK(acc.pending_micro_batches() == 0);
}

namespace {
// One training-mode forward/backward under `plan`, dropout from seed 77, into zeroed buffers;
// the parameters' gradients and the input's, on the host.
std::vector<Tensor> ckpt_grads(nn::Sequential& m, const std::vector<nn::Segment>& plan, const Tensor& x_data,
                               const Tensor& target) {
  const Device d = m.parameters()[0].device();
  m.zero_grad();
  for (const Tensor& p : m.parameters()) p.set_grad(Tensor::zeros(p.shape(), TensorOptions{DType::f32, d}));
  Tensor x = x_data.to(d).requires_grad_();
  manual_seed(77);
  cross_entropy(nn::forward_with_plan(m, plan, x), target.to(d)).backward();
  std::vector<Tensor> g;
  for (const Tensor& p : m.parameters()) g.push_back(p.grad().cpu());
  g.push_back(x.grad().cpu());
  return g;
}
}  // namespace

TEST_CASE("cuda: checkpointed gradients equal plain ones bit for bit on the device, dropout included") {
  Tf32Conv off(false);
  struct Case {
    const char* name;
    std::shared_ptr<nn::Sequential> (*make)();
    Shape in;
    std::vector<std::vector<nn::Segment>> plans;
  };
  const std::vector<Case> cases = {
      {"MLP with dropout", test::mlp_with_dropout, {7, 4, 5}, {{{0, 8}}, {{1, 4}, {4, 7}}, {{3, 4}}, {{2, 3}, {5, 8}}}},
      {"CNN with dropout", test::small_cnn, {3, 3, 11, 13}, {{{0, 3}}, {{0, 2}, {2, 5}}, {{0, 11}}, {{1, 2}, {4, 8}, {9, 10}}}},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    manual_seed(5);
    auto cpu_model = c.make();
    manual_seed(5);
    auto m = c.make();
    m->to(kGpu);
    const Tensor x = rand_tensor(c.in, 12);
    const Tensor t = labels(c.in[0], c.name[0] == 'M' ? 5 : 3, 13);
    const std::vector<Tensor> ref = ckpt_grads(*m, {}, x, t);
    // The device computes what the host does (dropout masks from the same (seed, offset)).
    const std::vector<Tensor> host = ckpt_grads(*cpu_model, {}, x, t);
    for (size_t i = 0; i < ref.size(); ++i) {
      INFO("gradient " << i << " device vs CPU rel err " << rel_err(ref[i], host[i]));
      CHECK(rel_err(ref[i], host[i]) < kStrict);
    }
    // Deterministic convolutions are the default (Note [deterministic convolutions],
    // kernels/cuda/conv2d.cu) and max-pool backward gathers without atomics: two plain runs,
    // and every checkpointed run, give the same bits.
    REQUIRE(cuda::cudnn_deterministic());
    const std::vector<Tensor> again = ckpt_grads(*m, {}, x, t);
    for (size_t i = 0; i < ref.size(); ++i) CHECK(test::bit_equal(again[i], ref[i]));
    for (const auto& plan : c.plans) {
      nn::Plan p;
      p.segments = plan;
      const std::vector<Tensor> got = ckpt_grads(*m, plan, x, t);
      for (size_t i = 0; i < ref.size(); ++i) {
        INFO("plan " << p.str() << ", gradient " << i << ", max |diff| " << test::max_abs_diff(got[i], ref[i]));
        CHECK(test::bit_equal(got[i], ref[i]));
      }
    }
  }
}

TEST_CASE("cuda: max-pool backward with overlapping windows is bit-identical to the CPU (no atomics)") {
  // 3x3 stride 2 padding 1: windows overlap, and few distinct values make inputs the argmax of
  // several windows, whose dy are then summed.
  Tensor x = Tensor::from_vector([] {
    std::vector<float> v(2 * 5 * 17 * 15);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7919) % 4);
    return v;
  }(), {2, 5, 17, 15});
  Tensor y = Tensor::empty({2, 5, 9, 8}), idx = Tensor::empty({2, 5, 9, 8}, TensorOptions{DType::i64});
  max_pool2d_forward<Cpu>(y, idx, x, 3, 2, 1);
  Tensor yg = Tensor::empty({2, 5, 9, 8}, TensorOptions{DType::f32, kGpu});
  Tensor idxg = Tensor::empty({2, 5, 9, 8}, TensorOptions{DType::i64, kGpu});
  max_pool2d_forward<Cuda>(yg, idxg, x.to(kGpu), 3, 2, 1);
  CHECK(idxg.to_vector<int64_t>() == idx.to_vector<int64_t>());
  Tensor dy = rand_tensor({2, 5, 9, 8}, 31);
  Tensor dx = poisoned({2, 5, 17, 15}, Device::cpu()), dxg = poisoned({2, 5, 17, 15}, kGpu);
  max_pool2d_backward<Cpu>(dx, dy, idx, 3, 2, 1);
  max_pool2d_backward<Cuda>(dxg, dy.to(kGpu), idxg, 3, 2, 1);
  CHECK(test::bit_equal(dxg.cpu(), dx));
}

TEST_CASE("cuda: conv2d backward is deterministic by default: the same bits run after run") {
  Tf32Conv off(false);
  for (bool bench : {false, true}) {
    cuda::set_cudnn_benchmark(bench);
    INFO("cudnn benchmark " << bench);
    Tensor x = rand_tensor({8, 16, 19, 17}, 41).to(kGpu), w = rand_tensor({32, 16, 3, 3}, 42).to(kGpu);
    Tensor dy = rand_tensor({8, 32, 19, 17}, 43).to(kGpu);
    std::vector<std::vector<float>> runs;
    for (int r = 0; r < 3; ++r) {
      Tensor dx = Tensor::empty(x.shape(), TensorOptions{DType::f32, kGpu});
      Tensor dw = Tensor::empty(w.shape(), TensorOptions{DType::f32, kGpu});
      Tensor db = Tensor::empty({32}, TensorOptions{DType::f32, kGpu});
      conv2d_backward<Cuda>(dx, dw, db, dy, x, w, 1, 1, false);
      std::vector<float> all = dx.to_vector<float>(), vw = dw.to_vector<float>(), vb = db.to_vector<float>();
      all.insert(all.end(), vw.begin(), vw.end());
      all.insert(all.end(), vb.begin(), vb.end());
      runs.push_back(std::move(all));
    }
    CHECK(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)) == 0);
    CHECK(std::memcmp(runs[0].data(), runs[2].data(), runs[0].size() * sizeof(float)) == 0);
  }
  cuda::set_cudnn_benchmark(false);
}

TEST_CASE("cuda: the planner's predicted peak holds on the device, cuDNN benchmark on and off") {
  for (bool bench : {false, true}) {
    cuda::set_cudnn_benchmark(bench);
    INFO("cudnn benchmark " << bench);
    manual_seed(1);
    auto m = test::small_cnn();
    m->to(kGpu);
    m->train();
    optim::SGD opt(m->parameters(), {.lr = 0.001f, .momentum = 0.9f});
    // Shapes no other test used, so the first measurement meets cold algorithm caches.
    const Shape in{5, 3, 37 + (bench ? 2 : 0), 41};
    const nn::ChainCost first = nn::measure_chain(*m, in);
    const nn::ChainCost second = nn::measure_chain(*m, in);
    // Algorithm searches and context creation happen once, outside what is measured.
    CHECK(first.fixed_bytes == second.fixed_bytes);
    for (size_t u = 0; u < first.units.size(); ++u) {
      INFO("unit " << u << " " << first.units[u].name);
      CHECK(first.units[u].fwd_peak == second.units[u].fwd_peak);
      CHECK(first.units[u].bwd_peak == second.units[u].bwd_peak);
      CHECK(first.units[u].extra_bytes == second.units[u].extra_bytes);
    }
    const size_t lo = nn::min_feasible_peak(first), hi = nn::plan_none(first).predicted_peak;
    for (const nn::Plan& p : {nn::plan_none(first), nn::plan_sqrt(first), nn::plan_min_peak(first),
                              nn::plan_budget(first, lo + (hi - lo) / 2)}) {
      Tensor x = rand_tensor(in, 31).to(kGpu);
      Tensor target = labels(in[0], 3, 32).to(kGpu);
      synchronize(Device::cuda(0));
      reset_peak_memory_stats(kGpu);
      opt.zero_grad();
      {
        Tensor loss = cross_entropy(nn::forward_with_plan(*m, p, x), target);
        loss.backward();
        opt.step();
      }
      synchronize(Device::cuda(0));
      const size_t measured = memory_stats(kGpu).peak_in_use;
      const double ratio = static_cast<double>(measured) / static_cast<double>(p.predicted_peak);
      INFO("plan " << p.kind << " " << p.str() << ": predicted " << p.predicted_peak << ", measured " << measured);
      CHECK(ratio > 0.9);
      CHECK(ratio < 1.1);
    }
  }
  cuda::set_cudnn_benchmark(false);
}

TEST_CASE("cuda: a training state saved from the device resumes on the device bit for bit") {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("mg_test_cuda_" + std::to_string(::getpid()) + ".state.safetensors")).string();
  auto a = mlp_for_moves(9);
  a->to(kGpu);
  optim::Adam opt_a(a->parameters(), {.lr = 1e-2f});
  three_steps(*a, opt_a, kGpu, 400);
  manual_seed(1234);
  default_generator().advance(5);
  optim::save_train_state(path, *a, opt_a, {.epoch = 2});
  auto b = mlp_for_moves(10);  // other weights, overwritten by the load
  b->to(kGpu);
  optim::Adam opt_b(b->parameters(), {.lr = 1e-2f});
  manual_seed(0);
  const optim::TrainState st = optim::load_train_state(path, *b, opt_b);
  std::filesystem::remove(path);
  CHECK(st.epoch == 2);
  CHECK(opt_b.step_count() == 3);
  CHECK(default_generator().seed() == 1234);
  auto sa = opt_a.state_tensors(), sb = opt_b.state_tensors();
  for (size_t i = 0; i < sa.size(); ++i) {
    CHECK(sb[i].second.is_cuda());
    CHECK(test::bit_equal(sb[i].second.cpu(), sa[i].second.cpu()));
  }
  three_steps(*a, opt_a, kGpu, 500);
  three_steps(*b, opt_b, kGpu, 500);
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    CHECK(pb[i].is_cuda());
    CHECK(test::bit_equal(pb[i].cpu(), pa[i].cpu()));
  }
}

#endif  // MINIGRAD_WITH_CUDA
