// Which GEMM for the CPU kernels, in isolation: Eigen 3.4 vs OpenBLAS vs BLIS, one thread, on the
// shapes of the MLP and VGG steps and a large square product. Row-major C = op(A) op(B).
// Build and run: bash bench/gemm_choice/run.sh (needs libopenblas-dev and libblis-dev).
#include <Eigen/Core>
#include <chrono>
#include <cstdio>
#include <vector>
#include <random>
#include <algorithm>
extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*);
}
using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
struct Shape { const char* name; int m, n, k; bool ta, tb; };
template <class F> double best_ms(F f, int reps) {
  f();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto a = std::chrono::steady_clock::now(); f(); auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::milli>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
int main(int argc, char** argv) {
  const char* which = argc > 1 ? argv[1] : "eigen";
  std::vector<Shape> shapes = {
      {"mlp fwd 64x512x784 (X W^T)", 64, 512, 784, false, true},
      {"mlp dW 512x784x64 (dY^T X)", 512, 784, 64, true, false},
      {"mlp dX 64x784x512 (dY W)", 64, 784, 512, false, false},
      {"mlp fwd 16x512x784", 16, 512, 784, false, true},
      {"conv fwd 64x3136x576 (W col)", 64, 3136, 576, false, false},
      {"conv dW 64x576x3136 (dY col^T)", 64, 576, 3136, false, true},
      {"conv dX 576x3136x64 (W^T dY)", 576, 3136, 64, true, false},
      {"conv1_2 fwd 8x4096x72", 8, 4096, 72, false, false},
      {"square 1024", 1024, 1024, 1024, false, false}};
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto s : shapes) {
    // A is (m,k) or stored (k,m) when ta; B is (k,n) or stored (n,k) when tb. Row-major.
    std::vector<float> A(size_t(s.m) * s.k), B(size_t(s.k) * s.n), C(size_t(s.m) * s.n);
    for (auto& v : A) v = u(g);
    for (auto& v : B) v = u(g);
    const int reps = std::max(5, int(2e9 / (2.0 * s.m * s.n * s.k)));
    double ms = 0;
    if (std::string(which) == "eigen") {
      Eigen::Map<Mat> Cm(C.data(), s.m, s.n);
      Eigen::Map<const Mat> Am(A.data(), s.ta ? s.k : s.m, s.ta ? s.m : s.k), Bm(B.data(), s.tb ? s.n : s.k, s.tb ? s.k : s.n);
      ms = best_ms([&] {
        if (s.ta && s.tb) Cm.noalias() = Am.transpose() * Bm.transpose();
        else if (s.ta) Cm.noalias() = Am.transpose() * Bm;
        else if (s.tb) Cm.noalias() = Am * Bm.transpose();
        else Cm.noalias() = Am * Bm;
      }, reps);
    } else {
      // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
      const float one = 1, zero = 0;
      const char tA = s.ta ? 'T' : 'N', tB = s.tb ? 'T' : 'N';
      const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n, ldc = s.n;
      ms = best_ms([&] { sgemm_(&tB, &tA, &s.n, &s.m, &s.k, &one, B.data(), &ldb, A.data(), &lda, &zero, C.data(), &ldc); }, reps);
    }
    std::printf("%-8s %-34s %8.3f ms %7.1f GFLOP/s\n", which, s.name, ms, 2.0 * s.m * s.n * s.k / ms / 1e6);
  }
}
