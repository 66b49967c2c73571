#include <cmath>
#include <limits>
#include <numbers>

#include "helpers.h"
#include "kernels/elementwise.h"

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

// Note [reusing large CPU blocks] (src/core/allocator.h).
TEST_CASE("cpu allocator keeps a large freed block for the next request of its size") {
#if defined(__SANITIZE_ADDRESS__)
  MESSAGE("skipped: AddressSanitizer builds keep nothing");
  return;
#endif
  const Device cpu = Device::cpu();
  empty_cache(cpu);
  const MemoryStats start = memory_stats(cpu);  // nothing kept after empty_cache
  const size_t bytes = 600 * 1000 * 4;      // 2.4 MB, a multiple of the 64-byte alignment
  const float* first = nullptr;
  {
    Tensor a = Tensor::empty({600, 1000});
    first = a.data<float>();
  }
  MemoryStats s = memory_stats(cpu);
  CHECK(s.in_use == start.in_use);
  CHECK(s.reserved == start.reserved + bytes);  // kept, still reserved
  {
    Tensor b = Tensor::empty({1000, 600});  // same size: the kept block, no system allocation
    CHECK(b.data<float>() == first);
    CHECK(memory_stats(cpu).system_alloc_count == s.system_alloc_count);
    CHECK(memory_stats(cpu).in_use == start.in_use + bytes);
    CHECK(memory_stats(cpu).reserved == start.reserved + bytes);
    Tensor c = Tensor::empty({600, 1001});  // another size: from the system
    CHECK(memory_stats(cpu).system_alloc_count == s.system_alloc_count + 1);
  }
  {
    Tensor small = Tensor::empty({100});  // small blocks are never kept
  }
  CHECK(memory_stats(cpu).reserved > memory_stats(cpu).in_use);
  empty_cache(cpu);
  s = memory_stats(cpu);
  CHECK(s.in_use == start.in_use);
  CHECK(s.reserved == start.reserved);
}

