// Channels last (Note [channels last] in src/ops/conv2d.cpp): permute, the layers' Layout::nhwc,
// models built channels last, and mg::data::ChannelsLast; and a ReLU fused into the Conv2d or
// BatchNorm before it (Note [fused relu]), the other form issue 36 gives CNN layers for the GPU.
// On the CPU a channels-last op runs the channels-first kernels between permutes (Note [channels
// last on the CPU]) and a fused ReLU runs the ReLU kernel after its op, so every result here is
// checked for the plain channels-first bits, whole training steps included, at 1 and 2 threads;
// and the planner's prediction against the measured peak. test_ops runs the ops' channels-last
// and fused rows (gradients by finite differences; CUDA against the CPU on a GPU).
#include <minigrad/data/dataset.h>
#include <minigrad/train/trainer.h>

#include "helpers.h"

using namespace mg;

namespace {

// A model's state with every 4-D parameter taken back to channels first ((O, KH, KW, C) ->
// (O, C, KH, KW)), to compare a channels-last model with its channels-first twin.
std::vector<std::pair<std::string, Tensor>> channels_first_state(const nn::Module& m) {
  auto state = m.state_dict();
  for (auto& [name, t] : state) {
    if (t.dim() == 4) t = permute(t, {0, 3, 1, 2});
  }
  return state;
}

// `second` built in `layout`; its state compared with `first`'s (channels first).
void check_same_state(const nn::Module& first, const nn::Module& second, Layout layout = Layout::nhwc) {
  const auto a = first.state_dict(), b = layout == Layout::nhwc ? channels_first_state(second) : second.state_dict();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(a[i].first == b[i].first);
    CHECK(test::bit_equal(a[i].second, b[i].second));
  }
}

// Losses of `steps` SGD steps (momentum) through the Trainer, the model built in `layout`.
struct Trained {
  std::shared_ptr<nn::Sequential> model;
  FitReport report;
};
Trained train(const std::function<std::shared_ptr<nn::Sequential>(Layout)>& make, Layout layout,
              const std::shared_ptr<const data::Dataset>& images, const std::string& plan, int64_t batch) {
  manual_seed(3);
  Trained t{make(layout), {}};
  optim::SGD opt(t.model->parameters(), {.lr = 0.01f, .momentum = 0.9f});
  std::shared_ptr<const data::Dataset> set = images;
  if (layout == Layout::nhwc) set = std::make_shared<data::ChannelsLast>(images);
  Trainer trainer(*t.model, set, opt, {.batch_size = batch, .checkpoint = plan, .epochs = 1, .max_steps = 2,
                                       .seed = 9, .tiles = false, .progress = Progress::off});
  t.report = trainer.fit();
  return t;
}

}  // namespace

TEST_CASE("permute: shapes, values, any dtype, and the gradient is the inverse permute") {
  const Tensor x = test::rand_tensor({2, 3, 4, 5}, 1, /*requires_grad=*/true);
  const Tensor y = permute(x, {0, 2, 3, 1});
  CHECK(y.shape() == Shape{2, 4, 5, 3});
  const float* px = x.data<float>();
  const float* py = y.data<float>();
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t w = 0; w < 5; ++w) CHECK(py[((n * 4 + h) * 5 + w) * 3 + c] == px[((n * 3 + c) * 4 + h) * 5 + w]);
  CHECK(test::bit_equal(to_channels_first(to_channels_last(x)), x));
  // With y's gradient r, x's is r permuted back.
  const Tensor r = test::rand_tensor(y.shape(), 2);
  y.backward(r);
  CHECK(test::bit_equal(x.grad(), permute(r, {0, 3, 1, 2})));
  std::vector<int64_t> ints(120);
  for (size_t i = 0; i < ints.size(); ++i) ints[i] = static_cast<int64_t>(i * i);
  for (DType d : {DType::bf16, DType::f16, DType::i64, DType::f64}) {
    CAPTURE(dtype_name(d));
    const Tensor xd = d == DType::i64 ? Tensor::from_vector(ints, x.shape()) : x.detach().to(d);
    const Tensor yd = permute(xd, {3, 1, 0, 2});
    CHECK(yd.dtype() == d);
    CHECK(test::bit_equal(permute(yd, {2, 1, 3, 0}), xd));
  }
  CHECK_THROWS_WITH_AS(permute(x, {0, 1, 2}), doctest::Contains("name 3 dimensions"), Error);
  CHECK_THROWS_WITH_AS(permute(x, {0, 1, 1, 2}), doctest::Contains("each of 0 .. 3 once"), Error);
  CHECK_THROWS_WITH_AS(to_channels_last(test::rand_tensor({2, 3}, 1)), doctest::Contains("(N, C, H, W)"), Error);
}

