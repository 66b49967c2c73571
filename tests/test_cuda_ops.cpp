// The CUDA kernels against the CPU ones: every op forward and backward and every element-wise
// kernel on random odd-sized inputs (ggml's test-backend-ops idea), in strict FP32 and in TF32,
// the backward passes that accumulate into existing gradients, the dropout masks, and the
// kernels that must give the same bits run after run. tests/test_ops.cpp runs every op of the op
// table on both devices too, from the table's own cases; the shapes here are larger and differ.
// Tolerances: tests/cuda_helpers.h.
#include "cuda_helpers.h"  // exits with 77 (skipped) without the CUDA backend or a device

#ifdef MINIGRAD_WITH_CUDA
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>

#include <minigrad/core/autocast.h>
#include "core/tape.h"  // rows_view
#include "kernels/attention.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/cublaslt.h"
#include "kernels/conv2d.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/layer_norm.h"
#include "kernels/linear.h"
#include "kernels/matmul.h"
#include "kernels/pooling.h"
#include "ops/op.h"  // set_add_into_pending

using namespace mg;
using namespace mg::test;

namespace {

Tensor to_gpu(const Tensor& t) {
  Tensor g = t.to(kGpu);
  if (t.requires_grad()) g.requires_grad_();
  return g;
}

// Runs f on the CPU inputs and on CUDA copies; compares the outputs, then the gradients of
// sum(f(inputs) * probe) for every input that requires grad.
void compare_op(const char* what, const std::function<Tensor(const std::vector<Tensor>&)>& f,
                const std::vector<Tensor>& cpu_in, double tol) {
  INFO(what);
  std::vector<Tensor> gpu_in;
  for (const Tensor& t : cpu_in) gpu_in.push_back(to_gpu(t));
  Tensor y_cpu = f(cpu_in), y_gpu = f(gpu_in);
  REQUIRE(y_gpu.is_cuda());
  REQUIRE(y_gpu.shape() == y_cpu.shape());
  INFO("output rel err " << rel_err(y_gpu, y_cpu));
  CHECK(rel_err(y_gpu, y_cpu) < tol);
  bool wants_grad = false;
  for (const Tensor& t : cpu_in) wants_grad |= t.requires_grad();
  // An output off the tape (a .to() copy) would skip the gradients without a word.
  REQUIRE_MESSAGE(y_cpu.requires_grad() == wants_grad, "the output is not on the tape: its gradients cannot be compared");
  if (!wants_grad) return;
  Tensor probe = rand_tensor(y_cpu.shape(), 4242);
  y_cpu.backward(probe);
  y_gpu.backward(probe.to(kGpu));
  for (size_t i = 0; i < cpu_in.size(); ++i) {
    if (!cpu_in[i].requires_grad()) continue;
    REQUIRE(gpu_in[i].grad().defined());
    REQUIRE(gpu_in[i].grad().is_cuda());
    INFO("grad of input " << i << " rel err " << rel_err(gpu_in[i].grad(), cpu_in[i].grad()));
    CHECK(rel_err(gpu_in[i].grad(), cpu_in[i].grad()) < tol);
  }
}

}  // namespace

TEST_CASE("cuda: element-wise kernels and the step statistics") {
  Tensor a = rand_tensor({17, 19}, 3, true), b = rand_tensor({17, 19}, 4, true);
  compare_op("add", [](const std::vector<Tensor>& in) { return add(in[0], in[1]); }, {a, b}, kStrict);
  compare_op("scale", [](const std::vector<Tensor>& in) { return scale(in[0], -1.75f); },
             {rand_tensor({3, 5, 7}, 5, true)}, kStrict);

  Tensor y = rand_tensor({1001, 3}, 6), x = rand_tensor({1001, 3}, 7);
  Tensor yg = y.to(kGpu), xg = x.to(kGpu);
  add_inplace<Cpu>(y, x);
  add_inplace<Cuda>(yg, xg);
  CHECK(test::bit_equal(yg.cpu(), y));  // one rounding each: identical

  Tensor f = poisoned({333, 3}, kGpu);
  fill<Cuda>(f, 3.25f);
  for (float v : f.to_vector<float>()) CHECK(v == 3.25f);

  // The step statistics (minigrad/optim/accumulate.h): squared norms of many tensors of odd sizes, in
  // more than one launch (over 256 tensors), and a stored loss.
  std::vector<Tensor> xs, xs_gpu;
  for (int i = 0; i < 300; ++i) xs.push_back(rand_tensor({i % 7 == 0 ? 1000003 : 1 + 37 * i}, 100 + i));
  for (const Tensor& t : xs) xs_gpu.push_back(t.to(kGpu));
  Tensor st = Tensor::full({3}, -1.0f, TensorOptions{DType::f64});
  Tensor st_gpu = st.to(kGpu);
  sum_squares_into<Cpu>(xs, st, 1);
  sum_squares_into<Cuda>(xs_gpu, st_gpu, 1);
  Tensor loss = rand_tensor({1}, 9);
  Tensor loss_gpu = loss.to(kGpu);
  store_scalar<Cpu>(st, 2, loss);
  store_scalar<Cuda>(st_gpu, 2, loss_gpu);
  const std::vector<double> cpu = st.to_vector<double>(), gpu = st_gpu.to_vector<double>();
  CHECK(gpu[0] == -1.0);  // untouched
  CHECK(std::abs(gpu[1] - cpu[1]) / cpu[1] < 1e-12);  // both accumulate in double
  CHECK(gpu[2] == cpu[2]);
  CHECK(gpu[2] == static_cast<double>(loss.item()));
  sum_squares_into<Cuda>({}, st_gpu, 0);
  CHECK(st_gpu.to_vector<double>()[0] == 0.0);
  // zero_many (Optimizer::zero_grad) over the same 300 tensors: two launches, every element.
  zero_many<Cuda>(xs_gpu);
  sum_squares_into<Cuda>(xs_gpu, st_gpu, 1);
  CHECK(st_gpu.to_vector<double>()[1] == 0.0);
  for (size_t i = 0; i < xs_gpu.size(); i += 37) CHECK(test::max_abs_diff(xs_gpu[i].cpu(), Tensor::zeros(xs[i].shape())) == 0.0);
}