TEST_CASE("set_memory_limit: the cpu allocator refuses past the cap with OutOfMemoryError") {
  const Device cpu = Device::cpu();
  REQUIRE(memory_limit(cpu) == 0);
  const size_t base = memory_stats(cpu).in_use;
  reset_peak_memory_stats(cpu);
  constexpr size_t kMB = 1000 * 250 * 4;
  set_memory_limit(cpu, base + 2 * kMB);  // room for exactly two 1 MB tensors
  struct Uncap {
    ~Uncap() { set_memory_limit(Device::cpu(), 0); }
  } uncap;
  CHECK(memory_limit(cpu) == base + 2 * kMB);
  {
    Tensor a = Tensor::empty({1000, 250});
    Tensor b = Tensor::empty({1000, 250});  // in use == the cap: still allowed
    const MemoryStats before = memory_stats(cpu);
    std::string msg;
    size_t requested = 0;
    try {
      Tensor c = Tensor::empty({1});
    } catch (const OutOfMemoryError& e) {
      msg = e.what();
      requested = e.requested();
    }
    INFO(msg);
    CHECK(requested == 4);
    CHECK(msg.find("cpu out of memory: tried to allocate 4 B with") != std::string::npos);
    CHECK(msg.find("the memory limit is") != std::string::npos);
    CHECK(msg.find("mg::set_memory_limit") != std::string::npos);
    CHECK(msg.find("gradient accumulation") != std::string::npos);
    CHECK(msg.find("mg::checkpoint") != std::string::npos);
    // A refusal counts nothing.
    const MemoryStats after = memory_stats(cpu);
    CHECK(after.in_use == before.in_use);
    CHECK(after.peak_in_use == before.peak_in_use);
    CHECK(after.alloc_count == before.alloc_count);
    // An out-of-memory error is an mg::Error, as every error of the library.
    CHECK_THROWS_AS(Tensor::empty({2}), Error);
  }
  CHECK(memory_stats(cpu).in_use == base);
  Tensor fits = Tensor::empty({2 * 1000, 250});  // freed bytes count again
  CHECK(memory_stats(cpu).in_use == base + 2 * kMB);
  // A cap below what is in use refuses everything until enough is freed.
  set_memory_limit(cpu, base + kMB);
  CHECK_THROWS_AS(Tensor::empty({1}), OutOfMemoryError);
  fits = Tensor();
  Tensor one = Tensor::empty({1000, 250});
  set_memory_limit(cpu, 0);
  Tensor more = Tensor::empty({3000, 250});  // no cap: anything the system gives
  CHECK(memory_stats(cpu).in_use == base + 4 * kMB);
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

TEST_CASE("philox_uniforms, uniform and randn give each element's own draws, whatever the start and the pieces") {
  // One Philox block serves four draws: starts at every word of a block, lengths that end inside one.
  for (uint64_t first : {0, 1, 2, 3, 4, 6, 4097}) {
    for (int64_t n : {0, 1, 2, 3, 4, 5, 7, 9, 33}) {
      std::vector<int64_t> order;
      philox_uniforms(7, first, n, [&](int64_t k, float u) {
        order.push_back(k);
        CHECK(u == philox_uniform(7, first + static_cast<uint64_t>(k)));
      });
      REQUIRE(static_cast<int64_t>(order.size()) == n);
      for (int64_t k = 0; k < n; ++k) CHECK(order[static_cast<size_t>(k)] == k);
    }
  }
  // The tensors' definitions (minigrad/core/rng.h): element i of uniform is draw off + i, of randn
  // Box-Muller on draws off + 2i and off + 2i + 1; at 1 and 2 threads, over pieces of 2^14.
  const int64_t n = (int64_t{1} << 15) + 5;
  const int saved = num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Generator gen(11);
    gen.advance(4);  // a stream not at its start
    const Tensor u = Tensor::uniform({n}, 0.0f, 1.0f, gen);  // lo + (hi - lo) u = u, however contracted
    const Tensor z = Tensor::randn({n}, gen);
    const uint64_t off_u = 4, off_z = off_u + static_cast<uint64_t>(n + 3) / 4 * 4;
    int64_t bad_u = 0, bad_z = 0;
    for (int64_t i = 0; i < n; ++i) {
      bad_u += u.data<float>()[i] != philox_uniform(11, off_u + static_cast<uint64_t>(i));
      const uint64_t k = off_z + 2 * static_cast<uint64_t>(i);
      const double r = std::sqrt(-2.0 * std::log(1.0 - static_cast<double>(philox_uniform(11, k))));
      bad_z += z.data<float>()[i] != static_cast<float>(r * std::cos(2.0 * std::numbers::pi * philox_uniform(11, k + 1)));
    }
    CHECK(bad_u == 0);
    CHECK(bad_z == 0);
  }
  set_num_threads(saved);
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

TEST_CASE("cross_entropy: a masked class (-inf) gets exactly 0, far-off classes flush to 0, a NaN logit gives a NaN loss") {
  // 20 classes: the packet path and its padded tail (kernels/cpu/packet_math.h) on every build.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v(40, 0.5f);
  v[3] = -inf;       // row 0: masked
  v[17] = -200.0f;   // row 0: below ln(FLT_MIN) from the row's max
  v[20 + 5] = std::numeric_limits<float>::quiet_NaN();  // row 1
  Tensor logits = Tensor::from_vector(v, {2, 20}).requires_grad_();
  const Tensor t = Tensor::from_vector(std::vector<int64_t>{0, 1}, {2});
  Tensor first = cross_entropy(Tensor::from_vector(std::vector<float>(v.begin(), v.begin() + 20), {1, 20}).requires_grad_(),
                               Tensor::from_vector(std::vector<int64_t>{0}, {1}), Reduction::sum);
  CHECK(std::isfinite(first.item()));
  CHECK(first.item() == doctest::Approx(std::log(18.0)).epsilon(1e-6));  // 18 classes at 0.5 share the mass
  Tensor both = cross_entropy(logits, t, Reduction::sum);
  CHECK(std::isnan(both.item()));
  Tensor x0 = Tensor::from_vector(std::vector<float>(v.begin(), v.begin() + 20), {1, 20}).requires_grad_();
  cross_entropy(x0, Tensor::from_vector(std::vector<int64_t>{0}, {1}), Reduction::sum).backward();
  CHECK(x0.grad().data<float>()[3] == 0.0f);
  CHECK(x0.grad().data<float>()[17] == 0.0f);
}

TEST_CASE("bad shapes raise mg::Error naming the op and the shapes") {
  Tensor x = rand_tensor({64, 783}, 1), w = rand_tensor({512, 784}, 2, true);
  CHECK_THROWS_WITH_AS(linear(x, w), doctest::Contains("linear: input has 783 features, weight expects 784"), Error);
  CHECK_THROWS_WITH_AS(add(rand_tensor({2, 3}, 1), rand_tensor({3, 2}, 2)), doctest::Contains("add: shapes differ"), Error);
  CHECK_THROWS_WITH_AS(mul(rand_tensor({2, 3}, 1), rand_tensor({3, 2}, 2)), doctest::Contains("mul: shapes differ"), Error);
  CHECK_THROWS_WITH_AS(mul(rand_tensor({2}, 1), Tensor::from_vector(std::vector<int64_t>{1, 2}, {2})),
                       doctest::Contains("mul: b must be float32"), Error);
  Tensor logits = rand_tensor({2, 3}, 1);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{0, 3}, {2})),
                       doctest::Contains("target[1] = 3"), Error);
  CHECK_THROWS_AS(cross_entropy(logits, rand_tensor({2}, 3)), Error);
}

