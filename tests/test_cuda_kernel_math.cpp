// The per-element bodies of the CUDA kernels (src/kernels/cuda/*_math.h) run here on the CPU,
// against the CPU kernels and naive references, so the index arithmetic and formulas the GPU
// runs are checked on every machine, GPU or not.
#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>

#include <minigrad/cuda.h>

#include "helpers.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/conv_cudnn.h"
#include "kernels/cuda/attention_math.h"
#include "kernels/cuda/cublaslt.h"
#include "kernels/cuda/conv_algos.h"
#include "kernels/cuda/dropout_math.h"
#include "kernels/cuda/embedding_math.h"
#include "kernels/cuda/layer_norm_math.h"
#include "kernels/cuda/linear_math.h"
#include "kernels/cuda/matmul_math.h"
#include "kernels/cuda/multi_tensor_math.h"
#include "kernels/cuda/optim_math.h"
#include "kernels/cuda/pooling_math.h"
#include "kernels/attention.h"
#include "kernels/dropout.h"
#include "kernels/embedding.h"
#include "kernels/layer_norm.h"
#include "kernels/linear.h"
#include "kernels/pooling.h"

using namespace mg;
namespace km = mg::cuda::math;

namespace {

std::vector<float> random_values(size_t n, uint64_t seed, int levels = 0, float scale = 1.0f, float shift = 0.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = levels > 0 ? static_cast<float>(static_cast<int>(rng() % levels)) - levels / 2 : u(rng) * scale + shift;
  return v;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

}  // namespace

TEST_CASE("kernel math: max-pool windows, first maximum wins, NaN propagates, padding skipped") {
  struct Case { int h, w, k, s, pad, levels; };
  for (Case c : {Case{15, 13, 3, 2, 1, 0}, Case{11, 9, 2, 2, 0, 0}, Case{7, 10, 3, 1, 1, 3}, Case{5, 5, 5, 1, 2, 2}}) {
    CAPTURE(c.h); CAPTURE(c.w); CAPTURE(c.k); CAPTURE(c.s); CAPTURE(c.pad);
    std::vector<float> x = random_values(static_cast<size_t>(c.h) * c.w, 7 + c.h, c.levels);  // levels: ties
    const int oh = (c.h + 2 * c.pad - c.k) / c.s + 1, ow = (c.w + 2 * c.pad - c.k) / c.s + 1;
    for (int i = 0; i < oh; ++i) {
      for (int j = 0; j < ow; ++j) {
        float y = std::nanf("");
        int64_t idx = -7;
        km::max_pool_window(x.data(), c.h, c.w, c.k, c.s, c.pad, i, j, &y, &idx);
        // Reference: scan the clipped window in row-major order, keep the first strict maximum.
        float best = -std::numeric_limits<float>::infinity();
        int64_t best_idx = -1;
        for (int hh = std::max(0, i * c.s - c.pad); hh < std::min(c.h, i * c.s - c.pad + c.k); ++hh)
          for (int ww = std::max(0, j * c.s - c.pad); ww < std::min(c.w, j * c.s - c.pad + c.k); ++ww)
            if (best_idx < 0 || x[hh * c.w + ww] > best) best = x[hh * c.w + ww], best_idx = hh * c.w + ww;
        CHECK(idx == best_idx);
        CHECK(y == best);
      }
    }
  }
  // A NaN in the window wins, and of several NaNs the last one (PyTorch's rule).
  std::vector<float> x = {1.0f, std::nanf(""), 5.0f, std::nanf("")};
  float y = 0;
  int64_t idx = -1;
  km::max_pool_window(x.data(), 2, 2, 2, 2, 0, 0, 0, &y, &idx);
  CHECK(std::isnan(y));
  CHECK(idx == 3);
}

TEST_CASE("kernel math: max-pool windows give the CPU kernel's values and indices, NaNs and ties included") {
  struct Case { int h, w, k, s, pad; };
  for (Case c : {Case{15, 13, 3, 2, 1}, Case{11, 9, 2, 2, 0}, Case{7, 10, 3, 1, 1}, Case{9, 7, 4, 3, 2}}) {
    CAPTURE(c.h); CAPTURE(c.w); CAPTURE(c.k); CAPTURE(c.s); CAPTURE(c.pad);
    const int64_t planes = 3;
    std::vector<float> v = random_values(static_cast<size_t>(planes * c.h * c.w), 40 + c.w, 4);  // many ties
    std::mt19937_64 rng(c.h);
    for (float& e : v) {
      const uint64_t r = rng() % 10;
      if (r == 0) e = std::nanf("");
      else if (r == 1) e = -std::numeric_limits<float>::infinity();
    }
    Tensor x = Tensor::from_vector(v, {1, planes, c.h, c.w});
    const int oh = (c.h + 2 * c.pad - c.k) / c.s + 1, ow = (c.w + 2 * c.pad - c.k) / c.s + 1;
    Tensor y = Tensor::full({1, planes, oh, ow}, 123.0f);
    Tensor idx = Tensor::from_vector(std::vector<int64_t>(static_cast<size_t>(planes * oh * ow), -5), {1, planes, oh, ow});
    max_pool2d_forward<Cpu>(y, idx, x, c.k, c.s, c.pad, false);
    const std::vector<float> y_cpu = y.to_vector<float>();
    const std::vector<int64_t> idx_cpu = idx.to_vector<int64_t>();
    for (int64_t pl = 0; pl < planes; ++pl) {
      for (int i = 0; i < oh; ++i) {
        for (int j = 0; j < ow; ++j) {
          float yk = 7.0f;
          int64_t ik = -7;
          km::max_pool_window(v.data() + pl * c.h * c.w, c.h, c.w, c.k, c.s, c.pad, i, j, &yk, &ik);
          const int64_t o = (pl * oh + i) * ow + j;
          CAPTURE(o);
          CHECK(ik == idx_cpu[o]);
          CHECK((yk == y_cpu[o] || (std::isnan(yk) && std::isnan(y_cpu[o]))));
        }
      }
    }
  }
}

TEST_CASE("kernel math: the max-pool gradient gathered per input equals the CPU's scatter, bit for bit") {
  struct Case { int h, w, k, s, pad; };
  for (Case c : {Case{15, 13, 3, 2, 1}, Case{11, 9, 2, 2, 0}, Case{7, 10, 3, 1, 1}, Case{9, 7, 4, 3, 2},
                 Case{12, 12, 5, 2, 2}, Case{6, 8, 2, 3, 0}, Case{1, 1, 1, 1, 0}}) {
    CAPTURE(c.h); CAPTURE(c.w); CAPTURE(c.k); CAPTURE(c.s); CAPTURE(c.pad);
    const int64_t planes = 3;
    // Few distinct values: many ties, so overlapping windows often share an argmax and the
    // gradient of one input is a sum of several dy (the order of the adds matters).
    std::vector<float> v = random_values(static_cast<size_t>(planes * c.h * c.w), 70 + c.w, 3);
    Tensor x = Tensor::from_vector(v, {1, planes, c.h, c.w});
    const int oh = (c.h + 2 * c.pad - c.k) / c.s + 1, ow = (c.w + 2 * c.pad - c.k) / c.s + 1;
    Tensor y = Tensor::empty({1, planes, oh, ow});
    Tensor idx = Tensor::empty({1, planes, oh, ow}, TensorOptions{DType::i64});
    max_pool2d_forward<Cpu>(y, idx, x, c.k, c.s, c.pad, false);
    const std::vector<float> dy = random_values(static_cast<size_t>(planes * oh * ow), 90 + c.h);
    Tensor dx = Tensor::full({1, planes, c.h, c.w}, 5.0f);
    max_pool2d_backward<Cpu>(dx, Tensor::from_vector(dy, {1, planes, oh, ow}), idx, c.k, c.s, c.pad, false);
    const std::vector<float> dx_cpu = dx.to_vector<float>();
    const std::vector<int64_t> ix = idx.to_vector<int64_t>();
    int shared = 0;  // inputs that are the argmax of more than one window
    for (int64_t pl = 0; pl < planes; ++pl) {
      for (int hh = 0; hh < c.h; ++hh) {
        for (int ww = 0; ww < c.w; ++ww) {
          const float g = km::max_pool_grad(dy.data() + pl * oh * ow, ix.data() + pl * oh * ow, c.w, oh, ow, c.k, c.s,
                                            c.pad, hh, ww);
          const float want = dx_cpu[(pl * c.h + hh) * c.w + ww];
          CAPTURE(pl); CAPTURE(hh); CAPTURE(ww);
          CHECK(std::memcmp(&g, &want, sizeof g) == 0);
          int windows = 0;
          for (int64_t o = 0; o < int64_t{oh} * ow; ++o) windows += ix[pl * oh * ow + o] == int64_t{hh} * c.w + ww;
          shared += windows > 1;
        }
      }
    }
    if (c.s < c.k) CHECK(shared > 0);  // overlapping windows: the sums were really exercised
  }
}

// pooling.cu's channels-last kernels hand the same bodies a plane's first value and its pixel
// stride C (Note [channels last] in src/ops/conv2d.cpp): the channels-first results, bit for bit.
TEST_CASE("kernel math: pools read channels last with the pixel stride: the channels-first bits") {
  const int h = 11, w = 9, k = 3, s = 2, pad = 1, oh = 6, ow = 5, aoh = 4, aow = 3;
  const int64_t planes = 5;
  const std::vector<float> v = random_values(static_cast<size_t>(planes * h * w), 17, 3);  // ties
  const Tensor x = Tensor::from_vector(v, {1, planes, h, w});
  Tensor y = Tensor::empty({1, planes, oh, ow});
  Tensor idx = Tensor::empty({1, planes, oh, ow}, TensorOptions{DType::i64});
  max_pool2d_forward<Cpu>(y, idx, x, k, s, pad, false);
  const Tensor dy = Tensor::from_vector(random_values(static_cast<size_t>(planes * oh * ow), 23), {1, planes, oh, ow});
  // The same tensors channels last.
  const std::vector<float> xl = to_channels_last(x).to_vector<float>(), dyl = to_channels_last(dy).to_vector<float>();
  const std::vector<int64_t> ix = idx.to_vector<int64_t>(), ixl = permute(idx, {0, 2, 3, 1}).to_vector<int64_t>();
  const std::vector<float> dyv = dy.to_vector<float>();
  auto same = [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; };
  for (int64_t c = 0; c < planes; ++c) {
    CAPTURE(c);
    for (int i = 0; i < oh; ++i) {
      for (int j = 0; j < ow; ++j) {
        float y1 = 0, y2 = 0;
        int64_t i1 = -1, i2 = -2;
        km::max_pool_window(v.data() + c * h * w, h, w, k, s, pad, i, j, &y1, &i1);
        km::max_pool_window(xl.data() + c, h, w, k, s, pad, i, j, &y2, &i2, planes);
        CHECK(same(y1, y2));
        CHECK(i1 == i2);
      }
    }
    for (int i = 0; i < aoh; ++i)
      for (int j = 0; j < aow; ++j)
        CHECK(same(km::adaptive_avg_window(v.data() + c * h * w, h, w, aoh, aow, i, j),
                   km::adaptive_avg_window(xl.data() + c, h, w, aoh, aow, i, j, planes)));
    for (int hh = 0; hh < h; ++hh) {
      for (int ww = 0; ww < w; ++ww) {
        CHECK(same(km::max_pool_grad(dyv.data() + c * oh * ow, ix.data() + c * oh * ow, w, oh, ow, k, s, pad, hh, ww),
                   km::max_pool_grad(dyl.data() + c, ixl.data() + c, w, oh, ow, k, s, pad, hh, ww, planes)));
        // dy read as a 6 x 5 adaptive output: any gradient will do to compare the two readings.
        CHECK(same(km::adaptive_avg_grad(dyv.data() + c * oh * ow, h, w, oh, ow, hh, ww),
                   km::adaptive_avg_grad(dyl.data() + c, h, w, oh, ow, hh, ww, planes)));
      }
    }
  }
}

TEST_CASE("kernel math: adaptive average pooling windows and their gradient") {
  struct Case { int h, w, oh, ow; };
  for (Case c : {Case{13, 11, 7, 5}, Case{5, 4, 7, 7}, Case{8, 8, 8, 8}, Case{1, 1, 3, 2}, Case{17, 3, 4, 1}, Case{14, 14, 7, 7}}) {
    CAPTURE(c.h); CAPTURE(c.w); CAPTURE(c.oh); CAPTURE(c.ow);
    std::vector<float> x = random_values(static_cast<size_t>(c.h) * c.w, 3 + c.h * 31 + c.w);
    std::vector<float> dy = random_values(static_cast<size_t>(c.oh) * c.ow, 5 + c.oh);
    std::vector<float> dx_ref(x.size(), 0.0f), y(dy.size()), y_ref(dy.size());
    for (int i = 0; i < c.oh; ++i) {
      for (int j = 0; j < c.ow; ++j) {
        // PyTorch's rule in floating point: [floor(i H / OH), ceil((i+1) H / OH)).
        const int h0 = static_cast<int>(std::floor(static_cast<double>(i) * c.h / c.oh));
        const int h1 = static_cast<int>(std::ceil(static_cast<double>(i + 1) * c.h / c.oh));
        const int w0 = static_cast<int>(std::floor(static_cast<double>(j) * c.w / c.ow));
        const int w1 = static_cast<int>(std::ceil(static_cast<double>(j + 1) * c.w / c.ow));
        double sum = 0;
        for (int hh = h0; hh < h1; ++hh)
          for (int ww = w0; ww < w1; ++ww) sum += x[hh * c.w + ww];
        const int size = (h1 - h0) * (w1 - w0);
        y_ref[i * c.ow + j] = static_cast<float>(sum / size);
        y[i * c.ow + j] = km::adaptive_avg_window(x.data(), c.h, c.w, c.oh, c.ow, i, j);
        for (int hh = h0; hh < h1; ++hh)
          for (int ww = w0; ww < w1; ++ww) dx_ref[hh * c.w + ww] += dy[i * c.ow + j] / static_cast<float>(size);
      }
    }
    CHECK(rel_err(y, y_ref) < 1e-6);
    std::vector<float> dx(x.size(), std::nanf(""));
    for (int hh = 0; hh < c.h; ++hh)
      for (int ww = 0; ww < c.w; ++ww) dx[hh * c.w + ww] = km::adaptive_avg_grad(dy.data(), c.h, c.w, c.oh, c.ow, hh, ww);
    CHECK(rel_err(dx, dx_ref) < 1e-6);
  }
}

TEST_CASE("kernel math: the 4-wide dropout gives the CPU kernel's mask, aligned offset or not") {
  for (uint64_t offset : {uint64_t{0}, uint64_t{8}, uint64_t{13}, (uint64_t{1} << 33) + 4}) {
    for (float p : {0.1f, 0.5f, 0.0f}) {
      const int64_t n = 1003;
      Tensor x = test::rand_tensor({n}, 11), y_cpu = Tensor::full({n}, std::nanf(""));
      dropout_forward<Cpu>(y_cpu, x, p, 1234, offset);
      std::vector<float> in = x.to_vector<float>(), out(n, std::nanf(""));
      for (int64_t first = 0; first < n; first += 4)
        km::dropout4(out.data(), in.data(), first, n, p, 1.0f / (1.0f - p), 1234, offset);
      CAPTURE(offset);
      CAPTURE(p);
      CHECK(out == y_cpu.to_vector<float>());
    }
  }
}

TEST_CASE("kernel math: block-to-tensor lookup of the multi-tensor launch") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    const int count = 1 + static_cast<int>(rng() % 96);
    std::vector<int64_t> first(count + 1, 0);
    for (int t = 0; t < count; ++t) first[t + 1] = first[t] + 1 + static_cast<int64_t>(rng() % 5);
    for (int64_t b = 0; b < first[count]; ++b) {
      int expect = 0;
      while (first[expect + 1] <= b) ++expect;
      REQUIRE(km::tensor_of_block(first.data(), count, b) == expect);
    }
  }
}