TEST_CASE("cuda: linear forward and backward, strict FP32 by default") {
  REQUIRE(!cuda::tf32_matmul());
  Tensor x = rand_tensor({37, 53}, 11, true), w = rand_tensor({29, 53}, 12, true), b = rand_tensor({29}, 13, true);
  compare_op("linear", [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, {x, w, b}, kStrict);
  Tensor x2 = rand_tensor({1, 257}, 14, true), w2 = rand_tensor({3, 257}, 15, true);
  compare_op("linear, no bias, one row", [](const std::vector<Tensor>& in) { return linear(in[0], in[1]); },
             {x2, w2}, kStrict);
}

TEST_CASE("cuda: linear backward accumulates into existing gradients") {
  Tensor x = rand_tensor({23, 41}, 21), w = rand_tensor({13, 41}, 22), dy = rand_tensor({23, 13}, 23);
  Tensor dw = rand_tensor({13, 41}, 24), db = rand_tensor({13}, 25);
  Tensor dwg = dw.to(kGpu), dbg = db.to(kGpu), dxg = poisoned({23, 41}, kGpu), dx = poisoned({23, 41}, Device::cpu());
  Tensor xg = x.to(kGpu), wg = w.to(kGpu), dyg = dy.to(kGpu);
  linear_backward<Cpu>(dx, dw, db, dy, x, w, /*accumulate=*/true);
  linear_backward<Cuda>(dxg, dwg, dbg, dyg, xg, wg, /*accumulate=*/true);
  CHECK(rel_err(dxg, dx) < kStrict);
  CHECK(rel_err(dwg, dw) < kStrict);
  CHECK(rel_err(dbg, db) < kStrict);
}

TEST_CASE("cuda: linear in TF32 when asked (tolerance 1e-2)") {
  Tf32Matmul on(true);
  Tensor x = rand_tensor({65, 257}, 31, true), w = rand_tensor({33, 257}, 32, true), b = rand_tensor({33}, 33, true);
  compare_op("linear tf32", [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, {x, w, b}, kTf32);
}

namespace {

// linear forward and backward on CUDA, all four outputs, with cuBLASLt on or off; dw and db
// float32 (a parameter's buffers), accumulating into `dw0`/`db0` or written over NaN.
struct LinearRun {
  Tensor y, dx, dw, db;
  cuda::LtCounts lt;  // cuBLASLt's products during the run
};
LinearRun run_linear(bool lt, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy, const Tensor& dw0,
                     const Tensor& db0, bool accumulate) {
  CublasLt mode(lt);
  const cuda::LtCounts before = cuda::lt_counts();
  LinearRun r;
  r.y = poisoned({x.size(0), w.size(0)}, kGpu).to(x.dtype());
  r.dx = poisoned(x.shape(), kGpu).to(x.dtype());
  r.dw = accumulate ? dw0.to(kGpu) : poisoned(w.shape(), kGpu);
  r.db = accumulate ? db0.to(kGpu) : poisoned(b.shape(), kGpu);
  linear_forward<Cuda>(r.y, x, w, b);
  linear_backward<Cuda>(r.dx, r.dw, r.db, dy, x, w, accumulate);
  synchronize(kGpu);
  const cuda::LtCounts after = cuda::lt_counts();
  r.lt = {after.runs - before.runs, after.refused - before.refused, after.invalid - before.invalid};
  return r;
}

}  // namespace

// Note [cublaslt products]: the bias epilogue in the forward, BGRADB for db in dw's GEMM (into a
// temporary added when accumulating), against the unfused cublasGemmEx products on the same
// inputs; and the fused path's bits again on a second run (a fixed algorithm per key).
TEST_CASE("cuda: linear through cuBLASLt's epilogues against cublasGemmEx, fp32, tf32, bf16 and f16, accumulating or not") {
  struct Mode {
    const char* name;
    DType dtype;
    bool tf32;
    double tol;  // Lt against GemmEx: each its own order of float32 sums (bf16: y and dx rounded)
  };
  struct Dims {
    int64_t n, k, m;
  };
  for (const Mode mode : {Mode{"fp32", DType::f32, false, kStrict}, Mode{"tf32", DType::f32, true, kTf32},
                          Mode{"bf16", DType::bf16, false, 1e-2}, Mode{"f16", DType::f16, false, 1e-2}}) {
    for (const Dims d : {Dims{37, 53, 29}, Dims{256, 768, 2304}, Dims{1, 257, 3}}) {
      for (const bool accumulate : {false, true}) {
        INFO(mode.name << " N=" << d.n << " K=" << d.k << " M=" << d.m << (accumulate ? " accumulating" : ""));
        Tf32Matmul math(mode.tf32);
        const Tensor x = rand_tensor({d.n, d.k}, 61).to(kGpu).to(mode.dtype);
        const Tensor w = rand_tensor({d.m, d.k}, 62).to(kGpu).to(mode.dtype);
        const Tensor b = rand_tensor({d.m}, 63).to(kGpu).to(mode.dtype);
        const Tensor dy = rand_tensor({d.n, d.m}, 64).to(kGpu).to(mode.dtype);
        const Tensor dw0 = rand_tensor({d.m, d.k}, 65), db0 = rand_tensor({d.m}, 66);
        const LinearRun lt = run_linear(true, x, w, b, dy, dw0, db0, accumulate);
        const LinearRun ex = run_linear(false, x, w, b, dy, dw0, db0, accumulate);
        MESSAGE("cuBLASLt ran " << lt.lt.runs << " products, refused " << lt.lt.refused
                                << (lt.lt.refused > 0 ? ": " + cuda::lt_refusal() : std::string()));
        CHECK(lt.lt.runs >= 3);  // every product through cuBLASLt: y, dx, dw (and db where unfused)
        WARN(lt.lt.refused == 0);  // a refused fusion runs unfused: right, but slower
        CHECK(lt.lt.invalid == 0);  // no descriptor of ours that cuBLASLt calls invalid
        CHECK(ex.lt.runs == 0);
        const auto f32 = [](const Tensor& t) { return t.to(DType::f32); };
        CHECK(rel_err(f32(lt.y), f32(ex.y)) < mode.tol);
        CHECK(rel_err(f32(lt.dx), f32(ex.dx)) < mode.tol);
        CHECK(rel_err(lt.dw, ex.dw) < mode.tol);
        CHECK(rel_err(lt.db, ex.db) < mode.tol);
        const LinearRun again = run_linear(true, x, w, b, dy, dw0, db0, accumulate);
        CHECK(bit_equal(again.y, lt.y));
        CHECK(bit_equal(again.dx, lt.dx));
        CHECK(bit_equal(again.dw, lt.dw));
        CHECK(bit_equal(again.db, lt.db));
      }
    }
  }
}

// Note [fused gelu]: linear_gelu through cuBLASLt's GELU_AUX_BIAS epilogue (or its fallback) against
// the CPU, fp32 and bf16; the MESSAGE says whether the epilogue ran. cuBLASLt does not document how
// its epilogue computes tanh: float32 is held to 1e-3 of the output's norm (the product's sums are
// float32's; the erf form of GELU would differ from the tanh form by about 1e-4 here, so this
// checks the wiring, not the form: the GPT's losses against PyTorch's check that).
TEST_CASE("cuda: linear_gelu, cuBLASLt's GELU epilogue or its fallback, against the CPU") {
  // 29 outputs: the aux matrix's leading dimension is not a multiple of 8, which cuBLASLt refuses:
  // linear then gelu.
  for (const int64_t m : {int64_t{384}, int64_t{29}}) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(m);
      CAPTURE(dtype_name(dtype));
      const cuda::LtCounts before = cuda::lt_counts();
      Tensor x = rand_tensor({64, 96}, 81, true), w = rand_tensor({m, 96}, 82, true), b = rand_tensor({m}, 83, true);
      compare_op("linear_gelu", [&](const std::vector<Tensor>& in) {
        const AutocastGuard cast(dtype);
        return linear_gelu(in[0], in[1], in[2]);  // no .to(): a copy off the tape, no gradients compared
      }, {x, w, b}, dtype == DType::f32 ? 1e-3 : 3e-2);
      const cuda::LtCounts after = cuda::lt_counts();
      MESSAGE("cuBLASLt ran " << after.runs - before.runs << " products, refused " << after.refused - before.refused
                              << (after.refused > before.refused ? ": " + cuda::lt_refusal() : std::string()));
      CHECK(after.invalid == before.invalid);  // refused (m = 29) for its ld, not for a descriptor of ours
    }
  }
}

TEST_CASE("cuda: matmul's strided batches through cuBLASLt against cublasGemmStridedBatchedEx") {
  const MatmulDims d{6, 33, 65, 17};
  for (const DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dtype));
    const Tensor a = rand_tensor({d.batch, d.m, d.k}, 71).to(kGpu).to(dtype);
    const Tensor b = rand_tensor({d.batch, d.k, d.n}, 72).to(kGpu).to(dtype);
    const Tensor dy = rand_tensor({d.batch, d.m, d.n}, 73).to(kGpu).to(dtype);
    std::array<Tensor, 3> out[2];
    for (const bool lt : {true, false}) {
      CublasLt mode(lt);
      const cuda::LtCounts before = cuda::lt_counts();
      std::array<Tensor, 3>& o = out[lt ? 0 : 1];
      o[0] = poisoned({d.batch, d.m, d.n}, kGpu).to(dtype);
      o[1] = poisoned(a.shape(), kGpu).to(dtype);
      o[2] = poisoned(b.shape(), kGpu).to(dtype);
      matmul_forward<Cuda>(o[0], a, b, d);
      matmul_backward<Cuda>(o[1], o[2], dy, a, b, d);
      const cuda::LtCounts after = cuda::lt_counts();
      if (lt) {  // else two GemmEx paths compared with each other would pass whatever cuBLASLt did
        MESSAGE("cuBLASLt ran " << after.runs - before.runs << " of matmul's 3 products, refused "
                                << after.refused - before.refused
                                << (after.refused > before.refused ? ": " + cuda::lt_refusal() : std::string()));
        CHECK(after.invalid == before.invalid);
        if (dtype == DType::f32) CHECK(after.runs - before.runs == 3);  // float32 products: cuBLASLt has them all
        else WARN(after.runs - before.runs == 3);  // a refused bf16 product runs on GemmEx: right, not compared
      } else {
        CHECK(after.runs == before.runs);
      }
    }
    for (int i = 0; i < 3; ++i)
      CHECK(rel_err(out[0][i].to(DType::f32), out[1][i].to(DType::f32)) < (dtype == DType::f32 ? kStrict : 1e-2));
  }
}

