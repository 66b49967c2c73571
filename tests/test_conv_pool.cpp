// conv2d, max_pool2d, adaptive_avg_pool2d and dropout on the CPU: forward and backward against
// PyTorch golden values (tests/golden/make_conv_pool_golden.py), the accumulate path,
// determinism, workspace accounting, and error messages. Their finite-difference gradient checks
// are the ops' case rows (src/ops/conv2d.cpp, src/ops/pooling.cpp), run by tests/test_ops.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/tape.h"  // rows_view
#include "helpers.h"
#include "kernels/conv2d.h"
#include "kernels/cpu/conv2d_onednn.h"
#include "kernels/dropout.h"
#include "kernels/pooling.h"

using namespace mg;
using mg::test::bit_equal;
using mg::test::rand_tensor;
using mg::test::rel_err;
using nlohmann::json;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

const json& golden() {
  static const json j = [] {
    std::ifstream f(std::string(MG_SOURCE_DIR) + "/tests/golden/conv_pool.json");
    REQUIRE_MESSAGE(f.good(), "missing tests/golden/conv_pool.json: run "
                              "/usr/bin/python3 tests/golden/make_conv_pool_golden.py");
    return json::parse(f);
  }();
  return j;
}

Tensor from_json(const json& values, const json& shape) {
  return Tensor::from_vector(values.get<std::vector<float>>(), shape.get<Shape>());
}

// An output buffer full of NaN, so a kernel that skips an element cannot pass.
Tensor poisoned(const Shape& s) { return Tensor::full(s, kNaN); }

}  // namespace

// ---- golden values from PyTorch ----------------------------------------------------------------

TEST_CASE("conv2d forward and backward match PyTorch") {
  for (const json& c : golden()["conv2d"]) {
    INFO("case " << c["name"].get<std::string>());
    const Tensor x = from_json(c["x"], c["x_shape"]), w = from_json(c["w"], c["w_shape"]);
    const bool bias = !c["b"].is_null();
    const Tensor b = bias ? from_json(c["b"], json::array({w.size(0)})) : Tensor();
    const Tensor dy = from_json(c["dy"], c["y_shape"]);
    const int stride = c["stride"].get<int>(), pad = c["pad"].get<int>();

    Tensor y = poisoned(c["y_shape"].get<Shape>());
    conv2d_forward<Cpu>(y, x, w, b, stride, pad, false);
    CHECK(rel_err(y, from_json(c["y"], c["y_shape"])) < 1e-5);

    Tensor dx = poisoned(x.shape()), dw = poisoned(w.shape()), db = bias ? poisoned(b.shape()) : Tensor();
    conv2d_backward<Cpu>(dx, dw, db, dy, x, w, stride, pad, false, false);
    CHECK(rel_err(dx, from_json(c["dx"], c["x_shape"])) < 1e-5);
    CHECK(rel_err(dw, from_json(c["dw"], c["w_shape"])) < 1e-5);
    if (bias) CHECK(rel_err(db, from_json(c["db"], json::array({w.size(0)}))) < 1e-5);

    // The same through the tape.
    Tensor xt = x.clone().requires_grad_(), wt = w.clone().requires_grad_();
    Tensor bt = bias ? b.clone().requires_grad_() : Tensor();
    Tensor yt = conv2d(xt, wt, bt, stride, pad);
    CHECK(bit_equal(yt, y));
    yt.backward(dy);
    CHECK(bit_equal(xt.grad(), dx));
    CHECK(bit_equal(wt.grad(), dw));
    if (bias) CHECK(bit_equal(bt.grad(), db));
  }
}

TEST_CASE("max_pool2d forward, indices and backward match PyTorch") {
  for (const json& c : golden()["max_pool2d"]) {
    INFO("case " << c["name"].get<std::string>());
    const Tensor x = from_json(c["x"], c["x_shape"]), dy = from_json(c["dy"], c["y_shape"]);
    const Shape ys = c["y_shape"].get<Shape>();
    Tensor y = poisoned(ys);
    Tensor idx = Tensor::from_vector(std::vector<int64_t>(static_cast<size_t>(shape_numel(ys)), -7), ys);
    const int kernel = c["kernel"].get<int>(), stride = c["stride"].get<int>(), pad = c["pad"].get<int>();
    max_pool2d_forward<Cpu>(y, idx, x, kernel, stride, pad, false);
    CHECK(rel_err(y, from_json(c["y"], c["y_shape"])) < 1e-5);
    CHECK(idx.to_vector<int64_t>() == c["idx"].get<std::vector<int64_t>>());
    Tensor dx = poisoned(x.shape());
    max_pool2d_backward<Cpu>(dx, dy, idx, kernel, stride, pad, false);
    CHECK(rel_err(dx, from_json(c["dx"], c["x_shape"])) < 1e-5);

    Tensor xt = x.clone().requires_grad_();
    Tensor yt = max_pool2d(xt, kernel, stride, pad);
    CHECK(bit_equal(yt, y));
    yt.backward(dy);
    CHECK(bit_equal(xt.grad(), dx));
  }
}

