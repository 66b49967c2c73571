// The op-indexed test (ggml's test-backend-ops): every op of the op table (mg::all_ops(),
// src/ops/op.h) on every one of its cases, odd shapes chosen by the op's author. An op added to
// the table is picked up here without touching this file. MG_OPS=gelu,conv2d checks only those;
// each op runs in a doctest subcase of its own. `test_ops --list` prints every registered op with
// its cases and its files (src/ops/, the kernel header and its CPU and CUDA implementations).
//
// 1. Finite-difference gradient check, on the CPU. L = sum(y * r) for a fixed random r; the tape
//    gives dL/dx by a backward with dL/dy = r, and each element of each input with `grad` is
//    compared with the central difference (L(x + h) - L(x - h)) / (2h). No op has a float64
//    kernel (every kernel is float32), so "in double where the op allows" means this: y comes
//    from the float32 forward, while r, L, the difference and its divisor (the step actually
//    taken, after x +/- h was rounded to float) are all formed in double.
//
//    Step: h = min(1e-2, spacing / 4), where spacing is the smallest gap between two values of
//    the input (and zero lies farther away still, see distinct_values): x +/- h never crosses
//    relu's kink or changes the winner of a max-pool window. Smaller h only adds noise.
//
//    Tolerance, per element: |numeric - analytic| <= kRtol * |analytic| + floor, kRtol = 1e-2.
//    The floor is the float32 resolution of the difference itself, not a fudge factor: each of
//    L(x + h) and L(x - h) carries the forward's rounding, kUlps float32 epsilons of each output
//    that depends on x_i (those that the step, or a probe move of x_i by kProbe, changed),
//    weighted by |r|; divided by the step, that is what the difference cannot resolve. Outputs
//    that do not depend on x_i come out bit-identical on both sides and cancel exactly. Every
//    element of every checked input is checked (the cases are small), and each op prints how
//    many of its elements the relative tolerance decided and how many only the floor: where a
//    gradient is tiny next to the loss, float32 cannot resolve it by finite differences at any
//    step, and the floor says so (cross_entropy over 300 classes: 1/300 of a loss of ~17, none
//    resolved; its sum-reduced case therefore has 40 classes).
//
//    Note [large op cases]
//    ~~~~~~~~~~~~~~~~~~~~~~
//    Besides its small cases, every op has a large one (asserted below): an input of at least
//    kLargeElements elements, an odd count, so that a CUDA kernel runs many blocks and a partial
//    last one, and a 4-wide vector loop its tail. On the CPU its gradient is checked like the
//    small cases' against the same float64 differences, at kSampledElements elements (the first
//    and last few, the rest spread at random) instead of all of them; on CUDA it is compared with
//    the CPU in full (2. below).
//
// 2. CUDA against CPU, when a GPU is present: the same inputs on both devices; the output and
//    the gradient of every checked input (backward with the same r) must agree per element to
//    kCudaTol = 1e-5 of the largest magnitude of the CPU tensor. Strict FP32 on the device for
//    the whole comparison (TF32 off for matmuls and convolutions, Note [cuda math modes] in
//    minigrad/cuda.h): TF32 results and more GEMM shapes are in test_cuda_ops. Without a GPU this
//    part says so and passes; the gradient check still runs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <minigrad/cuda.h>

#include <doctest/doctest.h>
#include <minigrad/minigrad.h>

#include "helpers.h"
#include "kernels/cpu/half_rows.h"
#include "ops/op.h"

using namespace mg;

namespace {

constexpr double kMaxStep = 1e-2;
constexpr double kStepsPerGap = 4;
constexpr double kRtol = 1e-2;
constexpr double kUlps = 4;  // rounding of one float32 forward output, in units of its value
constexpr double kEps32 = std::numeric_limits<float>::epsilon();
constexpr float kProbe = 1.0f;  // a move far larger than h, to find the outputs x_i reaches
constexpr double kCudaTol = 1e-5;
constexpr int64_t kLargeElements = 2048;    // Note [large op cases]
constexpr int64_t kFullCheckElements = 1024;  // inputs larger than this are checked at samples
constexpr int64_t kSampledElements = 48;

// Where a number came from, for failure messages: "conv2d case 1 input 0".
std::string where(const OpDef& op, size_t case_index, const char* what, size_t input = SIZE_MAX) {
  std::ostringstream s;
  s << op.name << " case " << case_index << " " << what;
  if (input != SIZE_MAX) s << " " << input;
  return s.str();
}

// "element 17 [0, 1, 2, 3]": the flat index and the multi-index in a tensor of shape s.
std::string element_str(const Shape& s, int64_t flat) {
  Shape idx(s.size());
  int64_t rest = flat;
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = rest % s[d];
    rest /= s[d];
  }
  return "element " + std::to_string(flat) + " " + shape_str(idx);
}

uint64_t name_hash(const char* name) {  // FNV-1a: the same seeds on every platform
  uint64_t h = 1469598103934665603ull;
  for (const char* c = name; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  return h;
}

// n distinct float32 values +/-(0.25 + k d), k < m = ceil(n / 2), d = 1 / m, shuffled: magnitudes
// in [0.25, 1.25), none within 0.25 of zero, no two within `spacing` = min(d, 0.5) of each other.
std::vector<float> distinct_values(int64_t n, std::mt19937_64& rng, double* spacing) {
  const int64_t m = (n + 1) / 2;
  const double d = 1.0 / static_cast<double>(std::max<int64_t>(m, 1));
  std::vector<float> v;
  for (int64_t k = 0; k < m; ++k) {
    const float mag = static_cast<float>(0.25 + static_cast<double>(k) * d);
    v.push_back(mag);
    v.push_back(-mag);
  }
  std::shuffle(v.begin(), v.end(), rng);
  v.resize(static_cast<size_t>(n));
  *spacing = std::min(d, 0.5);
  return v;
}

// The inputs of one case on the CPU, as src/ops/op.h describes them, and the finite-difference
// step of each checked one (0 for the others).
struct CaseInputs {
  std::vector<Tensor> tensors;
  std::vector<double> step;
};

CaseInputs make_inputs(const OpDef& op, size_t case_index, const OpCase& c) {
  CaseInputs in;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    const TestInput& ti = c.inputs[k];
    std::mt19937_64 rng(name_hash(op.name) + 1000 * case_index + k);
    const int64_t n = shape_numel(ti.shape);
    Tensor t;
    double step = 0;
    if (ti.kind == TestInput::real) {
      double spacing = 0;
      t = Tensor::from_vector(distinct_values(n, rng, &spacing), ti.shape);
      if (ti.grad) {
        t.requires_grad_();
        step = std::min(kMaxStep, spacing / kStepsPerGap);
      }
    } else if (ti.kind == TestInput::index) {
      REQUIRE_MESSAGE(ti.classes > 0, where(op, case_index, "input", k) << ": index input without classes");
      std::vector<int64_t> v(static_cast<size_t>(n));
      for (int64_t& e : v) e = static_cast<int64_t>(rng() % static_cast<uint64_t>(ti.classes));
      t = Tensor::from_vector(v, ti.shape);
    }
    in.tensors.push_back(t);
    in.step.push_back(step);
  }
  return in;
}