TEST_CASE("kernel math: SGD and Adam element updates are the CPU kernels' formulas") {
  const int64_t n = 1001;
  auto make = [&](uint64_t seed) { return test::rand_tensor({n}, seed); };
  for (bool nesterov : {false, true}) {
    for (float momentum : {0.0f, 0.9f}) {
      std::vector<Tensor> p{make(1)}, g{make(2)}, buf{make(3)};
      std::vector<float> hp = p[0].to_vector<float>(), hg = g[0].to_vector<float>(), hb = buf[0].to_vector<float>();
      std::vector<Tensor> bufs = momentum != 0.0f ? buf : std::vector<Tensor>{};
      SgdHyper h;
      h.lr = 0.05f; h.momentum = momentum; h.dampening = 0.1f; h.weight_decay = 1e-3f; h.nesterov = nesterov;
      h.grad_scale = 0.25f;
      for (int step = 0; step < 3; ++step) {
        h.first_step = step == 0;
        sgd_update<Cpu>(p, g, bufs, h);
        for (int64_t i = 0; i < n; ++i) km::sgd_element(&hp[i], hg[i], momentum != 0.0f ? &hb[i] : nullptr, h);
      }
      CAPTURE(nesterov);
      CAPTURE(momentum);
      CHECK(rel_err(hp, p[0].to_vector<float>()) < 1e-6);
      if (momentum != 0.0f) CHECK(rel_err(hb, buf[0].to_vector<float>()) < 1e-6);
    }
  }
  for (bool decoupled : {false, true}) {
    std::vector<Tensor> p{make(4)}, g{make(5)}, m{make(6)}, v{Tensor::full({n}, 0.01f)};
    const std::vector<float> p0 = p[0].to_vector<float>();
    std::vector<float> hp = p0, hg = g[0].to_vector<float>(), hm = m[0].to_vector<float>(), hv = v[0].to_vector<float>();
    AdamHyper h;
    h.lr = 1e-2f; h.weight_decay = 0.01f; h.decoupled = decoupled; h.grad_scale = 0.5f;
    for (int step = 1; step <= 3; ++step) {
      h.step = step;
      adam_update<Cpu>(p, g, m, v, h);
      const float bias_c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta1), step));
      const float bias_c2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), step)));
      for (int64_t i = 0; i < n; ++i) km::adam_element(&hp[i], hg[i], &hm[i], &hv[i], h, h.lr / bias_c1, bias_c2_sqrt);
    }
    // Compare the updates (small next to p), not only p.
    std::vector<float> du(n), du_ref(n), pc = p[0].to_vector<float>();
    for (int64_t i = 0; i < n; ++i) du[i] = hp[i] - p0[i], du_ref[i] = pc[i] - p0[i];
    CAPTURE(decoupled);
    CHECK(rel_err(du, du_ref) < 1e-5);
    CHECK(rel_err(hm, m[0].to_vector<float>()) < 1e-6);
    CHECK(rel_err(hv, v[0].to_vector<float>()) < 1e-6);
  }
}

