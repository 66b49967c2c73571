// The CPU thread pool (src/core/parallel.h): results do not depend on the thread count (Note
// [fixed pieces]), every piece runs exactly once, errors come back to the caller, nested and
// concurrent parallel parts work, and the back-off policy (Note [backing off]) acts as documented.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include <minigrad/minigrad.h>

#include "core/backoff.h"
#include "core/parallel.h"
#include "helpers.h"
#include "kernels/conv2d.h"
#include "kernels/cross_entropy.h"
#include "kernels/gelu.h"
#include "kernels/linear.h"

using namespace mg;
using namespace mg::test;

namespace {

// Restores the thread count a test changed.
struct ThreadCount {
  int saved = num_threads();
  ~ThreadCount() { set_num_threads(saved); }
};

// Trains `model` for a few steps from a fixed start and returns its parameters.
std::vector<Tensor> train(const std::function<std::shared_ptr<nn::Sequential>()>& make, const Shape& sample,
                          int64_t classes, bool adam, int threads) {
  set_num_threads(threads);
  manual_seed(5);
  auto model = make();
  std::unique_ptr<optim::Optimizer> opt;
  if (adam) opt = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions{.lr = 1e-3f});
  else opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 0.05f, .momentum = 0.9f});
  optim::Accumulator acc(*opt, {.steps = 2});
  Generator gen(9);
  for (int step = 0; step < 6; ++step) {
    Shape xs = sample;
    xs.insert(xs.begin(), 24);
    const Tensor x = Tensor::uniform(xs, -1.0f, 1.0f, gen);
    std::vector<int64_t> y(24);
    for (int64_t j = 0; j < 24; ++j) y[j] = philox_u32(3, step * 24 + j) % classes;
    Tensor loss;
    {
      auto window = acc.sample_window();
      loss = cross_entropy(model->forward(x), Tensor::from_vector(y, {24}), Reduction::sum);
    }
    acc.backward(loss, 24);
    if (acc.ready()) acc.step();
  }
  std::vector<Tensor> out;
  for (const Tensor& p : model->parameters()) out.push_back(p.clone());
  return out;
}

void check_same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("parameter " << i << " " << shape_str(a[i].shape()));
    CHECK(bit_equal(a[i], b[i]));
  }
}

}  // namespace

TEST_CASE("training gives the same bits with 1, 2 and 3 threads (MLP 784-512-512-10 and a CNN, SGD and Adam)") {
  ThreadCount restore;
  const auto mlp = [] { return nn::make_mlp({784, 512, 512, 10}); };
  for (bool adam : {false, true}) {
    INFO(std::string(adam ? "Adam" : "SGD momentum"));
    const std::vector<Tensor> one = train(mlp, {1, 28, 28}, 10, adam, 1);
    check_same_bits(train(mlp, {1, 28, 28}, 10, adam, 2), one);
    check_same_bits(train(mlp, {1, 28, 28}, 10, adam, 3), one);
  }
  // Convolutions (im2col blocks, dW by channel groups), pooling and dropout; 3 x 96 x 96 makes
  // every kernel split its work into several pieces.
  const auto cnn = [] { return small_cnn(); };
  const std::vector<Tensor> one = train(cnn, {3, 96, 96}, 3, true, 1);
  check_same_bits(train(cnn, {3, 96, 96}, 3, true, 2), one);
  check_same_bits(train(cnn, {3, 96, 96}, 3, true, 3), one);
}

namespace {

// Rows [r0, r1) of t along its first dimension, as a tensor of their own.
Tensor rows(const Tensor& t, int64_t r0, int64_t r1) {
  const int64_t per = t.numel() / std::max<int64_t>(t.size(0), 1);
  Shape s = t.shape();
  s[0] = r1 - r0;
  return Tensor::from_vector(std::vector<float>(t.data<float>() + r0 * per, t.data<float>() + r1 * per), s);
}

// The batch cut into consecutive parts of these sizes (the last part takes what is left).
std::vector<std::pair<int64_t, int64_t>> cut(int64_t n, const std::vector<int64_t>& sizes) {
  std::vector<std::pair<int64_t, int64_t>> parts;
  int64_t r = 0;
  for (int64_t len : sizes) {
    if (r >= n) break;
    parts.push_back({r, std::min(n, r + len)});
    r += len;
  }
  if (r < n) parts.push_back({r, n});
  return parts;
}

}  // namespace