TEST_CASE("backward frees the saved activations; retain_graph keeps them") {
  const Device cpu = Device::cpu();
  Tensor w1 = rand_tensor({256, 300}, 21, true), w2 = rand_tensor({10, 256}, 22, true);
  Tensor x = rand_tensor({128, 300}, 23);
  Tensor t = Tensor::from_vector(std::vector<int64_t>(128, 4), {128});
  // Gradient buffers first, so that backward allocates no lasting memory of its own.
  w1.set_grad(Tensor::zeros(w1.shape()));
  w2.set_grad(Tensor::zeros(w2.shape()));
  const size_t base = memory_stats(cpu).in_use;
  {
    Tensor loss = cross_entropy(linear(relu(linear(x, w1)), w2), t);
    // Saved: relu's output (128x256, shared with the second linear's input) and the softmax
    // probabilities (128x10) and the number of rows counted (ignore_index), plus the scalar loss.
    // The first linear's output is already gone.
    const size_t act = (128 * 256 + 128 * 10 + 1 + 1) * sizeof(float);
    CHECK(memory_stats(cpu).in_use - base == act);
    loss.backward({}, /*retain_graph=*/true);
    CHECK(memory_stats(cpu).in_use - base == act);
    loss.backward();
    CHECK(memory_stats(cpu).in_use - base == sizeof(float));  // only the loss tensor itself
  }
  CHECK(memory_stats(cpu).in_use == base);
}

TEST_CASE("a tensor used twice gets the sum of both gradients") {
  Tensor a = rand_tensor({4, 3}, 41, true);
  Tensor y = add(a * 3.0f, relu(a));
  y.backward(Tensor::ones({4, 3}));
  auto va = a.to_vector<float>(), g = a.grad().to_vector<float>();
  for (size_t i = 0; i < va.size(); ++i) CHECK(g[i] == doctest::Approx(3.0f + (va[i] > 0 ? 1.0f : 0.0f)));
}