// The kernel runs a row of outputs at a time, vectorised over columns; each output must still
// meet its window in row-major order: the first maximum's index, the last NaN, and an all -inf
// window pointing at its first element inside the plane. Values drawn from a few levels make ties.
TEST_CASE("max_pool2d forward: ties, NaN and -inf against one window at a time, every kernel, stride and padding") {
  struct Case {
    int64_t h, w;
    int kernel, stride, pad;
  };
  for (const Case& t : {Case{16, 16, 3, 2, 1}, Case{9, 13, 3, 1, 1}, Case{11, 7, 5, 3, 2}, Case{8, 8, 2, 2, 0},
                        Case{7, 10, 2, 1, 1}, Case{5, 5, 4, 4, 2}, Case{6, 33, 3, 2, 0}}) {
    CAPTURE(t.kernel);
    CAPTURE(t.stride);
    CAPTURE(t.pad);
    const int64_t planes = 6, oh = (t.h + 2 * t.pad - t.kernel) / t.stride + 1, ow = (t.w + 2 * t.pad - t.kernel) / t.stride + 1;
    std::vector<float> xv(static_cast<size_t>(planes * t.h * t.w));
    uint64_t state = 12345;
    for (float& v : xv) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const uint64_t r = state >> 59;  // 0..31
      v = r == 0 ? kNaN : r == 1 ? -std::numeric_limits<float>::infinity() : static_cast<float>(r % 4);
    }
    for (int64_t i = 0; i < t.h * t.w; ++i) xv[static_cast<size_t>(5 * t.h * t.w + i)] = -std::numeric_limits<float>::infinity();
    const Tensor x = Tensor::from_vector(xv, {2, 3, t.h, t.w});
    Tensor y = poisoned({2, 3, oh, ow});
    Tensor idx = Tensor::from_vector(std::vector<int64_t>(static_cast<size_t>(planes * oh * ow), -7), {2, 3, oh, ow});
    max_pool2d_forward<Cpu>(y, idx, x, t.kernel, t.stride, t.pad, false);
    const std::vector<float> yv = y.to_vector<float>();
    const std::vector<int64_t> iv = idx.to_vector<int64_t>();
    for (int64_t pl = 0; pl < planes; ++pl) {
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t h0 = std::max<int64_t>(i * t.stride - t.pad, 0), h1 = std::min<int64_t>(i * t.stride - t.pad + t.kernel, t.h);
          const int64_t w0 = std::max<int64_t>(j * t.stride - t.pad, 0), w1 = std::min<int64_t>(j * t.stride - t.pad + t.kernel, t.w);
          float best = -std::numeric_limits<float>::infinity();
          int64_t at = h0 * t.w + w0;
          for (int64_t r = h0; r < h1; ++r) {
            for (int64_t c = w0; c < w1; ++c) {
              const float v = xv[static_cast<size_t>((pl * t.h + r) * t.w + c)];
              if (v > best || std::isnan(v)) best = v, at = r * t.w + c;
            }
          }
          const size_t o = static_cast<size_t>((pl * oh + i) * ow + j);
          REQUIRE(iv[o] == at);
          REQUIRE((std::isnan(yv[o]) ? std::isnan(best) : yv[o] == best));
        }
      }
    }
  }
}

TEST_CASE("adaptive_avg_pool2d forward and backward match PyTorch") {
  for (const json& c : golden()["adaptive_avg_pool2d"]) {
    INFO("case " << c["name"].get<std::string>());
    const Tensor x = from_json(c["x"], c["x_shape"]), dy = from_json(c["dy"], c["y_shape"]);
    Tensor y = poisoned(c["y_shape"].get<Shape>());
    adaptive_avg_pool2d_forward<Cpu>(y, x, false);
    CHECK(rel_err(y, from_json(c["y"], c["y_shape"])) < 1e-5);
    Tensor dx = poisoned(x.shape());
    adaptive_avg_pool2d_backward<Cpu>(dx, dy, false);
    CHECK(rel_err(dx, from_json(c["dx"], c["x_shape"])) < 1e-5);

    Tensor xt = x.clone().requires_grad_();
    Tensor yt = adaptive_avg_pool2d(xt, c["out_h"].get<int>(), c["out_w"].get<int>());
    CHECK(bit_equal(yt, y));
    yt.backward(dy);
    CHECK(bit_equal(xt.grad(), dx));
  }
}

// ---- conv2d at sizes where im2col runs in many row blocks, against a direct loop in double ----

namespace {
struct DirectConv {
  std::vector<double> y, dx, dw, db;
};

DirectConv direct_conv(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy, int s, int pad) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t O = w.size(0), KH = w.size(2), KW = w.size(3), OH = dy.size(2), OW = dy.size(3);
  const auto xv = x.to_vector<float>(), wv = w.to_vector<float>(), bv = b.to_vector<float>();
  const auto gv = dy.to_vector<float>();
  DirectConv r{std::vector<double>(gv.size()), std::vector<double>(xv.size()), std::vector<double>(wv.size()),
               std::vector<double>(bv.size())};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < OH; ++i)
        for (int64_t j = 0; j < OW; ++j) {
          const int64_t yi = ((n * O + o) * OH + i) * OW + j;
          double acc = bv[o];
          r.db[o] += gv[yi];
          for (int64_t c = 0; c < C; ++c)
            for (int64_t p = 0; p < KH; ++p)
              for (int64_t q = 0; q < KW; ++q) {
                const int64_t ih = i * s - pad + p, iw = j * s - pad + q;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const int64_t xi = ((n * C + c) * H + ih) * W + iw, wi = ((o * C + c) * KH + p) * KW + q;
                acc += static_cast<double>(wv[wi]) * xv[xi];
                r.dx[xi] += static_cast<double>(wv[wi]) * gv[yi];
                r.dw[wi] += static_cast<double>(xv[xi]) * gv[yi];
              }
          r.y[yi] = acc;
        }
  return r;
}