namespace {
// A reference column-major GEMM with cuBLAS's argument conventions: C = op(A) op(B) + beta C.
// First the checks cublasGemmEx makes (CUBLAS_STATUS_INVALID_VALUE otherwise): A is stored
// m x k (k x m when transposed) with lda >= its row count, B k x n (n x k), C m x n.
void ref_gemm(const km::GemmCall& g, const float* a, const float* b, float beta, float* c) {
  REQUIRE(g.m >= 1);
  REQUIRE(g.n >= 1);
  REQUIRE(g.k >= 1);
  CHECK(g.lda >= (g.trans_a ? g.k : g.m));
  CHECK(g.ldb >= (g.trans_b ? g.n : g.k));
  CHECK(g.ldc >= g.m);
  for (int64_t j = 0; j < g.n; ++j) {
    for (int64_t i = 0; i < g.m; ++i) {
      double s = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        const float av = g.trans_a ? a[p + i * g.lda] : a[i + p * g.lda];
        const float bv = g.trans_b ? b[j + p * g.ldb] : b[p + j * g.ldb];
        s += static_cast<double>(av) * bv;
      }
      c[i + j * g.ldc] = static_cast<float>(s + beta * c[i + j * g.ldc]);
    }
  }
}
}  // namespace

TEST_CASE("kernel math: the column-major GEMMs of linear compute x w^T, dy w, dy^T x and dy^T 1") {
  struct Dims { int64_t n, k, m; };
  for (Dims dims : {Dims{7, 13, 5}, Dims{1, 9, 4}, Dims{6, 1, 3}, Dims{5, 8, 1}, Dims{3, 17, 11}}) {
    const int64_t n = dims.n, k = dims.k, m = dims.m;
    CAPTURE(n); CAPTURE(k); CAPTURE(m);
    Tensor x = test::rand_tensor({n, k}, 21), w = test::rand_tensor({m, k}, 22), dy = test::rand_tensor({n, m}, 23);
    const Tensor ones = Tensor::full({n}, 1.0f);
    auto operand = [&](km::GemmOperand o) {
      using O = km::GemmOperand;
      return (o == O::x ? x : o == O::w ? w : o == O::dy ? dy : ones).data<float>();
    };
    // Forward.
    Tensor y_ref = linear(x, w);
    std::vector<float> y(n * m, 0.0f);  // beta = 0 still reads C: NaN here would poison the reference
    const km::GemmCall f = km::linear_forward_gemm(n, k, m);
    ref_gemm(f, operand(f.a), operand(f.b), 0.0f, y.data());
    CHECK(rel_err(y, y_ref.to_vector<float>()) < 1e-6);
    // Backward, with accumulation into an existing dw and db (beta = 1).
    Tensor dx_ref = Tensor::empty({n, k}), dw_ref = test::rand_tensor({m, k}, 24), db_ref = test::rand_tensor({m}, 25);
    std::vector<float> dw = dw_ref.to_vector<float>(), db = db_ref.to_vector<float>(), dx(n * k, 0.0f);
    linear_backward<Cpu>(dx_ref, dw_ref, db_ref, dy, x, w, /*accumulate=*/true);
    const km::GemmCall gx = km::linear_dx_gemm(n, k, m), gw = km::linear_dw_gemm(n, k, m);
    const km::GemmCall gb = km::linear_db_gemm(n, m);
    ref_gemm(gx, operand(gx.a), operand(gx.b), 0.0f, dx.data());
    ref_gemm(gw, operand(gw.a), operand(gw.b), 1.0f, dw.data());
    ref_gemm(gb, operand(gb.a), operand(gb.b), 1.0f, db.data());
    CHECK(rel_err(dx, dx_ref.to_vector<float>()) < 1e-6);
    CHECK(rel_err(dw, dw_ref.to_vector<float>()) < 1e-6);
    CHECK(rel_err(db, db_ref.to_vector<float>()) < 1e-6);
  }
}

TEST_CASE("kernel math: the column-major GEMMs of matmul compute a b, dy b^T and a^T dy") {
  struct Dims { int64_t m, k, n; };
  for (Dims dims : {Dims{7, 13, 5}, Dims{1, 9, 4}, Dims{6, 1, 3}, Dims{5, 8, 1}, Dims{3, 17, 11}}) {
    const int64_t m = dims.m, k = dims.k, n = dims.n;
    CAPTURE(m); CAPTURE(k); CAPTURE(n);
    Tensor a = test::rand_tensor({m, k}, 31, true), b = test::rand_tensor({k, n}, 32, true), dy = test::rand_tensor({m, n}, 33);
    auto operand = [&](km::GemmOperand o) {
      return o == km::GemmOperand::x ? a.data<float>() : o == km::GemmOperand::w ? b.data<float>() : dy.data<float>();
    };
    Tensor y_ref = matmul(a, b);
    std::vector<float> y(m * n, 0.0f), da(m * k, 0.0f), db(k * n, 0.0f);
    const km::GemmCall f = km::matmul_forward_gemm(m, k, n), ga = km::matmul_da_gemm(m, k, n),
                       gb = km::matmul_db_gemm(m, k, n);
    ref_gemm(f, operand(f.a), operand(f.b), 0.0f, y.data());
    CHECK(rel_err(y, y_ref.to_vector<float>()) < 1e-6);
    y_ref.backward(dy);
    ref_gemm(ga, operand(ga.a), operand(ga.b), 0.0f, da.data());
    ref_gemm(gb, operand(gb.a), operand(gb.b), 0.0f, db.data());
    CHECK(rel_err(da, a.grad().to_vector<float>()) < 1e-6);
    CHECK(rel_err(db, b.grad().to_vector<float>()) < 1e-6);
  }
}

