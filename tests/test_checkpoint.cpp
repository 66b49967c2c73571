// mg::checkpoint (Note [checkpoint replay]): exact gradients, memory actually dropped, replay
// checks, and the errors a user can run into. Plans and the planner: tests/test_planner.cpp.
#include <functional>
#include <optional>
#include <string>

#include "core/tape.h"
#include "helpers.h"
#include <minigrad/nn/checkpoint_plan.h>

using namespace mg;
using mg::test::bit_equal;
using mg::test::mlp_with_dropout;
using mg::test::rand_tensor;
using mg::test::small_cnn;

namespace {

const Device kCpu = Device::cpu();

struct StepResult {
  std::vector<Tensor> grads;  // parameters', then the input's
  float loss = 0;
};

// One forward/backward in training mode with dropout drawn from seed 77; gradients land in
// fresh tensors (Module::release_grads) or, with `buffers`, in optimizer-style zeroed buffers.
StepResult step(nn::Sequential& m, const std::vector<nn::Segment>& plan, const Tensor& x_data,
                const Tensor& target, bool buffers) {
  m.release_grads();
  if (buffers) {
    for (const Tensor& p : m.parameters()) p.set_grad(Tensor::zeros(p.shape()));
  }
  Tensor x = x_data.clone().requires_grad_();
  manual_seed(77);
  Tensor loss = cross_entropy(nn::forward_with_plan(m, plan, x), target);
  loss.backward();
  StepResult r;
  for (const Tensor& p : m.parameters()) r.grads.push_back(p.grad().clone());
  r.grads.push_back(x.grad().clone());
  r.loss = loss.item();
  return r;
}

void check_bit_equal(const StepResult& a, const StepResult& b) {
  REQUIRE(a.grads.size() == b.grads.size());
  CHECK(a.loss == b.loss);
  for (size_t i = 0; i < a.grads.size(); ++i) {
    INFO("gradient " << i << " shape " << shape_str(a.grads[i].shape()) << ", max |diff| "
                     << mg::test::max_abs_diff(a.grads[i], b.grads[i]));
    CHECK(bit_equal(a.grads[i], b.grads[i]));
  }
}

Tensor targets(std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return Tensor::from_vector(v, {n});
}

}  // namespace

TEST_CASE("checkpointed MLP with dropout: gradients bit for bit, for several splits") {
  manual_seed(3);
  auto m = mlp_with_dropout();
  m->train();
  Tensor x = rand_tensor({7, 4, 5}, 11);
  Tensor t = targets({0, 4, 2, 2, 1, 3, 0});
  for (bool buffers : {false, true}) {
    const StepResult ref = step(*m, {}, x, t, buffers);
    // Dropout really is active: a different mask stream gives different gradients.
    {
      m->release_grads();
      manual_seed(78);
      Tensor xx = x.clone().requires_grad_();
      cross_entropy(m->forward(xx), t).backward();
      CHECK_FALSE(bit_equal(xx.grad(), ref.grads.back()));
    }
    const std::vector<std::vector<nn::Segment>> plans = {
        {{0, 8}}, {{1, 4}}, {{1, 4}, {4, 7}}, {{3, 4}}, {{2, 3}, {5, 8}}, {{0, 1}, {1, 2}, {2, 3}, {6, 8}},
        nn::pytorch_segments(8, 3)};
    for (const auto& plan : plans) {
      nn::Plan p;
      p.segments = plan;
      INFO("plan " << p.str() << (buffers ? ", optimizer buffers" : ", fresh gradients"));
      check_bit_equal(ref, step(*m, plan, x, t, buffers));
    }
  }
}