// The fixed weights r of L = sum(y * r): +/-[0.5, 1.5), float32 values held in double, so the
// backward (float32 r) and L (double r) use the same numbers.
std::vector<double> make_r(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.5, 1.5);
  std::vector<double> r(static_cast<size_t>(n));
  for (double& e : r) e = static_cast<float>((rng() & 1 ? 1.0 : -1.0) * u(rng));
  return r;
}

Tensor r_tensor(const std::vector<double>& r, const Shape& s) {
  return Tensor::from_vector(std::vector<float>(r.begin(), r.end()), s);
}

std::vector<float> forward_values(const OpDef& op, const OpAttrs& a, const std::vector<Tensor>& in) {
  NoGradGuard no_grad;
  return apply(op, a, in).to_vector<float>();
}

double loss(const std::vector<float>& y, const std::vector<double>& r) {
  double s = 0;
  for (size_t j = 0; j < y.size(); ++j) s += static_cast<double>(y[j]) * r[j];
  return s;
}

struct Worst {
  double err = 0;
  int64_t element = -1;
  int64_t failures = 0;
  double numeric = 0, analytic = 0, floor = 0;
};

// How much of an op the check resolved, printed per op so that the tolerance's margin shows:
// `resolved` elements have a floor below kRtol |analytic| (the relative tolerance decides);
// at `floor_bound` ones the float32 floor is larger than that, so they are checked only to it;
// `zero` ones have an analytic gradient of exactly 0 (numeric must then be within the floor).
struct OpStats {
  double worst = 0, worst_resolved = 0, worst_floor_bound = 0;
  int64_t elements = 0, resolved = 0, floor_bound = 0, zero = 0;

  void add(double diff, double analytic, double floor) {
    ++elements;
    const double rel = diff / std::abs(analytic);
    if (analytic == 0) {
      ++zero;
    } else if (floor <= kRtol * std::abs(analytic)) {
      ++resolved;
      worst_resolved = std::max(worst_resolved, rel);
    } else {
      ++floor_bound;
      worst_floor_bound = std::max(worst_floor_bound, rel);
    }
  }
  void print(const char* op) const {
    std::printf("test_ops: %-20s worst %.1e of %.0e | %4lld elements: %4lld resolved, worst |diff|/|analytic| "
                "%.1e; %4lld to the float32 floor only, worst %.1e; %4lld zero\n",
                op, worst, kRtol, static_cast<long long>(elements), static_cast<long long>(resolved),
                worst_resolved, static_cast<long long>(floor_bound), worst_floor_bound,
                static_cast<long long>(zero));
  }
};

// The elements of an input of n that the gradient check visits: all of them, or for a large
// input (Note [large op cases]) the first and last 8 and the rest at random, in increasing order.
std::vector<int64_t> checked_elements(int64_t n, uint64_t seed) {
  std::vector<int64_t> idx;
  if (n <= kFullCheckElements) {
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    return idx;
  }
  for (int64_t i = 0; i < 8; ++i) idx.push_back(i), idx.push_back(n - 1 - i);
  std::mt19937_64 rng(seed);
  while (static_cast<int64_t>(idx.size()) < kSampledElements) {
    const int64_t i = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
    if (std::find(idx.begin(), idx.end(), i) == idx.end()) idx.push_back(i);
  }
  std::sort(idx.begin(), idx.end());
  return idx;
}

// Compares the tape's gradient of input k (already computed by a backward with dL/dy = r) with
// central differences of L = sum(y * r), element by element; y0 is the unperturbed output.
void check_gradient(const OpDef& op, size_t ci, const OpAttrs& attrs, CaseInputs& in, size_t k,
                    const std::vector<double>& r, const std::vector<float>& y0, OpStats& st) {
  Tensor& x = in.tensors[k];
  const std::string what = where(op, ci, "input", k);
  REQUIRE_MESSAGE(x.grad().defined(), what << ": backward left no gradient");
  REQUIRE_MESSAGE(x.grad().shape() == x.shape(), what << ": gradient shape " << shape_str(x.grad().shape()));
  const std::vector<float> analytic = x.grad().to_vector<float>();
  float* data = x.data<float>();
  const float h = static_cast<float>(in.step[k]);
  Worst worst;
  const std::vector<int64_t> elements = checked_elements(x.numel(), name_hash(op.name) + 31 * ci + k);
  for (const int64_t i : elements) {
    const float orig = data[i];
    const float xp = orig + h, xm = orig - h;
    data[i] = xp;
    const std::vector<float> yp = forward_values(op, attrs, in.tensors);
    data[i] = xm;
    const std::vector<float> ym = forward_values(op, attrs, in.tensors);
    data[i] = orig + kProbe;
    const std::vector<float> probe = forward_values(op, attrs, in.tensors);
    data[i] = orig;
    const double step = static_cast<double>(xp) - static_cast<double>(xm);
    const double numeric = (loss(yp, r) - loss(ym, r)) / step;
    // Sum of |r_j y_j| over the outputs that depend on x_i: those the step or the probe moved.
    double dependent = 0;
    for (size_t j = 0; j < y0.size(); ++j) {
      if (yp[j] != y0[j] || ym[j] != y0[j] || probe[j] != y0[j]) {
        dependent += std::abs(r[j]) * std::max({std::abs(yp[j]), std::abs(ym[j]), std::abs(y0[j])});
      }
    }
    const double floor = 2 * kUlps * kEps32 * dependent / step;
    const double a = analytic[static_cast<size_t>(i)];
    const double diff = std::abs(numeric - a);
    const double err = diff == 0 ? 0 : diff / (std::abs(a) + floor / kRtol);
    if (!(err <= kRtol)) ++worst.failures;
    if (!(err <= worst.err)) worst = {err, i, worst.failures, numeric, a, floor};  // NaN is the worst
    st.add(diff, a, floor);
  }
  CHECK_MESSAGE(worst.err <= kRtol,
                what << " " << shape_str(x.shape()) << ", " << element_str(x.shape(), worst.element)
                     << ": numeric " << worst.numeric << ", analytic " << worst.analytic << ", |diff| = "
                     << std::abs(worst.numeric - worst.analytic) << " > " << kRtol << " * |analytic| + "
                     << worst.floor << " (float32 floor); " << worst.failures << " of " << elements.size()
                     << " checked elements out of tolerance");
  st.worst = std::max(st.worst, worst.err);
}