// run_backward adds a node's later gradients into its pending one when nothing else holds it,
// instead of a new sum beside both (a residual stream's gradient, once per block).
TEST_CASE("a non-leaf used many times sums its gradients in place, with add's bits") {
  const Device cpu = Device::cpu();
  for (const DType dt : {DType::f32, DType::bf16}) {
    CAPTURE(std::string(dtype_name(dt)));
    const int64_t n = 64 * 1024;
    Tensor a = rand_tensor({n}, 43).to(dt);
    a.requires_grad_();
    Tensor h = a * 2.0f;  // not a leaf
    Tensor y = relu(h);
    for (int k = 1; k <= 6; ++k) y = add(y, h * static_cast<float>(k));
    const Tensor gy = Tensor::ones({n}).to(dt);
    const size_t before = memory_stats(cpu).in_use;
    reset_peak_memory_stats(cpu);
    y.backward(gy);
    const size_t extra = memory_stats(cpu).peak_in_use - before;
    // Two buffers of h at a time (the pending sum and the incoming term; the sum becomes a's
    // gradient). A new tensor per sum made it three.
    const size_t buffer = static_cast<size_t>(n) * dtype_size(dt);
    CHECK_MESSAGE(extra < 3 * buffer, "backward's peak is " << static_cast<double>(extra) / buffer << " buffers of h above its start");
    // dh = relu'(h) + (1 + ... + 6), summed in h's dtype one term at a time, as add_kernel would.
    std::vector<float> hv = h.to(DType::f32).to_vector<float>(), g = a.grad().to(DType::f32).to_vector<float>();
    for (int64_t i = 0; i < n; i += 997) {
      Tensor acc = Tensor::full({1}, hv[i] > 0 ? 1.0f : 0.0f).to(dt);
      for (int k = 6; k >= 1; --k) acc = add(acc, Tensor::full({1}, static_cast<float>(k)).to(dt));
      CHECK(g[i] == acc.item() * 2.0f);
    }
  }
}

TEST_CASE("modules: PyTorch names, init bounds, to(), zero_grad and release_grads") {
  manual_seed(7);
  auto mlp = nn::make_mlp({12, 9, 5});
  auto named = mlp->named_parameters();
  REQUIRE(named.size() == 4);
  CHECK(named[0].first == "1.weight");
  CHECK(named[1].first == "1.bias");
  CHECK(named[2].first == "3.weight");
  CHECK(named[3].first == "3.bias");
  CHECK(named[0].second.shape() == Shape{9, 12});
  CHECK(mlp->parameter_count() == 9 * 12 + 9 + 5 * 9 + 5);
  for (float v : named[0].second.to_vector<float>()) CHECK(std::abs(v) <= 1.0f / std::sqrt(12.0f));
  manual_seed(7);
  auto again = nn::make_mlp({12, 9, 5});
  CHECK(test::bit_equal(again->parameters()[0], named[0].second));
  Tensor p0 = named[0].second;
  mlp->to(Device::cpu());
  CHECK(mlp->parameters()[0].same(p0));
  CHECK_THROWS_WITH_AS(mlp->forward(rand_tensor({2, 11}, 1)), doctest::Contains("11 features, weight expects 12"), Error);
  mlp->forward(rand_tensor({2, 12}, 1)).backward(Tensor::ones({2, 5}));
  CHECK(p0.grad().defined());
  // zero_grad means what Optimizer::zero_grad means: the same buffer, zeroed in place.
  Tensor buffer = p0.grad();
  mlp->zero_grad();
  CHECK(p0.grad().same(buffer));
  CHECK(test::max_abs_diff(buffer, Tensor::zeros(buffer.shape())) == 0.0);
  mlp->release_grads();
  CHECK(!p0.grad().defined());
  mlp->zero_grad();  // nothing to zero: stays undefined
  CHECK(!p0.grad().defined());
}

TEST_CASE("device strings") {
  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK(Device::parse("cuda:1") == Device::cuda(1));
  CHECK_THROWS_WITH_AS(Device::parse("gpu"), doctest::Contains("expected cpu, cuda or cuda:N"), Error);
  if (!cuda_available()) {
    CHECK_THROWS_AS(Tensor::zeros({2}).to(Device::cuda()), Error);
    // Why not: a build without CUDA, or the runtime's answer with the versions.
#ifdef MINIGRAD_WITH_CUDA
    CHECK_MESSAGE(cuda_unavailable_reason().find("cudaGetDeviceCount: ") == 0, cuda_unavailable_reason());
    CHECK_MESSAGE(cuda_unavailable_reason().find("the runtime is CUDA ") != std::string::npos, cuda_unavailable_reason());
#else
    CHECK(cuda_unavailable_reason() == "this libminigrad was built without CUDA");
#endif
  } else {
    CHECK(cuda_unavailable_reason().empty());
  }
}