TEST_CASE("checkpointed CNN (conv, pools, dropout): gradients bit for bit") {
  manual_seed(5);
  auto m = small_cnn();
  m->train();
  Tensor x = rand_tensor({3, 3, 11, 13}, 12);
  Tensor t = targets({2, 0, 1});
  const StepResult ref = step(*m, {}, x, t, true);
  const std::vector<std::vector<nn::Segment>> plans = {
      {{0, 3}}, {{0, 2}, {2, 5}}, {{3, 6}}, {{0, 11}}, {{5, 9}}, {{1, 2}, {4, 8}, {9, 10}},
      nn::pytorch_segments(11, 4)};
  for (const auto& plan : plans) {
    nn::Plan p;
    p.segments = plan;
    INFO("plan " << p.str());
    check_bit_equal(ref, step(*m, plan, x, t, true));
  }
}

TEST_CASE("checkpoint_sequential splits like torch.utils.checkpoint.checkpoint_sequential") {
  using S = std::vector<nn::Segment>;
  // segment_size = n // segments; the first segments - 1 chunks are checkpointed; the last chunk
  // (with the remainder) is not.
  CHECK(nn::pytorch_segments(10, 3) == S{{0, 3}, {3, 6}});
  CHECK(nn::pytorch_segments(7, 2) == S{{0, 3}});
  CHECK(nn::pytorch_segments(5, 5) == S{{0, 1}, {1, 2}, {2, 3}, {3, 4}});
  CHECK(nn::pytorch_segments(9, 1).empty());
  CHECK(nn::pytorch_segments(40, 6) == S{{0, 6}, {6, 12}, {12, 18}, {18, 24}, {24, 30}});
  CHECK_THROWS_AS(nn::pytorch_segments(4, 0), Error);
  CHECK_THROWS_AS(nn::pytorch_segments(4, 5), Error);

  manual_seed(4);
  auto m = mlp_with_dropout();
  Tensor x = rand_tensor({6, 20}, 13);
  Tensor t = targets({1, 2, 3, 4, 0, 1});
  const StepResult ref = step(*m, {}, x, t, false);
  m->release_grads();
  Tensor xx = x.clone().requires_grad_();
  manual_seed(77);
  Tensor loss = cross_entropy(nn::checkpoint_sequential(*m, 3, xx), t);
  loss.backward();
  CHECK(loss.item() == ref.loss);
  CHECK(bit_equal(xx.grad(), ref.grads.back()));
  CHECK(bit_equal(m->parameters()[0].grad(), ref.grads[0]));
}

TEST_CASE("forward_with_plan rejects malformed plans") {
  auto m = mlp_with_dropout();
  Tensor x = rand_tensor({2, 20}, 1);
  CHECK_THROWS_WITH_AS(nn::forward_with_plan(*m, std::vector<nn::Segment>{{3, 3}}, x), doctest::Contains("non-empty"), Error);
  CHECK_THROWS_AS(nn::forward_with_plan(*m, std::vector<nn::Segment>{{2, 5}, {4, 6}}, x), Error);
  CHECK_THROWS_AS(nn::forward_with_plan(*m, std::vector<nn::Segment>{{5, 9}}, x), Error);
}

TEST_CASE("checkpoint drops the segment's activations after forward and frees everything after backward") {
  // L0 64->256, R1, L2 256->128, R3, L4 128->96, R5, L6 96->8. Segment [1, 6): the tape no longer
  // keeps R1's output (N x 256) and R3's (N x 128); it keeps the segment input, L0's output
  // (N x 256), which without checkpointing is freed after R1. R5's output is the segment's
  // output, kept by L6 either way.
  manual_seed(9);
  auto net = mg::test::seven_layer_mlp();
  nn::Sequential& m = *net;
  const int64_t n = 32;
  Tensor x = rand_tensor({n, 64}, 21);
  Tensor g = rand_tensor({n, 8}, 22);
  for (const Tensor& p : m.parameters()) p.set_grad(Tensor::zeros(p.shape()));

  auto forward_in_use = [&](const std::vector<nn::Segment>& plan, size_t* after_backward) {
    const size_t before = memory_stats(kCpu).in_use;
    size_t after_forward = 0;
    {
      Tensor y = nn::forward_with_plan(m, plan, x);
      after_forward = memory_stats(kCpu).in_use - before;
      y.backward(g);
    }
    *after_backward = memory_stats(kCpu).in_use - before;
    return after_forward;
  };
  size_t back_none = 1, back_ckpt = 1;
  const size_t none = forward_in_use({}, &back_none);
  const size_t ckpt = forward_in_use({{1, 6}}, &back_ckpt);
  const size_t f = sizeof(float);
  CHECK(none - ckpt == n * 256 * f + n * 128 * f - n * 256 * f);
  CHECK(none == n * (256 + 128 + 96 + 8) * f);  // R1, R3, R5 kept by the tape, the output
  CHECK(back_none == 0);
  CHECK(back_ckpt == 0);  // the boundary went with the checkpoint node's saved tensors
}

