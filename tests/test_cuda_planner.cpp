// Checkpoint plans on the device: checkpointed gradients equal plain ones bit for bit (dropout
// included, every plan), and the planner's predicted peak memory holds on the device, cuDNN
// benchmark on and off.
#include "cuda_helpers.h"  // exits with 77 (skipped) without the CUDA backend or a device

#ifdef MINIGRAD_WITH_CUDA
#include <functional>

#include <minigrad/core/checkpoint.h>
#include <minigrad/core/memory.h>
#include <minigrad/nn/checkpoint_plan.h>
#include <minigrad/nn/models.h>
#include <minigrad/optim/optimizer.h>

using namespace mg;
using namespace mg::test;

namespace {
// One training-mode forward/backward under `plan`, dropout from seed 77, into zeroed buffers;
// the parameters' gradients and the input's, on the host.
std::vector<Tensor> ckpt_grads(nn::Sequential& m, const std::vector<nn::Segment>& plan, const Tensor& x_data,
                               const Tensor& target) {
  const Device d = m.parameters()[0].device();
  m.release_grads();
  for (const Tensor& p : m.parameters()) p.set_grad(Tensor::zeros(p.shape(), TensorOptions{DType::f32, d}));
  Tensor x = x_data.to(d).requires_grad_();
  manual_seed(77);
  cross_entropy(nn::forward_with_plan(m, plan, x), target.to(d)).backward();
  std::vector<Tensor> g;
  for (const Tensor& p : m.parameters()) g.push_back(p.grad().cpu());
  g.push_back(x.grad().cpu());
  return g;
}

using MakeModel = std::function<std::shared_ptr<nn::Sequential>()>;
using PlansFor = std::function<std::vector<std::vector<nn::Segment>>(nn::Sequential& on_device)>;

// A model made twice from one seed, on the device and on the CPU: the device's gradients are the
// CPU's (dropout masks from the same (seed, offset)); two plain runs, and every checkpointed run,
// give the same bits. Deterministic convolutions are the default (Note [deterministic
// convolutions], src/kernels/cuda/conv2d.cu) and max-pool backward gathers without atomics.
void check_device_gradients(const MakeModel& make, const Shape& in, int64_t classes, const PlansFor& plans) {
  manual_seed(5);
  auto cpu_model = make();
  manual_seed(5);
  auto m = make();
  m->to(kGpu);
  const Tensor x = rand_tensor(in, 12), t = labels(in[0], classes, 13);
  const std::vector<Tensor> ref = ckpt_grads(*m, {}, x, t);
  const std::vector<Tensor> host = ckpt_grads(*cpu_model, {}, x, t);
  for (size_t i = 0; i < ref.size(); ++i) {
    INFO("gradient " << i << " device vs CPU rel err " << rel_err(ref[i], host[i]));
    CHECK(rel_err(ref[i], host[i]) < kStrict);
  }
  REQUIRE(cuda::cudnn_deterministic());
  const std::vector<Tensor> again = ckpt_grads(*m, {}, x, t);
  for (size_t i = 0; i < ref.size(); ++i) CHECK(test::bit_equal(again[i], ref[i]));
  for (const auto& plan : plans(*m)) {
    nn::Plan p;
    p.segments = plan;
    const std::vector<Tensor> got = ckpt_grads(*m, plan, x, t);
    for (size_t i = 0; i < ref.size(); ++i) {
      INFO("plan " << p.str() << ", gradient " << i << ", max |diff| " << test::max_abs_diff(got[i], ref[i]));
      CHECK(test::bit_equal(got[i], ref[i]));
    }
  }
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
    check_device_gradients(c.make, c.in, c.name[0] == 'M' ? 5 : 3, [&](nn::Sequential&) { return c.plans; });
  }
}

// Note [channels last] (src/ops/conv2d.cpp): cuDNN's NHWC convolutions (KRSC weights), the pools
// reading planes C apart and BatchNorm's channels-last sums, through whole models.
TEST_CASE("cuda: channels-last VGG16/16 and ResNet-18/16, ReLUs fused or not: the CPU's gradients; checkpointed = plain, bit for bit") {
  Tf32Conv off(false);
  struct Case {
    const char* name;
    std::shared_ptr<nn::Sequential> (*make)();
  };
  const std::vector<Case> cases = {
      {"VGG16/16 (dropout)", [] { return nn::make_vgg16(3, 16, 0.3f, Layout::nhwc); }},
      {"ResNet-18/16 (BatchNorm, dropout)", [] { return nn::make_resnet18(3, 16, 0.3f, Layout::nhwc); }},
      // Note [fused relu]: cuDNN's conv+bias+relu graph (or its fallback), BatchNorm's ReLU in its kernel.
      {"VGG16/16 with fused ReLUs", [] {
         auto m = nn::make_vgg16(3, 16, 0.3f, Layout::nhwc);
         nn::fuse_relu(*m);
         return m;
       }},
      {"ResNet-18/16 with fused ReLUs", [] {
         auto m = nn::make_resnet18(3, 16, 0.3f, Layout::nhwc);
         nn::fuse_relu(*m);
         return m;
       }},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    // The CPU runs the channels-first bits (test_layout); the plans are the planner's.
    const Shape in{6, 32, 32, 3};
    check_device_gradients(c.make, in, 3, [&](nn::Sequential& m) {
      const nn::ChainCost cost = nn::measure_chain(m, in);
      std::vector<std::vector<nn::Segment>> plans;
      for (const nn::Plan& p : {nn::plan_sqrt(cost), nn::plan_segments(cost, 2), nn::plan_min_peak(cost)})
        plans.push_back(p.segments);
      return plans;
    });
  }
}