// Restores the CUDA math switches at scope exit.
struct StrictFp32 {
  bool matmul = cuda::tf32_matmul(), conv = cuda::tf32_conv();
  StrictFp32() {
    cuda::set_tf32_matmul(false);
    cuda::set_tf32_conv(false);
  }
  ~StrictFp32() {
    cuda::set_tf32_matmul(matmul);
    cuda::set_tf32_conv(conv);
  }
};

// Per element |got - want| <= tol * max |want|.
void check_close(const Tensor& got, const Tensor& want, const std::string& what, double tol = kCudaTol) {
  REQUIRE_MESSAGE(got.shape() == want.shape(), what << ": shape " << shape_str(got.shape()) << ", expected "
                                                    << shape_str(want.shape()));
  const std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
  double scale = 0;
  for (float e : w) scale = std::max(scale, std::abs(static_cast<double>(e)));
  scale = std::max(scale, 1e-30);
  Worst worst;
  worst.element = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double err = std::abs(static_cast<double>(g[i]) - w[i]) / scale;
    if (!(err <= tol)) ++worst.failures;
    if (!(err <= worst.err)) {  // NaN counts as the worst
      worst.err = err;
      worst.element = static_cast<int64_t>(i);
    }
  }
  CHECK_MESSAGE(worst.err <= tol,
                what << ", " << element_str(want.shape(), worst.element) << ": cuda "
                     << g[static_cast<size_t>(worst.element)] << ", cpu " << w[static_cast<size_t>(worst.element)]
                     << ", |diff| / max |cpu| = " << worst.err << " > " << tol << " (" << worst.failures
                     << " of " << w.size() << " elements out of tolerance)");
}

// The ops this run checks: every registered one, or those MG_OPS names ("gelu,conv2d"), each
// checked in a doctest subcase of its own (one failing op does not hide the others).
std::vector<const OpDef*> selected_ops() {
  const char* env = std::getenv("MG_OPS");
  if (env == nullptr || *env == 0) return {all_ops().begin(), all_ops().end()};
  std::vector<const OpDef*> ops;
  std::stringstream names(env);
  for (std::string name; std::getline(names, name, ',');) {
    const OpDef* op = find_op(name);
    if (op == nullptr) {
      std::string known;
      for (const OpDef* o : all_ops()) known += std::string(known.empty() ? "" : ", ") + o->name;
      FAIL("MG_OPS names '" << name << "', which is not a registered op (" << known << ")");
    }
    ops.push_back(op);
  }
  return ops;
}

// The files of an op: the src/ops/*.cpp that defines it (an OpDef whose name is op.name), then
// the kernel files of the same base name that exist (STYLE.md: one op, one name, everywhere).
std::vector<std::string> op_files(const OpDef& op) {
  namespace fs = std::filesystem;
  const fs::path root(MG_SOURCE_DIR);
  std::vector<fs::path> sources;
  for (const auto& entry : fs::directory_iterator(root / "src/ops")) {
    if (entry.path().extension() == ".cpp") sources.push_back(entry.path());
  }
  std::sort(sources.begin(), sources.end());
  const std::string def = std::string("{\"") + op.name + "\",";
  std::vector<std::string> files;
  for (const fs::path& p : sources) {
    std::ifstream f(p);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t at = text.find(def);
    if (at == std::string::npos || text.rfind("OpDef", at) == std::string::npos) continue;
    const std::string base = p.stem().string();
    files.push_back("src/ops/" + base + ".cpp");
    for (const std::string rel : {"src/kernels/" + base + ".h", "src/kernels/cpu/" + base + ".cpp",
                                  "src/kernels/cuda/" + base + ".cu", "src/kernels/cuda/" + base + "_math.h"}) {
      if (fs::exists(root / rel)) files.push_back(rel);
    }
    break;
  }
  return files;
}

}  // namespace

// test_ops --list: one line per registered op, its cases (inputs' shapes) and its files.
int mg::test::own_options(int argc, char** argv) {
  bool list = false;
  for (int i = 1; i < argc; ++i) list |= std::string(argv[i]) == "--list";
  if (!list) return -1;
  for (const OpDef* op : all_ops()) {
    const std::vector<OpCase> cases = op->cases();
    std::printf("%-20s %zu case%s:", op->name, cases.size(), cases.size() == 1 ? "" : "s");
    for (const OpCase& c : cases) {
      std::string shapes;
      for (const TestInput& ti : c.inputs) {
        shapes += (shapes.empty() ? "" : " ") + (ti.kind == TestInput::none ? std::string("-") : shape_str(ti.shape));
      }
      std::printf(" (%s)", shapes.c_str());
    }
    std::printf("\n");
    std::string files;
    for (const std::string& f : op_files(*op)) files += (files.empty() ? "" : " ") + f;
    std::printf("%-20s %s\n", "", files.empty() ? "(no OpDef of this name in src/ops/*.cpp)" : files.c_str());
  }
  return 0;
}

TEST_CASE("ops: every op in the sources is registered, each with cases that check something") {
  // The registrations the sources make (no hand-kept list): one MG_REGISTER_OP per op definition
  // in src/ops/*.cpp, and as many ops in the registry.
  int64_t in_sources = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(MG_SOURCE_DIR) + "/src/ops")) {
    if (entry.path().extension() != ".cpp") continue;
    std::ifstream f(entry.path());
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (size_t at = text.find("MG_REGISTER_OP("); at != std::string::npos; at = text.find("MG_REGISTER_OP(", at + 1)) {
      ++in_sources;
    }
  }
  CHECK(in_sources == static_cast<int64_t>(all_ops().size()));
  MESSAGE(all_ops().size() << " ops registered, " << in_sources << " registrations in src/ops/*.cpp");
  for (const OpDef* op : all_ops()) {
    INFO("op " << op->name);
    const bool has_cases_fn = op->cases != nullptr;
    REQUIRE_MESSAGE(has_cases_fn, op->name << " has no cases function");
    const std::vector<OpCase> cases = op->cases();
    CHECK_MESSAGE(!cases.empty(), op->name << " has no test cases");
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      int64_t checked = 0;
      for (const TestInput& ti : cases[ci].inputs) {
        if (ti.kind == TestInput::real && ti.grad) checked += shape_numel(ti.shape);
      }
      CHECK_MESSAGE(checked > 0, where(*op, ci, "has no real input with grad: its gradient check is empty"));
    }
    bool large = false;  // Note [large op cases]
    for (const OpCase& c : cases) {
      for (const TestInput& ti : c.inputs) {
        const int64_t n = shape_numel(ti.shape);
        large |= ti.kind == TestInput::real && n >= kLargeElements && n % 2 == 1;
      }
    }
    CHECK_MESSAGE(large, op->name << " has no large case: a real input of at least " << kLargeElements
                                  << " elements, an odd number (Note [large op cases])");
  }
}

