#include "kernels/elementwise.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "kernels/convert.h"
#include "kernels/cpu/eigen.h"
#include "kernels/cpu/packet_math.h"

namespace mg {

namespace {
bool any_half(const Tensor& y, const Tensor& a, const Tensor& b) {
  return cpu::is_half(y.dtype()) || cpu::is_half(a.dtype()) || cpu::is_half(b.dtype());
}
}  // namespace

// add, mul and scale take bf16 and f16 as they are (OpDef::half_kernels): cpu::map_any in
// packet_math.h, whose packet sums and products round as these loops' float ones do.
template <> void add_forward<Cpu>(Tensor& y, const Tensor& a, const Tensor& b) {
  if (any_half(y, a, b)) return cpu::map_any(y, a, b, [](cpu::Packet u, cpu::Packet v) { return Eigen::internal::padd(u, v); });
  const float *pa = a.data<float>(), *pb = b.data<float>();
  float* py = y.data<float>();
  const int64_t n = y.numel();
  cpu::parallel_for(n, cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) py[i] = pa[i] + pb[i];
  });
}

template <> void mul_forward<Cpu>(Tensor& y, const Tensor& a, const Tensor& b) {
  if (any_half(y, a, b)) return cpu::map_any(y, a, b, [](cpu::Packet u, cpu::Packet v) { return Eigen::internal::pmul(u, v); });
  const float *pa = a.data<float>(), *pb = b.data<float>();
  float* py = y.data<float>();
  const int64_t n = y.numel();
  cpu::parallel_for(n, cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) py[i] = pa[i] * pb[i];
  });
}

template <> void add_inplace<Cpu>(Tensor& y, const Tensor& x) {
  MG_CHECK(y.numel() == x.numel(), "add_inplace: " << shape_str(y.shape()) << " += " << shape_str(x.shape()));
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const int64_t n = y.numel();
  cpu::parallel_for(n, cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) py[i] += px[i];
  });
}

template <> void scale_forward<Cpu>(Tensor& y, const Tensor& x, float s) {
  if (any_half(y, x, x)) {
    const cpu::Packet ps = Eigen::internal::pset1<cpu::Packet>(s);
    return cpu::map_any(y, x, [&](cpu::Packet v) { return Eigen::internal::pmul(ps, v); });
  }
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const int64_t n = y.numel();
  cpu::parallel_for(n, cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) py[i] = s * px[i];
  });
}

template <> void fill<Cpu>(Tensor& y, float v) {
  const int64_t n = y.numel();
  if (y.dtype() == DType::bf16 || y.dtype() == DType::f16) {  // the value rounded once
    const uint16_t bits = y.dtype() == DType::bf16 ? half::bf16_from_float(v) : half::f16_from_float(v);
    uint16_t* p = static_cast<uint16_t*>(y.raw_data());
    cpu::parallel_for(n, cpu::kParallelGrain, [&](int64_t i0, int64_t i1) { std::fill(p + i0, p + i1, bits); });
    return;
  }
  float* py = y.data<float>();
  cpu::parallel_for(n, cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) py[i] = v;
  });
}

template <> void zero_many<Cpu>(const std::vector<Tensor>& ys) {
  check_float_list("zero_many", ys, Device::cpu());
  for (Tensor y : ys) fill<Cpu>(y, 0.0f);  // each split over the threads when large
}

void check_float_list(const char* op, const std::vector<Tensor>& xs, Device d) {
  for (size_t i = 0; i < xs.size(); ++i) {
    MG_CHECK(xs[i].dtype() == DType::f32 && xs[i].device() == d,
             op << ": tensor " << i << " is " << dtype_name(xs[i].dtype()) << " on " << xs[i].device().str()
                << ", expected float32 on " << d.str());
  }
}

void check_stats_args(const char* op, const std::vector<Tensor>& xs, const Tensor& out, int64_t slot) {
  MG_CHECK(out.defined() && out.dtype() == DType::f64,
           op << ": the statistics tensor must be float64, got "
              << (out.defined() ? dtype_name(out.dtype()) : "an undefined tensor"));
  MG_CHECK(slot >= 0 && slot < out.numel(),
           op << ": slot " << slot << " outside a statistics tensor of " << out.numel() << " elements");
  check_float_list(op, xs, out.device());
}

void check_store_scalar_args(const Tensor& out, int64_t slot, const Tensor& x) {
  MG_CHECK(x.defined() && x.numel() == 1, "store_scalar: expected a tensor of one element, got "
                                              << (x.defined() ? shape_str(x.shape()) : "an undefined tensor"));
  check_stats_args("store_scalar", {x}, out, slot);
}

template <> void sum_squares_into<Cpu>(const std::vector<Tensor>& xs, Tensor& out, int64_t slot) {
  check_stats_args("sum_squares_into", xs, out, slot);
  double total = 0.0;
  std::vector<double> partial;  // a partial sum per piece, added in piece order: the same bits for any thread count
  for (const Tensor& x : xs) {
    const float* px = x.data<float>();
    const int64_t n = x.numel(), grain = cpu::kParallelGrain;
    partial.assign(static_cast<size_t>((n + grain - 1) / grain), 0.0);
    cpu::parallel_pieces(static_cast<int64_t>(partial.size()), [&](int64_t piece, int) {
      const int64_t i0 = piece * grain, i1 = std::min(i0 + grain, n);
      // 16 running sums in a fixed order, which the compiler keeps in vector registers: with one
      // (omp simd reduction) GCC 12 loaded px through gathers, and the gradient norm took a fifth
      // of an MLP step (perf, mnist_ga batch 64).
      constexpr int kLanes = 16;
      double lane[kLanes] = {};
      int64_t i = i0;
      for (; i + kLanes <= i1; i += kLanes) {
        for (int k = 0; k < kLanes; ++k) {
          const double v = px[i + k];
          lane[k] += v * v;
        }
      }
      double s = 0.0;
      for (int k = 0; k < kLanes; ++k) s += lane[k];
      for (; i < i1; ++i) s += static_cast<double>(px[i]) * px[i];
      partial[static_cast<size_t>(piece)] = s;
    });
    for (double s : partial) total += s;
  }
  out.data<double>()[slot] = total;
}

template <> void store_scalar<Cpu>(Tensor& out, int64_t slot, const Tensor& x) {
  check_store_scalar_args(out, slot, x);
  out.data<double>()[slot] = static_cast<double>(x.data<float>()[0]);
}

}  // namespace mg