double rel_err_vs(const Tensor& a, const std::vector<double>& ref) {
  const auto av = a.to_vector<float>();
  REQUIRE(av.size() == ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    num += (av[i] - ref[i]) * (av[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}
}  // namespace

TEST_CASE("conv2d in many im2col row blocks matches a direct loop") {
  struct Case { Shape x; int64_t o, k; int stride, pad; };
  // C KH KW OW floats per output row: 32*9*97*4 bytes = 112 KB, so a handful of rows per block,
  // and the last block is partial.
  for (const Case& c : {Case{{3, 32, 97, 97}, 5, 3, 1, 1}, Case{{2, 48, 61, 83}, 3, 3, 2, 0},
                        Case{{2, 40, 45, 50}, 4, 5, 3, 2}}) {
    CAPTURE(shape_str(c.x));
    const Tensor x = rand_tensor(c.x, 101), w = rand_tensor({c.o, c.x[1], c.k, c.k}, 102);
    const Tensor b = rand_tensor({c.o}, 103);
    const int64_t oh = (c.x[2] + 2 * c.pad - c.k) / c.stride + 1, ow = (c.x[3] + 2 * c.pad - c.k) / c.stride + 1;
    const Tensor dy = rand_tensor({c.x[0], c.o, oh, ow}, 104);
    const DirectConv ref = direct_conv(x, w, b, dy, c.stride, c.pad);
    Tensor y = poisoned(dy.shape()), dx = poisoned(x.shape()), dw = poisoned(w.shape()), db = poisoned({c.o});
    conv2d_forward<Cpu>(y, x, w, b, c.stride, c.pad, false);
    conv2d_backward<Cpu>(dx, dw, db, dy, x, w, c.stride, c.pad, false, false);
    CHECK(rel_err_vs(y, ref.y) < 1e-5);
    CHECK(rel_err_vs(dx, ref.dx) < 1e-5);
    CHECK(rel_err_vs(dw, ref.dw) < 1e-5);
    CHECK(rel_err_vs(db, ref.db) < 1e-5);
  }
}

// ---- conv2d: accumulate, skip, determinism, workspace --------------------------------------------

TEST_CASE("conv2d backward with accumulate adds into dw and db") {
  // Batch 5 so that more than one thread takes part (partials are summed before adding).
  const Tensor x = rand_tensor({5, 3, 9, 8}, 41), w = rand_tensor({6, 3, 3, 3}, 42);
  const Tensor dy = rand_tensor({5, 6, 5, 4}, 43);
  Tensor dw_fresh = poisoned(w.shape()), db_fresh = poisoned({6});
  Tensor none;
  conv2d_backward<Cpu>(none, dw_fresh, db_fresh, dy, x, w, 2, 1, false, false);

  const Tensor dw0 = rand_tensor(w.shape(), 44), db0 = rand_tensor({6}, 45);
  Tensor dw = dw0.clone(), db = db0.clone();
  conv2d_backward<Cpu>(none, dw, db, dy, x, w, 2, 1, true, false);
  auto expect = [](const Tensor& base, const Tensor& add) {
    auto a = base.to_vector<float>(), b = add.to_vector<float>();
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    return Tensor::from_vector(a, base.shape());
  };
  CHECK(rel_err(dw, expect(dw0, dw_fresh)) < 1e-6);
  CHECK(rel_err(db, expect(db0, db_fresh)) < 1e-6);
  CHECK(!bit_equal(dw, dw_fresh));

  // Through the tape: a leaf that already has a gradient buffer gets it added to in place.
  Tensor wt = w.clone().requires_grad_(), bt = rand_tensor({6}, 46, true);
  Tensor buf_w = dw0.clone(), buf_b = db0.clone();
  wt.set_grad(buf_w);
  bt.set_grad(buf_b);
  conv2d(x, wt, bt, 2, 1).backward(dy);
  CHECK(wt.grad().shares_storage(buf_w));
  CHECK(rel_err(wt.grad(), expect(dw0, dw_fresh)) < 1e-6);
  CHECK(rel_err(bt.grad(), expect(db0, db_fresh)) < 1e-6);
}

TEST_CASE("conv2d backward skips what is undefined") {
  const Tensor x = rand_tensor({3, 4, 6, 7}, 51), w = rand_tensor({5, 4, 3, 3}, 52);
  const Tensor dy = rand_tensor({3, 5, 6, 7}, 53);
  Tensor dx = poisoned(x.shape()), dw = poisoned(w.shape()), db = poisoned({5});
  conv2d_backward<Cpu>(dx, dw, db, dy, x, w, 1, 1, false, false);
  Tensor none, dx_only = poisoned(x.shape()), dw_only = poisoned(w.shape());
  conv2d_backward<Cpu>(dx_only, none, none, dy, x, w, 1, 1, false, false);
  conv2d_backward<Cpu>(none, dw_only, none, dy, x, w, 1, 1, false, false);
  CHECK(bit_equal(dx_only, dx));
  CHECK(bit_equal(dw_only, dw));
}

TEST_CASE("conv2d backward of an empty batch gives zero dw and db") {
  const Tensor x = Tensor::empty({0, 3, 7, 5}), w = rand_tensor({4, 3, 3, 3}, 54);
  const Tensor dy = Tensor::empty({0, 4, 7, 5});
  Tensor y = Tensor::empty({0, 4, 7, 5}), dx = Tensor::empty(x.shape());
  Tensor dw = poisoned(w.shape()), db = poisoned({4});
  conv2d_forward<Cpu>(y, x, w, Tensor(), 1, 1, false);
  conv2d_backward<Cpu>(dx, dw, db, dy, x, w, 1, 1, false, false);
  CHECK(bit_equal(dw, Tensor::zeros(w.shape())));
  CHECK(bit_equal(db, Tensor::zeros({4})));
}

TEST_CASE("conv2d is deterministic: two runs give the same bits") {
  // Big enough for Eigen's blocked GEMM and for every thread to get images.
  const Tensor x = rand_tensor({8, 16, 28, 28}, 61), w = rand_tensor({32, 16, 3, 3}, 62);
  const Tensor b = rand_tensor({32}, 63), dy = rand_tensor({8, 32, 28, 28}, 64);
  auto run = [&] {
    std::vector<Tensor> r{poisoned({8, 32, 28, 28}), poisoned(x.shape()), poisoned(w.shape()),
                          poisoned({32})};
    conv2d_forward<Cpu>(r[0], x, w, b, 1, 1, false);
    conv2d_backward<Cpu>(r[1], r[2], r[3], dy, x, w, 1, 1, false, false);
    return r;
  };
  const auto first = run();
  for (int rep = 0; rep < 3; ++rep) {
    const auto again = run();
    for (size_t i = 0; i < first.size(); ++i) CHECK(bit_equal(again[i], first[i]));
  }
  // And the batch result agrees with image-by-image convolution.
  for (int64_t n : {0, 5}) {
    Tensor xn = Tensor::from_vector(std::vector<float>(x.data<float>() + n * 16 * 28 * 28,
                                                       x.data<float>() + (n + 1) * 16 * 28 * 28),
                                    {1, 16, 28, 28});
    Tensor yn = poisoned({1, 32, 28, 28});
    conv2d_forward<Cpu>(yn, xn, w, b, 1, 1, false);
    Tensor ref = Tensor::from_vector(std::vector<float>(first[0].data<float>() + n * 32 * 28 * 28,
                                                        first[0].data<float>() + (n + 1) * 32 * 28 * 28),
                                     {1, 32, 28, 28});
    CHECK(rel_err(yn, ref) < 1e-6);
  }
}

TEST_CASE("conv2d workspace is counted by the allocator and bounded per thread, not per batch") {
  const int64_t max_threads = num_threads();
  const Device cpu = Device::cpu();
  // A small image (im2col fits one block) and a large one (im2col is built in L2-sized blocks).
  for (int64_t h : {32, 160}) {
    CAPTURE(h);
    const int64_t n = 8, c = 4, o = 4;  // below oneDNN's channel block: im2col (conv2d_onednn.h)
    const Tensor x = rand_tensor({n, c, h, h}, 71), w = rand_tensor({o, c, 3, 3}, 72);
    const Tensor dy = rand_tensor({n, o, h, h}, 73);
    Tensor y = poisoned({n, o, h, h}), dx = poisoned(x.shape()), dw = poisoned(w.shape());
    Tensor none;
    const size_t before = memory_stats(cpu).in_use;
    const size_t one_col = static_cast<size_t>(c * 9 * h * h) * sizeof(float);
    const size_t threads = static_cast<size_t>(std::clamp<int64_t>(max_threads, 1, n));

    reset_peak_memory_stats(cpu);
    conv2d_forward<Cpu>(y, x, w, Tensor(), 1, 1, false);
    const size_t fwd_extra = memory_stats(cpu).peak_in_use - before;
    CHECK(memory_stats(cpu).in_use == before);
    CHECK(fwd_extra > 0);                             // the workspace went through the allocator
    CHECK(fwd_extra <= threads * std::min<size_t>(one_col, 1 << 20));  // <= one L2 block per thread

    // Backward: the same column blocks, plus, for a layer with few input channels like this one,
    // one partial dW per image (Note [weight gradients in sample order]; not per thread).
    reset_peak_memory_stats(cpu);
    conv2d_backward<Cpu>(dx, dw, none, dy, x, w, 1, 1, false, false);
    const size_t bwd_extra = memory_stats(cpu).peak_in_use - before;
    CHECK(memory_stats(cpu).in_use == before);
    CHECK(bwd_extra > 0);
    CHECK(bwd_extra <= threads * std::min<size_t>(one_col, 1 << 20) + static_cast<size_t>(n) * w.nbytes());
  }
}

TEST_CASE("conv2d in oneDNN: its workspace is counted by the allocator, per thread and not per batch") {
  const cpu::onednn::ConvShape shape{.c = 16, .h = 20, .w = 20, .o = 16, .kh = 3, .kw = 3, .oh = 20, .ow = 20,
                                     .stride = 1, .pad = 1};
  if (!cpu::onednn::applies(shape)) {
    MESSAGE("skipped: this build has no oneDNN (or MG_CPU_CONV=gemm)");
    return;
  }
  struct TwoThreads {  // slots of scratch: min(threads, images), the same for 4 and 12 images
    int saved = num_threads();
    TwoThreads() { set_num_threads(2); }
    ~TwoThreads() { set_num_threads(saved); }
  } two;
  const Device cpu = Device::cpu();
  const Tensor w = rand_tensor({16, 16, 3, 3}, 75);
  std::vector<size_t> fwd, bwd;
  for (int64_t n : {4, 12}) {
    const Tensor x = rand_tensor({n, 16, 20, 20}, 76), dy = rand_tensor({n, 16, 20, 20}, 77);
    Tensor y = poisoned(dy.shape()), dx = poisoned(x.shape()), dw = poisoned(w.shape()), none;
    const size_t before = memory_stats(cpu).in_use;
    reset_peak_memory_stats(cpu);
    conv2d_forward<Cpu>(y, x, w, Tensor(), 1, 1, false);
    fwd.push_back(memory_stats(cpu).peak_in_use - before);
    CHECK(memory_stats(cpu).in_use == before);
    reset_peak_memory_stats(cpu);
    conv2d_backward<Cpu>(dx, dw, none, dy, x, w, 1, 1, false, false);
    // minus one partial dW per image (Note [weight gradients in sample order])
    bwd.push_back(memory_stats(cpu).peak_in_use - before - static_cast<size_t>(n) * w.nbytes());
    CHECK(memory_stats(cpu).in_use == before);
  }
  CHECK(fwd[0] > 0);  // the blocked images and the weights went through the allocator
  CHECK(bwd[0] > 0);
  CHECK(fwd[1] == fwd[0]);  // 4 or 12 images: the same scratch
  CHECK(bwd[1] == bwd[0]);
}

namespace {
// Whether oneDNN runs a 512 -> 512 channel 3 x 3 layer (stride 1, padding 1) on h x h images here.
bool onednn_runs_512(int64_t h) {
  return cpu::onednn::applies({.c = 512, .h = h, .w = h, .o = 512, .kh = 3, .kw = 3, .oh = h, .ow = h, .stride = 1, .pad = 1});
}
}  // namespace

// Note [dW partials in rounds] in kernels/cpu/conv2d.cpp: a 512 x 512 x 3 x 3 layer (9.4 MB of dW)
// on 9 x 9 images (over 64 pixels: oneDNN's dW, Note [dW of small images]) makes its per-image
// partials 4 images at a time, so 10 images run in rounds of 4, 4 and 2.
TEST_CASE("conv2d backward in rounds of dW partials: the bits of adding every image's term in order, less memory") {
  const int64_t n = 10, c = 512, o = 512, h = 9;
  if (!onednn_runs_512(h)) {
    MESSAGE("skipped: this build has no oneDNN (or MG_CPU_CONV=gemm), and only its layers make dW per image at this size");
    return;
  }
  const Device cpu = Device::cpu();
  const Tensor x = rand_tensor({n, c, h, h}, 81), w = rand_tensor({o, c, 3, 3}, 82), dy = rand_tensor({n, o, h, h}, 83);
  const int saved = num_threads();
  // dx and dw of the first `images` images, and the scratch backward took beside them.
  auto backward = [&](int64_t images, int threads, size_t& extra) {
    set_num_threads(threads);
    Tensor dx = poisoned({images, c, h, h}), dw = poisoned(w.shape()), none;
    const size_t before = memory_stats(cpu).in_use;
    reset_peak_memory_stats(cpu);
    conv2d_backward<Cpu>(dx, dw, none, rows_view(dy, 0, images), rows_view(x, 0, images), w, 1, 1, false, false);
    extra = memory_stats(cpu).peak_in_use - before;
    return std::pair{dx, dw};
  };
  size_t extra1 = 0, extra2 = 0, extra_round = 0;
  const auto [dx1, dw1] = backward(n, 1, extra1);
  const auto [dx2, dw2] = backward(n, 2, extra2);
  backward(4, 2, extra_round);
  set_num_threads(saved);
  CHECK(bit_equal(dx2, dx1));
  CHECK(bit_equal(dw2, dw1));
  // 10 images take the scratch of one round of 4 (its partials, the filters in oneDNN's layout and
  // a block per thread), where 10 partials at once were 10 x dW's bytes on their own.
  CHECK(extra2 == extra_round);
  CHECK(extra2 < static_cast<size_t>(n) * w.nbytes());
  MESSAGE("backward's scratch for 10 images: " << extra2 << " bytes, "
                                               << static_cast<double>(extra2) / static_cast<double>(w.nbytes()) << "x dW's");

  // Each image's term alone, added in image order onto 0: the same bits as the batch's dW.
  std::vector<float> sum(static_cast<size_t>(w.numel()), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    Tensor dw_i = poisoned(w.shape()), none;
    conv2d_backward<Cpu>(none, dw_i, none, rows_view(dy, i, 1), rows_view(x, i, 1), w, 1, 1, false, false);
    const std::vector<float> t = dw_i.to_vector<float>();
    for (size_t e = 0; e < sum.size(); ++e) sum[e] += t[e];
  }
  CHECK(sum == dw1.to_vector<float>());

  // The batch split 3 + 7 into an accumulating buffer (rounds of 3, then 4, 3), at 1 and 2
  // threads: the same bits.
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    Tensor dw_split = poisoned(w.shape()), none;
    conv2d_backward<Cpu>(none, dw_split, none, rows_view(dy, 0, 3), rows_view(x, 0, 3), w, 1, 1, false, false);
    conv2d_backward<Cpu>(none, dw_split, none, rows_view(dy, 3, 7), rows_view(x, 3, 7), w, 1, 1, true, false);
    CHECK(bit_equal(dw_split, dw1));
  }
  set_num_threads(saved);
}

// Note [dW of small images] in kernels/cpu/conv2d.cpp: the same layer on 2 x 2 images takes dW from
// chains of multiply-adds over (image, pixel) pairs, in place (no partials), and dx from products
// over the batch (Note [small images as products over the batch]).
// (On larger images oneDNN runs this layer; here neither dW nor dx uses it, so every build runs this.)
TEST_CASE("conv2d backward of a wide layer on small images: dW in place, the bits of any batch split") {
  const int64_t n = 10, c = 512, o = 512, h = 2;
  const Device cpu = Device::cpu();
  const Tensor x = rand_tensor({n, c, h, h}, 84), w = rand_tensor({o, c, 3, 3}, 85), dy = rand_tensor({n, o, h, h}, 86);
  Tensor dx = poisoned(x.shape()), dw = poisoned(w.shape()), none;
  const size_t before = memory_stats(cpu).in_use;
  reset_peak_memory_stats(cpu);
  conv2d_backward<Cpu>(dx, dw, none, dy, x, w, 1, 1, false, false);
  const size_t extra = memory_stats(cpu).peak_in_use - before;
  // The rows of (image, pixel) pairs for dW, then for dx a group's filters (4 of the 9 taps) and
  // its rows: no partial dW, and no whole copy of the filters.
  CHECK(extra < w.nbytes());
  Tensor dw_split = poisoned(w.shape()), dx_a = poisoned({3, c, h, h}), dx_b = poisoned({7, c, h, h});
  conv2d_backward<Cpu>(dx_a, dw_split, none, rows_view(dy, 0, 3), rows_view(x, 0, 3), w, 1, 1, false, false);
  conv2d_backward<Cpu>(dx_b, dw_split, none, rows_view(dy, 3, 7), rows_view(x, 3, 7), w, 1, 1, true, false);
  CHECK(bit_equal(dw_split, dw));
  CHECK(bit_equal(dx_a, rows_view(dx, 0, 3)));
  CHECK(bit_equal(dx_b, rows_view(dx, 3, 7)));
  // dW against a sum in double over images, pixels and taps: the GEMMs' float32 rounding only.
  const std::vector<float> xv = x.to_vector<float>(), dyv = dy.to_vector<float>(), got = dw.to_vector<float>();
  double err = 0, ref_norm = 0;
  for (int64_t oc = 0; oc < o; oc += 37) {
    for (int64_t ic = 0; ic < c; ic += 29) {
      for (int64_t p = 0; p < 3; ++p) {
        for (int64_t q = 0; q < 3; ++q) {
          double ref = 0;
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t a = 0; a < h; ++a) {
              for (int64_t b = 0; b < h; ++b) {
                const int64_t ya = a + p - 1, xb = b + q - 1;
                if (ya < 0 || ya >= h || xb < 0 || xb >= h) continue;
                ref += static_cast<double>(dyv[static_cast<size_t>(((i * o + oc) * h + a) * h + b)]) *
                       xv[static_cast<size_t>(((i * c + ic) * h + ya) * h + xb)];
              }
            }
          }
          const double g = got[static_cast<size_t>(((oc * c + ic) * 3 + p) * 3 + q)];
          err += (g - ref) * (g - ref);
          ref_norm += ref * ref;
        }
      }
    }
  }
  CHECK(std::sqrt(err / ref_norm) < 1e-5);
}