TEST_CASE("ops: finite-difference gradient check of every op and case") {
  for (const OpDef* op : selected_ops()) {
    SUBCASE(op->name) {
    const std::vector<OpCase> cases = op->cases();
    OpStats st;
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const OpCase& c = cases[ci];
      CaseInputs in = make_inputs(*op, ci, c);
      Tensor y = apply(*op, c.attrs, in.tensors);
      REQUIRE_MESSAGE(y.requires_grad(), where(*op, ci, "output was not recorded"));
      const std::vector<double> r = make_r(y.numel(), name_hash(op->name) + 7 * ci + 1);
      const std::vector<float> y0 = y.to_vector<float>();
      y.backward(r_tensor(r, y.shape()));
      for (size_t k = 0; k < in.tensors.size(); ++k) {
        if (in.step[k] != 0) check_gradient(*op, ci, c.attrs, in, k, r, y0, st);
      }
    }
    CHECK_MESSAGE(st.elements > 0, op->name << ": no element was checked");
    st.print(op->name);
    }
  }
}

TEST_CASE("ops: CUDA against CPU, every op and case") {
  if (!cuda_available()) {
    if (test::gpu_required()) FAIL("MG_REQUIRE_GPU=1, but " << cuda_unavailable_reason());
    MESSAGE("no CUDA device (" << cuda_unavailable_reason() << "): CUDA against CPU not run (the gradient check ran on the CPU)");
    return;
  }
  StrictFp32 strict;
  const Device gpu = Device::cuda(0);
  for (const OpDef* op : selected_ops()) {
    SUBCASE(op->name) {
    const std::vector<OpCase> cases = op->cases();
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const OpCase& c = cases[ci];
      CaseInputs cpu = make_inputs(*op, ci, c);
      std::vector<Tensor> dev;
      for (const Tensor& t : cpu.tensors) {
        Tensor d = t.defined() ? t.to(gpu) : Tensor();
        if (t.defined() && t.requires_grad()) d.requires_grad_();
        dev.push_back(d);
      }
      Tensor y_cpu = apply(*op, c.attrs, cpu.tensors), y_dev = apply(*op, c.attrs, dev);
      REQUIRE_MESSAGE(y_dev.is_cuda(), where(*op, ci, "output is not on the device"));
      check_close(y_dev.cpu(), y_cpu, where(*op, ci, "output"));

      const Tensor r = r_tensor(make_r(y_cpu.numel(), name_hash(op->name) + 7 * ci + 1), y_cpu.shape());
      y_cpu.backward(r);
      y_dev.backward(r.to(gpu));
      for (size_t k = 0; k < dev.size(); ++k) {
        if (cpu.step[k] == 0) continue;
        const std::string what = where(*op, ci, "gradient of input", k);
        REQUIRE_MESSAGE(dev[k].grad().defined(), what << ": none on the device");
        REQUIRE_MESSAGE(dev[k].grad().is_cuda(), what << ": not on the device");
        check_close(dev[k].grad().cpu(), cpu.tensors[k].grad(), what);
      }
    }
    }
  }
}

// The same on bf16 and f16 inputs (Note [cuda half kernels] in src/kernels/cuda/storage.cuh): the
// output and every gradient in the CPU's dtype, and per element within two units of the dtype's
// rounding of max |cpu|. Both devices sum in float32, in their own orders, and round once, so an
// element may round the other way: one unit, at most half of max |cpu| away from the exact sum.
TEST_CASE("ops: CUDA against CPU in bf16 and f16, every op and case") {
  if (!cuda_available()) {
    if (test::gpu_required()) FAIL("MG_REQUIRE_GPU=1, but " << cuda_unavailable_reason());
    MESSAGE("no CUDA device (" << cuda_unavailable_reason() << "): bf16 and f16 CUDA against CPU not run");
    return;
  }
  StrictFp32 strict;  // the float32 products of ops that widen their inputs
  const Device gpu = Device::cuda(0);
  for (const auto& [dtype, tol] : {std::pair{DType::bf16, 0x1p-7}, std::pair{DType::f16, 0x1p-10}}) {
    for (const OpDef* op : selected_ops()) {
      SUBCASE((std::string(dtype_name(dtype)) + " " + op->name).c_str()) {
      const std::vector<OpCase> cases = op->cases();
      for (size_t ci = 0; ci < cases.size(); ++ci) {
        const OpCase& c = cases[ci];
        CaseInputs in = make_inputs(*op, ci, c);
        std::vector<Tensor> cpu, dev;
        for (size_t k = 0; k < in.tensors.size(); ++k) {
          const Tensor& t = in.tensors[k];
          const bool real = t.defined() && is_floating(t.dtype());
          const Tensor low = real ? t.detach().to(dtype) : t;
          cpu.push_back(real ? low.detach().requires_grad_(in.step[k] != 0) : low);
          dev.push_back(!t.defined() ? Tensor() : real ? low.to(gpu).requires_grad_(in.step[k] != 0) : low.to(gpu));
        }
        const std::string name = std::string(dtype_name(dtype)) + " ";
        Tensor y_cpu = apply(*op, c.attrs, cpu), y_dev = apply(*op, c.attrs, dev);
        REQUIRE_MESSAGE(y_dev.is_cuda(), name << where(*op, ci, "output is not on the device"));
        CHECK_MESSAGE(y_dev.dtype() == y_cpu.dtype(), name << where(*op, ci, "output") << " is "
                                                           << dtype_name(y_dev.dtype()) << " on CUDA, "
                                                           << dtype_name(y_cpu.dtype()) << " on the CPU");
        check_close(y_dev.cpu(), y_cpu, name + where(*op, ci, "output"), tol);

        const Tensor r = r_tensor(make_r(y_cpu.numel(), name_hash(op->name) + 7 * ci + 1), y_cpu.shape()).to(y_cpu.dtype());
        y_cpu.backward(r);
        y_dev.backward(r.to(gpu));
        for (size_t k = 0; k < dev.size(); ++k) {
          if (in.step[k] == 0) continue;
          const std::string what = name + where(*op, ci, "gradient of input", k);
          REQUIRE_MESSAGE(dev[k].grad().defined(), what << ": none on the device");
          CHECK_MESSAGE(dev[k].grad().dtype() == cpu[k].grad().dtype(), what << " is " << dtype_name(dev[k].grad().dtype()));
          check_close(dev[k].grad().cpu(), cpu[k].grad(), what, tol);
        }
      }
      }
    }
  }
}

