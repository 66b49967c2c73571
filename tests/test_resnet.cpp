// ResNet-18/34/50 in torchvision's layout (minigrad/nn/models.h): names and sizes, blocks as the
// checkpoint planner's units, exact checkpointed training with BatchNorm and dropout, and nested
// segments (Note [nested segments]). tests/test_resnet_torchvision.cpp checks the math against
// torchvision itself.
#include <minigrad/minigrad.h>

#include "helpers.h"

using namespace mg;

namespace {

// One SGD step (momentum) on a fixed batch; labels i % classes.
void sgd_steps(nn::Sequential& m, const std::vector<nn::Segment>& plan, const Shape& in_shape, int64_t classes,
               int steps) {
  optim::SGD opt(m.parameters(), {.lr = 0.05f, .momentum = 0.9f});
  std::vector<int64_t> t(static_cast<size_t>(in_shape[0]));
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int64_t>(i) % classes;
  const Tensor target = Tensor::from_vector(t, {in_shape[0]});
  for (int s = 0; s < steps; ++s) {
    const Tensor x = test::rand_tensor(in_shape, 100 + static_cast<uint64_t>(s));
    opt.zero_grad();
    Tensor loss = cross_entropy(nn::forward_with_plan(m, plan, x), target);
    REQUIRE(std::isfinite(loss.item()));
    loss.backward();
    opt.step();
  }
}

// Weights, gradients' effect and running statistics after `steps` under each plan, against none.
void check_plans_bit_identical(const std::function<std::shared_ptr<nn::Sequential>()>& make, const Shape& in_shape,
                               int64_t classes, int steps) {
  manual_seed(7);
  auto ref = make();
  sgd_steps(*ref, {}, in_shape, classes, steps);
  const auto ref_state = ref->state_dict();

  manual_seed(7);
  auto probe = make();
  const nn::ChainCost cost = nn::measure_chain(*probe, in_shape);
  const size_t lo = nn::min_feasible_peak(cost), hi = nn::plan_none(cost).predicted_peak;
  REQUIRE(lo < hi);
  std::vector<nn::Plan> plans = {nn::plan_sqrt(cost), nn::plan_segments(cost, 2), nn::plan_min_peak(cost),
                                 nn::plan_budget(cost, lo + (hi - lo) / 2)};
  nn::Plan all;
  all.kind = "everything";
  all.segments = {{0, probe->size()}};
  plans.push_back(all);
  for (const nn::Plan& p : plans) {
    INFO("plan " << p.kind << ": " << p.str());
    CHECK(!p.segments.empty());
    manual_seed(7);
    auto m = make();
    sgd_steps(*m, p.segments, in_shape, classes, steps);
    const auto state = m->state_dict();
    REQUIRE(state.size() == ref_state.size());
    for (size_t i = 0; i < state.size(); ++i) {
      INFO(state[i].first);
      CHECK(state[i].first == ref_state[i].first);
      CHECK(test::bit_equal(state[i].second, ref_state[i].second));
    }
  }
}

// A residual block that checkpoints itself, whatever plan it is in (Note [nested segments]).
class SelfCheckpointed : public nn::Module {
 public:
  explicit SelfCheckpointed(std::shared_ptr<nn::Module> inner) : inner_(std::move(inner)) {
    register_module("inner", inner_);
  }
  Tensor forward(const Tensor& x) override {
    return checkpoint([this](const std::vector<Tensor>& in) { return inner_->forward(in[0]); }, {x});
  }
  std::string name() const override { return "SelfCheckpointed(" + inner_->name() + ")"; }