// Note [rows that do not depend on the batch] (kernels/cpu/gemm.h), Note [weight gradients in
// sample order] (kernels/cpu/conv2d.cpp): a sample's output and input gradient are the same bits in
// any batch, and weight gradients accumulated part by part are those of the whole batch.
TEST_CASE("a sample's results do not depend on the batch it is in: linear, conv2d, gelu and cross_entropy, batches cut every way") {
  const std::vector<std::vector<int64_t>> cuts = {{1}, {2}, {3}, {1, 2, 3, 5}, {13}, {16}, {7, 6}};
  struct Lin { int64_t n, in, out; };
  for (const Lin l : {Lin{37, 784, 512}, Lin{37, 512, 10}, Lin{300, 33, 100}}) {
    CAPTURE(l.in);
    CAPTURE(l.out);
    const Tensor x = rand_tensor({l.n, l.in}, 201), w = rand_tensor({l.out, l.in}, 202), b = rand_tensor({l.out}, 203);
    const Tensor dy = rand_tensor({l.n, l.out}, 204);
    Tensor y = Tensor::empty({l.n, l.out}), dx = Tensor::empty(x.shape()), dw = Tensor::empty(w.shape()), none;
    linear_forward<Cpu>(y, x, w, b);
    linear_backward<Cpu>(dx, dw, none, dy, x, w, false);
    for (const auto& sizes : cuts) {
      Tensor dw_parts = Tensor::zeros(w.shape());
      for (const auto& [r0, r1] : cut(l.n, sizes)) {
        CAPTURE(r0);
        CAPTURE(r1);
        Tensor yp = Tensor::empty({r1 - r0, l.out}), dxp = Tensor::empty({r1 - r0, l.in});
        linear_forward<Cpu>(yp, rows(x, r0, r1), w, b);
        linear_backward<Cpu>(dxp, dw_parts, none, rows(dy, r0, r1), rows(x, r0, r1), w, true);
        CHECK(bit_equal(yp, rows(y, r0, r1)));
        CHECK(bit_equal(dxp, rows(dx, r0, r1)));
      }
      CHECK(bit_equal(dw_parts, dw));
    }
  }
  // 3 -> 4 channels: im2col; 16 on a side: oneDNN where the build has it (kernels/cpu/conv2d_onednn.h).
  struct Conv { int64_t c, o, k; int stride, pad; };
  for (const Conv cv : {Conv{3, 4, 3, 1, 1}, Conv{16, 8, 3, 1, 1}, Conv{16, 12, 3, 2, 0}, Conv{24, 16, 1, 1, 0}}) {
    CAPTURE(cv.c);
    CAPTURE(cv.stride);
    const int64_t n = 7, h = 13, oh = (h + 2 * cv.pad - cv.k) / cv.stride + 1;
    const Tensor x = rand_tensor({n, cv.c, h, h}, 211), w = rand_tensor({cv.o, cv.c, cv.k, cv.k}, 212);
    const Tensor b = rand_tensor({cv.o}, 213), dy = rand_tensor({n, cv.o, oh, oh}, 214);
    Tensor y = Tensor::empty({n, cv.o, oh, oh}), dx = Tensor::empty(x.shape()), dw = Tensor::empty(w.shape());
    Tensor db = Tensor::empty({cv.o});
    conv2d_forward<Cpu>(y, x, w, b, cv.stride, cv.pad, false);
    conv2d_backward<Cpu>(dx, dw, db, dy, x, w, cv.stride, cv.pad, false, false);
    for (const auto& sizes : cuts) {
      Tensor dw_parts = Tensor::zeros(w.shape()), db_parts = Tensor::zeros({cv.o});
      for (const auto& [r0, r1] : cut(n, sizes)) {
        CAPTURE(r0);
        CAPTURE(r1);
        Tensor yp = Tensor::empty({r1 - r0, cv.o, oh, oh}), dxp = Tensor::empty({r1 - r0, cv.c, h, h});
        conv2d_forward<Cpu>(yp, rows(x, r0, r1), w, b, cv.stride, cv.pad, false);
        conv2d_backward<Cpu>(dxp, dw_parts, db_parts, rows(dy, r0, r1), rows(x, r0, r1), w, cv.stride, cv.pad, true, false);
        CHECK(bit_equal(yp, rows(y, r0, r1)));
        CHECK(bit_equal(dxp, rows(dx, r0, r1)));
      }
      CHECK(bit_equal(dw_parts, dw));
      CHECK(bit_equal(db_parts, db));
    }
  }
  // Packet maps (kernels/cpu/packet_math.h): 33 values per sample, so each part starts at another
  // place in a packet than in the whole batch, and a value lands in the tail in one and not the other.
  {
    const int64_t n = 37, d = 33, classes = 1001;
    Tensor x = rand_tensor({n, d}, 221);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] *= 6.0f;  // tanh's whole range
    const Tensor dy = rand_tensor({n, d}, 222), logits = rand_tensor({n, classes}, 223);
    std::vector<int64_t> labels(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = (i * 37) % classes;
    const Tensor target = Tensor::from_vector(labels, {n});
    Tensor y = Tensor::empty(x.shape()), dx = Tensor::empty(x.shape());
    gelu_forward<Cpu>(y, x);
    gelu_backward<Cpu>(dx, dy, x);
    Tensor loss = Tensor::empty({}), probs = Tensor::empty(logits.shape()), count = Tensor::empty({1});
    Tensor dlogits = Tensor::empty(logits.shape());
    cross_entropy_forward<Cpu>(loss, probs, count, logits, target, Reduction::sum, -100);
    cross_entropy_backward<Cpu>(dlogits, Tensor::ones({}), probs, count, target, Reduction::sum, -100);
    for (const Tensor* t : {&y, &dx, &probs, &dlogits}) {
      for (int64_t i = 0; i < t->numel(); ++i) REQUIRE(std::isfinite(t->data<float>()[i]));  // every element written
    }
    for (const auto& sizes : cuts) {
      for (const auto& [r0, r1] : cut(n, sizes)) {
        CAPTURE(r0);
        CAPTURE(r1);
        Tensor yp = Tensor::empty({r1 - r0, d}), dxp = Tensor::empty({r1 - r0, d});
        gelu_forward<Cpu>(yp, rows(x, r0, r1));
        gelu_backward<Cpu>(dxp, rows(dy, r0, r1), rows(x, r0, r1));
        CHECK(bit_equal(yp, rows(y, r0, r1)));
        CHECK(bit_equal(dxp, rows(dx, r0, r1)));
        const std::vector<int64_t> part(labels.begin() + r0, labels.begin() + r1);
        const Tensor tp = Tensor::from_vector(part, {r1 - r0});
        Tensor lp = Tensor::empty({}), pp = Tensor::empty({r1 - r0, classes}), cp = Tensor::empty({1});
        Tensor dlp = Tensor::empty({r1 - r0, classes});
        cross_entropy_forward<Cpu>(lp, pp, cp, rows(logits, r0, r1), tp, Reduction::sum, -100);
        cross_entropy_backward<Cpu>(dlp, Tensor::ones({}), pp, cp, tp, Reduction::sum, -100);
        CHECK(bit_equal(pp, rows(probs, r0, r1)));
        CHECK(bit_equal(dlp, rows(dlogits, r0, r1)));
      }
    }
  }
}