// Note [autocast]: every op takes bfloat16 and float16 inputs (widened on load, its output and the
// gradients rounded on store). Its output and every input's gradient against the float32 run of
// the same case: per element within tol * max |float32|, tol a few units of the dtype's rounding
// (2^-8 for bf16, 2^-11 for f16) over the case's rounding steps.
TEST_CASE("ops: every op and case in bf16 and f16 against float32") {
  for (const auto& [dtype, tol] : {std::pair{DType::bf16, 3e-2}, std::pair{DType::f16, 4e-3}}) {
    for (const OpDef* op : selected_ops()) {
      SUBCASE((std::string(dtype_name(dtype)) + " " + op->name).c_str()) {
      const std::vector<OpCase> cases = op->cases();
      for (size_t ci = 0; ci < cases.size(); ++ci) {
        const OpCase& c = cases[ci];
        CaseInputs full = make_inputs(*op, ci, c);
        std::vector<Tensor> low;
        // The inputs with a gradient in the low dtype, and the float32 run on the values it holds:
        // rounding can tie two inputs (a large case's values lie closer than bfloat16 resolves),
        // and a tie moves a max-pool window's winner, which is the input's rounding, not the op's.
        for (size_t k = 0; k < full.tensors.size(); ++k) {
          Tensor& t = full.tensors[k];
          if (full.step[k] != 0) t = t.detach().to(dtype).to(DType::f32).requires_grad_();
          low.push_back(full.step[k] != 0 ? t.detach().to(dtype).requires_grad_() : t);
        }
        Tensor y = apply(*op, c.attrs, full.tensors), yl = apply(*op, c.attrs, low);
        const std::string what = std::string(dtype_name(dtype)) + " " + where(*op, ci, "output");
        CHECK_MESSAGE(yl.dtype() == (op->kind == OpKind::loss ? DType::f32 : dtype), what << " is " << dtype_name(yl.dtype()));
        auto close = [&](const Tensor& got, const Tensor& want, const std::string& name) {
          const std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
          REQUIRE(g.size() == w.size());
          double scale = 1e-30, worst = 0;
          for (float e : w) scale = std::max(scale, std::abs(static_cast<double>(e)));
          for (size_t i = 0; i < w.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(g[i]) - w[i]) / scale);
          CHECK_MESSAGE(worst <= tol, name << ": |diff| / max |float32| = " << worst << " > " << tol);
        };
        close(yl, y, what);
        const Tensor r = r_tensor(make_r(y.numel(), name_hash(op->name) + 7 * ci + 1), y.shape());
        y.backward(r);
        yl.backward(r.to(yl.dtype()));
        for (size_t k = 0; k < low.size(); ++k) {
          if (full.step[k] == 0) continue;
          const std::string g = std::string(dtype_name(dtype)) + " " + where(*op, ci, "gradient of input", k);
          REQUIRE_MESSAGE(low[k].grad().defined(), g << ": none");
          CHECK_MESSAGE(low[k].grad().dtype() == dtype, g << " is " << dtype_name(low[k].grad().dtype()));
          close(low[k].grad(), full.tensors[k].grad(), g);
        }
      }
      }
    }
  }
}

// Note [half operands] (src/kernels/cpu/gemm.h): an op whose CPU kernels read bf16 and f16 as they
// are gives the bits of the float32 kernels run on widened copies, output and every gradient; with
// every float input in the low dtype, and under an AutocastGuard with the first float input low
// and the others float32 (parameters stay so: Note [autocast]), or all float32 (an fp32 op such as
// layer_norm or embedding then makes its low output itself).
TEST_CASE("ops: half kernels give the bits of float32 kernels on widened copies") {
  // Chunks of one sample per thread, so that kernels that widen a chunk of samples at a time
  // (conv2d) cut every case's batch.
  const int64_t chunk_bytes = cpu::half_chunk_bytes();
  cpu::set_half_chunk_bytes(0);
  struct Restore {
    int64_t bytes;
    ~Restore() { set_half_kernels(true), cpu::set_half_chunk_bytes(bytes); }
  } restore{chunk_bytes};
  enum class Inputs { all_low, autocast_first_low, autocast_f32 };
  const char* const kInputs[] = {"all low", "autocast, first low", "autocast, float32"};
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (const OpDef* op : selected_ops()) {
      if (!op->half_kernels) continue;
      SUBCASE((std::string(dtype_name(dtype)) + " " + op->name).c_str()) {
      const std::vector<OpCase> cases = op->cases();
      for (size_t ci = 0; ci < cases.size(); ++ci) {
        for (const Inputs inputs : {Inputs::all_low, Inputs::autocast_first_low, Inputs::autocast_f32}) {
        std::vector<std::vector<uint8_t>> bits[2];
        for (const bool half : {true, false}) {
          set_half_kernels(half);
          CaseInputs in = make_inputs(*op, ci, cases[ci]);
          const AutocastGuard autocast(inputs == Inputs::all_low ? DType::f32 : dtype);
          std::vector<Tensor> low;
          bool first = true;
          for (size_t k = 0; k < in.tensors.size(); ++k) {
            const Tensor& t = in.tensors[k];
            const bool floating = t.defined() && is_floating(t.dtype());
            const bool round = floating && (inputs == Inputs::all_low || (inputs == Inputs::autocast_first_low && first));
            first &= !floating;
            low.push_back(floating ? t.detach().to(round ? dtype : DType::f32).requires_grad_(in.step[k] != 0) : t);
          }
          Tensor y = apply(*op, cases[ci].attrs, low);
          y.backward(r_tensor(make_r(y.numel(), name_hash(op->name) + ci), y.shape()).to(y.dtype()));
          auto& b = bits[half ? 0 : 1];
          b.push_back(test::raw_bytes(y));
          for (size_t k = 0; k < low.size(); ++k) {
            if (in.step[k] != 0) b.push_back(test::raw_bytes(low[k].grad()));
          }
          clear_autocast_cache();
        }
        REQUIRE(bits[0].size() == bits[1].size());
        for (size_t j = 0; j < bits[0].size(); ++j) {
          const std::string what = std::string(dtype_name(dtype)) + " " + kInputs[static_cast<int>(inputs)] + " " +
                                   where(*op, ci, j == 0 ? "output" : "gradient") + " (result " + std::to_string(j) + ")";
          CHECK_MESSAGE(bits[0][j] == bits[1][j], what << ": half kernels and widened copies differ");
        }
        }
      }
      }
    }
  }
}