TEST_CASE("checkpoint: the function runs once; replay repeats none of its side effects") {
  manual_seed(2);
  nn::Linear lin(6, 5);
  Tensor x = rand_tensor({4, 6}, 3, true);
  int calls = 0;
  auto fn = [&](const std::vector<Tensor>& in) {
    ++calls;
    return relu(lin.forward(in[0]));
  };
  Tensor y = checkpoint(fn, {x});
  CHECK(calls == 1);
  y.backward(rand_tensor({4, 5}, 4));
  CHECK(calls == 1);
  CHECK(x.grad().defined());
  CHECK(lin.weight().grad().defined());
}

TEST_CASE("checkpoint with grad mode off is a plain call") {
  nn::Linear lin(6, 5);
  Tensor x = rand_tensor({4, 6}, 3, true);
  int calls = 0;
  auto fn = [&](const std::vector<Tensor>& in) {
    ++calls;
    return relu(lin.forward(in[0]));
  };
  NoGradGuard ng;
  Tensor y = checkpoint(fn, {x});
  CHECK(calls == 1);
  CHECK(y.grad_fn() == nullptr);
  CHECK_FALSE(y.requires_grad());
  CHECK(bit_equal(y, relu(lin.forward(x))));
}

TEST_CASE("checkpoint: a second backward through a released segment is an error") {
  nn::Linear lin(6, 5);
  Tensor x = rand_tensor({4, 6}, 3, true);
  auto fn = [&](const std::vector<Tensor>& in) { return relu(lin.forward(in[0])); };
  Tensor g = rand_tensor({4, 5}, 5);
  Tensor y = checkpoint(fn, {x});
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(std::string(node_name(*y.grad_fn())) == "checkpoint");
  y.backward(g);
  CHECK_THROWS_WITH_AS(y.backward(g), doctest::Contains("second time"), Error);

  // With retain_graph the segment replays again, and the gradients add up exactly as without
  // checkpointing.
  lin.release_grads();
  x.set_grad(Tensor());
  Tensor y2 = checkpoint(fn, {x});
  y2.backward(g, /*retain_graph=*/true);
  y2.backward(g);
  Tensor gx_ckpt = x.grad().clone(), gw_ckpt = lin.weight().grad().clone();
  lin.release_grads();
  x.set_grad(Tensor());
  Tensor y3 = fn({x});
  y3.backward(g, true);
  y3.backward(g);
  CHECK(bit_equal(gx_ckpt, x.grad()));
  CHECK(bit_equal(gw_ckpt, lin.weight().grad()));
}

TEST_CASE("checkpoint: a tensor with history captured from outside the segment is a clear error") {
  nn::Linear lin(6, 6);
  Tensor x = rand_tensor({3, 6}, 7, true);
  Tensor outside = relu(lin.forward(x));  // has history
  auto fn = [&](const std::vector<Tensor>& in) { return add(in[0], outside); };
  CHECK_THROWS_WITH_AS(checkpoint(fn, {x}), doctest::Contains("computed outside it"), Error);
  // Passed as an input instead, it works and its gradient flows back.
  Tensor y = checkpoint([](const std::vector<Tensor>& in) { return add(in[0], in[1]); }, {x, outside});
  y.backward(rand_tensor({3, 6}, 8));
  CHECK(lin.weight().grad().defined());
}