namespace {
// cuBLASLt's reading of a GemmCall, as a reference: the layouts linear.cu and matmul.cu give
// cuBLASLt (math::gemm_*_shape: column-major rows, columns, leading dimension) must describe the
// matrices ref_gemm reads; then the epilogue as cublasLt.h defines it: BIAS adds bias[i] to row i
// of D, BGRADB writes bias[j] = the sum over k of column j of op(B), read through B's layout.
void ref_lt(const km::GemmCall& g, const float* a, const float* b, float beta, float* c, cuda::LtEpilogue e,
            float* bias) {
  const km::MatrixShape sa = km::gemm_a_shape(g), sb = km::gemm_b_shape(g), sc = km::gemm_c_shape(g);
  CHECK(sa.rows * sa.cols == g.m * g.k);
  CHECK(sb.rows * sb.cols == g.k * g.n);
  CHECK((sc.rows == g.m && sc.cols == g.n));
  CHECK((sa.ld == g.lda && sb.ld == g.ldb && sc.ld == g.ldc));
  ref_gemm(g, a, b, beta, c);  // checks each ld against its matrix's rows
  if (e == cuda::LtEpilogue::bias) {
    for (int64_t j = 0; j < sc.cols; ++j)
      for (int64_t i = 0; i < sc.rows; ++i) c[i + j * sc.ld] += bias[i];
  } else if (e == cuda::LtEpilogue::bias_grad) {
    for (int64_t j = 0; j < sc.cols; ++j) {
      double s = 0;
      for (int64_t p = 0; p < g.k; ++p) s += g.trans_b ? b[j + p * sb.ld] : b[p + j * sb.ld];
      bias[j] = static_cast<float>(s);
    }
  }
}
}  // namespace

// Note [cublaslt products]: the forward's BIAS epilogue adds b along D's rows, and dw's GEMM's
// BGRADB epilogue sums dy into db along D's columns; accumulating, db comes out into a temporary
// that is added.
TEST_CASE("kernel math: cuBLASLt's layouts and epilogues give x w^T + b, and dw with db, accumulated") {
  struct Dims { int64_t n, k, m; };
  for (Dims dims : {Dims{7, 13, 5}, Dims{1, 9, 4}, Dims{6, 1, 3}, Dims{5, 8, 1}, Dims{3, 17, 11}}) {
    const int64_t n = dims.n, k = dims.k, m = dims.m;
    CAPTURE(n); CAPTURE(k); CAPTURE(m);
    Tensor x = test::rand_tensor({n, k}, 41), w = test::rand_tensor({m, k}, 42), b = test::rand_tensor({m}, 43);
    Tensor dy = test::rand_tensor({n, m}, 44);
    std::vector<float> y(n * m, 0.0f), bias = b.to_vector<float>();  // ref_gemm reads C even at beta = 0
    const km::GemmCall f = km::linear_forward_gemm(n, k, m);
    CHECK(km::gemm_c_shape(f).rows == m);  // BIAS: a vector of D's rows, y's columns
    ref_lt(f, w.data<float>(), x.data<float>(), 0.0f, y.data(), cuda::LtEpilogue::bias, bias.data());
    CHECK(rel_err(y, linear(x, w, b).to_vector<float>()) < 1e-6);

    Tensor dx_ref = Tensor::empty({n, k}), dw_ref = test::rand_tensor({m, k}, 45), db_ref = test::rand_tensor({m}, 46);
    std::vector<float> dw = dw_ref.to_vector<float>(), db = db_ref.to_vector<float>(), db_new(m, std::nanf(""));
    linear_backward<Cpu>(dx_ref, dw_ref, db_ref, dy, x, w, /*accumulate=*/true);
    const km::GemmCall gw = km::linear_dw_gemm(n, k, m);
    CHECK(km::gemm_c_shape(gw).cols == m);  // BGRADB: a vector of D's columns, dw's rows
    ref_lt(gw, x.data<float>(), dy.data<float>(), 1.0f, dw.data(), cuda::LtEpilogue::bias_grad, db_new.data());
    for (int64_t i = 0; i < m; ++i) db[i] += db_new[i];
    CHECK(rel_err(dw, dw_ref.to_vector<float>()) < 1e-6);
    CHECK(rel_err(db, db_ref.to_vector<float>()) < 1e-6);
    // The unfused path's db (dy^T against ones) is the epilogue's.
    std::vector<float> db0(m, 0.0f);
    const Tensor ones = Tensor::full({n}, 1.0f);
    ref_lt(km::linear_db_gemm(n, m), dy.data<float>(), ones.data<float>(), 0.0f, db0.data(), cuda::LtEpilogue::none,
           nullptr);
    CHECK(rel_err(db0, db_new) < 1e-6);
  }
}

// matmul's strided batches through the same layouts: product i's A, B and C start
// matmul_strides(...) elements after product i - 1's.
TEST_CASE("kernel math: cuBLASLt's strided batches of matmul's GEMMs compute each product of the batch") {
  const int64_t batch = 3, m = 5, k = 7, n = 4;
  Tensor a = test::rand_tensor({batch, m, k}, 51, true), b = test::rand_tensor({batch, k, n}, 52, true);
  Tensor dy = test::rand_tensor({batch, m, n}, 53);
  Tensor y_ref = matmul(a, b);
  y_ref.backward(dy);
  auto operand = [&](km::GemmOperand o) {
    return o == km::GemmOperand::x ? a.data<float>() : o == km::GemmOperand::w ? b.data<float>() : dy.data<float>();
  };
  const km::GemmCall calls[] = {km::matmul_forward_gemm(m, k, n), km::matmul_da_gemm(m, k, n), km::matmul_db_gemm(m, k, n)};
  const Tensor refs[] = {y_ref, a.grad(), b.grad()};
  for (int c = 0; c < 3; ++c) {
    CAPTURE(c);
    const km::GemmCall& g = calls[c];
    const km::BatchStrides s = km::matmul_strides(g, m, k, n);
    std::vector<float> out(batch * s.c, 0.0f);
    for (int64_t i = 0; i < batch; ++i)
      ref_lt(g, operand(g.a) + i * s.a, operand(g.b) + i * s.b, 0.0f, out.data() + i * s.c, cuda::LtEpilogue::none,
             nullptr);
    CHECK(rel_err(out, refs[c].to_vector<float>()) < 1e-6);
  }
}

// No GPU needed: cublasLtMatmulDescCreate, cublasLtMatrixLayoutCreate and the preferences are
// host calls (cublasLtCreate is not: it fails without a driver, so no algorithm is asked for here).
TEST_CASE("kernel math: cuBLASLt takes the descriptors of every product linear and matmul ask for") {
#ifdef MINIGRAD_WITH_CUDA
  const std::string why = cuda::lt_check_descriptors();
  CHECK_MESSAGE(why.empty(), why);
#else
  MESSAGE("this build has no CUDA backend: " << cuda::lt_check_descriptors());
#endif
}

// MG_CUBLASLT=0 in the environment sends linear and matmul to cublasGemmEx from the start
// (minigrad/cuda.h); ctest runs this case once more with it set (tests/CMakeLists.txt).
TEST_CASE("kernel math: MG_CUBLASLT sets cuda::cublaslt()'s default") {
  const char* env = std::getenv("MG_CUBLASLT");
  CHECK(cuda::cublaslt() == (env == nullptr || std::strcmp(env, "0") != 0));
  cuda::set_cublaslt(false);
  CHECK_FALSE(cuda::cublaslt());
  cuda::set_cublaslt(true);
  CHECK(cuda::cublaslt());
}

namespace {

// The CUDA attention kernels' outputs, a row at a time with head rows of compile-time size kD
// (0: the size read at run time), into buffers of NaN: every element must be written. t0_of
// gives the first query row a key row's loop visits (the kernel passes its warp's first key).
struct AttentionResult {
  std::vector<float> y, lse, e, dx;
};
template <int kD, class T0>
AttentionResult attention_rows(const std::vector<float>& x, const std::vector<float>& dy,
                               const std::vector<float>& lse_in, const km::AttentionDims& s, T0 t0_of) {
  const int64_t rows = s.b * s.heads * s.t;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  AttentionResult o{std::vector<float>(x.size() / 3, nan), std::vector<float>(rows, nan),
                    std::vector<float>(rows, nan), std::vector<float>(x.size(), nan)};
  for (int64_t r = 0; r < rows; ++r) km::attention_forward_row<kD>(o.y.data(), o.lse.data(), x.data(), s, r);
  // Backward from the given lse, as the GPU's backward reads the forward's.
  for (int64_t r = 0; r < rows; ++r)
    km::attention_dq_row<kD>(o.dx.data(), o.e.data(), dy.data(), x.data(), lse_in.data(), s, r);
  for (const bool dk : {true, false})
    for (int64_t r = 0; r < rows; ++r)
      km::attention_dkv_row<kD>(o.dx.data(), dy.data(), x.data(), lse_in.data(), o.e.data(), s, r, t0_of(r), dk);
  return o;
}

}  // namespace

