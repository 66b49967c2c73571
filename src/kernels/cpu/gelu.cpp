#include "kernels/gelu.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/packet_math.h"

namespace mg {

namespace {
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

// bf16 and f16 (Note [half operands] in kernels/cpu/gemm.h): each thread's range is widened
// kBlock values at a time into float32 on its stack, run through the float32 packets (whose
// result for a value does not depend on where it lies: packet_math.h), and rounded into y (or
// dx). The same bits as the float32 kernel on widened copies, without the copies.
constexpr int64_t kBlock = 1024;

template <class F> void half_unary(Tensor& y, const Tensor& x, F&& f) {
  const char* px = static_cast<const char*>(x.raw_data());
  char* py = static_cast<char*>(y.raw_data());
  const size_t xs = dtype_size(x.dtype()), ys = dtype_size(y.dtype());
  cpu::parallel_for(y.numel(), cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
    float a[kBlock], out[kBlock];
    for (int64_t b = i0; b < i1; b += kBlock) {
      const int64_t n = std::min(kBlock, i1 - b);
      cpu::widen_span(a, px + b * xs, x.dtype(), n);
      cpu::map_packets(out, a, n, f);
      cpu::narrow_span(py + b * ys, y.dtype(), out, n);
    }
  });
}

template <class F> void half_binary(Tensor& y, const Tensor& x, const Tensor& g, F&& f) {
  const char *px = static_cast<const char*>(x.raw_data()), *pg = static_cast<const char*>(g.raw_data());
  char* py = static_cast<char*>(y.raw_data());
  const size_t xs = dtype_size(x.dtype()), gs = dtype_size(g.dtype()), ys = dtype_size(y.dtype());
  cpu::parallel_for(y.numel(), cpu::kParallelGrain, [&](int64_t i0, int64_t i1) {
    float a[kBlock], b2[kBlock], out[kBlock];
    for (int64_t b = i0; b < i1; b += kBlock) {
      const int64_t n = std::min(kBlock, i1 - b);
      cpu::widen_span(a, px + b * xs, x.dtype(), n);
      cpu::widen_span(b2, pg + b * gs, g.dtype(), n);
      cpu::map_packets(out, a, b2, n, f);
      cpu::narrow_span(py + b * ys, y.dtype(), out, n);  // y may be g itself: its block is read already
    }
  });
}

bool any_half(const Tensor& a, const Tensor& b) { return cpu::is_half(a.dtype()) || cpu::is_half(b.dtype()); }

}  // namespace

// tanh and the products in Eigen's packets (kernels/cpu/packet_math.h): glibc's scalar tanhf was
// 14% of a GPT-2 small step on the CPU.
template <> void gelu_forward<Cpu>(Tensor& y, const Tensor& x) {
  using namespace Eigen::internal;
  const cpu::Packet half = pset1<cpu::Packet>(0.5f), one = pset1<cpu::Packet>(1.0f);
  const cpu::Packet k = pset1<cpu::Packet>(kGeluK), c = pset1<cpu::Packet>(kGeluC);
  auto f = [&](cpu::Packet v) {
    const cpu::Packet t = ptanh(pmul(k, padd(v, pmul(c, pmul(v, pmul(v, v))))));
    return pmul(pmul(half, v), padd(one, t));
  };
  if (any_half(y, x)) return half_unary(y, x, f);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  cpu::parallel_for(y.numel(), cpu::kParallelGrain,
                    [&](int64_t i0, int64_t i1) { cpu::map_packets(py + i0, px + i0, i1 - i0, f); });
}

template <> void gelu_backward<Cpu>(Tensor& dx, const Tensor& dy, const Tensor& x) {
  using namespace Eigen::internal;
  const cpu::Packet half = pset1<cpu::Packet>(0.5f), one = pset1<cpu::Packet>(1.0f);
  const cpu::Packet k = pset1<cpu::Packet>(kGeluK), c = pset1<cpu::Packet>(kGeluC);
  const cpu::Packet c3 = pset1<cpu::Packet>(3.0f * kGeluC);
  auto f = [&](cpu::Packet v, cpu::Packet g) {
    const cpu::Packet v2 = pmul(v, v);
    const cpu::Packet t = ptanh(pmul(k, padd(v, pmul(c, pmul(v, v2)))));
    const cpu::Packet dt = pmul(pmul(psub(one, pmul(t, t)), k), padd(one, pmul(c3, v2)));
    return pmul(g, padd(pmul(half, padd(one, t)), pmul(pmul(half, v), dt)));
  };
  if (any_half(dx, x) || cpu::is_half(dy.dtype())) return half_binary(dx, x, dy, f);
  const float *pdy = dy.data<float>(), *px = x.data<float>();
  float* pdx = dx.data<float>();
  cpu::parallel_for(dx.numel(), cpu::kParallelGrain,
                    [&](int64_t i0, int64_t i1) { cpu::map_packets(pdx + i0, px + i0, pdy + i0, i1 - i0, f); });
}

}  // namespace mg