TEST_CASE("checkpoint replay checks shapes against the first pass") {
  manual_seed(6);
  nn::Conv2d conv(2, 3, 3, 1, 1);
  Tensor x = rand_tensor({1, 2, 6, 7}, 9, true);
  Tensor y = checkpoint([&](const std::vector<Tensor>& in) { return relu(conv.forward(in[0])); }, {x});
  CHECK(y.shape() == Shape{1, 3, 6, 7});
  // The weight is reshaped in place between forward and backward (same elements, 1x9 kernel):
  // the replayed convolution produces [1, 3, 8, 1], not the recorded [1, 3, 6, 7].
  conv.weight().impl().shape = {3, 2, 1, 9};
  CHECK_THROWS_WITH_AS(y.backward(rand_tensor({1, 3, 6, 7}, 10)), doctest::Contains("checkpoint replay"), Error);
  conv.weight().impl().shape = {3, 2, 3, 3};
}

TEST_CASE("checkpoint of a function that returns its input keeps the input's history") {
  nn::Linear lin(4, 4);
  Tensor x = rand_tensor({2, 4}, 14, true);
  Tensor h = lin.forward(x);
  Tensor y = checkpoint([](const std::vector<Tensor>& in) { return in[0]; }, {h});
  CHECK(y.same(h));
}

TEST_CASE("a few SGD steps of a small VGG16 with dropout: weights bit-identical under the sqrt plan") {
  // vgg_ckpt --checkpoint sqrt against --checkpoint none, in miniature.
  auto train = [](const std::string& spec) {
    manual_seed(11);
    auto m = nn::make_vgg16(2, 16);
    m->train();
    optim::SGD opt(m->parameters(), {.lr = 0.001f, .momentum = 0.9f});
    const Shape in{2, 3, 32, 32};
    const nn::Plan plan = nn::make_plan(nn::measure_chain(*m, in), spec);
    for (int step = 0; step < 3; ++step) {
      Tensor x = rand_tensor(in, 100 + step);
      Tensor t = targets({step % 2, (step + 1) % 2});
      opt.zero_grad();
      cross_entropy(nn::forward_with_plan(*m, plan, x), t).backward();
      opt.step();
    }
    return std::make_pair(m, plan);
  };
  auto [ref, none] = train("none");
  auto [ck, sqrt_plan] = train("sqrt");
  CHECK(none.segments.empty());
  CHECK(sqrt_plan.segments == nn::pytorch_segments(40, 6));
  auto a = ref->named_parameters(), b = ck->named_parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(bit_equal(a[i].second, b[i].second));
  }
}

// ---- offloaded segments (Note [offload]) -------------------------------------------------------

namespace {
std::vector<nn::Segment> offloaded(std::vector<nn::Segment> plan) {
  for (nn::Segment& g : plan) g.offload = true;
  return plan;
}
}  // namespace

TEST_CASE("offloaded segments: gradients bit for bit (MLP and CNN with dropout), mixed with replayed ones") {
  manual_seed(3);
  auto mlp = mlp_with_dropout();
  mlp->train();
  Tensor x = rand_tensor({7, 4, 5}, 11);
  Tensor t = targets({0, 4, 2, 2, 1, 3, 0});
  const StepResult ref = step(*mlp, {}, x, t, true);
  for (const auto& plan : std::vector<std::vector<nn::Segment>>{
           offloaded({{0, 8}}), offloaded({{1, 4}, {4, 7}}), offloaded({{3, 4}}),
           {{0, 2, 0, true}, {2, 5}, {5, 8, 0, true}}}) {
    nn::Plan p;
    p.segments = plan;
    INFO("MLP, plan " << p.str());
    check_bit_equal(ref, step(*mlp, plan, x, t, true));
    CHECK(host_memory_stats().in_use == 0);  // every offloaded byte came back and went
  }
  manual_seed(5);
  auto cnn = small_cnn();
  cnn->train();
  Tensor xc = rand_tensor({3, 3, 11, 13}, 12);
  Tensor tc = targets({2, 0, 1});
  const StepResult ref_cnn = step(*cnn, {}, xc, tc, true);
  for (const auto& plan : std::vector<std::vector<nn::Segment>>{
           offloaded({{0, 3}}), offloaded({{0, 11}}), {{1, 2}, {4, 8, 0, true}, {9, 10, 1}},
           {{0, 5, 0, true}, {5, 9, 0, true}}}) {
    nn::Plan p;
    p.segments = plan;
    INFO("CNN, plan " << p.str());
    check_bit_equal(ref_cnn, step(*cnn, plan, xc, tc, true));
    CHECK(host_memory_stats().in_use == 0);
  }
}