TEST_CASE("cuda: the planner's predicted peak holds on the device, cuDNN benchmark on and off") {
  for (bool bench : {false, true}) {
    const CudnnBenchmark benchmark(bench);
    INFO("cudnn benchmark " << bench);
    manual_seed(1);
    auto m = test::small_cnn();
    m->to(kGpu);
    m->train();
    optim::SGD opt(m->parameters(), {.lr = 0.001f, .momentum = 0.9f});
    // Shapes no other test used, so the first measurement meets cold algorithm caches; a batch
    // whose activations (about 70 MB) outweigh the fixed part (the cuBLAS workspace alone is 32 MiB
    // on sm_90), so that what the planner predicts is what the check compares.
    const Shape in{64, 3, 127 + (bench ? 2 : 0), 129};
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
      // Above the fixed part F, which both sides hold.
      const double f = static_cast<double>(first.fixed_bytes);
      const double ratio = (static_cast<double>(measured) - f) / (static_cast<double>(p.predicted_peak) - f);
      INFO("plan " << p.kind << " " << p.str() << ": predicted " << p.predicted_peak << ", measured " << measured
                   << ", fixed " << first.fixed_bytes);
      MESSAGE("cudnn benchmark " << bench << ", plan " << p.kind << ": measured / predicted above F " << ratio);
      CHECK(ratio > 0.9);
      CHECK(ratio < 1.1);
    }
  }
}

TEST_CASE("cuda: offloaded segments give the plain gradients' bits; the host pool is page-locked and empties") {
  // Note [offload schedule]: the copies run on the copy stream; a missing wait would show here as
  // gradients from stale or half-copied activations.
  Tf32Conv off(false);
  manual_seed(5);
  auto m = test::small_cnn();
  m->to(kGpu);
  const Shape in{3, 3, 11, 13};
  const Tensor x = rand_tensor(in, 12);
  const Tensor t = labels(in[0], 3, 13);
  const std::vector<Tensor> ref = ckpt_grads(*m, {}, x, t);
  const std::vector<std::vector<nn::Segment>> plans = {
      {{0, 3, 0, true}}, {{0, 11, 0, true}}, {{0, 5, 0, true}, {5, 9, 0, true}}, {{1, 2}, {4, 8, 0, true}, {9, 10, 1}}};
  for (const auto& plan : plans) {
    nn::Plan p;
    p.segments = plan;
    reset_host_peak_memory_stats();
    const std::vector<Tensor> got = ckpt_grads(*m, plan, x, t);
    for (size_t i = 0; i < ref.size(); ++i) {
      INFO("plan " << p.str() << ", gradient " << i << ", max |diff| " << test::max_abs_diff(got[i], ref[i]));
      CHECK(test::bit_equal(got[i], ref[i]));
    }
    CHECK(host_memory_stats().peak_in_use > 0);
    CHECK(host_memory_stats().in_use == 0);
  }
}

TEST_CASE("cuda: offloaded plans' device and host peaks as predicted") {
  manual_seed(1);
  auto m = test::small_cnn();
  m->to(kGpu);
  m->train();
  optim::SGD opt(m->parameters(), {.lr = 0.001f, .momentum = 0.9f});
  const Shape in{64, 3, 131, 129};
  const nn::ChainCost cost = nn::measure_chain(*m, in, {.offload = nn::MeasureOptions::Offload::on});
  REQUIRE(nn::offload_offered(cost));
  CHECK(cost.copies_overlap);
  MESSAGE("host link: " << cost.to_host_bytes_per_ms / 1e6 << " GB/s to the host, " << cost.from_host_bytes_per_ms / 1e6
                        << " GB/s back");
  const size_t n = cost.units.size();
  auto seg = [&](size_t s, size_t e, bool off) { return nn::Segment{cost.units[s].begin, cost.units[e - 1].end, 0, off}; };
  const size_t lo = nn::min_feasible_peak(cost), hi = nn::plan_none(cost).predicted_peak;
  std::vector<std::vector<nn::Segment>> plans = {{seg(0, n / 2, true)}, {seg(0, 3, true), seg(3, n - 2, true)},
                                                 {seg(0, 2, false), seg(2, n - 1, true)},
                                                 nn::plan_budget(cost, lo + (hi - lo) / 2).segments};
  for (const auto& plan : plans) {
    nn::Plan p;
    p.segments = plan;
    Tensor x = rand_tensor(in, 31).to(kGpu);
    Tensor target = labels(in[0], 3, 32).to(kGpu);
    synchronize(Device::cuda(0));
    reset_peak_memory_stats(kGpu);
    reset_host_peak_memory_stats();
    opt.zero_grad();
    {
      Tensor loss = cross_entropy(nn::forward_with_plan(*m, plan, x), target);
      loss.backward();
      opt.step();
    }
    synchronize(Device::cuda(0));
    const size_t measured = memory_stats(kGpu).peak_in_use, predicted = nn::predict_peak(cost, plan);
    const double f = static_cast<double>(cost.fixed_bytes);
    const double ratio = (static_cast<double>(measured) - f) / (static_cast<double>(predicted) - f);
    INFO("plan " << p.str() << ": predicted " << predicted << ", measured " << measured);
    MESSAGE("offload plan " << p.str() << ": measured / predicted above F " << ratio << ", host "
                            << host_memory_stats().peak_in_use << " of " << nn::predict_host_peak(cost, plan) << " predicted");
    CHECK(ratio > 0.99);
    CHECK(ratio < 1.01);
    CHECK(host_memory_stats().peak_in_use == nn::predict_host_peak(cost, plan));
  }
}

#endif  // MINIGRAD_WITH_CUDA