TEST_CASE("kernel math: the attention rows give the CPU kernel's outputs, log-sum-exps and gradients") {
  struct Case {
    int64_t b, t, c;
    int heads;
  };
  // Heads of 4 (read at run time) and of 64 (GPT-2's, held in registers on the GPU); T = 150 is
  // three of the CPU kernel's blocks of query rows, the last short.
  for (const Case k : {Case{2, 9, 12, 3}, Case{2, 45, 128, 2}, Case{1, 150, 12, 3}}) {
    const Tensor qkv = Tensor::from_vector(random_values(k.b * k.t * 3 * k.c, 21, 0, 2.0f), {k.b, k.t, 3 * k.c});
    const Tensor dy = Tensor::from_vector(random_values(k.b * k.t * k.c, 22), {k.b, k.t, k.c});
    const std::vector<float> hx = qkv.to_vector<float>(), hdy = dy.to_vector<float>();
    for (const AttentionDropout drop : {AttentionDropout{}, AttentionDropout{0.25f, 11, 6, 0}}) {
      CAPTURE(k.c / k.heads);
      CAPTURE(drop.p);
      Tensor y = Tensor::empty({k.b, k.t, k.c}), lse = Tensor::empty({k.b, k.heads, k.t});
      // NaN first: the CPU kernel must write every element of dq, dk and dv.
      Tensor dqkv = Tensor::full({k.b, k.t, 3 * k.c}, std::nanf(""));
      attention_forward<Cpu>(y, lse, qkv, k.heads, drop);
      attention_backward<Cpu>(dqkv, dy, qkv, Tensor(), lse, k.heads, drop);
      const std::vector<float> hlse = lse.to_vector<float>(), hd = dqkv.to_vector<float>();

      const km::AttentionDims s = km::attention_dims(k.b, k.t, 3 * k.c, k.heads, drop);
      const auto own = [&](int64_t r) { return r % s.t; };  // from the row's own key
      const AttentionResult o = attention_rows<0>(hx, hdy, hlse, s, own);
      CHECK(rel_err(o.y, y.to_vector<float>()) < 1e-6);
      CHECK(rel_err(o.lse, hlse) < 1e-6);
      CHECK(rel_err(o.dx, hd) < 1e-5);
      // dq, dk and dv separately: a mix-up of the three slots would hide in the whole.
      for (int part = 0; part < 3; ++part) {
        std::vector<float> mine, cpu;
        for (size_t i = 0; i < hd.size(); ++i) {
          if (static_cast<int64_t>(i) % (3 * k.c) / k.c != part) continue;
          mine.push_back(o.dx[i]);
          cpu.push_back(hd[i]);
        }
        CAPTURE(part);
        CHECK(rel_err(mine, cpu) < 1e-5);
      }
      // Where a key row's loop starts changes nothing: from the warp's first lane (as the
      // kernel does, 128-thread blocks) or from row 0.
      const auto warp = [&](int64_t r) { return r % s.t - r % 32; };
      const auto zero = [](int64_t) { return int64_t{0}; };
      CHECK(attention_rows<0>(hx, hdy, hlse, s, warp).dx == o.dx);
      CHECK(attention_rows<0>(hx, hdy, hlse, s, zero).dx == o.dx);
      if (s.d == 64) {  // the registers' instance computes the same bits
        const AttentionResult r64 = attention_rows<64>(hx, hdy, hlse, s, warp);
        CHECK(r64.y == o.y);
        CHECK(r64.lse == o.lse);
        CHECK(r64.dx == o.dx);
      }
    }
  }
}

// What cuDNN's SDPA graph (src/kernels/cuda/attention_cudnn.cpp) is asked to compute, element by
// element through the views it is given (km::sdpa_views), in double: O and Stats, then dQ, dK and
// dV from dO, O and Stats as cuDNN's backward does (E_t = dO_t . O_t, not from the probabilities).
// Each view's element is written once; `writes` counts them per element of qkv, y and lse.
struct SdpaThroughViews {
  std::vector<float> y, lse, dx;
  std::vector<int> writes_y, writes_lse, writes_dx;
};
SdpaThroughViews sdpa_through_views(const std::vector<float>& x, const std::vector<float>& dy, const km::AttentionDims& s) {
  const km::SdpaViews v = km::sdpa_views(s);
  const int64_t h_n = s.heads;
  SdpaThroughViews r;
  r.y.assign(static_cast<size_t>(s.b * s.t * s.c), std::nanf(""));
  r.lse.assign(static_cast<size_t>(s.b * h_n * s.t), std::nanf(""));
  r.dx.assign(static_cast<size_t>(s.b * s.t * 3 * s.c), std::nanf(""));
  r.writes_y.assign(r.y.size(), 0);
  r.writes_lse.assign(r.lse.size(), 0);
  r.writes_dx.assign(r.dx.size(), 0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  const auto el = [&](const std::vector<float>& t, const km::SdpaView& w, int64_t b, int64_t h, int64_t i, int64_t c) {
    return static_cast<double>(t[static_cast<size_t>(km::view_at(w, b, h, i, c))]);
  };
  for (int64_t b = 0; b < s.b; ++b) {
    for (int64_t h = 0; h < h_n; ++h) {
      std::vector<double> score(static_cast<size_t>(s.t * s.t)), dq(static_cast<size_t>(s.t * s.d)),
          dk(dq.size()), dv(dq.size());
      std::vector<double> stats(static_cast<size_t>(s.t));
      for (int64_t t = 0; t < s.t; ++t) {
        double m = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < s.d; ++i) dot += el(x, v.q, b, h, t, i) * el(x, v.k, b, h, j, i);
          score[static_cast<size_t>(t * s.t + j)] = dot * scale;
          m = std::max(m, dot * scale);
        }
        double sum = 0;
        for (int64_t j = 0; j <= t; ++j) sum += std::exp(score[static_cast<size_t>(t * s.t + j)] - m);
        stats[static_cast<size_t>(t)] = m + std::log(sum);
        const auto at = static_cast<size_t>(km::view_at(v.stats, b, h, t, 0));
        r.lse[at] = static_cast<float>(stats[static_cast<size_t>(t)]);
        ++r.writes_lse[at];
        for (int64_t i = 0; i < s.d; ++i) {
          double o = 0;
          for (int64_t j = 0; j <= t; ++j)
            o += std::exp(score[static_cast<size_t>(t * s.t + j)] - stats[static_cast<size_t>(t)]) * el(x, v.v, b, h, j, i);
          const auto oat = static_cast<size_t>(km::view_at(v.o, b, h, t, i));
          r.y[oat] = static_cast<float>(o);
          ++r.writes_y[oat];
        }
      }
      for (int64_t t = 0; t < s.t; ++t) {
        double e = 0;
        for (int64_t i = 0; i < s.d; ++i) e += el(dy, v.o, b, h, t, i) * el(r.y, v.o, b, h, t, i);
        for (int64_t j = 0; j <= t; ++j) {
          const double p = std::exp(score[static_cast<size_t>(t * s.t + j)] - stats[static_cast<size_t>(t)]);
          double dp = 0;
          for (int64_t i = 0; i < s.d; ++i) dp += el(dy, v.o, b, h, t, i) * el(x, v.v, b, h, j, i);
          const double ds = p * (dp - e) * scale;
          for (int64_t i = 0; i < s.d; ++i) {
            dq[static_cast<size_t>(t * s.d + i)] += ds * el(x, v.k, b, h, j, i);
            dk[static_cast<size_t>(j * s.d + i)] += ds * el(x, v.q, b, h, t, i);
            dv[static_cast<size_t>(j * s.d + i)] += p * el(dy, v.o, b, h, t, i);
          }
        }
      }
      for (int64_t t = 0; t < s.t; ++t) {
        for (int64_t i = 0; i < s.d; ++i) {
          const auto n = static_cast<size_t>(t * s.d + i);
          for (const auto& [w, g] : {std::pair{&v.q, &dq}, std::pair{&v.k, &dk}, std::pair{&v.v, &dv}}) {
            const auto at = static_cast<size_t>(km::view_at(*w, b, h, t, i));
            r.dx[at] = static_cast<float>((*g)[n]);
            ++r.writes_dx[at];
          }
        }
      }
    }
  }
  return r;
}