TEST_CASE("channels-last layers: clear errors naming the layout") {
  const Tensor x = test::rand_tensor({2, 3, 8, 8}, 1);  // channels first, given as channels last
  const Tensor w_last = test::rand_tensor({4, 3, 3, 3}, 2);
  CHECK_THROWS_WITH_AS(conv2d(x, w_last, {}, 1, 1, Layout::nhwc), doctest::Contains("input has 8 channels, weight "
                                                                                     "expects 3"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, w_last, {}, 1, 1, Layout::nhwc), doctest::Contains("nhwc"), Error);
  CHECK_THROWS_WITH_AS(conv2d(test::rand_tensor({2, 8, 8}, 1), w_last, {}, 1, 1, Layout::nhwc),
                       doctest::Contains("(N, H, W, C) (channels last)"), Error);
  CHECK_THROWS_WITH_AS(max_pool2d(test::rand_tensor({2, 8, 8}, 1), 2, 2, 0, Layout::nhwc),
                       doctest::Contains("(N, H, W, C)"), Error);
  nn::BatchNorm2d bn(3, 1e-5f, 0.1f, true, Layout::nhwc);
  CHECK_THROWS_WITH_AS(bn.forward(x), doctest::Contains("input has 8 channels"), Error);
  auto images = test::random_dataset(4, {3, 5}, 2, 1);
  CHECK_THROWS_WITH_AS(data::ChannelsLast{images}, doctest::Contains("expected images (C, H, W)"), Error);
}

TEST_CASE("ChannelsLast: each image transposed to (H, W, C), labels as they were") {
  const auto images = test::random_dataset(6, {3, 4, 5}, 2, 1);
  const data::ChannelsLast last(images);
  CHECK(last.sample_shape() == Shape{4, 5, 3});
  CHECK(last.size() == 6);
  const std::vector<int64_t> idx = {4, 1};
  const data::Batch a = images->get_batch(idx, 0), b = last.get_batch(idx, 0);
  CHECK(test::bit_equal(b.x, to_channels_last(a.x)));
  CHECK(test::bit_equal(b.y, a.y));
}

TEST_CASE("VGG16/16 and ResNet-18/16 channels last train the channels-first bits on the CPU, at 1 and 2 threads") {
  struct Row {
    const char* name;
    std::function<std::shared_ptr<nn::Sequential>(Layout)> make;
  };
  // VGG: conv + bias, max pools, the 7x7 adaptive pool, Flatten back to channels first, dropout in
  // the classifier. ResNet: BatchNorm (and its running statistics), strided 1x1 downsamples, the
  // 3x3/2 max pool with padding, the 1x1 pool.
  const std::vector<Row> rows = {
      {"vgg16/16", [](Layout l) { return nn::make_vgg16(2, 16, 0.5f, l); }},
      {"resnet18/16", [](Layout l) { return nn::make_resnet18(2, 16, 0.0f, l); }},
  };
  const auto images = test::random_dataset(16, {3, 32, 32}, 2, 4);
  const int before = num_threads();
  for (const Row& row : rows) {
    CAPTURE(row.name);
    set_num_threads(2);
    const Trained first = train(row.make, Layout::nchw, images, "none", 8);
    for (int threads : {1, 2}) {
      CAPTURE(threads);
      set_num_threads(threads);
      const Trained last = train(row.make, Layout::nhwc, images, "none", 8);
      REQUIRE(last.report.losses.size() == first.report.losses.size());
      for (size_t i = 0; i < first.report.losses.size(); ++i) CHECK(last.report.losses[i] == first.report.losses[i]);
      check_same_state(*first.model, *last.model);
    }
  }
  set_num_threads(before);
}

TEST_CASE("a channels-last VGG16 and ResNet-18 under checkpoint plans: the bits of no plan, the peak as predicted") {
  const auto images = test::random_dataset(16, {3, 32, 32}, 2, 4);
  const std::vector<std::function<std::shared_ptr<nn::Sequential>(Layout)>> makes = {
      [](Layout l) { return nn::make_vgg16(2, 16, 0.5f, l); },
      [](Layout l) { return nn::make_resnet18(2, 16, 0.0f, l); },
  };
  for (size_t k = 0; k < makes.size(); ++k) {
    CAPTURE(k);
    const Trained plain = train(makes[k], Layout::nhwc, images, "none", 8);
    for (const char* plan : {"none", "sqrt", "min"}) {
      CAPTURE(plan);
      const Trained t = train(makes[k], Layout::nhwc, images, plan, 8);
      CHECK(t.report.losses == plain.report.losses);
      const auto a = plain.model->state_dict(), b = t.model->state_dict();
      for (size_t i = 0; i < a.size(); ++i) CHECK(test::bit_equal(a[i].second, b[i].second));
      // As for channels first (test_memory_report): the step holds a few scalars the model does not count.
      INFO("measured " << t.report.peak_in_use << ", predicted " << t.report.plan.predicted_peak);
      CHECK(t.report.peak_in_use >= t.report.plan.predicted_peak);
      CHECK(t.report.peak_in_use <= t.report.plan.predicted_peak + 64);
    }
  }
}