TEST_CASE("cuda: conv2d forward and backward in strict FP32") {
  Tf32Conv off(false);
  for (bool bench : {false, true}) {
    const CudnnBenchmark benchmark(bench);
    // Other inputs for each setting: an algorithm that wrote nothing would otherwise find the
    // first pass's results in the blocks the caching allocator hands back.
    const uint64_t s = bench ? 100 : 0;
    Tensor x = rand_tensor({3, 5, 13, 11}, 41 + s, true), w = rand_tensor({7, 5, 3, 3}, 42 + s, true),
           b = rand_tensor({7}, 43 + s, true);
    compare_op("conv2d 3x3 stride 2 pad 1",
               [](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], 2, 1); }, {x, w, b}, kStrict);
    Tensor x2 = rand_tensor({2, 3, 9, 17}, 44 + s, true), w2 = rand_tensor({5, 3, 5, 3}, 45 + s, true);
    compare_op("conv2d 5x3 no bias", [](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], {}, 1, 0); },
               {x2, w2}, kStrict);
  }
}

TEST_CASE("cuda: conv2d with TF32 allowed, the default (tolerance 1e-2)") {
  REQUIRE(cuda::tf32_conv());
  Tensor x = rand_tensor({4, 16, 15, 15}, 51, true), w = rand_tensor({24, 16, 3, 3}, 52, true), b = rand_tensor({24}, 53, true);
  compare_op("conv2d tf32", [](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], 1, 1); }, {x, w, b},
             kTf32);
}

// Note [fused relu]: cuDNN's conv+bias+relu graph where it takes the case (NHWC on tensor
// cores, mostly), else the convolution and the ReLU kernel; either way relu(conv2d) to the
// dtype's rounding, in TF32 and bf16, both layouts. The MESSAGE says whether the graph ran.
TEST_CASE("cuda: conv2d_relu, cuDNN's fused graph or its fallback, against the CPU in both layouts") {
  REQUIRE(cuda::tf32_conv());
  for (const Layout layout : {Layout::nhwc, Layout::nchw}) {
    const bool last = layout == Layout::nhwc;
    for (const DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(layout_name(layout));
      CAPTURE(dtype_name(dtype));
      const cuda::ConvFusionCounts before = cuda::conv_fusion_counts();
      // Channels in multiples of 8, as tensor-core kernels want them.
      Tensor x = rand_tensor(last ? Shape{4, 15, 15, 16} : Shape{4, 16, 15, 15}, 71, true);
      Tensor w = rand_tensor(last ? Shape{32, 3, 3, 16} : Shape{32, 16, 3, 3}, 72, true), b = rand_tensor({32}, 73, true);
      compare_op("conv2d_relu", [&](const std::vector<Tensor>& in) {
        const AutocastGuard cast(dtype);
        return conv2d_relu(in[0], in[1], in[2], 1, 1, layout);  // no .to(): a copy off the tape
      }, {x, w, b}, dtype == DType::f32 ? kTf32 : 3e-2);
      const cuda::ConvFusionCounts after = cuda::conv_fusion_counts();
      MESSAGE("fused graph ran " << after.ran - before.ran << " times, refused " << after.refused - before.refused
                                 << (after.refused > before.refused ? " (" + cuda::conv_fusion_refusal() + ")" : ""));
    }
  }
}

// Note [relu mask in the consumer]: a conv2d reading a ReLU's output alone masks its data gradient:
// the data gradient and the ReLU kernel in place by default (the bits of the ReLU masking its own),
// and under set_cudnn_dgrad_fusion cuDNN's dgrad+drelu graph where it takes the case. Against the
// CPU in TF32 and bf16, both layouts, with a strided layer whose dx's size does not follow from
// dy's (16 rows -> 8, and 8 back would be (8 - 1) 2 + 3 - 2 = 15). The MESSAGE says whether the
// graph ran, or why cuDNN refused it.
TEST_CASE("cuda: a conv2d masks the gradient of the ReLU before it, fused or not, against the CPU") {
  REQUIRE(cuda::tf32_conv());
  struct Restore {
    bool dgrad = cuda::cudnn_dgrad_fusion();
    ~Restore() {
      cuda::set_cudnn_dgrad_fusion(dgrad);
      set_relu_mask_in_consumer(true);
    }
  } restore;
  for (const Layout layout : {Layout::nhwc, Layout::nchw}) {
    const bool last = layout == Layout::nhwc;
    for (const DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(layout_name(layout));
      CAPTURE(dtype_name(dtype));
      Tensor x = rand_tensor({4, 16, 16, 16}, 81, true);  // 16 channels, 16 x 16, either layout
      Tensor w1 = rand_tensor(last ? Shape{32, 3, 3, 16} : Shape{32, 16, 3, 3}, 82, true);
      Tensor w2 = rand_tensor(last ? Shape{16, 3, 3, 32} : Shape{16, 32, 3, 3}, 83, true), b2 = rand_tensor({16}, 84, true);
      Tensor w3 = rand_tensor(last ? Shape{8, 3, 3, 16} : Shape{8, 16, 3, 3}, 85, true);
      const auto f = [&](const std::vector<Tensor>& in) {
        const AutocastGuard cast(dtype);
        const Tensor a = conv2d_relu(in[0], in[1], Tensor(), 1, 1, layout);  // read by one conv2d
        const Tensor c = relu(conv2d(a, in[2], in[3], 2, 1, layout));       // 16 -> 8
        return conv2d(c, in[4], Tensor(), 1, 1, layout);  // no .to(): a copy off the tape
      };
      for (const bool graph : {false, true}) {
        CAPTURE(graph);
        cuda::set_cudnn_dgrad_fusion(graph);
        const cuda::ConvFusionCounts before = cuda::conv_fusion_counts();
        const uint64_t moved = relu_masks_in_consumer();
        compare_op("conv2d_relu -> conv2d -> relu -> conv2d", f, {x, w1, w2, b2, w3}, dtype == DType::f32 ? kTf32 : 3e-2);
        CHECK(relu_masks_in_consumer() - moved == 4);  // two on each device
        const cuda::ConvFusionCounts after = cuda::conv_fusion_counts();
        if (!graph) CHECK(after.dgrad_ran + after.dgrad_refused == before.dgrad_ran + before.dgrad_refused);
        if (graph) {
          MESSAGE("dgrad+drelu graph ran " << after.dgrad_ran - before.dgrad_ran << " times, refused "
                                           << after.dgrad_refused - before.dgrad_refused
                                           << (after.dgrad_refused > before.dgrad_refused
                                                   ? " (" + cuda::conv_fusion_refusal(true) + ")" : ""));
        }
      }
      // By default, the bits of the ReLU masking its own.
      cuda::set_cudnn_dgrad_fusion(false);
      std::vector<std::vector<uint8_t>> grads[2];
      for (const bool on : {false, true}) {
        set_relu_mask_in_consumer(on);
        std::vector<Tensor> in;
        for (const Tensor& t : {x, w1, w2, b2, w3}) in.push_back(to_gpu(t));
        const Tensor y = f(in);
        y.backward(rand_tensor(y.shape(), 86).to(kGpu));
        for (const Tensor& t : in) grads[on].push_back(test::raw_bytes(t.grad()));
      }
      set_relu_mask_in_consumer(true);
      for (size_t i = 0; i < grads[0].size(); ++i) {
        CAPTURE(i);
        CHECK(grads[1][i] == grads[0][i]);
      }
    }
  }
}

