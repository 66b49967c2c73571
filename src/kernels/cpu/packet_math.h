// Element-wise maps through Eigen's packet math (its vectorised exp and tanh), with the same
// instructions for every element: whole packets, then the tail padded into one packet.
// Eigen's own array expressions send an unaligned head through the scalar function instead
// (glibc's exp: other bits), so an element's result would depend on its address, and a tile or
// a micro-batch could differ from the whole batch (Note [tiled segments] in
// minigrad/core/checkpoint.h). Results differ between packet widths (AVX2, AVX-512), as the
// GEMMs' do, never between calls of one build.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cstdint>
#include <limits>

#include <minigrad/core/tensor.h>

#include "core/parallel.h"
#include "kernels/cpu/half_rows.h"

namespace mg::cpu {

// Internal to each file that includes this: the bodies depend on the file's -march (the
// library's, or a test's), and one exported copy must not stand in for another.
namespace {

using Packet = Eigen::internal::packet_traits<float>::type;
constexpr int kPacketLanes = Eigen::internal::packet_traits<float>::size;

// y[i] = f(a[i]) for i in [0, n); f maps a Packet to a Packet.
template <class F> inline void map_packets(float* y, const float* a, int64_t n, F&& f) {
  using namespace Eigen::internal;
  int64_t i = 0;
  for (; i + kPacketLanes <= n; i += kPacketLanes) pstoreu(y + i, f(ploadu<Packet>(a + i)));
  if (i == n) return;
  float pa[kPacketLanes] = {}, out[kPacketLanes];
  std::copy(a + i, a + n, pa);
  pstoreu(out, f(ploadu<Packet>(pa)));
  std::copy(out, out + (n - i), y + i);
}

// y[i] = f(a[i], b[i]) for i in [0, n).
template <class F> inline void map_packets(float* y, const float* a, const float* b, int64_t n, F&& f) {
  using namespace Eigen::internal;
  int64_t i = 0;
  for (; i + kPacketLanes <= n; i += kPacketLanes) pstoreu(y + i, f(ploadu<Packet>(a + i), ploadu<Packet>(b + i)));
  if (i == n) return;
  float pa[kPacketLanes] = {}, pb[kPacketLanes] = {}, out[kPacketLanes];
  std::copy(a + i, a + n, pa);
  std::copy(b + i, b + n, pb);
  pstoreu(out, f(ploadu<Packet>(pa), ploadu<Packet>(pb)));
  std::copy(out, out + (n - i), y + i);
}

// The same maps over tensors of any float dtype (float32, bf16, f16: Note [half operands] in
// kernels/cpu/gemm.h), y = f(x) and y = f(a, b) element by element on every thread: bf16 and f16
// are widened kHalfBlock values at a time on the thread's stack and the results rounded into y, so
// an element gets the bits of f on its widened value, with no float32 copy of the tensors. y may
// be one of the inputs (its block is read before it is written).
constexpr int64_t kHalfBlock = 1024;

template <class F> void map_any(Tensor& y, const Tensor& x, F&& f) {
  const char* px = static_cast<const char*>(x.raw_data());
  char* py = static_cast<char*>(y.raw_data());
  const size_t xs = dtype_size(x.dtype()), ys = dtype_size(y.dtype());
  parallel_for(y.numel(), kParallelGrain, [&](int64_t i0, int64_t i1) {
    float a[kHalfBlock], out[kHalfBlock];
    for (int64_t b = i0; b < i1; b += kHalfBlock) {
      const int64_t n = std::min(kHalfBlock, i1 - b);
      widen_span(a, px + b * xs, x.dtype(), n);
      map_packets(out, a, n, f);
      narrow_span(py + b * ys, y.dtype(), out, n);
    }
  });
}

template <class F> void map_any(Tensor& y, const Tensor& x0, const Tensor& x1, F&& f) {
  const char *p0 = static_cast<const char*>(x0.raw_data()), *p1 = static_cast<const char*>(x1.raw_data());
  char* py = static_cast<char*>(y.raw_data());
  const size_t s0 = dtype_size(x0.dtype()), s1 = dtype_size(x1.dtype()), ys = dtype_size(y.dtype());
  parallel_for(y.numel(), kParallelGrain, [&](int64_t i0, int64_t i1) {
    float a[kHalfBlock], b2[kHalfBlock], out[kHalfBlock];
    for (int64_t b = i0; b < i1; b += kHalfBlock) {
      const int64_t n = std::min(kHalfBlock, i1 - b);
      widen_span(a, p0 + b * s0, x0.dtype(), n);
      widen_span(b2, p1 + b * s1, x1.dtype(), n);
      map_packets(out, a, b2, n, f);
      narrow_span(py + b * ys, y.dtype(), out, n);
    }
  });
}

// The sum of a[0, n) in one packet's lanes (lane l adds a[l], a[l + lanes], ...), then the lanes
// in Eigen's fixed order: the same bits wherever a lies.
inline float sum_packets(const float* a, int64_t n) {
  using namespace Eigen::internal;
  Packet acc = pset1<Packet>(0.0f);
  int64_t i = 0;
  for (; i + kPacketLanes <= n; i += kPacketLanes) acc = padd(acc, ploadu<Packet>(a + i));
  if (i < n) {
    float pa[kPacketLanes] = {};
    std::copy(a + i, a + n, pa);
    acc = padd(acc, ploadu<Packet>(pa));
  }
  return predux(acc);
}

// exp(d), and 0 below ln(FLT_MIN): the AVX2 pexp clamps its argument at -88.7, and would give a
// masked score or class (-inf) a subnormal instead of 0. NaN stays NaN.
inline Packet exp_or_zero(Packet d) {
  using namespace Eigen::internal;
  constexpr float kLogFloatMin = -87.33654f;  // ln(FLT_MIN)
  return pandnot(pexp(d), pcmp_lt(d, pset1<Packet>(kLogFloatMin)));
}

// The largest of a[0, n), n > 0 (order does not matter for a maximum).
inline float max_packets(const float* a, int64_t n) {
  using namespace Eigen::internal;
  Packet acc = pset1<Packet>(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + kPacketLanes <= n; i += kPacketLanes) acc = pmax(acc, ploadu<Packet>(a + i));
  float m = predux_max(acc);
  for (; i < n; ++i) m = std::max(m, a[i]);
  return m;
}

}  // namespace
}  // namespace mg::cpu