TEST_CASE("an offloaded segment moves its activations to the host pool, and back for backward") {
  // The net of "checkpoint drops the segment's activations ...": segment [1, 6) offloaded keeps
  // on the device what the checkpointed one keeps (its input, R5's output), and moves R1's and
  // R3's outputs (the saved inputs of L2 and L4) to the host pool; the weights L2 and L4 save
  // are parameters, and stay.
  manual_seed(9);
  auto net = mg::test::seven_layer_mlp();
  nn::Sequential& m = *net;
  const int64_t n = 32;
  const size_t f = sizeof(float);
  Tensor x = rand_tensor({n, 64}, 21);
  Tensor g = rand_tensor({n, 8}, 22);
  for (const Tensor& p : m.parameters()) p.set_grad(Tensor::zeros(p.shape()));
  const size_t before = memory_stats(kCpu).in_use;
  reset_host_peak_memory_stats();
  size_t on_device = 0, on_host = 0;
  {
    Tensor y = nn::forward_with_plan(m, offloaded({{1, 6}}), x);
    on_device = memory_stats(kCpu).in_use - before;
    on_host = host_memory_stats().in_use;
    y.backward(g);
  }
  CHECK(on_device == n * (256 + 96 + 8) * f);
  CHECK(on_host == n * (256 + 128) * f);
  CHECK(host_memory_stats().peak_in_use == on_host);
  CHECK(host_memory_stats().in_use == 0);
  CHECK(memory_stats(kCpu).in_use == before);

  // A second backward is the same error as for a replayed segment; with retain_graph it works,
  // and the gradients add up as without the segment.
  Tensor y = nn::forward_with_plan(m, offloaded({{1, 6}}), x);
  y.backward(g);
  CHECK_THROWS_WITH_AS(y.backward(g), doctest::Contains("second time"), Error);
  for (const Tensor& p : m.parameters()) p.set_grad(Tensor::zeros(p.shape()));
  Tensor y2 = nn::forward_with_plan(m, offloaded({{1, 6}}), x);
  y2.backward(g, /*retain_graph=*/true);
  y2.backward(g);
  std::vector<Tensor> twice;
  for (const Tensor& p : m.parameters()) twice.push_back(p.grad().clone());
  for (const Tensor& p : m.parameters()) p.set_grad(Tensor::zeros(p.shape()));
  Tensor y3 = m.forward(x);
  y3.backward(g, true);
  y3.backward(g);
  const std::vector<Tensor> params = m.parameters();
  for (size_t i = 0; i < params.size(); ++i) CHECK(bit_equal(twice[i], params[i].grad()));
}

TEST_CASE("offload and tiles together are a clear error") {
  nn::Linear lin(6, 5);
  Tensor x = rand_tensor({4, 6}, 3, true);
  auto fn = [&](const std::vector<Tensor>& in) { return relu(lin.forward(in[0])); };
  CHECK_THROWS_WITH_AS(checkpoint(fn, {x}, {.tile_rows = 2, .offload = true}), doctest::Contains("not both"), Error);
}

// ---- tiled segments (Note [tiled segments]) ----------------------------------------------------

