// Training on the device against training on the host: the fused SGD and Adam updates, whole MLP
// training steps, an optimizer following model.to (its state and gradients), gradient
// accumulation and the step statistics, and a training state saved and resumed on the device.
// Tolerances: tests/cuda_helpers.h.
#include "cuda_helpers.h"  // exits with 77 (skipped) without the CUDA backend or a device

#ifdef MINIGRAD_WITH_CUDA
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "kernels/optim.h"
#include <minigrad/core/autocast.h>
#include <minigrad/data/idx.h>
#include <minigrad/data/loader.h>
#include <minigrad/nn/models.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/optim/accumulate.h>
#include <minigrad/optim/optimizer.h>
#include <minigrad/optim/train_state.h>
#include <minigrad/train/trainer.h>

using namespace mg;
using namespace mg::test;

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

namespace {
// Steps of SGD under autocast(bf16) on a model on the CPU and its twin on the device, from the same
// weights and batches (Note [cuda half kernels] in src/kernels/cuda/storage.cuh): each step's loss
// within 2e-2 relative (the bound for bf16 against a reference) and the final weights within
// 2e-2 relative error of the CPU's. `batch(step, device)` gives (input, target).
template <class Batch>
void bf16_steps_match(const std::function<std::shared_ptr<nn::Module>()>& make, int steps, float lr, Batch batch,
                      const optim::LossFn& loss_fn) {
  auto cpu_model = make(), gpu_model = make();
  gpu_model->to(kGpu);
  optim::SGD cpu_opt(cpu_model->parameters(), {.lr = lr, .momentum = 0.9f});
  optim::SGD gpu_opt(gpu_model->parameters(), {.lr = lr, .momentum = 0.9f});
  const AutocastGuard bf16(DType::bf16);
  for (int step = 0; step < steps; ++step) {
    const auto [xc, yc] = batch(step, Device::cpu());
    const auto [xg, yg] = batch(step, kGpu);
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
    Tensor loss_c = loss_fn(cpu_model->forward(xc), yc), loss_g = loss_fn(gpu_model->forward(xg), yg);
    loss_c.backward();
    loss_g.backward();
    cpu_opt.step();
    gpu_opt.step();
    INFO("step " << step << " loss cpu " << loss_c.item() << " cuda " << loss_g.item());
    CHECK(std::isfinite(loss_g.item()));
    CHECK(std::abs(loss_g.item() - loss_c.item()) <= 2e-2 * std::abs(loss_c.item()));
  }
  auto pc = cpu_model->named_parameters(), pg = gpu_model->named_parameters();
  REQUIRE(pc.size() == pg.size());
  for (size_t i = 0; i < pc.size(); ++i) {
    INFO(pc[i].first);
    CHECK(pg[i].second.dtype() == DType::f32);  // the masters stay float32
    CHECK(rel_err(pg[i].second, pc[i].second) < 2e-2);
  }
}
}  // namespace