TEST_CASE("cuda: conv2d backward accumulates into existing gradients") {
  Tf32Conv off(false);
  Tensor x = rand_tensor({2, 3, 8, 7}, 61), w = rand_tensor({4, 3, 3, 3}, 62), dy = rand_tensor({2, 4, 8, 7}, 63);
  Tensor dw = rand_tensor({4, 3, 3, 3}, 64), db = rand_tensor({4}, 65), dx;  // dx undefined: skipped
  Tensor dwg = dw.to(kGpu), dbg = db.to(kGpu), dxg;
  conv2d_backward<Cpu>(dx, dw, db, dy, x, w, 1, 1, true, false);
  conv2d_backward<Cuda>(dxg, dwg, dbg, dy.to(kGpu), x.to(kGpu), w.to(kGpu), 1, 1, true, false);
  CHECK(rel_err(dwg, dw) < kStrict);
  CHECK(rel_err(dbg, db) < kStrict);
}

// bf16 convolutions are searched in tensor-op math (search_math in src/kernels/cuda/conv2d.cu:
// cuDNN's default math lets tensor cores in for TF32 only); under a workspace limit of 0 the
// choice is the ranked algorithm with the least workspace, over the limit, not the fixed fallback.
// Each against the CPU on the same bf16 inputs, channels last (VGG16's layout under --layout nhwc).
TEST_CASE("cuda: bf16 convolutions in tensor-op math, and under a workspace limit of 0, against the CPU") {
  struct Limit {
    size_t old = cuda::conv_workspace_limit();
    explicit Limit(size_t bytes) { cuda::set_conv_workspace_limit(bytes); }
    ~Limit() { cuda::set_conv_workspace_limit(old); }
  };
  for (const size_t limit : {cuda::conv_workspace_limit(), size_t{0}}) {
    CAPTURE(limit);
    const Limit set(limit);
    const int64_t n = 4, c = 64, hw = 28, o = 64;
    const Tensor x = rand_tensor({n, hw, hw, c}, 91).to(DType::bf16), w = rand_tensor({o, 3, 3, c}, 92).to(DType::bf16);
    const Tensor b = rand_tensor({o}, 93).to(DType::bf16), dy = rand_tensor({n, hw, hw, o}, 94).to(DType::bf16);
    Tensor y = Tensor::empty({n, hw, hw, o}, TensorOptions{DType::bf16}), dx = Tensor::empty(x.shape(), TensorOptions{DType::bf16});
    Tensor dw = Tensor::empty(w.shape(), TensorOptions{DType::f32}), db = Tensor::empty(b.shape(), TensorOptions{DType::f32});
    conv2d_forward<Cpu>(y, x, w, b, 1, 1, true);
    conv2d_backward<Cpu>(dx, dw, db, dy, x, w, 1, 1, false, true);
    const size_t before = cuda::conv_algorithms().size();
    Tensor gy = poisoned(y.shape(), kGpu).to(DType::bf16), gdx = poisoned(dx.shape(), kGpu).to(DType::bf16);
    Tensor gdw = poisoned(dw.shape(), kGpu), gdb = poisoned(db.shape(), kGpu);
    conv2d_forward<Cuda>(gy, x.to(kGpu), w.to(kGpu), b.to(kGpu), 1, 1, true);
    conv2d_backward<Cuda>(gdx, gdw, gdb, dy.to(kGpu), x.to(kGpu), w.to(kGpu), 1, 1, false, true);
    const auto f32 = [](const Tensor& t) { return t.to(DType::f32).cpu(); };
    CHECK(rel_err(f32(gy), f32(y)) < 1e-2);
    CHECK(rel_err(f32(gdx), f32(dx)) < 1e-2);
    CHECK(rel_err(gdw.cpu(), dw) < 1e-2);
    CHECK(rel_err(gdb.cpu(), db) < 1e-2);
    const std::vector<cuda::ConvAlgorithm> algos = cuda::conv_algorithms();
    REQUIRE(algos.size() == before + 3);  // a new key (the limit is part of it): three new choices
    for (size_t i = before; i < algos.size(); ++i) {
      const cuda::ConvAlgorithm& a = algos[i];
      MESSAGE(a.pass << ": " << a.algo_name << ", " << a.math << " math, workspace " << a.workspace_bytes << ", "
                     << a.how << " (rank " << a.rank << ")");
      CHECK(a.how != "fallback");  // cuDNN ranked some algorithm that qualifies
      if (limit == 0) CHECK((a.workspace_bytes == 0 || a.how == "least workspace, over the limit"));
    }
  }
}

TEST_CASE("cuda: relu, pooling") {
  compare_op("relu", [](const std::vector<Tensor>& in) { return relu(in[0]); },
             {test::away_from_zero(rand_tensor({9, 37}, 71, true))}, kStrict);
  compare_op("max_pool2d k3 s2 p1", [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 3, 2, 1); },
             {rand_tensor({3, 4, 15, 13}, 72, true)}, kStrict);
  compare_op("max_pool2d k2", [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 2); },
             {rand_tensor({2, 5, 11, 9}, 73, true)}, kStrict);
  compare_op("adaptive_avg_pool2d 13x11 -> 7x5",
             [](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], 7, 5); },
             {rand_tensor({2, 3, 13, 11}, 74, true)}, kStrict);
  compare_op("adaptive_avg_pool2d 5x4 -> 7x7 (windows overlap)",
             [](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], 7, 7); },
             {rand_tensor({2, 3, 5, 4}, 75, true)}, kStrict);
}

TEST_CASE("cuda: dropout masks are the same on both devices") {
  for (float p : {0.1f, 0.5f}) {
    Tensor x = rand_tensor({5, 1003}, 81, true);
    Tensor xg = to_gpu(x);
    Generator g1(77), g2(77);
    g1.advance(13);  // an offset that is not 0
    g2.advance(13);
    Tensor y = dropout(x, p, &g1), yg = dropout(xg, p, &g2);
    CHECK(test::bit_equal(yg.cpu(), y));
    Tensor probe = rand_tensor(y.shape(), 82);
    y.backward(probe);
    yg.backward(probe.to(kGpu));
    CHECK(test::bit_equal(xg.grad().cpu(), x.grad()));
  }
}

TEST_CASE("cuda: dropout kernels at offsets that are not a multiple of 4") {
  // Generator::advance keeps offsets block-aligned; a (seed, offset) set by hand need not be, and
  // then each element draws on its own (src/kernels/cuda/dropout_math.h dropout4).
  for (uint64_t offset : {uint64_t{13}, uint64_t{6}, (uint64_t{1} << 35) + 3}) {
    CAPTURE(offset);
    Tensor x = rand_tensor({3, 1001}, 83);
    Tensor y = poisoned({3, 1001}, Device::cpu()), yg = poisoned({3, 1001}, kGpu);
    dropout_forward<Cpu>(y, x, 0.3f, 99, offset);
    dropout_forward<Cuda>(yg, x.to(kGpu), 0.3f, 99, offset);
    CHECK(test::bit_equal(yg.cpu(), y));
    Tensor dx = poisoned({3, 1001}, Device::cpu()), dxg = poisoned({3, 1001}, kGpu);
    dropout_backward<Cpu>(dx, x, 0.3f, 99, offset);
    dropout_backward<Cuda>(dxg, x.to(kGpu), 0.3f, 99, offset);
    CHECK(test::bit_equal(dxg.cpu(), dx));
  }
}