// Note [half scratch] in kernels/cpu/gemm.cpp: a product whose rows are samples runs an odd
// batch's last rows as a padded group of 4, copies the CPU allocator must count.
TEST_CASE("an odd batch's padded group of rows is counted by the allocator, each thread's once") {
  const Device cpu = Device::cpu();
  const int64_t k = 4096, out = 96;
  const Tensor x = rand_tensor({3, k}, 211), w = rand_tensor({out, k}, 212);
  Tensor y = Tensor::empty({3, out}), none;
  const size_t before = memory_stats(cpu).in_use;
  reset_peak_memory_stats(cpu);
  linear_forward<Cpu>(y, x, w, none);
  const size_t extra = memory_stats(cpu).peak_in_use - before;
  CHECK(extra >= 4 * k * sizeof(float));  // at least one group's rows of A
  CHECK(extra <= static_cast<size_t>(num_threads() * 4 * (k + out)) * sizeof(float) + 1024);
  CHECK(memory_stats(cpu).in_use == before);
}

// Note [sums in sample order] in kernels/cpu/gemm.h: a weight gradient over more samples than one
// panel holds (kPanelSamples, 4096) runs them in chunks that continue the same chains.
TEST_CASE("a weight gradient over 9000 samples has the bits of its parts accumulated in order") {
  const int64_t n = 9000, in = 16, out = 24;
  const Tensor x = rand_tensor({n, in}, 213), w = rand_tensor({out, in}, 214), dy = rand_tensor({n, out}, 215);
  Tensor dw = Tensor::empty(w.shape()), none;
  linear_backward<Cpu>(none, dw, none, dy, x, w, false);
  Tensor parts = Tensor::empty(w.shape());
  linear_backward<Cpu>(none, parts, none, rows(dy, 0, 3000), rows(x, 0, 3000), w, false);
  linear_backward<Cpu>(none, parts, none, rows(dy, 3000, n), rows(x, 3000, n), w, true);
  CHECK(bit_equal(parts, dw));
  CHECK(rel_err(dw, matmul(permute(dy, {1, 0}), x)) < 1e-5);
}