// Note [dW of small images] in kernels/cpu/conv2d.cpp: layers of at most 16 output pixels an image
// take dW as one chain of fused multiply-adds per element over the batch's (image, pixel) pairs in
// order. Shapes: rounds of pairs (27 images of 256 x 9 + 64 floats a pixel, then 3), taps in the
// padding with too few channels for oneDNN, a strided 1 x 1, and 1 x 1 images with padding.
TEST_CASE("conv2d dW of images of at most 16 pixels: one chain of multiply-adds per element, any split, any threads") {
  struct Case {
    int64_t n, c, o, h, k, stride, pad;
  };
  const int saved = num_threads();
  for (const Case& t : {Case{30, 256, 64, 4, 3, 1, 1}, Case{7, 3, 8, 7, 3, 2, 1}, Case{9, 32, 48, 3, 1, 2, 0},
                        Case{5, 16, 16, 1, 3, 1, 1}}) {
    CAPTURE(t.n);
    CAPTURE(t.c);
    CAPTURE(t.h);
    CAPTURE(t.k);
    const int64_t oh = (t.h + 2 * t.pad - t.k) / t.stride + 1, ckk = t.c * t.k * t.k;
    REQUIRE(oh * oh <= 16);
    const Tensor x = rand_tensor({t.n, t.c, t.h, t.h}, 91), w = rand_tensor({t.o, t.c, t.k, t.k}, 92);
    const Tensor dy = rand_tensor({t.n, t.o, oh, oh}, 93), start = rand_tensor(w.shape(), 94);
    // dW over images [i0, i0 + count), onto `start` when given.
    auto dw_of = [&](int64_t i0, int64_t count, Tensor dw, bool accumulate) {
      Tensor none;
      conv2d_backward<Cpu>(none, dw, none, rows_view(dy, i0, count), rows_view(x, i0, count), w, t.stride, t.pad,
                           accumulate, false);
      return dw;
    };
    set_num_threads(1);
    const Tensor whole = dw_of(0, t.n, poisoned(w.shape()), false);
    const Tensor onto = dw_of(0, t.n, start.clone(), true);
    for (float v : whole.to_vector<float>()) REQUIRE(std::isfinite(v));  // every element written
    {  // dx beside the chains: the bits of dx alone
      Tensor dx = poisoned(x.shape()), dx_alone = poisoned(x.shape()), dw = poisoned(w.shape()), none;
      conv2d_backward<Cpu>(dx, dw, none, dy, x, w, t.stride, t.pad, false, false);
      conv2d_backward<Cpu>(dx_alone, none, none, dy, x, w, t.stride, t.pad, false, false);
      CHECK(bit_equal(dx, dx_alone));
      CHECK(bit_equal(dw, whole));
    }
    for (int threads : {1, 2}) {
      CAPTURE(threads);
      set_num_threads(threads);
      CHECK(bit_equal(dw_of(0, t.n, poisoned(w.shape()), false), whole));
      const int64_t first = t.n / 3;  // a split into two consecutive parts
      CHECK(bit_equal(dw_of(first, t.n - first, dw_of(0, first, poisoned(w.shape()), false), true), whole));
    }
    set_num_threads(saved);

    // Elements of dW against their chains written out here: from 0 (or the buffer's value), for
    // each image, for each output pixel in row order, dW = fma(dy, x's tap, dW); or, where the
    // library was built without fused multiply-adds, dW + dy x's tap rounded twice.
    const std::vector<float> xv = x.to_vector<float>(), dyv = dy.to_vector<float>(), got = whole.to_vector<float>();
    const std::vector<float> startv = start.to_vector<float>(), got_onto = onto.to_vector<float>();
    double err = 0, ref_norm = 0;
    bool all_fused = true, all_plain = true;
    for (int64_t e = 0; e < t.o * ckk; e += 7) {
      const int64_t oc = e / ckk, ic = e % ckk / (t.k * t.k), p = e % (t.k * t.k) / t.k, q = e % t.k;
      float chain = 0.0f, chain_onto = startv[static_cast<size_t>(e)], plain = 0.0f, plain_onto = chain_onto;
      double ref = 0;
      for (int64_t i = 0; i < t.n; ++i) {
        for (int64_t a = 0; a < oh; ++a) {
          for (int64_t b = 0; b < oh; ++b) {
            const int64_t ya = a * t.stride - t.pad + p, xb = b * t.stride - t.pad + q;
            const bool inside = ya >= 0 && ya < t.h && xb >= 0 && xb < t.h;
            const float tap = inside ? xv[static_cast<size_t>(((i * t.c + ic) * t.h + ya) * t.h + xb)] : 0.0f;
            const float g = dyv[static_cast<size_t>(((i * t.o + oc) * oh + a) * oh + b)];
            chain = std::fma(g, tap, chain);
            chain_onto = std::fma(g, tap, chain_onto);
            volatile float product = g * tap;  // rounded on its own, never contracted
            plain += product;
            plain_onto += product;
            ref += static_cast<double>(g) * tap;
          }
        }
      }
      const float mine = got[static_cast<size_t>(e)], mine_onto = got_onto[static_cast<size_t>(e)];
      all_fused = all_fused && mine == chain && mine_onto == chain_onto;
      all_plain = all_plain && mine == plain && mine_onto == plain_onto;
      err += (got[static_cast<size_t>(e)] - ref) * (got[static_cast<size_t>(e)] - ref);
      ref_norm += ref * ref;
    }
    CHECK((all_fused || all_plain));
    MESSAGE("dW's chains: " << std::string(all_fused ? "fused" : all_plain ? "unfused" : "neither"));
    CHECK(std::sqrt(err / ref_norm) < 1e-5);
  }
}