TEST_CASE("cuda: cross-entropy, mean and sum, small and many classes") {
  for (Reduction r : {Reduction::mean, Reduction::sum}) {
    Tensor logits = rand_tensor({37, 11}, 91, true);
    Tensor t = labels(37, 11, 92);
    compare_op("cross_entropy 37x11",
               [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], r); }, {logits, t}, kStrict);
    Tensor wide = rand_tensor({9, 1000}, 93, true);
    compare_op("cross_entropy 9x1000", [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], r); },
               {wide, labels(9, 1000, 94)}, kStrict);
    // Logits in (-90, 90): exp overflows float without the max subtraction; 300 classes leave
    // threads of the 256-wide block with one and with two columns.
    std::vector<float> big = rand_tensor({13, 300}, 96).to_vector<float>();
    for (float& v : big) v *= 90.0f;
    Tensor large = Tensor::from_vector(big, {13, 300});
    large.requires_grad_();
    compare_op("cross_entropy 13x300, large logits",
               [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], r); },
               {large, labels(13, 300, 97)}, kStrict);
  }
}

TEST_CASE("cuda: an out-of-range target is reported at the next synchronisation") {
  Tensor logits = rand_tensor({4, 5}, 95).to(kGpu);
  Tensor t = Tensor::from_vector(std::vector<int64_t>{0, 7, 1, 2}, {4}).to(kGpu);
  Tensor loss = cross_entropy(logits, t);
  CHECK_THROWS_WITH_AS(loss.item(), doctest::Contains("target[1] = 7"), Error);
  // The flag is cleared: a good call works again.
  Tensor ok = cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{0, 4, 1, 2}, {4}).to(kGpu));
  CHECK(std::isfinite(ok.item()));
}

TEST_CASE("cuda: max-pool backward with overlapping windows is bit-identical to the CPU (no atomics)") {
  // 3x3 stride 2 padding 1: windows overlap, and few distinct values make inputs the argmax of
  // several windows, whose dy are then summed.
  Tensor x = Tensor::from_vector([] {
    std::vector<float> v(2 * 5 * 17 * 15);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7919) % 4);
    return v;
  }(), {2, 5, 17, 15});
  Tensor y = Tensor::empty({2, 5, 9, 8}), idx = Tensor::empty({2, 5, 9, 8}, TensorOptions{DType::i64});
  max_pool2d_forward<Cpu>(y, idx, x, 3, 2, 1, false);
  Tensor yg = Tensor::empty({2, 5, 9, 8}, TensorOptions{DType::f32, kGpu});
  Tensor idxg = Tensor::empty({2, 5, 9, 8}, TensorOptions{DType::i64, kGpu});
  max_pool2d_forward<Cuda>(yg, idxg, x.to(kGpu), 3, 2, 1, false);
  CHECK(idxg.to_vector<int64_t>() == idx.to_vector<int64_t>());
  Tensor dy = rand_tensor({2, 5, 9, 8}, 31);
  Tensor dx = poisoned({2, 5, 17, 15}, Device::cpu()), dxg = poisoned({2, 5, 17, 15}, kGpu);
  max_pool2d_backward<Cpu>(dx, dy, idx, 3, 2, 1, false);
  max_pool2d_backward<Cuda>(dxg, dy.to(kGpu), idxg, 3, 2, 1, false);
  CHECK(test::bit_equal(dxg.cpu(), dx));
}