TEST_CASE("cuda: bf16 training steps (autocast) of an MLP, VGG16/16, ResNet-18/8 and a tiny GPT follow the CPU's") {
  const optim::LossFn ce = [](const Tensor& logits, const Tensor& y) { return cross_entropy(logits, y); };
  SUBCASE("MLP") {
    bf16_steps_match([] { manual_seed(7); return std::static_pointer_cast<nn::Module>(nn::make_mlp({37, 64, 29, 10})); },
                     6, 0.05f,
                     [](int step, Device d) { return std::pair{rand_tensor({23, 37}, 800 + step).to(d), labels(23, 10, 900 + step).to(d)}; },
                     ce);
  }
  SUBCASE("VGG16/16 (conv2d, max_pool2d, batch of 8 at 32x32)") {
    bf16_steps_match([] { manual_seed(8); return std::static_pointer_cast<nn::Module>(nn::make_vgg16(10, 16, 0.0f)); },
                     4, 0.01f,
                     [](int step, Device d) { return std::pair{rand_tensor({8, 3, 32, 32}, 810 + step).to(d), labels(8, 10, 910 + step).to(d)}; },
                     ce);
  }
  SUBCASE("ResNet-18/8 (batch_norm with float32 parameters, adaptive_avg_pool2d, add)") {
    bf16_steps_match([] { manual_seed(10); return std::static_pointer_cast<nn::Module>(nn::make_resnet18(10, 8)); },
                     4, 0.01f,
                     [](int step, Device d) { return std::pair{rand_tensor({8, 3, 32, 32}, 830 + step).to(d), labels(8, 10, 930 + step).to(d)}; },
                     ce);
  }
  SUBCASE("tiny GPT (layer_norm and embedding with float32 parameters, attention, gelu)") {
    const nn::GPTConfig cfg{.vocab_size = 256, .block_size = 32, .n_layer = 2, .n_head = 4, .n_embd = 64};
    bf16_steps_match([cfg] { manual_seed(9); return std::static_pointer_cast<nn::Module>(nn::make_gpt2(cfg)); }, 4,
                     0.01f,
                     [](int step, Device d) {
                       return std::pair{labels(4 * 32, 256, 820 + step).reshape({4, 32}).to(d),
                                        labels(4 * 32, 256, 920 + step).to(d)};
                     },
                     [](const Tensor& logits, const Tensor& y) { return cross_entropy(logits.reshape({-1, 256}), y); });
  }
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

// Note [each step from the same weights] (tests/mpi_training.cpp): over a whole epoch two orders
// of summation (cuBLAS's and the CPU's, or 16x4 against 64) can part for good at a ReLU input that
// rounding moves across zero, so the exactness claim is checked per step. Before each of the
// epoch's 125 steps the weights of the 16x4 run on the device are copied into a CPU model, which
// takes one step at batch 64 on the same window; both must land on the same weights.
TEST_CASE("cuda: each 16x4 window on the device steps as one batch of 64 on the CPU") {
  static const data::IdxDataset data = data::make_synthetic(7992, 7);
  manual_seed(3);
  auto model = nn::make_mlp({784, 64, 10});
  model->to(kGpu);
  optim::SGD opt(model->parameters(), {.lr = 0.05f});
  optim::Accumulator acc(opt, {.steps = 4});
  data::DataLoader loader(data, {.batch_size = 16, .seed = 11, .device = kGpu});
  manual_seed(3);
  auto ref = nn::make_mlp({784, 64, 10});
  optim::SGD ref_opt(ref->parameters(), {.lr = 0.05f});
  data::DataLoader ref_loader(data, {.batch_size = 64, .seed = 11});  // the same windows
  ref_loader.start_epoch(0);
  std::vector<Tensor> before;
  for (const Tensor& p : ref->parameters()) before.push_back(p.clone());
  double worst = 0;
  int64_t steps = 0;
  optim::TrainCallbacks cb;
  cb.on_step = [&](const optim::StepInfo&) {
    const std::vector<Tensor> now = model->parameters();
    std::vector<Tensor> rp = ref->parameters();
    for (size_t i = 0; i < rp.size(); ++i) rp[i].copy_(before[i]);
    data::Batch b;
    REQUIRE(ref_loader.next(b));
    optim::Accumulator one(ref_opt, {.steps = 1});
    one.backward(cross_entropy(ref->forward(b.x), b.y, Reduction::sum), b.x.size(0));
    one.step();
    for (size_t i = 0; i < rp.size(); ++i) {
      before[i] = now[i].cpu();
      worst = std::max(worst, rel_err(before[i], rp[i]));
    }
    ++steps;
  };
  optim::train_epoch(*model, loader, acc, 0, {}, cb);
  data::Batch extra;
  CHECK_FALSE(ref_loader.next(extra));  // one step per window, none missed
  MESSAGE("16x4 on the device against 64 on the CPU, each of " << steps << " steps from the same weights: worst "
                                                                 "relative error " << worst);
  CHECK(steps == 125);
  CHECK(worst < kStrict);
}

// The same setting end to end: the differences are reported, not held to rounding (a kink can
// separate any two orders of summation over an epoch, above); the usual recipe's error on the
// short last window is far larger than either.
TEST_CASE("cuda: accumulation 16x4 and 64 over an epoch, on the device and the CPU") {
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
  double acc_vs_big = 0, device_vs_cpu = 0;
  for (size_t i = 0; i < big.size(); ++i) {
    acc_vs_big = std::max(acc_vs_big, rel_err(acc[i], big[i]));
    device_vs_cpu = std::max(device_vs_cpu, rel_err(big[i], cpu[i]));
  }
  MESSAGE("end to end, worst relative error: 16x4 vs 64 on the device " << acc_vs_big << ", device vs CPU "
                                                                       << device_vs_cpu);
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

// Note [prefetched micro-batches] on a GPU: the next micro-batch read into page-locked memory and
// copied on the copy stream while one computes (Note [staged batches]). Deterministic convolutions
// (the default) make the bits comparable: prefetch on must give those of prefetch off, and the
// step's peak must hold the one micro-batch more that the plan counts.
TEST_CASE("cuda: the Trainer's prefetched micro-batches give the bits of prefetch off; the peak holds one more") {
  const auto data = random_dataset(72, {3, 32, 32}, 3, 7);
  std::vector<std::vector<std::vector<uint8_t>>> bits;
  std::vector<FitReport> reports;
  std::vector<size_t> staged;
  for (Prefetch p : {Prefetch::off, Prefetch::on}) {
    manual_seed(21);
    auto m = nn::make_vgg16(3, 16, 0.3f);
    m->to(kGpu);
    optim::SGD opt(m->parameters(), {.lr = 0.05f, .momentum = 0.9f});
    Trainer t(*m, data, opt, {.batch_size = 32, .micro_batch = 12, .checkpoint = "sqrt", .epochs = 2, .drop_last = false,
                              .seed = 2, .progress = Progress::off, .prefetch = p});
    reports.push_back(t.fit());
    staged.push_back(t.cost().staged_bytes);
    bits.push_back(state_bits(*m));
  }
  CHECK(reports[1].prefetch);
  CHECK(reports[1].steps == 6);
  CHECK(reports[1].losses == reports[0].losses);
  CHECK(bits[1] == bits[0]);
  CHECK(staged[0] == 0);
  CHECK(staged[1] == 12 * (3 * 32 * 32 * sizeof(float) + sizeof(int64_t)));
  const FitReport& on = reports[1];
  MESSAGE("prefetch on: peak " << on.peak_in_use << " B (predicted " << on.plan.predicted_peak << ", off "
                               << reports[0].peak_in_use << "), data wait per step (ms) " << on.step_data_ms[1] << ", "
                               << on.step_data_ms[2] << "; cudaMalloc calls per step " << on.step_system_allocs[1] << ", "
                               << on.step_system_allocs[2]);
  CHECK(on.peak_in_use >= reports[0].peak_in_use);
  CHECK(on.peak_in_use <= on.plan.predicted_peak + on.plan.predicted_peak / 100);
}

#endif  // MINIGRAD_WITH_CUDA