// Note [small images as products over the batch] in kernels/cpu/conv2d.cpp: layers of at most 4
// output pixels an image run forward and dx as products over the batch, one per group of pixels
// that see the same taps. Shapes: 2 x 2 images with padding (4 groups), 1 x 1 images (the centre
// tap only), a stride of 2 onto 2 x 2, a strided 1 x 1, every tap inside (W used as it is), a
// 1 x 3 image under a 3 x 2 kernel, and a 1 x 1 kernel whose every tap falls in the padding.
TEST_CASE("conv2d forward and dx of images of at most 4 pixels: products over the batch, any split, any threads") {
  struct Case {
    int64_t n, c, o, h, w, kh, kw, stride, pad;
    bool bias;
  };
  const int saved = num_threads();
  for (const Case& t : {Case{10, 64, 48, 2, 2, 3, 3, 1, 1, true}, Case{6, 32, 40, 1, 1, 3, 3, 1, 1, false},
                        Case{7, 24, 16, 4, 4, 3, 3, 2, 1, true}, Case{9, 32, 48, 3, 3, 1, 1, 2, 0, true},
                        Case{5, 3, 8, 5, 5, 5, 5, 2, 0, false}, Case{6, 16, 24, 1, 3, 3, 2, 1, 1, true},
                        Case{4, 8, 8, 1, 1, 1, 1, 2, 1, true}}) {  // the last: every tap in the padding
    CAPTURE(t.c);
    CAPTURE(t.h);
    CAPTURE(t.w);
    CAPTURE(t.kh);
    CAPTURE(t.kw);
    CAPTURE(t.stride);
    const int64_t oh = (t.h + 2 * t.pad - t.kh) / t.stride + 1, ow = (t.w + 2 * t.pad - t.kw) / t.stride + 1;
    REQUIRE(oh * ow <= 4);
    const Tensor x = rand_tensor({t.n, t.c, t.h, t.w}, 95), w = rand_tensor({t.o, t.c, t.kh, t.kw}, 96);
    const Tensor b = t.bias ? rand_tensor({t.o}, 97) : Tensor(), dy = rand_tensor({t.n, t.o, oh, ow}, 98);
    const int stride = static_cast<int>(t.stride), pad = static_cast<int>(t.pad);
    // y and dx of images [i0, i0 + count), every element poisoned first.
    auto run = [&](int64_t i0, int64_t count) {
      Tensor y = poisoned({count, t.o, oh, ow}), dx = poisoned({count, t.c, t.h, t.w}), none;
      conv2d_forward<Cpu>(y, rows_view(x, i0, count), w, b, stride, pad, false);
      conv2d_backward<Cpu>(dx, none, none, rows_view(dy, i0, count), rows_view(x, i0, count), w, stride, pad, false,
                           false);
      return std::pair{y, dx};
    };
    set_num_threads(1);
    const auto [y, dx] = run(0, t.n);
    const DirectConv ref = direct_conv(x, w, t.bias ? b : Tensor::zeros({t.o}), dy, stride, pad);
    CHECK(rel_err_vs(y, ref.y) < 1e-6);  // every element written: a poisoned one would be NaN here
    if (std::any_of(ref.dx.begin(), ref.dx.end(), [](double v) { return v != 0.0; })) {
      CHECK(rel_err_vs(dx, ref.dx) < 1e-6);
    } else {  // no tap inside the image: y is b, and dx is 0
      for (float v : dx.to_vector<float>()) CHECK(v == 0.0f);
    }
    {  // dx beside dW (in chains) has the bits of dx alone
      Tensor dx_with = poisoned(x.shape()), dw = poisoned(w.shape()), none;
      conv2d_backward<Cpu>(dx_with, dw, none, dy, x, w, stride, pad, false, false);
      CHECK(bit_equal(dx_with, dx));
    }
    for (int threads : {1, 2}) {
      CAPTURE(threads);
      set_num_threads(threads);
      const int64_t first = t.n / 3;  // a split into two consecutive parts
      for (auto [i0, count] : {std::pair{int64_t{0}, t.n}, std::pair{int64_t{0}, first}, std::pair{first, t.n - first}}) {
        const auto [ys, dxs] = run(i0, count);
        CHECK(bit_equal(ys, rows_view(y, i0, count)));
        CHECK(bit_equal(dxs, rows_view(dx, i0, count)));
      }
    }
    set_num_threads(saved);
  }
}