TEST_CASE("cuda: conv2d backward is deterministic by default: the same bits run after run") {
  Tf32Conv off(false);
  const Tensor xc = rand_tensor({8, 16, 19, 17}, 41), wc = rand_tensor({32, 16, 3, 3}, 42), dyc = rand_tensor({8, 32, 19, 17}, 43);
  Tensor dxc = Tensor::empty(xc.shape()), dwc = Tensor::empty(wc.shape()), dbc = Tensor::empty({32});
  conv2d_backward<Cpu>(dxc, dwc, dbc, dyc, xc, wc, 1, 1, false, false);
  for (bool bench : {false, true}) {
    const CudnnBenchmark benchmark(bench);
    INFO("cudnn benchmark " << bench);
    const Tensor x = xc.to(kGpu), w = wc.to(kGpu), dy = dyc.to(kGpu);
    std::vector<std::vector<float>> runs;
    for (int r = 0; r < 3; ++r) {
      // NaN first: a run that wrote nothing cannot pass for one that wrote the same bits.
      Tensor dx = poisoned(x.shape(), kGpu), dw = poisoned(w.shape(), kGpu), db = poisoned({32}, kGpu);
      conv2d_backward<Cuda>(dx, dw, db, dy, x, w, 1, 1, false, false);
      if (r == 0) {
        CHECK(rel_err(dx, dxc) < kStrict);
        CHECK(rel_err(dw, dwc) < kStrict);
        CHECK(rel_err(db, dbc) < kStrict);
      }
      std::vector<float> all = dx.to_vector<float>(), vw = dw.to_vector<float>(), vb = db.to_vector<float>();
      all.insert(all.end(), vw.begin(), vw.end());
      all.insert(all.end(), vb.begin(), vb.end());
      runs.push_back(std::move(all));
    }
    CHECK(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)) == 0);
    CHECK(std::memcmp(runs[0].data(), runs[2].data(), runs[0].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("cuda: causal self-attention, GPT-2's heads of 64 (in tiles) and others (row kernels), with dropout") {
  struct Case {
    int64_t b, t, c;
    int heads;
  };
  // Heads of 64 take the tiles (Note [attention tiles] in attention.cu): T = 70 (two tiles) and
  // GPT-2's shape at T = 1024 (sixteen), without dropout there (the CPU's reference is slow).
  // D = 4 and D = 12 take the row kernels (rows read where they lie), with a T that is not a
  // multiple of 32, so that warps span two heads.
  for (const Case k : {Case{2, 70, 128, 2}, Case{3, 13, 12, 3}, Case{1, 33, 36, 3}, Case{1, 1024, 768, 12}}) {
    for (const float p : {0.0f, 0.2f}) {
      if (k.t == 1024 && p > 0.0f) continue;
      CAPTURE(k.c / k.heads);
      CAPTURE(p);
      Tensor qkv = rand_tensor({k.b, k.t, 3 * k.c}, 51, true);
      compare_op("causal_self_attention", [&](const std::vector<Tensor>& in) {
        Generator gen(5);  // the same mask on both devices
        return causal_self_attention(in[0], k.heads, p, &gen);
      }, {qkv}, kStrict);
    }
  }
}

TEST_CASE("cuda: attention's tiles write every element of y, lse and dqkv, as the CPU kernels") {
  // Heads of 64 at T = 200: four tiles, the last of 8 rows; the outputs NaN before the kernels run,
  // so a row or a slot the tiles leave unwritten fails.
  const int64_t b = 2, t = 200, c = 192;
  const int heads = 3;
  for (const float p : {0.0f, 0.2f}) {
    CAPTURE(p);
    const AttentionDropout drop{p, 5, 17, 0};
    const Tensor qkv = rand_tensor({b, t, 3 * c}, 81), dy = rand_tensor({b, t, c}, 82);
    Tensor y = poisoned({b, t, c}, Device::cpu()), lse = poisoned({b, heads, t}, Device::cpu()),
           dqkv = poisoned({b, t, 3 * c}, Device::cpu());
    attention_forward<Cpu>(y, lse, qkv, heads, drop);
    attention_backward<Cpu>(dqkv, dy, qkv, Tensor(), lse, heads, drop);
    Tensor yg = poisoned({b, t, c}, kGpu), lg = poisoned({b, heads, t}, kGpu), dg = poisoned({b, t, 3 * c}, kGpu);
    const Tensor qg = qkv.to(kGpu);
    attention_forward<Cuda>(yg, lg, qg, heads, drop);
    attention_backward<Cuda>(dg, dy.to(kGpu), qg, Tensor(), lg, heads, drop);
    CHECK(rel_err(yg, y) < kStrict);
    CHECK(rel_err(lg, lse) < kStrict);
    CHECK(rel_err(dg, dqkv) < kStrict);
    // Deterministic: the same bits again.
    Tensor dg2 = poisoned({b, t, 3 * c}, kGpu);
    attention_backward<Cuda>(dg2, dy.to(kGpu), qg, Tensor(), lg, heads, drop);
    CHECK(test::bit_equal(dg2.cpu(), dg.cpu()));
  }
}

TEST_CASE("cuda: attention's row kernels for heads of 64 (rows not 16-byte aligned) as the CPU kernels") {
  // qkv one float past an aligned block: the tiles' float4 reads cannot take it, so the row kernels
  // with their rows in registers run (Note [attention tiles]).
  const int64_t b = 2, t = 70, c = 128, n = b * t * 3 * c;
  const int heads = 2;
  const AttentionDropout drop{0.2f, 5, 17, 0};
  const Tensor qkv = rand_tensor({b, t, 3 * c}, 83), dy = rand_tensor({b, t, c}, 84);
  Tensor y = Tensor::empty({b, t, c}), lse = Tensor::empty({b, heads, t}), dqkv = Tensor::empty({b, t, 3 * c});
  attention_forward<Cpu>(y, lse, qkv, heads, drop);
  attention_backward<Cpu>(dqkv, dy, qkv, Tensor(), lse, heads, drop);
  Tensor qg = rows_view(Tensor::empty({n + 1}, TensorOptions{}.with_device(kGpu)), 1, n);
  qg.impl().shape = qkv.shape();
  qg.copy_(qkv);
  REQUIRE(reinterpret_cast<uintptr_t>(qg.data<float>()) % 16 != 0);
  Tensor yg = poisoned({b, t, c}, kGpu), lg = poisoned({b, heads, t}, kGpu), dg = poisoned({b, t, 3 * c}, kGpu);
  attention_forward<Cuda>(yg, lg, qg, heads, drop);
  attention_backward<Cuda>(dg, dy.to(kGpu), qg, Tensor(), lg, heads, drop);
  CHECK(rel_err(yg, y) < kStrict);
  CHECK(rel_err(lg, lse) < kStrict);
  CHECK(rel_err(dg, dqkv) < kStrict);
}

// ---- bf16/f16 attention: cuDNN's fused attention and the fallback -----------------------------
// docs/cuda.md, "Fused attention". cuDNN's SDPA rounds P to the operands' dtype before P V and its
// backward's dP and dS likewise, so against the float32 kernels on the same rounded inputs its y
// and dqkv differ by a few units of the dtype's rounding (bf16: 2^-8 = 3.9e-3): held to 2e-2 in
// the 2-norm (f16, 2^-11: 5e-3). lse is float32 on both and must agree closely (the same natural-log
// meaning; a base-2 Stats would be 1.44 times ours).
namespace {

constexpr double kBf16Attention = 2e-2, kF16Attention = 5e-3;

struct CudnnAttentionSwitch {
  bool old = cuda::cudnn_attention();
  explicit CudnnAttentionSwitch(bool on) { cuda::set_cudnn_attention(on); }
  ~CudnnAttentionSwitch() { cuda::set_cudnn_attention(old); }
};

Tensor uniform_on_gpu(const Shape& s, uint64_t seed, float bound, DType dtype) {
  Generator g(seed);
  return Tensor::uniform(s, -bound, bound, g).to(dtype).to(kGpu);
}

Tensor poisoned_as(const Shape& s, DType dtype) { return poisoned(s, kGpu).to(dtype); }

struct AttentionRun {
  Tensor y, lse, dqkv;
  bool wants_y = false;
};

// The kernels alone, forward then backward (given y where forward asks for it), outputs poisoned.
AttentionRun run_attention(const Tensor& qkv, const Tensor& dy, int heads, const AttentionDropout& drop = {}) {
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  AttentionRun r{poisoned_as({b, t, c}, qkv.dtype()), poisoned({b, heads, t}, kGpu),
                 poisoned_as({b, t, 3 * c}, qkv.dtype())};
  r.wants_y = attention_forward<Cuda>(r.y, r.lse, qkv, heads, drop);
  attention_backward<Cuda>(r.dqkv, dy, qkv, r.wants_y ? r.y : Tensor(), r.lse, heads, drop);
  return r;
}

double wide_err(const Tensor& got, const Tensor& want) { return rel_err(got.to(DType::f32), want.to(DType::f32)); }

// The 2-norm relative error of each of dq, dk and dv (a mix-up of the slots would hide in the whole).
std::array<double, 3> slot_errs(const Tensor& got, const Tensor& want) {
  const std::vector<float> g = got.to(DType::f32).to_vector<float>(), w = want.to(DType::f32).to_vector<float>();
  const int64_t c3 = got.size(2), c = c3 / 3;
  std::array<double, 3> num{}, den{}, out{};
  for (size_t i = 0; i < g.size(); ++i) {
    const auto part = static_cast<size_t>(static_cast<int64_t>(i) % c3 / c);
    num[part] += (static_cast<double>(g[i]) - w[i]) * (static_cast<double>(g[i]) - w[i]);
    den[part] += static_cast<double>(w[i]) * w[i];
  }
  for (size_t p = 0; p < 3; ++p) out[p] = std::sqrt(num[p]) / std::max(std::sqrt(den[p]), 1e-30);
  return out;
}

}  // namespace

TEST_CASE("cuda: bf16 attention at GPT-2's shapes through cuDNN's fused attention, against float32") {
  const CudnnAttentionSwitch on(true);
  const int heads = 12;
  const int64_t b = 2, c = 768;
  if (!cuda::sdpa_built())
    MESSAGE("this build has no cuDNN frontend: the bf16 fallback runs where cuDNN's fused attention would");
  for (const int64_t t : {128, 1024}) {
    CAPTURE(t);
    // Scores of about unit spread (q, k in [-2, 2)): some rows peaked, not all flat.
    const Tensor qkv = uniform_on_gpu({b, t, 3 * c}, 91, 2.0f, DType::bf16), dy = uniform_on_gpu({b, t, c}, 92, 1.0f, DType::bf16);
    const AttentionRun ref = run_attention(qkv.to(DType::f32), dy.to(DType::f32), heads);  // the same rounded values
    const cuda::SdpaCounts before = cuda::sdpa_counts();
    const AttentionRun got = run_attention(qkv, dy, heads);
    const cuda::SdpaCounts after = cuda::sdpa_counts();
    INFO("cuDNN's last refusal: " << cuda::sdpa_refusal());
    if (cuda::sdpa_built()) {
      CHECK(got.wants_y);
      CHECK(after.forward == before.forward + 1);
      CHECK(after.backward == before.backward + 1);
    }
    CHECK(got.y.dtype() == DType::bf16);
    CHECK(got.dqkv.dtype() == DType::bf16);
    const double ey = wide_err(got.y, ref.y), ed = wide_err(got.dqkv, ref.dqkv), dl = max_abs_diff(got.lse, ref.lse);
    const std::array<double, 3> slots = slot_errs(got.dqkv, ref.dqkv);
    MESSAGE("bf16 T " << t << (got.wants_y ? " cuDNN" : " fallback") << ": y rel err " << ey << ", dqkv " << ed
                      << " (dq " << slots[0] << ", dk " << slots[1] << ", dv " << slots[2] << "), lse max |diff| " << dl);
    CHECK(ey < kBf16Attention);
    CHECK(ed < kBf16Attention);
    for (const double e : slots) CHECK(e < kBf16Attention);
    CHECK(dl < 1e-3);
    // Deterministic backward (cuda::cudnn_deterministic(), the default): the same bits again.
    Tensor again = poisoned_as(got.dqkv.shape(), DType::bf16);
    attention_backward<Cuda>(again, dy, qkv, got.wants_y ? got.y : Tensor(), got.lse, heads, AttentionDropout{});
    CHECK(test::bit_equal(again, got.dqkv));
    // cuDNN's lse in our backward (as when cuDNN refuses only the backward graph): the float32
    // kernels' gradient on the same inputs, rounded.
    Tensor mixed = poisoned_as(got.dqkv.shape(), DType::bf16);
    attention_backward<Cuda>(mixed, dy, qkv, Tensor(), got.lse, heads, AttentionDropout{});
    CHECK(wide_err(mixed, ref.dqkv) < kBf16Attention);
  }
}

TEST_CASE("cuda: bf16 attention with cuDNN's fused attention off: the float32 kernels' bits, rounded") {
  // MG_CUDNN_ATTENTION=0 or cuda::set_cudnn_attention(false): widened copies through the float32
  // kernels (tiles for heads of 64), y and dqkv rounded once, lse float32.
  const CudnnAttentionSwitch off(false);
  const int heads = 12;
  const int64_t b = 2, c = 768;
  for (const int64_t t : {128, 1024}) {
    CAPTURE(t);
    const Tensor qkv = uniform_on_gpu({b, t, 3 * c}, 93, 2.0f, DType::bf16), dy = uniform_on_gpu({b, t, c}, 94, 1.0f, DType::bf16);
    const AttentionRun ref = run_attention(qkv.to(DType::f32), dy.to(DType::f32), heads);
    const cuda::SdpaCounts before = cuda::sdpa_counts();
    const AttentionRun got = run_attention(qkv, dy, heads);
    const cuda::SdpaCounts after = cuda::sdpa_counts();
    CHECK_FALSE(got.wants_y);
    CHECK(after.forward == before.forward);
    CHECK(after.backward == before.backward);
    CHECK(test::bit_equal(got.y, ref.y.to(DType::bf16)));
    CHECK(test::bit_equal(got.lse, ref.lse));
    CHECK(test::bit_equal(got.dqkv, ref.dqkv.to(DType::bf16)));
    CHECK(wide_err(got.y, ref.y) < kBf16Attention);
    CHECK(wide_err(got.dqkv, ref.dqkv) < kBf16Attention);
  }
}

TEST_CASE("cuda: causal_self_attention on bf16 and f16 through the tape, autocast and dropout") {
  const CudnnAttentionSwitch on(true);
  const int heads = 12;
  const int64_t b = 2, t = 128, c = 768;
  const Tensor probe = uniform_on_gpu({b, t, c}, 96, 1.0f, DType::f32);
  for (const auto& low_dtype : {std::pair{DType::bf16, kBf16Attention}, std::pair{DType::f16, kF16Attention}}) {
    const DType dtype = low_dtype.first;
    const double tol = low_dtype.second;
    CAPTURE(dtype_name(dtype));
    const Tensor low = uniform_on_gpu({b, t, 3 * c}, 95, 2.0f, dtype);
    Tensor wide = low.to(DType::f32).requires_grad_(), x = low.detach().requires_grad_();
    Tensor y32 = causal_self_attention(wide, heads);
    y32.backward(probe.to(dtype).to(DType::f32));
    const cuda::SdpaCounts before = cuda::sdpa_counts();
    Tensor y = causal_self_attention(x, heads);
    REQUIRE(y.dtype() == dtype);
    y.backward(probe.to(dtype));
    const cuda::SdpaCounts after = cuda::sdpa_counts();
    INFO("cuDNN's last refusal: " << cuda::sdpa_refusal());
    if (cuda::sdpa_built()) CHECK(after.backward == before.backward + 1);  // y was kept for it
    REQUIRE(x.grad().defined());
    CHECK(x.grad().dtype() == dtype);
    CHECK(wide_err(y, y32) < tol);
    CHECK(wide_err(x.grad(), wide.grad()) < tol);
  }
  // Autocast: a float32 qkv rounded to bf16 by the op's precision row; its gradient float32.
  {
    Tensor x = uniform_on_gpu({b, t, 3 * c}, 97, 2.0f, DType::bf16).to(DType::f32).requires_grad_();
    Tensor ref_x = x.detach().requires_grad_();
    Tensor y32 = causal_self_attention(ref_x, heads);
    y32.backward(probe.to(DType::bf16).to(DType::f32));
    Tensor y;
    {
      const AutocastGuard bf16(DType::bf16);
      y = causal_self_attention(x, heads);
    }
    CHECK(y.dtype() == DType::bf16);
    y.backward(probe.to(DType::bf16));
    REQUIRE(x.grad().defined());
    CHECK(x.grad().dtype() == DType::f32);
    CHECK(wide_err(y, y32) < kBf16Attention);
    CHECK(wide_err(x.grad(), ref_x.grad()) < kBf16Attention);
  }
  // Dropout on the probabilities: our mask, so our kernels on widened copies, the bits of float32 rounded.
  {
    const Tensor low = uniform_on_gpu({b, t, 3 * c}, 98, 2.0f, DType::bf16);
    Tensor wide = low.to(DType::f32).requires_grad_(), x = low.detach().requires_grad_();
    Generator g1(5), g2(5);
    Tensor y32 = causal_self_attention(wide, heads, 0.1f, &g1);
    y32.backward(probe.to(DType::bf16).to(DType::f32));
    const cuda::SdpaCounts before = cuda::sdpa_counts();
    Tensor y = causal_self_attention(x, heads, 0.1f, &g2);
    y.backward(probe.to(DType::bf16));
    const cuda::SdpaCounts after = cuda::sdpa_counts();
    CHECK(after.forward == before.forward);
    CHECK(after.backward == before.backward);
    CHECK(test::bit_equal(y, y32.to(DType::bf16)));
    CHECK(test::bit_equal(x.grad(), wide.grad().to(DType::bf16)));
  }
}

TEST_CASE("cuda: float32 attention never takes cuDNN's fused attention") {
  const CudnnAttentionSwitch on(true);
  const int heads = 2;
  const int64_t b = 2, t = 70, c = 128;
  const Tensor qkv = rand_tensor({b, t, 3 * c}, 99), dy = rand_tensor({b, t, c}, 100);
  Tensor y = Tensor::empty({b, t, c}), lse = Tensor::empty({b, heads, t}), dqkv = Tensor::empty({b, t, 3 * c});
  attention_forward<Cpu>(y, lse, qkv, heads, AttentionDropout{});
  attention_backward<Cpu>(dqkv, dy, qkv, Tensor(), lse, heads, AttentionDropout{});
  const cuda::SdpaCounts before = cuda::sdpa_counts();
  const AttentionRun got = run_attention(qkv.to(kGpu), dy.to(kGpu), heads);
  const cuda::SdpaCounts after = cuda::sdpa_counts();
  CHECK_FALSE(got.wants_y);
  CHECK(after.forward == before.forward);
  CHECK(after.backward == before.backward);
  CHECK(after.refused == before.refused);  // not even asked
  CHECK(got.y.dtype() == DType::f32);
  CHECK(rel_err(got.y, y) < kStrict);
  CHECK(rel_err(got.lse, lse) < kStrict);
  CHECK(rel_err(got.dqkv, dqkv) < kStrict);
}

TEST_CASE("cuda: embedding's backward sorts on the device: the CPU's bits, accumulating, GPT-2's vocabulary") {
  // Each row's positions added in increasing order on both devices: adds only, so the same bits.
  for (const int64_t v : {1, 7, 50257}) {
    for (const int64_t n : {0, 1, 4096}) {
      CAPTURE(v);
      CAPTURE(n);
      const int64_t c = 24;
      std::vector<int64_t> hidx(static_cast<size_t>(n));
      for (int64_t p = 0; p < n; ++p) hidx[static_cast<size_t>(p)] = (p * 7919 % 97) * (v / 97 + 1) % v;  // repeats
      const Tensor idx = Tensor::from_vector(hidx, {n}), dy = rand_tensor({n, c}, 71);
      for (const bool accumulate : {false, true}) {
        Tensor dw = rand_tensor({v, c}, 72), dwg = accumulate ? dw.to(kGpu) : poisoned({v, c}, kGpu);
        embedding_backward<Cpu>(dw, dy, idx, accumulate);
        embedding_backward<Cuda>(dwg, dy.to(kGpu), idx.to(kGpu), accumulate);
        CHECK(dwg.cpu().to_vector<float>() == dw.to_vector<float>());
      }
    }
  }
  // An index outside the table: flagged by the forward, raised at the next synchronisation,
  // naming the position; the flag is then cleared.
  Tensor w = rand_tensor({5, 3}, 73).to(kGpu);
  Tensor y = embedding(Tensor::from_vector(std::vector<int64_t>{0, 4, 5, 1}, {4}).to(kGpu), w);
  CHECK_THROWS_WITH_AS(y.cpu(), doctest::Contains("index[2] = 5"), Error);
  CHECK(embedding(Tensor::from_vector(std::vector<int64_t>{4}, {1}).to(kGpu), w).cpu().numel() == 3);
  // The backward's keys flag one too (the first met: either bad position), and leave the bad
  // positions out of every row: dw is the CPU's over the good positions.
  const Tensor dy = rand_tensor({5, 3}, 74);
  Tensor dwg = poisoned({5, 3}, kGpu);
  embedding_backward<Cuda>(dwg, dy.to(kGpu), Tensor::from_vector(std::vector<int64_t>{0, 4, -1, 5, 0}, {5}).to(kGpu),
                           false);
  CHECK_THROWS_WITH_AS(synchronize(kGpu), doctest::Contains("is not a row of the table"), Error);
  const std::vector<float> hdy = dy.to_vector<float>();
  std::vector<float> good_dy(hdy.begin(), hdy.begin() + 6);  // positions 0 and 1
  good_dy.insert(good_dy.end(), hdy.begin() + 12, hdy.end());  // position 4
  Tensor dw = Tensor::empty({5, 3});
  embedding_backward<Cpu>(dw, Tensor::from_vector(good_dy, {3, 3}), Tensor::from_vector(std::vector<int64_t>{0, 4, 0}, {3}),
                          false);
  CHECK(dwg.cpu().to_vector<float>() == dw.to_vector<float>());
  synchronize(kGpu);  // the flag was cleared
}

TEST_CASE("cuda: layer_norm over tiles of rows, columns not a multiple of 32, accumulating") {
  for (const int64_t c : {1, 45, 768}) {
    CAPTURE(c);
    Tensor x = rand_tensor({3, 100, c}, 61, true), w = rand_tensor({c}, 62, true), b = rand_tensor({c}, 63, true);
    compare_op("layer_norm", [](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b},
               kStrict);
    // dw and db added onto existing gradients (300 rows: three tiles, the last one short).
    const int64_t m = 300;
    Tensor xs = rand_tensor({m, c}, 64), dy = rand_tensor({m, c}, 65), ws = rand_tensor({c}, 66);
    Tensor y = Tensor::empty({m, c}), mean = Tensor::empty({m}), rstd = Tensor::empty({m});
    layer_norm_forward<Cpu>(y, mean, rstd, xs, ws, Tensor(), 1e-5f);
    Tensor dx = Tensor::empty({m, c}), dw = rand_tensor({c}, 67), db = rand_tensor({c}, 68);
    Tensor dxg = poisoned({m, c}, kGpu), dwg = dw.to(kGpu), dbg = db.to(kGpu);
    layer_norm_backward<Cpu>(dx, dw, db, dy, xs, ws, mean, rstd, /*accumulate=*/true);
    layer_norm_backward<Cuda>(dxg, dwg, dbg, dy.to(kGpu), xs.to(kGpu), ws.to(kGpu), mean.to(kGpu), rstd.to(kGpu),
                              /*accumulate=*/true);
    CHECK(rel_err(dxg, dx) < kStrict);
    CHECK(rel_err(dwg, dw) < kStrict);
    CHECK(rel_err(dbg, db) < kStrict);
    // dx added onto a gradient already there (Note [adding into pending gradients]), float32 and
    // bf16: the CPU's sum within the tolerance.
    for (const DType dt : {DType::f32, DType::bf16}) {
      CAPTURE(dtype_name(dt));
      const Tensor pending = rand_tensor({m, c}, 69).to(dt);
      Tensor sum = pending.clone(), sumg = pending.to(kGpu), none;
      layer_norm_backward<Cpu>(sum, none, none, dy, xs, ws, mean, rstd, false, /*add_dx=*/true);
      layer_norm_backward<Cuda>(sumg, none, none, dy.to(kGpu), xs.to(kGpu), ws.to(kGpu), mean.to(kGpu), rstd.to(kGpu),
                                false, /*add_dx=*/true);
      CHECK(rel_err(sumg.to(DType::f32), sum.to(DType::f32)) < (dt == DType::f32 ? kStrict : 2e-2));
      if (c > 1) CHECK(rel_err(sum.to(DType::f32), pending.to(DType::f32)) > 1e-3);  // something was added (xhat = 0 at c = 1)
    }
  }
}

TEST_CASE("cuda: the profiler times CUDA ops by events on the device's stream") {
  Tensor x = rand_tensor({64, 128}, 71).to(kGpu), w = rand_tensor({256, 128}, 72).to(kGpu);
  w.requires_grad_();
  profiler::start();
  for (int i = 0; i < 3; ++i) linear(x, w).backward(Tensor::ones({64, 256}, TensorOptions{}.with_device(kGpu)));
  profiler::stop();
  const std::vector<profiler::Row> rows = profiler::report();
  int found = 0;
  for (const profiler::Row& r : rows) {
    if (r.name != "linear") continue;
    CAPTURE(r.pass);
    CHECK(r.device == "cuda:0");
    CHECK(r.calls == 3);
    CHECK(r.ms > 0.0);
    ++found;
  }
  CHECK(found == 2);  // forward and backward
}


// Note [fused residual layer_norm]: one pass on the GPU gives the bits of add then layer_norm
// there, forward and backward, float32 and bf16 (a and b of one dtype: the fused kernel runs); and
// Note [adding into pending gradients]: layer_norm's dx added onto the residual stream's gradient
// gives the bits of a separate dx added in (a product after the block, so that the stream's
// gradient is backward's own and the add path is taken: one allocation fewer).
TEST_CASE("cuda: add_layer_norm and dx added into the pending gradient give the unfused bits") {
  const int64_t c = 768;
  struct Restore {
    ~Restore() { set_add_into_pending(true); }
  } restore;
  for (const DType dt : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dt));
    auto run = [&](bool fused, bool add_into, uint64_t* allocs) {
      set_add_into_pending(add_into);
      std::vector<Tensor> in{rand_tensor({4, 33, c}, 91).to(kGpu).to(dt), rand_tensor({4, 33, c}, 92).to(kGpu).to(dt),
                             rand_tensor({c}, 93).to(kGpu), rand_tensor({c}, 94).to(kGpu)};
      for (Tensor& t : in) t.requires_grad_();
      profiler::start();
      Tensor s, y;
      if (fused) {
        std::tie(s, y) = add_layer_norm(in[0], in[1], in[2], in[3]);
      } else {
        s = add(in[0], in[1]);
        y = layer_norm(s, in[2], in[3]);
      }
      profiler::stop();
      const std::vector<profiler::Row> rows = profiler::report();
      CHECK(std::count_if(rows.begin(), rows.end(), [](const profiler::Row& r) { return r.name == "add+layer_norm"; }) ==
            (fused ? 1 : 0));
      const Tensor out = mul(add(s, scale(y, 2.0f)), rand_tensor({4, 33, c}, 95).to(kGpu).to(y.dtype()));
      const Tensor ones = Tensor::ones({4, 33, c}, TensorOptions{}.with_device(kGpu)).to(y.dtype());
      const uint64_t before = memory_stats(kGpu).alloc_count;
      out.backward(ones);
      *allocs = memory_stats(kGpu).alloc_count - before;
      std::vector<std::vector<float>> res{s.cpu().to(DType::f32).to_vector<float>(), y.cpu().to(DType::f32).to_vector<float>()};
      for (const Tensor& t : in) res.push_back(t.grad().cpu().to(DType::f32).to_vector<float>());
      return res;
    };
    uint64_t a_off = 0, a_on = 0, a_fused = 0;
    const auto plain = run(false, false, &a_off), added = run(false, true, &a_on), fused = run(true, true, &a_fused);
    MESSAGE("backward allocations: " << a_off << " apart, " << a_on << " adding into the pending gradient");
    CHECK(a_on < a_off);
    for (size_t i = 0; i < plain.size(); ++i) {
      CAPTURE(i);
      CHECK(added[i] == plain[i]);
      CHECK(fused[i] == plain[i]);
    }
  }
}

#endif  // MINIGRAD_WITH_CUDA