 private:
  std::shared_ptr<nn::Module> inner_;
};

std::shared_ptr<nn::Sequential> self_checkpointing_net() {
  auto m = std::make_shared<nn::Sequential>();
  m->add<nn::Conv2d>(3, 8, 3, 1, 1, false);
  m->add<nn::BatchNorm2d>(8);
  m->add<nn::ReLU>();
  m->add<nn::BasicBlock>(8, 8, 1);
  m->push_back(std::make_shared<SelfCheckpointed>(std::make_shared<nn::BasicBlock>(8, 16, 2)));
  m->add<nn::BasicBlock>(16, 16, 1);
  m->push_back(std::make_shared<SelfCheckpointed>(std::make_shared<nn::BasicBlock>(16, 16, 1)));
  m->add<nn::AdaptiveAvgPool2d>(1, 1);
  m->add<nn::Flatten>();
  m->add<nn::Dropout>(0.3f);
  m->add<nn::Linear>(16, 3);
  return m;
}

}  // namespace

TEST_CASE("make_resnet18/34/50: torchvision's parameter counts, state_dict names and order") {
  struct Row {
    std::function<std::shared_ptr<nn::Sequential>()> make;
    int64_t params;
    size_t entries, buffers;
  };
  // torchvision 0.14: sum(p.numel() for p in m.parameters()), len(m.state_dict()), len(list(m.buffers())).
  const std::vector<Row> rows = {{[] { return nn::make_resnet18(1000); }, 11689512, 122, 60},
                                 {[] { return nn::make_resnet34(1000); }, 21797672, 218, 108},
                                 {[] { return nn::make_resnet50(1000); }, 25557032, 320, 159}};
  for (const Row& r : rows) {
    auto m = r.make();
    CHECK(m->parameter_count() == r.params);
    CHECK(m->state_dict().size() == r.entries);
    CHECK(m->named_buffers().size() == r.buffers);
  }
  auto m = nn::make_resnet18(10);
  const auto sd = m->state_dict();
  const std::vector<std::string> first = {"conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                                          "bn1.running_var", "bn1.num_batches_tracked", "layer1.0.conv1.weight",
                                          "layer1.0.bn1.weight"};
  for (size_t i = 0; i < first.size(); ++i) CHECK(sd[i].first == first[i]);
  CHECK(sd.back().first == "fc.bias");
  auto has = [&](const std::string& name) {
    return std::any_of(sd.begin(), sd.end(), [&](const auto& e) { return e.first == name; });
  };
  CHECK(has("layer2.0.downsample.0.weight"));
  CHECK(has("layer2.0.downsample.1.num_batches_tracked"));
  CHECK(!has("layer1.0.downsample.0.weight"));  // same shape in layer1 of ResNet-18: no downsample
  CHECK(has("layer4.1.bn2.running_var"));
  auto r50 = nn::make_resnet50(10);
  const auto sd50 = r50->state_dict();
  CHECK(std::any_of(sd50.begin(), sd50.end(), [](const auto& e) { return e.first == "layer1.0.downsample.0.weight"; }));
  CHECK(std::any_of(sd50.begin(), sd50.end(), [](const auto& e) { return e.first == "layer3.5.conv3.weight"; }));
  // The chain: stem, 8 blocks, head; the blocks are single layers (units of the planner).
  CHECK(m->size() == 4 + 8 + 3);
  CHECK(m->child_name(4) == "layer1.0");
  CHECK(m->child_name(11) == "layer4.1");
}

TEST_CASE("ResNet forward: shapes in training and eval, widths divided") {
  manual_seed(1);
  for (auto m : {nn::make_resnet18(10, 16), nn::make_resnet34(10, 16), nn::make_resnet50(10, 16)}) {
    const Tensor x = test::rand_tensor({2, 3, 64, 64}, 3);
    CHECK(m->forward(x).shape() == Shape{2, 10});
    m->eval();
    CHECK(m->forward(x).shape() == Shape{2, 10});
  }
  auto r50 = nn::make_resnet50(10, 16);
  CHECK(r50->parameters().front().shape() == Shape{4, 3, 7, 7});  // 64 / 16 channels in the stem
  CHECK(r50->parameters().back().shape() == Shape{10});
  CHECK_THROWS_WITH_AS(nn::make_resnet18(0), doctest::Contains("num_classes"), Error);
  CHECK_THROWS_WITH_AS(nn::make_resnet50(10, 0), doctest::Contains("width_div"), Error);
  CHECK_THROWS_WITH_AS(nn::make_model("resnet101", 10), doctest::Contains("expected vgg16, resnet18"), Error);
  auto m = nn::make_resnet18(10, 16);
  CHECK_THROWS_WITH_AS(m->forward(test::rand_tensor({2, 1, 64, 64}, 4)), doctest::Contains("channels"), Error);
}