// ---- errors ------------------------------------------------------------------------------------

TEST_CASE("conv2d and pooling reject bad shapes with clear messages") {
  const Tensor x = rand_tensor({2, 3, 7, 5}, 81);
  CHECK_THROWS_WITH_AS(conv2d(x, rand_tensor({4, 2, 3, 3}, 82)),
                       doctest::Contains("input has 3 channels, weight expects 2"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, rand_tensor({4, 3, 9, 3}, 83)), doctest::Contains("smaller than kernel"),
                       Error);
  // A kernel one row too tall with stride 2: (7 - 8) / 2 + 1 truncates to 1, yet nothing fits.
  CHECK_THROWS_WITH_AS(conv2d(x, rand_tensor({4, 3, 8, 3}, 86), {}, 2),
                       doctest::Contains("smaller than kernel 8x3"), Error);
  CHECK_THROWS_WITH_AS(conv2d(rand_tensor({3, 7, 5}, 84), rand_tensor({4, 3, 3, 3}, 82)),
                       doctest::Contains("input must be 4-D"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, rand_tensor({4, 3, 3, 3}, 82), rand_tensor({5}, 85)),
                       doctest::Contains("bias shape [5], expected [4]"), Error);
  CHECK_THROWS_WITH_AS(max_pool2d(x, 6), doctest::Contains("smaller than kernel 6"), Error);
  CHECK_THROWS_WITH_AS(max_pool2d(x, 2, 2, 2), doctest::Contains("padding <= kernel/2"), Error);
  CHECK_THROWS_WITH_AS(adaptive_avg_pool2d(x, 0, 3), doctest::Contains("output size must be positive"),
                       Error);
}