// Note [loss gradient in place] (src/ops/cross_entropy.cpp): the logits' gradient takes the place
// of what the loss kept, so its backward adds no logits-sized buffer; a caller that keeps what the
// loss kept (bf16 logits), or retain_graph, gets one of its own. The gradients' bits are the same.
TEST_CASE("ops: cross_entropy's gradient takes the place of what it kept, unless someone else holds it") {
  const Device cpu = Device::cpu();
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const std::string name = dtype_name(dtype);
    CAPTURE(name);
    const int64_t n = 64, c = 1000;
    const size_t logits_bytes = static_cast<size_t>(n * c) * dtype_size(dtype);
    const Tensor x0 = test::rand_tensor({n, c}, 41).to(dtype);
    std::vector<int64_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 37) % c;
    const Tensor target = Tensor::from_vector(t, {n});
    // The bytes backward adds at its peak, and the gradient it gives x.
    auto run = [&](bool keep_logits, bool retain) {
      Tensor x = x0.detach().requires_grad_();
      Tensor logits = scale(x, 2.0f);
      Tensor loss = cross_entropy(logits, target);
      if (!keep_logits) logits = Tensor();
      const size_t before = memory_stats(cpu).in_use;
      reset_peak_memory_stats(cpu);
      loss.backward(Tensor(), retain);
      return std::pair{memory_stats(cpu).peak_in_use - before, test::raw_bytes(x.grad())};
    };
    const auto [in_place, g0] = run(false, false);
    const auto [kept, g1] = run(true, false);
    const auto [retained, g2] = run(false, true);
    CHECK_MESSAGE(in_place < logits_bytes / 2, "backward added " << in_place << " bytes, logits are " << logits_bytes);
    // float32 logits are not what the loss keeps (it keeps the probabilities): the caller's hold
    // on them changes nothing.
    if (dtype == DType::f32) CHECK(kept < logits_bytes / 2);
    else CHECK_MESSAGE(kept >= logits_bytes, "backward added " << kept << " bytes with the logits kept");
    CHECK_MESSAGE(retained >= logits_bytes, "backward added " << retained << " bytes with retain_graph");
    CHECK(g0 == g1);
    CHECK(g0 == g2);
  }
}

// A node must not hold its own output's handle (that handle points back at the node: a cycle that
// outlives the output when no backward runs). softmax saved its output so until 2026-11-27, and
// autocast's rounding did too (LeakSanitizer found the second in test_precision).
TEST_CASE("ops: an output dropped without backward frees its node, in float32 and bf16") {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const OpDef* op : selected_ops()) {
      SUBCASE((std::string(dtype_name(dtype)) + " " + op->name).c_str()) {
      const std::vector<OpCase> cases = op->cases();
      for (size_t ci = 0; ci < cases.size(); ++ci) {
        CaseInputs in = make_inputs(*op, ci, cases[ci]);
        if (dtype != DType::f32) {
          for (size_t k = 0; k < in.tensors.size(); ++k) {
            if (in.step[k] != 0) in.tensors[k] = in.tensors[k].detach().to(dtype).requires_grad_();
          }
        }
        Tensor y = apply(*op, cases[ci].attrs, in.tensors);
        REQUIRE(y.grad_fn());
        const std::weak_ptr<Node> node = y.grad_fn();
        y = Tensor();
        CHECK_MESSAGE(node.expired(), (std::string(dtype_name(dtype)) + " " + where(*op, ci, "node outlived its output")));
      }
      }
    }
  }
}

// Note [adding into pending gradients] (src/core/autograd.cpp): two residual junctions, as in a
// GPT block, where layer_norm's input gradient goes onto the residual add's. The bits of every
// gradient are those of a separate gradient added in, in float32 and under bf16 autocast (where
// the second stream is bf16), plain and in a checkpoint segment; the buffers it saves show in the
// peak.
TEST_CASE("ops: layer_norm adds its input gradient into the residual stream's, with the same bits") {
  struct Restore {
    ~Restore() { set_add_into_pending(true); }
  } restore;
  const int64_t c = 40;
  using test::rand_tensor;
  const Tensor r = rand_tensor({6, 50, c}, 91);
  auto block = [](const std::vector<Tensor>& in) {
    const Tensor s = scale(in[0], 1.5f);
    const Tensor t = add(s, gelu(layer_norm(s, in[1], in[2])));
    return add(t, relu(layer_norm(t, in[3], in[4])));
  };
  for (const DType low : {DType::f32, DType::bf16}) {
    for (const bool segment : {false, true}) {
      const std::string dtype = dtype_name(low);
      CAPTURE(dtype);
      CAPTURE(segment);
      struct Run {
        std::vector<std::vector<uint16_t>> grads;  // bits: float32 as two halves
        size_t peak = 0;
        uint64_t allocs = 0;
      };
      auto run = [&](bool on) {
        set_add_into_pending(on);
        std::vector<Tensor> in{rand_tensor({6, 50, c}, 92, true), rand_tensor({c}, 93, true), rand_tensor({c}, 94, true),
                               rand_tensor({c}, 95, true), rand_tensor({c}, 96, true)};
        Tensor out;
        {
          const AutocastGuard autocast(low);
          // A product after the block, so that the residual stream's gradients are backward's
          // own (the one handed to backward is the caller's too).
          out = mul(segment ? checkpoint(block, in) : block(in), r);
        }
        const Tensor ones = Tensor::ones(out.shape(), TensorOptions{out.dtype()});
        reset_peak_memory_stats(Device::cpu());
        const MemoryStats before = memory_stats(Device::cpu());
        out.backward(ones);
        Run res;
        res.peak = memory_stats(Device::cpu()).peak_in_use - before.in_use;
        res.allocs = memory_stats(Device::cpu()).alloc_count - before.alloc_count;
        for (const Tensor& t : in) {
          const Tensor g = t.grad();
          const auto* p = static_cast<const uint16_t*>(g.raw_data());
          res.grads.emplace_back(p, p + g.numel() * 2);
        }
        return res;
      };
      const Run off = run(false), on = run(true);
      for (size_t i = 0; i < on.grads.size(); ++i) {
        CAPTURE(i);
        CHECK(on.grads[i] == off.grads[i]);
      }
      MESSAGE("backward: peak " << on.peak << " bytes in " << on.allocs << " allocations; " << off.peak << " in "
                                << off.allocs << " without adding into pending gradients");
      // Each junction's layer_norm makes no gradient of its own (the replay's too, in a segment).
      CHECK(on.allocs + 2 <= off.allocs);
      CHECK(on.peak <= off.peak);
    }
  }
}