// The views and the math asked of cuDNN's fused attention give the CPU kernels' y, lse and dqkv:
// q, k and v at their places in the packed rows, y's rows, lse's natural-log meaning, and every
// element of y, lse and dqkv written exactly once.
TEST_CASE("kernel math: cuDNN's SDPA views of the packed qkv, run on the CPU, give the CPU kernels' results") {
  struct Case {
    int64_t b, t, c;
    int heads;
  };
  // Heads of 8 and of 64 (GPT-2's); T not a multiple of anything cuDNN tiles by.
  for (const Case k : {Case{2, 13, 24, 3}, Case{1, 37, 128, 2}}) {
    CAPTURE(k.c / k.heads);
    const km::AttentionDims s = km::attention_dims(k.b, k.t, 3 * k.c, k.heads, AttentionDropout{});
    const km::SdpaViews v = km::sdpa_views(s);
    // The views name the elements the row kernels read and write (qkv_at, y_at, lse's row).
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t t = 0; t < s.t; ++t) {
          CHECK(km::view_at(v.stats, b, h, t, 0) == (b * s.heads + h) * s.t + t);
          for (const int64_t i : {int64_t{0}, s.d / 2, s.d - 1}) {
            CHECK(km::view_at(v.q, b, h, t, i) == km::qkv_at(s, b, h, t) + i);
            CHECK(km::view_at(v.k, b, h, t, i) == km::qkv_at(s, b, h, t) + s.c + i);
            CHECK(km::view_at(v.v, b, h, t, i) == km::qkv_at(s, b, h, t) + 2 * s.c + i);
            CHECK(km::view_at(v.o, b, h, t, i) == km::y_at(s, b, h, t) + i);
          }
        }
    const Tensor qkv = Tensor::from_vector(random_values(k.b * k.t * 3 * k.c, 31, 0, 2.0f), {k.b, k.t, 3 * k.c});
    const Tensor dy = Tensor::from_vector(random_values(k.b * k.t * k.c, 32), {k.b, k.t, k.c});
    Tensor y = Tensor::empty({k.b, k.t, k.c}), lse = Tensor::empty({k.b, k.heads, k.t});
    Tensor dqkv = Tensor::empty({k.b, k.t, 3 * k.c});
    CHECK_FALSE(attention_forward<Cpu>(y, lse, qkv, k.heads, AttentionDropout{}));  // the CPU's backward reads no y
    attention_backward<Cpu>(dqkv, dy, qkv, Tensor(), lse, k.heads, AttentionDropout{});
    const SdpaThroughViews r = sdpa_through_views(qkv.to_vector<float>(), dy.to_vector<float>(), s);
    CHECK(rel_err(r.y, y.to_vector<float>()) < 1e-5);
    CHECK(rel_err(r.lse, lse.to_vector<float>()) < 1e-6);
    CHECK(rel_err(r.dx, dqkv.to_vector<float>()) < 1e-5);
    for (const std::vector<int>* w : {&r.writes_y, &r.writes_lse, &r.writes_dx})
      CHECK(std::all_of(w->begin(), w->end(), [](int n) { return n == 1; }));
  }
}

// An H100 SXM (sm_90) as cuDNN 9 reads a device from JSON (CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION,
// cuDNN 9.8 and later): the cudaDevAttr values cuDNN queries on a device, under its own names. An
// H200 differs in memory only.
constexpr const char* kH100Json = R"({"maxGridSize": [2147483647, 65535, 65535], "maxBlockSize": [1024, 1024, 64],
  "regsPerBlock": 65536, "multiProcessorCount": 132, "warpSize": 32, "maxSharedMemoryPerBlock": 49152,
  "maxSharedMemoryPerBlockOptin": 232448, "reservedSharedMemoryPerBlock": 1024, "maxRegistersPerSM": 65536,
  "maxCtasPerSM": 32, "maxThreadsPerBlock": 1024, "maxThreadsPerSM": 2048, "pciDeviceId": 8960, "isTccDriver": 0,
  "supportCoopLaunch": 1, "totalGlobalMem": 85017755648, "smClockRateKHz": 1980000, "memClockRateKHz": 2619000,
  "l2CacheSize": 52428800, "cudaDeviceId": 0, "deviceVer": 900, "driverVer": 13000,
  "deviceName": "NVIDIA H100 80GB HBM3"})";

// No GPU needed: the graphs src/kernels/cuda/attention_cudnn.cpp describes pass the frontend's SDPA
// checks (head size, strides of the packed views, causal band, Stats, the deterministic backward)
// and cuDNN builds their operation graphs, for sm_90. Choosing and building an engine needs a
// driver: the GPU tests (test_cuda_ops) do that.
TEST_CASE("kernel math: cuDNN takes the fused attention's graphs for sm_90, up to the operation graph") {
  if (!cuda::sdpa_built()) {
    MESSAGE("this build has no cuDNN frontend: its graphs are not described");
    return;
  }
  const std::string probe = cuda::sdpa_check_description(kH100Json, 90, 2, 12, 128, 64, DType::bf16, false, false);
  if (probe.rfind("device description:", 0) == 0) {
    MESSAGE("this cuDNN does not read the H100's JSON description (" << probe << "): not checked");
    return;
  }
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (const int64_t t : {128, 1024, 37}) {
      for (const int mode : {0, 1, 2}) {  // forward; backward; backward, deterministic
        CAPTURE(dtype_name(dtype));
        CAPTURE(t);
        CAPTURE(mode);
        const std::string why = cuda::sdpa_check_description(kH100Json, 90, 2, 12, t, 64, dtype, mode > 0, mode == 2);
        CHECK_MESSAGE(why.empty(), why);
      }
    }
  }
  // Heads of 128 and 8, which sdpa_takes offers too; and one it does not (12), which cuDNN refuses.
  CHECK(cuda::sdpa_check_description(kH100Json, 90, 1, 2, 64, 128, DType::bf16, true, true).empty());
  CHECK(cuda::sdpa_check_description(kH100Json, 90, 1, 3, 64, 8, DType::bf16, true, true).empty());
  CHECK_FALSE(cuda::sdpa_check_description(kH100Json, 90, 1, 3, 64, 12, DType::bf16, false, false).empty());
}

// No GPU needed: the conv + bias + ReLU graph of src/kernels/cuda/conv_cudnn.cpp (Note [fused
// relu]) passes the frontend's checks and cuDNN builds its operation graph for sm_90, in both
// layouts and the three dtypes, with and without a bias, strided and padded. Whether an engine
// runs it (runtime fusion) needs a driver: test_ops' CUDA rows and test_cuda_training do that.
TEST_CASE("kernel math: cuDNN takes the fused conv+bias+relu graph for sm_90, up to the operation graph") {
  if (!cuda::conv_fusion_built()) {
    MESSAGE("this build has no cuDNN frontend: the graph is not described");
    return;
  }
  const std::string probe =
      cuda::conv_fusion_check_description(kH100Json, 90, {8, 64, 56, 56}, {64, 64, 3, 3}, 1, 1, DType::bf16, false, true);
  if (probe.rfind("device description:", 0) == 0) {
    MESSAGE("this cuDNN does not read the H100's JSON description (" << probe << "): not checked");
    return;
  }
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (const bool nhwc : {true, false}) {
      for (const bool bias : {true, false}) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(nhwc);
        CAPTURE(bias);
        // VGG16's second layer at 224 and ResNet's strided 7x7 stem, in the tensors' own layout.
        const Shape x1 = nhwc ? Shape{4, 224, 224, 64} : Shape{4, 64, 224, 224};
        const Shape w1 = nhwc ? Shape{64, 3, 3, 64} : Shape{64, 64, 3, 3};
        const Shape x2 = nhwc ? Shape{2, 224, 224, 3} : Shape{2, 3, 224, 224};
        const Shape w2 = nhwc ? Shape{64, 7, 7, 3} : Shape{64, 3, 7, 7};
        std::string why = cuda::conv_fusion_check_description(kH100Json, 90, x1, w1, 1, 1, dtype, nhwc, bias);
        CHECK_MESSAGE(why.empty(), why);
        why = cuda::conv_fusion_check_description(kH100Json, 90, x2, w2, 2, 3, dtype, nhwc, bias);
        CHECK_MESSAGE(why.empty(), why);
      }
    }
  }
  // These host-side checks see the graph's form, not everything: a weight of 32 channels for an
  // input of 64 passes them too (tried 2026-11-28; conv2d's own checks refuse it first).
}