// ---- dropout -------------------------------------------------------------------------------------

TEST_CASE("dropout mask is a pure function of (seed, offset)") {
  const float p = 0.3f, keep_scale = 1.0f / (1.0f - p);
  // Offsets not on a Philox block boundary, and sizes that end mid-block; one size runs threaded.
  for (uint64_t offset : {uint64_t{0}, uint64_t{6}, uint64_t{1} << 33}) {
    for (int64_t n : {1, 3, 1001, 100003}) {
      CAPTURE(offset);
      CAPTURE(n);
      const Tensor x = mg::test::away_from_zero(rand_tensor({n}, 91));
      Tensor y = poisoned({n});
      dropout_forward<Cpu>(y, x, p, 1234, offset);
      const auto xv = x.to_vector<float>(), yv = y.to_vector<float>();
      int64_t mismatches = 0;
      for (int64_t i = 0; i < n; ++i) {
        const bool keep = philox_uniform(1234, offset + static_cast<uint64_t>(i)) >= p;
        const float want = keep ? xv[i] * keep_scale : 0.0f;
        mismatches += std::memcmp(&want, &yv[i], sizeof(float)) != 0;
      }
      CHECK(mismatches == 0);
      // Backward regenerates the same mask.
      Tensor dx = poisoned({n});
      dropout_backward<Cpu>(dx, x, p, 1234, offset);
      CHECK(bit_equal(dx, y));
    }
  }
}