TEST_CASE("fuse_relu: VGG16/16 fused, channels first and last, trains the unfused bits with the same names") {
  const auto images = test::random_dataset(16, {3, 32, 32}, 2, 4);
  const auto plain = [](Layout l) { return nn::make_vgg16(2, 16, 0.5f, l); };
  const auto fused = [](Layout l) {
    auto m = nn::make_vgg16(2, 16, 0.5f, l);
    CHECK(nn::fuse_relu(*m) == 13);
    CHECK(nn::fuse_relu(*m) == 0);  // nothing left to fuse
    return m;
  };
  const Trained ref = train(plain, Layout::nchw, images, "none", 8);
  CHECK(fused(Layout::nchw)->size() + 13 == ref.model->size());
  CHECK(fused(Layout::nchw)->at(0)->name() == "Conv2d(3, 4, kernel_size=3, stride=1, padding=1) + ReLU");
  {  // A layer added after the erasures is named past every number in use, as the new size would collide.
    auto m = fused(Layout::nchw);
    const std::string last = m->child_name(m->size() - 1);
    m->add<nn::ReLU>();
    CHECK(m->child_name(m->size() - 1) == std::to_string(std::stoul(last) + 1));
  }
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    CAPTURE(layout_name(layout));
    // Its model goes before the fused ones train: the allocator's peak counts every live tensor.
    const size_t unfused_peak = train(plain, layout, images, "none", 8).report.peak_in_use;
    for (const char* plan : {"none", "sqrt"}) {
      CAPTURE(plan);
      const Trained t = train(fused, layout, images, plan, 8);
      CHECK(t.report.losses == ref.report.losses);
      check_same_state(*ref.model, *t.model, layout);  // names and bits
      INFO("measured " << t.report.peak_in_use << ", predicted " << t.report.plan.predicted_peak);
      CHECK(t.report.peak_in_use >= t.report.plan.predicted_peak);
      CHECK(t.report.peak_in_use <= t.report.plan.predicted_peak + 64);
      // The convolution's output and the ReLU's are never held together.
      if (std::string(plan) == "none") CHECK(t.report.peak_in_use <= unfused_peak);
    }
  }
}

TEST_CASE("fuse_relu: ResNet-18/16's BatchNorm + ReLU fused, channels first and last, trains the unfused bits") {
  const auto images = test::random_dataset(16, {3, 32, 32}, 2, 4);
  const auto plain = [](Layout l) { return nn::make_resnet18(2, 16, 0.0f, l); };
  const auto fused = [](Layout l) {
    auto m = nn::make_resnet18(2, 16, 0.0f, l);
    CHECK(nn::fuse_relu(*m) == 9);  // the stem's, and bn1's in each of the 8 blocks
    CHECK(nn::fuse_relu(*m) == 0);
    return m;
  };
  CHECK(nn::fuse_relu(*nn::make_resnet50(2, 16)) == 33);  // the stem's, bn1's and bn2's in 16 blocks
  const Trained ref = train(plain, Layout::nchw, images, "none", 8);
  CHECK(fused(Layout::nchw)->at(1)->name() ==
        "BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=True) + ReLU");
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    CAPTURE(layout_name(layout));
    for (const char* plan : {"none", "sqrt"}) {
      CAPTURE(plan);
      const Trained t = train(fused, layout, images, plan, 8);
      CHECK(t.report.losses == ref.report.losses);
      check_same_state(*ref.model, *t.model, layout);  // weights and running statistics
      CHECK(t.report.peak_in_use >= t.report.plan.predicted_peak);
      CHECK(t.report.peak_in_use <= t.report.plan.predicted_peak + 64);
    }
    // Evaluation: the running statistics, the ReLU in the same op.
    const Trained t = train(fused, layout, images, "none", 8);
    ref.model->eval();
    t.model->eval();
    const Tensor x = test::rand_tensor({4, 3, 32, 32}, 77);
    const Tensor y = t.model->forward(layout == Layout::nhwc ? to_channels_last(x) : x);
    CHECK(test::bit_equal(y, ref.model->forward(x)));
    ref.model->train();
  }
}

TEST_CASE("conv2d_relu gives relu(conv2d) bit for bit, forward and backward, both layouts, on the CPU") {
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    CAPTURE(layout_name(layout));
    const bool last = layout == Layout::nhwc;
    const Shape xs = last ? Shape{3, 9, 11, 5} : Shape{3, 5, 9, 11}, ws = last ? Shape{6, 3, 3, 5} : Shape{6, 5, 3, 3};
    const Tensor r = test::rand_tensor(last ? Shape{3, 5, 6, 6} : Shape{3, 6, 5, 6}, 9);
    auto run = [&](bool fused) {
      const Tensor x = test::rand_tensor(xs, 1, true), w = test::rand_tensor(ws, 2, true);
      const Tensor b = test::rand_tensor({6}, 3, true);
      const Tensor y = fused ? conv2d_relu(x, w, b, 2, 1, layout) : relu(conv2d(x, w, b, 2, 1, layout));
      y.backward(r);
      return std::vector<Tensor>{y.detach(), x.grad(), w.grad(), b.grad()};
    };
    const std::vector<Tensor> a = run(false), f = run(true);
    for (size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      CHECK(test::bit_equal(a[i], f[i]));
    }
    // Some outputs were negative, so the mask mattered.
    const std::vector<float> y = a[0].to_vector<float>();
    CHECK(std::count(y.begin(), y.end(), 0.0f) > static_cast<long>(y.size() / 4));
  }
}