// The same for the data gradient masked by a ReLU (dgrad + dReLU; Note [relu mask in the consumer]
// in src/core/autograd.cpp): VGG16's 3x3 layers and a strided 3x3 whose dx size does not follow
// from dy's (56 -> 28, and 28 back would be 55: the dimensions the graph is given).
TEST_CASE("kernel math: cuDNN takes the dgrad+drelu graph for sm_90, up to the operation graph") {
  if (!cuda::conv_fusion_built()) {
    MESSAGE("this build has no cuDNN frontend: the graph is not described");
    return;
  }
  const std::string probe = cuda::conv_fusion_check_description(kH100Json, 90, {8, 64, 56, 56}, {64, 64, 3, 3}, 1, 1,
                                                                DType::bf16, false, false, cuda::ConvGraph::dgrad_relu);
  if (probe.rfind("device description:", 0) == 0) {
    MESSAGE("this cuDNN does not read the H100's JSON description (" << probe << "): not checked");
    return;
  }
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (const bool nhwc : {true, false}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(nhwc);
      const Shape x1 = nhwc ? Shape{4, 224, 224, 64} : Shape{4, 64, 224, 224};
      const Shape w1 = nhwc ? Shape{128, 3, 3, 64} : Shape{128, 64, 3, 3};
      const Shape x2 = nhwc ? Shape{2, 56, 56, 64} : Shape{2, 64, 56, 56};
      const Shape w2 = nhwc ? Shape{64, 3, 3, 64} : Shape{64, 64, 3, 3};
      std::string why = cuda::conv_fusion_check_description(kH100Json, 90, x1, w1, 1, 1, dtype, nhwc, false,
                                                            cuda::ConvGraph::dgrad_relu);
      CHECK_MESSAGE(why.empty(), why);
      why = cuda::conv_fusion_check_description(kH100Json, 90, x2, w2, 2, 1, dtype, nhwc, false, cuda::ConvGraph::dgrad_relu);
      CHECK_MESSAGE(why.empty(), why);
    }
  }
}

TEST_CASE("kernel math: the cases asked of cuDNN's fused attention") {
  const auto takes = [](int64_t t, int64_t c, int heads, float p) {
    return km::sdpa_takes(km::attention_dims(2, t, 3 * c, heads, AttentionDropout{p, 1, 0, 0}));
  };
  CHECK(takes(1024, 768, 12, 0.0f));  // GPT-2: heads of 64
  CHECK(takes(7, 24, 3, 0.0f));       // heads of 8
  CHECK(takes(5, 256, 2, 0.0f));      // heads of 128
  CHECK_FALSE(takes(1024, 768, 12, 0.1f));  // dropout: our mask, not cuDNN's
  CHECK_FALSE(takes(5, 12, 2, 0.0f));       // heads of 6
  CHECK_FALSE(takes(5, 36, 3, 0.0f));       // heads of 12
  CHECK_FALSE(takes(5, 272, 2, 0.0f));      // heads of 136
  CHECK_FALSE(takes(0, 768, 12, 0.0f));     // no positions
}

// MG_CUDNN_ATTENTION=0 in the environment turns cuDNN's fused attention off from the start
// (minigrad/cuda.h); ctest runs this case once more with it set (tests/CMakeLists.txt).
TEST_CASE("kernel math: MG_CUDNN_ATTENTION sets cuda::cudnn_attention()'s default") {
  const char* env = std::getenv("MG_CUDNN_ATTENTION");
  CHECK(cuda::cudnn_attention() == (env == nullptr || std::strcmp(env, "0") != 0));
  cuda::set_cudnn_attention(false);
  CHECK_FALSE(cuda::cudnn_attention());
  cuda::set_cudnn_attention(true);
  CHECK(cuda::cudnn_attention());
}

// Scores of -inf (an infinite key) before the first finite one: the one-pass forward must not
// compute exp(-inf + inf). Rows of (b 0, head 0) from t = 1 on see key 0 at -inf.
TEST_CASE("kernel math: the attention forward with infinite scores, as the CPU kernel") {
  const int64_t b = 1, t = 6, c = 8;
  const int heads = 2;
  std::vector<float> x = random_values(b * t * 3 * c, 23);
  for (int64_t s = 0; s < t; ++s) x[static_cast<size_t>(s * 3 * c)] = 1.0f;  // q_s[0] of head 0 > 0
  x[static_cast<size_t>(c)] = -std::numeric_limits<float>::infinity();     // k_0[0] of head 0
  const Tensor qkv = Tensor::from_vector(x, {b, t, 3 * c});
  Tensor y = Tensor::empty({b, t, c}), lse = Tensor::empty({b, heads, t});
  attention_forward<Cpu>(y, lse, qkv, heads, AttentionDropout{});
  const km::AttentionDims s = km::attention_dims(b, t, 3 * c, heads, AttentionDropout{});
  std::vector<float> ky(static_cast<size_t>(b * t * c)), klse(static_cast<size_t>(b * heads * t));
  for (int64_t r = 0; r < b * heads * t; ++r) km::attention_forward_row<0>(ky.data(), klse.data(), x.data(), s, r);
  const std::vector<float> cy = y.to_vector<float>(), clse = lse.to_vector<float>();
  // Row t = 0 of head 0 has only the -inf score: NaN on both; every other row is finite.
  CHECK(std::isnan(klse[0]));
  CHECK(std::isnan(clse[0]));
  for (size_t i = 1; i < klse.size(); ++i) {
    CAPTURE(i);
    CHECK(std::isfinite(klse[i]));
    CHECK(std::abs(klse[i] - clse[i]) <= 1e-6f * std::max(1.0f, std::abs(clse[i])));
  }
  for (int64_t s2 = 1; s2 < t; ++s2) {
    for (int64_t i = 0; i < c; ++i) {
      const size_t at = static_cast<size_t>(s2 * c + i);
      CAPTURE(at);
      CHECK(std::isfinite(ky[at]));
      CHECK(std::abs(ky[at] - cy[at]) <= 1e-6f * std::max(1.0f, std::abs(cy[at])));
    }
  }
}