TEST_CASE("tiled segments: gradients bit for bit for any tile size (CNN with dropout)") {
  // With optimizer buffers, every parameter's gradient is summed sample by sample into them, so
  // tiles change no bit; the input's gradient is a per-sample computation either way.
  auto cnn = std::make_shared<nn::Sequential>();
  cnn->add<nn::Conv2d>(3, 4, 3, 1, 1);
  cnn->add<nn::ReLU>();
  cnn->add<nn::Dropout>(0.3f);
  cnn->add<nn::Conv2d>(4, 6, 3, 2, 1);
  cnn->add<nn::ReLU>();
  cnn->add<nn::MaxPool2d>(2);
  cnn->add<nn::Dropout>(0.5f);
  cnn->add<nn::Flatten>();
  cnn->add<nn::Linear>(54, 3);
  manual_seed(5);
  cnn->train();
  Tensor x = rand_tensor({5, 3, 11, 13}, 12);
  Tensor t = targets({2, 0, 1, 1, 2});
  using S = std::vector<nn::Segment>;
  const std::vector<S> plans = {S{{0, 3, 1}}, S{{0, 3, 2}}, S{{0, 4, 3}}, S{{0, 8, 4}}, S{{0, 2, 2}, {3, 7, 3}},
                                S{{2, 8, 1}}, S{{0, 3, 5}}, S{{0, 3, 9}}};
  for (bool window : {false, true}) {  // dropout from the generator, and by sample
    auto run = [&](const S& plan) {
      std::optional<SampleWindowGuard> w;
      if (window) w.emplace(/*key=*/3, /*first_sample=*/2, /*sample_stride=*/2, /*sample_lane=*/1);
      return step(*cnn, plan, x, t, true);
    };
    const StepResult ref = run({});
    for (const S& plan : plans) {
      nn::Plan p;
      p.segments = plan;
      INFO("plan " << p.str() << (window ? ", in a sample window" : ""));
      check_bit_equal(ref, run(plan));
    }
  }
}

TEST_CASE("tiled segments: a few SGD steps of a small VGG16, dropout by sample on, weights bit-identical") {
  auto train = [](const std::vector<nn::Segment>& plan) {
    manual_seed(11);
    auto m = nn::make_vgg16(2, 16);
    m->train();
    optim::SGD opt(m->parameters(), {.lr = 0.01f, .momentum = 0.9f});
    optim::Accumulator acc(opt, {.steps = 1});
    const Shape in{4, 3, 32, 32};
    for (int s = 0; s < 3; ++s) {
      Tensor x = rand_tensor(in, 100 + s);
      Tensor t = targets({s % 2, (s + 1) % 2, 1, 0});
      auto window = acc.sample_window();
      acc.backward(cross_entropy(nn::forward_with_plan(*m, plan, x), t, Reduction::sum), 4);
      acc.step();
    }
    return m;
  };
  auto ref = train({});
  using S = std::vector<nn::Segment>;
  // The first block (conv, relu, conv, relu, pool), all the convolutions, and two tiled segments.
  for (const S& plan : {S{{0, 5, 1}}, S{{0, 5, 3}}, S{{0, 31, 2}}, S{{0, 5, 1}, {5, 10, 2}}}) {
    nn::Plan p;
    p.segments = plan;
    INFO("plan " << p.str());
    auto m = train(plan);
    auto a = ref->named_parameters(), b = m->named_parameters();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first);
      CHECK(bit_equal(a[i].second, b[i].second));
    }
  }
}

TEST_CASE("tiled segments hold one tile's activations, not the batch's") {
  // conv-relu-conv at 16 x 8 x 32 x 32: whole, the segment's backward holds several activations
  // of the batch; in tiles of 1 it holds the batch's input, output and gradients only.
  auto m = std::make_shared<nn::Sequential>();
  m->add<nn::Conv2d>(8, 8, 3, 1, 1);
  m->add<nn::ReLU>();
  m->add<nn::Conv2d>(8, 8, 3, 1, 1);
  m->add<nn::ReLU>();
  const Tensor x = rand_tensor({16, 8, 32, 32}, 4);
  auto peak_of = [&](const std::vector<nn::Segment>& plan) {
    for (const Tensor& p : m->parameters()) p.set_grad(Tensor::zeros(p.shape()));
    reset_peak_memory_stats(kCpu);
    const size_t before = memory_stats(kCpu).in_use;
    Tensor y = nn::forward_with_plan(*m, plan, x.clone().requires_grad_());
    y.backward(Tensor::ones(y.shape()));
    return memory_stats(kCpu).peak_in_use - before;
  };
  // Live either way: the input's copy, the output, the incoming gradient, the input gradient and
  // its copy into x.grad. Whole, the backward of the second conv adds three more of the batch.
  const size_t act = x.nbytes();
  const size_t whole = peak_of({{0, 4}}), tiled = peak_of({{0, 4, 1}});
  INFO("whole " << whole << " B, tiles of 1: " << tiled << " B, one activation " << act << " B");
  CHECK(tiled < 5 * act + act / 2);
  CHECK(whole > tiled + 3 * act / 2);
}