TEST_CASE("set_num_threads: a count below 1 is an error") {
  ThreadCount restore;
  CHECK_THROWS_WITH_AS(set_num_threads(0), doctest::Contains("expected a count in [1, 4096], got 0"), Error);
  set_num_threads(3);
  CHECK(num_threads() == 3);
}

TEST_CASE("parallel_pieces runs every piece once, nests, and returns a piece's exception") {
  ThreadCount restore;
  set_num_threads(3);
  for (int64_t pieces : {int64_t{2}, int64_t{7}, int64_t{1000}}) {
    std::vector<std::atomic<int>> runs(static_cast<size_t>(pieces));
    std::atomic<int> bad_slot{0};
    const int slots = cpu::parallel_slots(pieces);
    CHECK(slots == std::min<int64_t>(3, pieces));
    cpu::parallel_pieces(pieces, [&](int64_t p, int slot) {
      if (slot < 0 || slot >= slots) ++bad_slot;
      CHECK(cpu::parallel_slots(10) == 1);  // inside a piece, parts run on this thread
      int64_t inner = 0;
      cpu::parallel_for(10, 1, [&](int64_t b, int64_t e) { inner += e - b; });
      if (inner == 10) runs[static_cast<size_t>(p)]++;
    });
    CHECK(bad_slot == 0);
    for (int64_t p = 0; p < pieces; ++p) CHECK(runs[static_cast<size_t>(p)] == 1);
  }
  CHECK_THROWS_WITH_AS(cpu::parallel_pieces(64,
                                            [](int64_t p, int) {
                                              if (p == 17) throw Error("piece 17 failed");
                                            }),
                       doctest::Contains("piece 17 failed"), Error);
  // The pool works after an error.
  std::atomic<int64_t> sum{0};
  cpu::parallel_for(1000, 10, [&](int64_t b, int64_t e) { sum += e - b; });
  CHECK(sum == 1000);
}

TEST_CASE("two threads of the caller's may run kernels at once") {
  ThreadCount restore;
  set_num_threads(2);
  const Tensor a = rand_tensor({64, 300}, 1), w = rand_tensor({200, 300}, 2), b = rand_tensor({200}, 3);
  const Tensor ref = linear(a, w, b);
  std::atomic<int> wrong{0};
  std::vector<std::thread> users;
  for (int t = 0; t < 2; ++t) {
    users.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        if (!bit_equal(linear(a, w, b), ref)) ++wrong;
      }
    });
  }
  for (auto& u : users) u.join();
  CHECK(wrong == 0);
}

TEST_CASE("back-off: stalls over a quarter of a window drop a thread; the full count is retried later") {
  using namespace std::chrono_literals;
  using clock = std::chrono::steady_clock;
  cpu::detail::Backoff b;
  clock::time_point now{};
  CHECK(b.threads(4, now) == 4);
  // A quiet window: waits of a fifth of the time are normal unevenness, nothing changes.
  for (int i = 0; i < 10; ++i) b.record(4, 1ms, 200us, now += 1ms);
  CHECK(b.threads(4, now) == 4);
  // Stalls of half the time: one thread fewer, until the 200 ms pause is over.
  for (int i = 0; i < 10; ++i) b.record(4, 1ms, 500us, now += 1ms);
  CHECK(b.threads(4, now) == 3);
  CHECK(b.threads(4, now + 199ms) == 3);
  now += 200ms;
  CHECK(b.threads(4, now) == 4);  // tried again
  // Still stalled: back to 3, and the next try waits twice as long.
  for (int i = 0; i < 10; ++i) b.record(4, 1ms, 500us, now += 1ms);
  CHECK(b.threads(4, now + 399ms) == 3);
  now += 400ms;
  CHECK(b.threads(4, now) == 4);
  // A clean window at the full count forgets the failures: the pause is 200 ms again.
  for (int i = 0; i < 10; ++i) b.record(4, 1ms, 0us, now += 1ms);
  for (int i = 0; i < 10; ++i) b.record(4, 1ms, 500us, now += 1ms);
  CHECK(b.threads(4, now + 199ms) == 3);
  CHECK(b.threads(4, now + 200ms) == 4);
  // Never below one thread.
  cpu::detail::Backoff one;
  for (int i = 0; i < 10; ++i) one.record(1, 1ms, 900us, now += 1ms);
  CHECK(one.threads(2, now) == 1);
}