TEST_CASE("a graph dropped without backward frees everything") {
  const Device cpu = Device::cpu();
  Tensor w = rand_tensor({64, 32}, 51, true);
  const size_t base = memory_stats(cpu).in_use;
  {
    Tensor y = relu(linear(rand_tensor({16, 32}, 52), w));
    y = dropout(relu(y), 0.5f);
    CHECK(memory_stats(cpu).in_use > base);
  }
  CHECK(memory_stats(cpu).in_use == base);
}

TEST_CASE("step statistics: squared norms of many tensors and stored losses, in float64") {
  std::vector<Tensor> xs;
  double expect = 0.0;
  for (int i = 0; i < 5; ++i) {
    xs.push_back(test::rand_tensor({3 + 17 * i, 1 + i}, 40 + i));
    for (float v : xs.back().to_vector<float>()) expect += static_cast<double>(v) * v;
  }
  xs.push_back(Tensor::empty({0, 4}));  // empty tensors add nothing
  Tensor st = Tensor::full({3}, -1.0f, TensorOptions{DType::f64});
  CHECK(st.nbytes() == 24);
  CHECK(std::string(dtype_name(st.dtype())) == "float64");
  sum_squares_into<Cpu>(xs, st, 1);
  store_scalar<Cpu>(st, 2, Tensor::full({1}, 2.5f));
  const std::vector<double> v = st.to_vector<double>();
  CHECK(v[0] == -1.0);
  CHECK(std::abs(v[1] - expect) <= 1e-12 * expect);
  CHECK(v[2] == 2.5);
  CHECK_THROWS_WITH_AS(sum_squares_into<Cpu>(xs, st, 3), doctest::Contains("slot 3 outside a statistics tensor of 3"), Error);
  Tensor f32 = Tensor::zeros({2});
  CHECK_THROWS_WITH_AS(sum_squares_into<Cpu>(xs, f32, 0), doctest::Contains("must be float64, got float32"), Error);
  CHECK_THROWS_WITH_AS(store_scalar<Cpu>(st, 0, Tensor::zeros({2})), doctest::Contains("one element, got [2]"), Error);
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{1}, {1});
  CHECK_THROWS_WITH_AS(store_scalar<Cpu>(st, 0, labels), doctest::Contains("tensor 0 is int64"), Error);
}

// An error names the library's file relative to the repository, never the build machine's
// absolute path (which means nothing to whoever reads the message elsewhere).
TEST_CASE("errors name library sources relative to the repository") {
  std::string what;
  try {
    Tensor x = Tensor::zeros({2, 3}).requires_grad_();
    relu(x).requires_grad_(false);  // MG_CHECK in src/core/tensor.cpp
  } catch (const Error& e) {
    what = e.what();
  }
  REQUIRE(!what.empty());
  CHECK(what.find("at src/core/tensor.cpp:") != std::string::npos);
  CHECK(what.find(MG_SOURCE_DIR) == std::string::npos);
}

// A shape whose element count overflows int64 (or whose bytes overflow size_t) once wrapped to a
// small allocation; it is an error naming the shape.
TEST_CASE("shapes too large to count are refused before anything is allocated") {
  const int64_t big = int64_t{1} << 40;
  CHECK_THROWS_WITH_AS(Tensor::empty({big, big}), doctest::Contains("more elements than an int64 can count"), Error);
  CHECK_THROWS_WITH_AS(shape_numel({3, big, big}), doctest::Contains("[3, 1099511627776, 1099511627776]"), Error);
  CHECK(shape_numel({big, big, 0}) == 0);  // a zero dimension: no elements, however large the rest
  CHECK_THROWS_WITH_AS(Tensor::empty({int64_t{1} << 61}, TensorOptions{DType::f64}),
                       doctest::Contains("needs more bytes than a size_t can count"), Error);
}
