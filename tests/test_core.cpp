#include "helpers.h"

using namespace mg;
using mg::test::rand_tensor;

TEST_CASE("tensor factories and copies") {
  Tensor t = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.numel() == 6);
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  Tensor c = t.clone();
  c.fill_(7.0f);
  CHECK(t.to_vector<float>()[0] == 1.0f);
  CHECK(!c.shares_storage(t));
  Tensor r = t.reshape({3, -1});
  CHECK(r.shape() == Shape{3, 2});
  CHECK(r.shares_storage(t));
  CHECK_THROWS_AS(t.reshape({4, 2}), Error);
  CHECK_THROWS_WITH_AS(Tensor::from_vector(std::vector<float>{1, 2}, {3}), doctest::Contains("2 values for shape [3]"), Error);
}

TEST_CASE("cpu allocator counts bytes, peak and release") {
  const Device cpu = Device::cpu();
  const size_t before = memory_stats(cpu).in_use;
  reset_peak_memory_stats(cpu);
  {
    Tensor a = Tensor::empty({1000, 250});  // 1 MB
    CHECK(memory_stats(cpu).in_use == before + 1000 * 250 * 4);
    {
      Tensor b = Tensor::empty({1000, 250});
      Tensor view = b.reshape({-1});  // shares storage: no new bytes
      CHECK(memory_stats(cpu).in_use == before + 2 * 1000 * 250 * 4);
    }
    CHECK(memory_stats(cpu).in_use == before + 1000 * 250 * 4);
  }
  CHECK(memory_stats(cpu).in_use == before);
  CHECK(memory_stats(cpu).peak_in_use == before + 2 * 1000 * 250 * 4);
  reset_peak_memory_stats(cpu);
  CHECK(memory_stats(cpu).peak_in_use == before);
}

TEST_CASE("philox is a pure function of seed and counter") {
  CHECK(philox_u32(1, 5) == philox_u32(1, 5));
  CHECK(philox_u32(1, 5) != philox_u32(2, 5));
  CHECK(philox_u32(1, 5) != philox_u32(1, 6));
  // Known-answer test from the Random123 distribution (philox4x32_10, ctr = 0, key = 0).
  Philox4 r = philox4x32(0, 0);
  CHECK(r.v[0] == 0x6627e8d5u);
  CHECK(r.v[1] == 0xe169c58du);
  CHECK(r.v[2] == 0xbc57ac4cu);
  CHECK(r.v[3] == 0x9b00dbd8u);
  Generator g(3);
  CHECK(g.advance(5) == 0);
  CHECK(g.advance(1) == 8);  // rounded to whole blocks of 4
}

TEST_CASE("backward accumulates into grad and frees saved tensors") {
  Tensor x = rand_tensor({5, 7}, 1);
  Tensor w = rand_tensor({3, 7}, 2, true);
  Tensor b = rand_tensor({3}, 3, true);
  Tensor y = cross_entropy(linear(x, w, b), Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 1, 0}, {5}));
  y.backward({}, /*retain_graph=*/true);
  Tensor g1 = w.grad().clone();
  y.backward();
  CHECK(test::max_abs_diff(w.grad(), g1 * 2.0f) < 1e-6);
  CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("second time"), Error);
}

TEST_CASE("no_grad records nothing") {
  Tensor w = rand_tensor({3, 4}, 2, true);
  NoGradGuard ng;
  Tensor y = linear(rand_tensor({2, 4}, 1), w);
  CHECK(!y.requires_grad());
  CHECK(y.grad_fn() == nullptr);
}

TEST_CASE("gradients: linear, relu, add, scale, cross_entropy") {
  Tensor x = rand_tensor({5, 7}, 11, true), w = rand_tensor({3, 7}, 12, true), b = rand_tensor({3}, 13, true);
  test::gradcheck([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, {x, w, b});
  test::gradcheck([](const std::vector<Tensor>& in) { return relu(in[0]); }, {test::away_from_zero(rand_tensor({4, 9}, 14, true))});
  test::gradcheck([](const std::vector<Tensor>& in) { return add(in[0], in[1]) * 1.5f; },
                  {rand_tensor({3, 5}, 15, true), rand_tensor({3, 5}, 16, true)});
  Tensor t = Tensor::from_vector(std::vector<int64_t>{2, 0, 4, 1, 3, 3}, {6});
  for (Reduction r : {Reduction::mean, Reduction::sum}) {
    test::gradcheck([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t, r); },
                    {rand_tensor({6, 5}, 17, true)});
  }
}

TEST_CASE("bad shapes raise mg::Error naming the op and the shapes") {
  Tensor x = rand_tensor({64, 783}, 1), w = rand_tensor({512, 784}, 2, true);
  CHECK_THROWS_WITH_AS(linear(x, w), doctest::Contains("linear: input has 783 features, weight expects 784"), Error);
  CHECK_THROWS_WITH_AS(add(rand_tensor({2, 3}, 1), rand_tensor({3, 2}, 2)), doctest::Contains("add: shapes differ"), Error);
  Tensor logits = rand_tensor({2, 3}, 1);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{0, 3}, {2})),
                       doctest::Contains("target[1] = 3"), Error);
  CHECK_THROWS_AS(cross_entropy(logits, rand_tensor({2}, 3)), Error);
}