TEST_CASE("kernel math: layer_norm's tiled dw and db add each column's rows in order, as the CPU kernel does") {
  // One block of the CUDA kernel per 32 columns: its warps load a tile, then warp 0 adds it.
  auto tiled = [](std::vector<float>& dw, std::vector<float>& db, const std::vector<float>& dy,
                  const std::vector<float>& x, const std::vector<float>& mean, const std::vector<float>& rstd,
                  int64_t m, int64_t c, bool accumulate) {
    std::vector<float> tile_g(km::kLnTileRows * km::kLnCols), tile_h(tile_g.size());
    for (int64_t j0 = 0; j0 < c; j0 += km::kLnCols) {
      float aw[km::kLnCols] = {}, ab[km::kLnCols] = {};
      for (int lane = 0; lane < km::kLnCols && j0 + lane < c && accumulate; ++lane) {
        aw[lane] = dw[j0 + lane];
        ab[lane] = db[j0 + lane];
      }
      for (int64_t r0 = 0; r0 < m; r0 += km::kLnTileRows) {
        for (int warp = 0; warp < km::kLnWarps; ++warp)
          for (int lane = 0; lane < km::kLnCols; ++lane)
            for (int rr = warp; rr < km::kLnTileRows; rr += km::kLnWarps)
              km::layer_norm_tile_load(tile_g.data(), tile_h.data(), dy.data(), x.data(), mean.data(), rstd.data(), m,
                                       c, r0, j0, rr, lane);
        const int rows = static_cast<int>(std::min<int64_t>(m - r0, km::kLnTileRows));
        for (int lane = 0; lane < km::kLnCols; ++lane)
          km::layer_norm_tile_add(&aw[lane], &ab[lane], tile_g.data(), tile_h.data(), rows, lane);
      }
      for (int lane = 0; lane < km::kLnCols && j0 + lane < c; ++lane) {
        dw[j0 + lane] = aw[lane];
        db[j0 + lane] = ab[lane];
      }
    }
  };
  for (const int64_t m : {0, 1, 127, 128, 300}) {
    for (const int64_t c : {1, 31, 33, 70}) {
      for (const bool accumulate : {false, true}) {
        CAPTURE(m);
        CAPTURE(c);
        CAPTURE(accumulate);
        const Tensor x = Tensor::from_vector(random_values(m * c, 31, 0, 3.0f, 0.5f), {m, c});
        const Tensor dy = Tensor::from_vector(random_values(m * c, 32), {m, c});
        const Tensor w = Tensor::from_vector(random_values(c, 33), {c});
        Tensor y = Tensor::empty({m, c}), mean = Tensor::empty({m}), rstd = Tensor::empty({m});
        layer_norm_forward<Cpu>(y, mean, rstd, x, w, Tensor(), 1e-5f);
        const std::vector<float> before_w = random_values(c, 34), before_b = random_values(c, 35);
        Tensor dx = Tensor::empty({m, c}), dw = Tensor::from_vector(before_w, {c}), db = Tensor::from_vector(before_b, {c});
        layer_norm_backward<Cpu>(dx, dw, db, dy, x, w, mean, rstd, accumulate);
        const std::vector<float> hdy = dy.to_vector<float>(), hx = x.to_vector<float>(), hm = mean.to_vector<float>(),
                                 hr = rstd.to_vector<float>();
        std::vector<float> kdw = before_w, kdb = before_b;
        tiled(kdw, kdb, hdy, hx, hm, hr, m, c, accumulate);
        // The order: each column's rows one after another onto the buffer (or 0), as a thread
        // per column adds them. Compiled here, beside the tiles, with the same contraction.
        std::vector<float> sdw = before_w, sdb = before_b;
        for (int64_t j = 0; j < c; ++j) {
          float aw = accumulate ? sdw[j] : 0.0f, ab = accumulate ? sdb[j] : 0.0f;
          for (int64_t r = 0; r < m; ++r) {
            const float g = hdy[r * c + j];
            aw += g * ((hx[r * c + j] - hm[r]) * hr[r]);
            ab += g;
          }
          sdw[j] = aw;
          sdb[j] = ab;
        }
        CHECK(kdw == sdw);
        CHECK(kdb == sdb);
        // The formula: the CPU kernel's (the same order; its build may fuse the multiply-adds).
        CHECK(rel_err(kdw, dw.to_vector<float>()) < 1e-6);
        CHECK(rel_err(kdb, db.to_vector<float>()) < 1e-6);
      }
    }
  }
}

TEST_CASE("kernel math: embedding's keys, stable sort and offsets give embedding_buckets' rows, and the CPU's dw") {
  // The CUDA backward: keys per position, a stable radix sort over the keys' low bits (CUB's; here
  // std::stable_sort of the masked keys), offsets by binary search, one sum per (row, channel).
  const int64_t lim = std::numeric_limits<int64_t>::max(), low = std::numeric_limits<int64_t>::min();
  for (const int64_t rows : {1, 2, 7, 64, 1000, 50257}) {
    for (const int64_t n : {0, 1, 5, 300}) {
      for (const bool bad : {false, true}) {
        CAPTURE(rows);
        CAPTURE(n);
        CAPTURE(bad);
        std::mt19937_64 rng(static_cast<uint64_t>(rows * 1000 + n));
        std::vector<int64_t> idx(static_cast<size_t>(n));
        // Few distinct rows, so rows repeat and most of a large table is empty.
        for (auto& t : idx) t = static_cast<int64_t>(rng() % 5) * (rows / 5) + static_cast<int64_t>(rng() % 2) % rows;
        if (bad && n >= 5) {
          idx[0] = -1;
          idx[2] = rows;
          idx[3] = lim;
          idx[4] = low;
        }
        const int bits = km::embedding_key_bits(rows);
        const uint64_t mask = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
        CHECK(static_cast<uint64_t>(rows) <= mask);            // every key fits the sort's bits
        CHECK((static_cast<uint64_t>(rows) >> (bits - 1)) == 1);  // and no more bits than that
        std::vector<std::pair<uint64_t, int64_t>> kp;
        for (int64_t p = 0; p < n; ++p) kp.emplace_back(km::embedding_key(idx[static_cast<size_t>(p)], rows) & mask, p);
        std::stable_sort(kp.begin(), kp.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        std::vector<uint64_t> sorted(kp.size());
        std::vector<int64_t> pos(kp.size());
        for (size_t k = 0; k < kp.size(); ++k) std::tie(sorted[k], pos[k]) = kp[k];
        std::vector<int64_t> offset(static_cast<size_t>(rows) + 1);
        for (int64_t r = 0; r <= rows; ++r) offset[static_cast<size_t>(r)] = km::embedding_offset(sorted.data(), n, r);
        // Reference: each row's positions in increasing order; out-of-range indices in none.
        std::vector<int64_t> ref_offset{0}, ref_pos;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t p = 0; p < n; ++p)
            if (idx[static_cast<size_t>(p)] == r) ref_pos.push_back(p);
          ref_offset.push_back(static_cast<int64_t>(ref_pos.size()));
        }
        CHECK(offset == ref_offset);
        CHECK(std::vector<int64_t>(pos.begin(), pos.begin() + offset.back()) == ref_pos);
        if (!bad) {
          const EmbeddingBuckets b = embedding_buckets(idx.data(), n, rows);
          CHECK(offset == b.offset);
          CHECK(pos == b.pos);
          // dw, accumulating and not: the CPU kernel's bits (the same additions in the same order).
          const int64_t c = 3;
          const std::vector<float> hdy = random_values(static_cast<size_t>(n * c), 41), before = random_values(static_cast<size_t>(rows * c), 42);
          for (const bool accumulate : {false, true}) {
            Tensor dw = Tensor::from_vector(before, {rows, c});
            embedding_backward<Cpu>(dw, Tensor::from_vector(hdy, {n, c}), Tensor::from_vector(idx, {n}), accumulate);
            std::vector<float> kdw(before.size());
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t j = 0; j < c; ++j)
                kdw[static_cast<size_t>(r * c + j)] = km::embedding_grad(accumulate ? before[static_cast<size_t>(r * c + j)] : 0.0f,
                                                                         hdy.data(), offset.data(), pos.data(), r, j, c);
            CHECK(kdw == dw.to_vector<float>());
          }
        }
      }
    }
  }
}

TEST_CASE("kernel math: cuDNN's convolution algorithms by name; none listed before a convolution on a GPU") {
  // mg::cuda::conv_algorithms() names the cached choices through conv_algos.h, whose tables follow
  // cuDNN 9's enum values (conv2d.cu checks them against cudnn.h when it compiles).
  using cuda::ConvPass;
  CHECK(std::string(cuda::conv_algo_name(ConvPass::forward, 1)) == "IMPLICIT_PRECOMP_GEMM");
  CHECK(std::string(cuda::conv_algo_name(ConvPass::forward, 7)) == "WINOGRAD_NONFUSED");
  CHECK(std::string(cuda::conv_algo_name(ConvPass::backward_data, 1)) == "ALGO_1");
  CHECK(std::string(cuda::conv_algo_name(ConvPass::backward_data, 3)) == "FFT_TILING");
  CHECK(std::string(cuda::conv_algo_name(ConvPass::backward_filter, 3)) == "ALGO_3");
  CHECK(std::string(cuda::conv_algo_name(ConvPass::backward_filter, 6)) == "FFT_TILING");
  CHECK(std::string(cuda::conv_algo_name(ConvPass::forward, 8)) == "?");
  CHECK(std::string(cuda::conv_algo_name(ConvPass::backward_filter, -1)) == "?");
  CHECK(std::string(cuda::cudnn_math_name(1)) == "tensor op");
  CHECK(std::string(cuda::cudnn_math_name(3)) == "fma");
  CHECK(std::string(cuda::conv_pass_name(ConvPass::backward_filter)) == "backward filter");
  // A convolution on the CPU chooses nothing; without a GPU nothing ran on one.
  if (!cuda_available()) {
    Generator gen(3);
    const Tensor x = Tensor::randn({2, 3, 8, 8}, gen), w = Tensor::randn({4, 3, 3, 3}, gen);
    (void)conv2d(x, w, Tensor(), 1, 1);
    CHECK(cuda::conv_algorithms().empty());
  }
}