TEST_CASE("tiled segments: clear errors for what cannot run in tiles") {
  Tensor x = rand_tensor({4, 6}, 1).requires_grad_();
  Tensor w = rand_tensor({3, 6}, 2).requires_grad_();
  auto message = [&](const SegmentFn& fn, std::vector<Tensor> in) {
    try {
      checkpoint(fn, in, {.tile_rows = 2});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Tensor t = targets({0, 1});  // the first tile's (fn runs on it)
  CHECK(message([&](const std::vector<Tensor>& in) { return relu(linear(in[0], w, Tensor())); }, {x})
            .find("linear cannot run in tiles") != std::string::npos);
  CHECK(message([&](const std::vector<Tensor>& in) { return cross_entropy(relu(in[0]), t); }, {x})
            .find("cross_entropy cannot run in tiles") != std::string::npos);
  CHECK(message([&](const std::vector<Tensor>& in) { return relu(in[0]).reshape({-1}); }, {x})
            .find("produced shape [12] from a tile of 2 rows; tiles need every output to keep the batch first") !=
        std::string::npos);
  CHECK(message([&](const std::vector<Tensor>& in) { return in[0] + in[1]; }, {x, rand_tensor({3, 6}, 3)})
            .find("every input needs the batch as its first dimension") != std::string::npos);
  CHECK(message([&](const std::vector<Tensor>& in) { return relu(in[0]); }, {rand_tensor({}, 3).requires_grad_()})
            .find("every input needs the batch") != std::string::npos);
}

TEST_CASE("checkpoint_multi: a segment with two outputs (a block and its skip) gives the same gradients bit for bit") {
  auto run = [](bool ckpt) {
    manual_seed(11);
    nn::Conv2d down(3, 6, 3, 2, 1), up(6, 6, 3, 1, 1);
    nn::Linear fc1(150, 2), fc2(150, 2);
    nn::Dropout drop(0.25f);
    Tensor x = mg::test::rand_tensor({3, 3, 10, 10}, 12, true);
    auto block = [&](const std::vector<Tensor>& in) {
      Tensor skip = relu(down.forward(in[0]));
      return std::vector<Tensor>{drop.forward(relu(up.forward(skip))), skip};
    };
    std::vector<Tensor> out = ckpt ? checkpoint_multi(block, {x}) : block({x});
    REQUIRE(out.size() == 2);
    CHECK(out[0].shape() == Shape{3, 6, 5, 5});
    CHECK(out[1].shape() == Shape{3, 6, 5, 5});
    // The skip is read twice: gradients from three places meet in the segment.
    Tensor logits = add(fc1.forward(add(out[0], out[1]).flatten(1)), fc2.forward(out[1].flatten(1)));
    Tensor target = Tensor::from_vector(std::vector<int64_t>{0, 1, 0}, {3});
    cross_entropy(logits, target).backward();
    std::vector<Tensor> grads = {x.grad()};
    for (nn::Module* m : std::initializer_list<nn::Module*>{&down, &up, &fc1, &fc2}) {
      for (const Tensor& p : m->parameters()) grads.push_back(p.grad());
    }
    return grads;
  };
  const std::vector<Tensor> plain = run(false), ckpt = run(true);
  REQUIRE(plain.size() == ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    INFO("gradient " << i);
    REQUIRE(ckpt[i].defined());
    CHECK(mg::test::bit_equal(plain[i], ckpt[i]));
  }
}

TEST_CASE("checkpoint_multi: errors and the no-grad path") {
  Tensor x = mg::test::rand_tensor({2, 3}, 13, true);
  auto none = [](const std::vector<Tensor>&) { return std::vector<Tensor>{}; };
  CHECK_THROWS_WITH_AS(checkpoint_multi(none, {x}), doctest::Contains("returned no tensors"), Error);
  auto two = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{relu(in[0]), scale(in[0], 2.0f)}; };
  CHECK_THROWS_WITH_AS(checkpoint_multi(two, {x}, {.tile_rows = 1}), doctest::Contains("does not run in tiles"), Error);
  NoGradGuard no_grad;
  std::vector<Tensor> out = checkpoint_multi(two, {x});
  REQUIRE(out.size() == 2);
  CHECK(!out[0].requires_grad());
}

// Note [gradient-ready hooks]: every parameter reached is reported once, after its last
// contribution (its gradient then is the final one, bit for bit), the last layer's first; a
// parameter inside a segment (tiled or not) after the segment's backward.
TEST_CASE("gradient-ready hooks: once per parameter, when its gradient is final, under any plan") {
  auto cnn = std::make_shared<nn::Sequential>();
  cnn->add<nn::Conv2d>(3, 4, 3, 1, 1);
  cnn->add<nn::ReLU>();
  cnn->add<nn::Conv2d>(4, 6, 3, 2, 1);
  cnn->add<nn::ReLU>();
  cnn->add<nn::MaxPool2d>(2);
  cnn->add<nn::Flatten>();
  cnn->add<nn::Linear>(54, 7);
  cnn->add<nn::ReLU>();
  cnn->add<nn::Linear>(7, 3);
  manual_seed(5);
  const Tensor x = rand_tensor({5, 3, 11, 13}, 12);
  const Tensor t = targets({2, 0, 1, 1, 2});
  const std::vector<Tensor> params = cnn->parameters();
  using S = std::vector<nn::Segment>;
  for (const S& plan : {S{}, S{{0, 3}}, S{{0, 4, 2}}, S{{2, 9}}, S{{0, 2}, {4, 9}}, S{{0, 3, 0, true}, {4, 9, 0, true}}}) {
    nn::Plan p;
    p.segments = plan;
    INFO("plan " << p.str());
    for (const Tensor& q : params) q.set_grad(Tensor());
    std::vector<std::pair<Tensor, Tensor>> reported;  // (parameter, its gradient when reported)
    {
      GradReadyHook hook([&](const Tensor& leaf) { reported.emplace_back(leaf, leaf.grad().clone()); });
      cross_entropy(nn::forward_with_plan(*cnn, p.segments, x), t).backward();
    }
    REQUIRE(reported.size() == params.size());
    for (const auto& [param, grad_then] : reported) CHECK(test::bit_equal(grad_then, param.grad()));
    // The last layer's weight and bias come before every earlier layer's.
    auto where = [&](const Tensor& q) {
      for (size_t i = 0; i < reported.size(); ++i) if (reported[i].first.same(q)) return i;
      return reported.size();
    };
    for (size_t k = 0; k + 2 < params.size(); k += 2) CHECK(where(params[k + 2]) < where(params[k]));
  }
  // Only the outermost backward reports, and only while the hook lives.
  for (const Tensor& q : params) q.set_grad(Tensor());
  cross_entropy(cnn->forward(x), t).backward();
  int calls = 0;
  {
    GradReadyHook outer([&](const Tensor&) { ++calls; });
    GradReadyHook inner([&](const Tensor&) { calls += 100; });  // the innermost hook is the one called
    cross_entropy(nn::forward_with_plan(*cnn, S{{0, 9}}, x), t).backward();
  }
  CHECK(calls == 100 * static_cast<int>(params.size()));
  CHECK(GradReadyHook::current() == nullptr);
}