TEST_CASE("dropout drops about p, and backward uses the forward mask") {
  for (float p : {0.1f, 0.5f, 0.8f}) {
    CAPTURE(p);
    const int64_t n = 200000;
    Generator gen(77);
    gen.advance(10);  // start mid-stream
    Tensor x = mg::test::away_from_zero(rand_tensor({n}, 92)).requires_grad_();
    Tensor y = dropout(x, p, &gen);
    const auto yv = y.to_vector<float>();
    const double dropped = static_cast<double>(std::count(yv.begin(), yv.end(), 0.0f)) / n;
    CHECK(std::abs(dropped - p) < 0.01);  // std of the fraction is < 0.0012
    const Tensor dy = rand_tensor({n}, 93);
    y.backward(dy);
    const auto dxv = x.grad().to_vector<float>(), dyv = dy.to_vector<float>(), xv = x.to_vector<float>();
    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool kept = yv[i] != 0.0f;
      mismatches += kept ? dxv[i] != dyv[i] * (1.0f / (1.0f - p)) : dxv[i] != 0.0f;
      mismatches += kept && yv[i] != xv[i] * (1.0f / (1.0f - p));
    }
    CHECK(mismatches == 0);
    // A second draw from the generator gives a different mask.
    Tensor y2 = dropout(x.detach(), p, &gen);
    CHECK(!bit_equal(y2, y));
  }
}