// The relu-mask switches as a test found them, put back when it ends.
struct ReluMaskSettings {
  bool dgrad = cuda::cudnn_dgrad_fusion();
  ~ReluMaskSettings() {
    set_relu_mask_in_consumer(true);
    cuda::set_cudnn_dgrad_fusion(dgrad);
  }
};

// Note [relu mask in the consumer] (src/core/autograd.cpp): a ReLU's output read by one conv2d
// gets its gradient masked by that conv2d; read by two ops, by the ReLU itself. Every gradient has
// the bits of the ReLUs masking their own, in both layouts, in float32 and under bf16 autocast,
// plain, in a checkpoint segment and through a retained graph's second backward.
TEST_CASE("ops: a ReLU's one reader masks its gradient, with the same bits") {
  const ReluMaskSettings restore;
  using test::rand_tensor;
  for (const Layout layout : {Layout::nchw, Layout::nhwc}) {
    const bool last = layout == Layout::nhwc;
    // x (2, 3, 9, 9); w (O, C, 3, 3) or (O, 3, 3, C)
    const auto wshape = [&](int64_t o, int64_t c) { return last ? Shape{o, 3, 3, c} : Shape{o, c, 3, 3}; };
    const int64_t ch = last ? 3 : 1;  // the channel dimension
    // relu -> conv2d_relu -> conv2d (stride 2) -> batch_norm + relu -> {conv2d, add}: two ReLUs
    // read by one conv2d each, one read twice.
    auto chain = [&](const std::vector<Tensor>& in) {
      const Tensor a = relu(conv2d(in[0], in[1], in[2], 1, 1, layout));
      const Tensor b = conv2d_relu(a, in[3], Tensor(), 1, 1, layout);
      const Tensor c = conv2d(b, in[4], in[5], 2, 1, layout);
      const Tensor d = batch_norm(c, in[6], in[7], Tensor(), Tensor(), true, 1e-5f, nullptr, layout, true);
      return add(conv2d(d, in[8], Tensor(), 1, 1, layout), d);
    };
    for (const DType low : {DType::f32, DType::bf16}) {
      for (const bool segment : {false, true}) {
       for (const bool every_reader : {false, true}) {  // relu_mask_every_reader: the dgrad graph's mode
        cuda::set_cudnn_dgrad_fusion(every_reader);
        const std::string dtype = dtype_name(low), layout_str = layout_name(layout);
        CAPTURE(layout_str);
        CAPTURE(dtype);
        CAPTURE(segment);
        CAPTURE(every_reader);
        struct Run {
          std::vector<std::vector<uint8_t>> grads, again;
          uint64_t moved = 0;
        };
        auto run = [&](bool on) {
          set_relu_mask_in_consumer(on);
          std::vector<Tensor> in{rand_tensor(last ? Shape{2, 9, 9, 3} : Shape{2, 3, 9, 9}, 11, true),
                                 rand_tensor(wshape(4, 3), 12, true),
                                 rand_tensor({4}, 13, true),
                                 rand_tensor(wshape(5, 4), 14, true),
                                 rand_tensor(wshape(6, 5), 15, true),
                                 rand_tensor({6}, 16, true),
                                 rand_tensor({6}, 17, true),
                                 rand_tensor({6}, 18, true),
                                 rand_tensor(wshape(6, 6), 19, true)};
          Tensor out;
          {
            const AutocastGuard autocast(low);
            out = segment ? checkpoint(chain, in) : chain(in);
          }
          REQUIRE(out.size(ch) == 6);
          const Tensor r = rand_tensor(out.shape(), 20).to(out.dtype());
          const uint64_t before = relu_masks_in_consumer();
          Run res;
          for (int pass = 0; pass < 2; ++pass) {  // the second through the retained graph
            for (const Tensor& t : in) t.set_grad(Tensor());
            out.backward(r, /*retain_graph=*/pass == 0);
            for (const Tensor& t : in) (pass == 0 ? res.grads : res.again).push_back(test::raw_bytes(t.grad()));
          }
          res.moved = relu_masks_in_consumer() - before;
          return res;
        };
        const Run off = run(false), on = run(true);
        for (size_t i = 0; i < on.grads.size(); ++i) {
          CAPTURE(i);
          CHECK(on.grads[i] == off.grads[i]);
          CHECK(on.again[i] == off.grads[i]);
        }
        CHECK(off.moved == 0);
        // relu -> conv2d_relu and conv2d_relu -> conv2d, each backward (a segment's replay once
        // each); batch_norm's ReLU, read twice, masks its own, and in every-reader mode its
        // conv2d reader masks its part too.
        CHECK(on.moved == (every_reader ? 6u : 4u));
       }
      }
    }
  }
}

// Note [relu mask in the consumer]: a ReLU outside a checkpoint segment whose first op is a
// conv2d: the segment's replay masks its boundary's gradient as the plain step's conv2d does (the
// same count, so on CUDA the same kernels); no mask for a conv2d reading an autocast copy (its
// rounding could zero a small value the ReLU passed).
TEST_CASE("ops: a ReLU's mask moves into a checkpoint segment, and not onto a converted copy") {
  const ReluMaskSettings restore;
  using test::rand_tensor;
  for (const bool cast : {false, true}) {
    for (const bool every_reader : {false, true}) {
      CAPTURE(cast);
      CAPTURE(every_reader);
      cuda::set_cudnn_dgrad_fusion(every_reader);
      auto tail = [&](const std::vector<Tensor>& in) {
        const AutocastGuard autocast(cast ? DType::bf16 : DType::f32);
        return conv2d(in[0], in[1], Tensor(), 1, 1);
      };
      std::vector<std::vector<uint8_t>> first;
      for (const bool segment : {false, true}) {
        for (const bool on : {false, true}) {
          CAPTURE(segment);
          CAPTURE(on);
          set_relu_mask_in_consumer(on);
          const Tensor x = rand_tensor({2, 3, 8, 8}, 31, true), w0 = rand_tensor({4, 3, 3, 3}, 32, true),
                       w1 = rand_tensor({5, 4, 3, 3}, 33, true);
          const Tensor h = relu(conv2d(x, w0, Tensor(), 1, 1));  // float32, outside the segment
          const Tensor out = segment ? checkpoint(tail, {h, w1}) : tail({h, w1});
          const uint64_t before = relu_masks_in_consumer();
          out.backward(rand_tensor(out.shape(), 34));
          CHECK(relu_masks_in_consumer() - before == (on && !cast ? 1u : 0u));
          std::vector<std::vector<uint8_t>> grads;
          for (const Tensor& t : {x, w0, w1}) grads.push_back(test::raw_bytes(t.grad()));
          if (first.empty()) first = grads;
          for (size_t i = 0; i < grads.size(); ++i) {
            CAPTURE(i);
            CHECK(grads[i] == first[i]);
          }
        }
      }
    }
  }
}