TEST_CASE("Sequential names: unique and not empty") {
  nn::Sequential s;
  s.add_named<nn::ReLU>("relu");
  CHECK_THROWS_WITH_AS(s.add_named<nn::ReLU>("relu"), doctest::Contains("already there"), Error);
  CHECK_THROWS_WITH_AS(s.add_named<nn::ReLU>(""), doctest::Contains("empty"), Error);
  CHECK(s.child_name(0) == "relu");
}

TEST_CASE("checkpointed ResNet-18 training (BatchNorm, dropout): weights and running statistics bit-identical") {
  check_plans_bit_identical([] { return nn::make_resnet18(3, 16, 0.5f); }, {16, 3, 64, 64}, 3, 3);
}

TEST_CASE("checkpointed ResNet-50 training (bottlenecks, BatchNorm, dropout): bit-identical for every plan") {
  check_plans_bit_identical([] { return nn::make_resnet50(3, 16, 0.5f); }, {4, 3, 64, 64}, 3, 2);
}

TEST_CASE("measure_chain on a ResNet: blocks are units, and running statistics are left as they were") {
  manual_seed(2);
  auto m = nn::make_resnet18(3, 16);
  auto before = m->state_dict();
  std::vector<Tensor> copies;
  for (auto& [n, t] : before) copies.push_back(t.clone());
  const nn::ChainCost cost = nn::measure_chain(*m, {4, 3, 48, 48}, {.tile_rows = nn::tile_rows_below(4)});
  // stem (4), 8 blocks, avgpool, flatten merged into fc: 14 units.
  CHECK(cost.units.size() == 14);
  CHECK(cost.units[4].name.find("BasicBlock") == 0);
  CHECK(!cost.units[4].tiles);  // BatchNorm mixes the samples of its batch
  CHECK(cost.units[0].tiles);   // conv1
  for (size_t i = 0; i < before.size(); ++i) {
    INFO(before[i].first);
    CHECK(test::bit_equal(before[i].second, copies[i]));
  }
  CHECK(dynamic_cast<nn::BatchNorm&>((*m)[1]).num_batches_tracked() == 0);
}

TEST_CASE("nested segments: a block that checkpoints itself, inside a checkpointed range, gives the same bits") {
  check_plans_bit_identical(self_checkpointing_net, {4, 3, 16, 16}, 3, 2);
}

TEST_CASE("nested segments: the planner keeps self-checkpointing units out of its segments") {
  manual_seed(3);
  auto m = self_checkpointing_net();
  const nn::ChainCost cost = nn::measure_chain(*m, {4, 3, 16, 16});
  std::vector<size_t> inside;
  for (size_t u = 0; u < cost.units.size(); ++u) {
    if (cost.units[u].checkpoints_inside) inside.push_back(u);
  }
  REQUIRE(inside.size() == 2);
  CHECK(cost.units[inside[0]].flops > 0);  // its segment's work is counted
  const size_t lo = nn::min_feasible_peak(cost), hi = nn::plan_none(cost).predicted_peak;
  for (const nn::Plan& p : {nn::plan_min_peak(cost), nn::plan_budget(cost, lo + (hi - lo) / 3)}) {
    INFO(p.str());
    for (const nn::Segment& g : p.segments) {
      for (size_t u : inside) CHECK(!(cost.units[u].begin >= g.begin && cost.units[u].end <= g.end));
    }
  }
}