// Note [adding into pending gradients]: a leaf's buffer is handed to layer_norm's rule only where
// adding into it gives a separate gradient's bits: a bf16 input's float32 buffer (an optimizer's
// zeros) takes the bf16-rounded gradient, as accumulate_grad adds it.
TEST_CASE("ops: layer_norm adds into a leaf's gradient buffer only where the bits stay those of a separate gradient") {
  struct Restore {
    ~Restore() { set_add_into_pending(true); }
  } restore;
  using test::rand_tensor;
  // x's gradient after a backward, onto `buffer` (or none), with add_into on or off.
  auto run = [](bool add_into, const Tensor& buffer) {
    set_add_into_pending(add_into);
    const Tensor x = rand_tensor({5, 40}, 71).to(DType::bf16).requires_grad_();
    if (buffer.defined()) x.set_grad(buffer.clone());
    mul(layer_norm(x, Tensor(), Tensor()), rand_tensor({5, 40}, 73).to(DType::bf16)).backward(
        Tensor::ones({5, 40}, TensorOptions{DType::bf16}));
    return x.grad();
  };
  const Tensor g = run(true, Tensor());  // bf16, the leaf's own
  REQUIRE(g.dtype() == DType::bf16);
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const std::string name = dtype_name(dtype);
    CAPTURE(name);
    const Tensor buffer = rand_tensor({5, 40}, 72).to(dtype);
    Tensor want;  // accumulate_grad's sum: float(buffer) + float(g), in the buffer's dtype
    {
      const NoGradGuard no_grad;
      want = add(buffer, dtype == DType::f32 ? g.to(DType::f32) : g);
    }
    REQUIRE(want.dtype() == dtype);
    for (const bool add_into : {true, false}) {
      CAPTURE(add_into);
      const Tensor got = run(add_into, buffer);
      CHECK(got.dtype() == dtype);
      CHECK(got.to(DType::f32).to_vector<float>() == want.to(DType::f32).to_vector<float>());
    }
  }
}

// Note [fused residual layer_norm]: the two nodes add and layer_norm record, with their outputs'
// bits, and the same gradients; float32 and bf16; without grad; arguments the ops refuse get
// their errors.
TEST_CASE("ops: add_layer_norm records add and layer_norm, with their bits, values and gradients") {
  using test::rand_tensor;
  const int64_t c = 48;
  for (const DType low : {DType::f32, DType::bf16}) {
    const std::string dtype = dtype_name(low);
    CAPTURE(dtype);
    auto run = [&](bool fused) {
      std::vector<Tensor> in{rand_tensor({3, 7, c}, 81, true), rand_tensor({3, 7, c}, 82, true), rand_tensor({c}, 83, true),
                             rand_tensor({c}, 84, true)};
      Tensor s, y;
      {
        const AutocastGuard autocast(low);
        const Tensor b = gelu(in[1]);  // bf16 under autocast: a and b of two dtypes on the CPU
        if (fused) {
          profiler::start();
          std::tie(s, y) = add_layer_norm(in[0], b, in[2], in[3], 1e-5f);
          profiler::stop();
          const std::vector<profiler::Row> rows = profiler::report();  // one pass, not the two ops apart
          CHECK(std::count_if(rows.begin(), rows.end(), [](const profiler::Row& r) { return r.name == "add+layer_norm"; }) == 1);
          CHECK(std::count_if(rows.begin(), rows.end(), [](const profiler::Row& r) { return r.name == "add"; }) == 0);
          CHECK(std::string(node_name(*s.grad_fn())) == "add");
          CHECK(std::string(node_name(*y.grad_fn())) == "layer_norm");
          CHECK(y.grad_fn()->inputs[0].fn == s.grad_fn());
        } else {
          s = add(in[0], b);
          y = layer_norm(s, in[2], in[3], 1e-5f);
        }
      }
      mul(add(s, relu(y)), rand_tensor({3, 7, c}, 85).to(y.dtype())).backward(Tensor::ones({3, 7, c}, TensorOptions{y.dtype()}));
      std::vector<std::vector<float>> out{s.to(DType::f32).to_vector<float>(), y.to(DType::f32).to_vector<float>()};
      for (const Tensor& t : in) out.push_back(t.grad().to(DType::f32).to_vector<float>());
      return std::pair{out, std::pair{s.dtype(), y.dtype()}};
    };
    const auto plain = run(false), fused = run(true);
    CHECK(fused.second == plain.second);
    for (size_t i = 0; i < plain.first.size(); ++i) {
      CAPTURE(i);
      CHECK(fused.first[i] == plain.first[i]);
    }
  }
  {
    const NoGradGuard no_grad;
    const auto [s, y] = add_layer_norm(rand_tensor({2, c}, 86, true), rand_tensor({2, c}, 87), Tensor(), Tensor());
    CHECK(!s.grad_fn());
    CHECK(!y.grad_fn());
    CHECK(y.to_vector<float>() == layer_norm(s, Tensor(), Tensor()).to_vector<float>());
  }
  CHECK_THROWS_WITH_AS(add_layer_norm(rand_tensor({2, c}, 1), rand_tensor({3, c}, 2), Tensor(), Tensor()),
                       doctest::Contains("add: shapes differ"), Error);
  CHECK_THROWS_WITH_AS(add_layer_norm(rand_tensor({2, c}, 1), rand_tensor({2, c}, 2), rand_tensor({c + 1}, 3), Tensor()),
                       doctest::Contains("layer_norm: weight has shape [49]"), Error);
}
