// Causal self-attention on the CPU (kernels/attention.h): one piece per (sample, head); within it
// the head's q, k and v are gathered into contiguous float32 matrices of the piece's (widened
// there when qkv is bf16 or f16: Note [half operands] in kernels/cpu/gemm.h), Eigen products on
// them, query rows in blocks of kRows, and a block's scores (kRows x T at most) in a workspace;
// the head's output (and in backward its dq, dk, dv) is written into a matrix of its own and then
// copied, or rounded, into y (dqkv). The buffers come from the allocator (counted in the memory
// statistics; freed with the piece), and every dtype runs the same products on buffers laid out
// alike, so a bf16 qkv gives the bits of the float32 kernel on a widened copy. The exponentials
// run in Eigen's packets (kernels/cpu/packet_math.h: the same bits wherever a row lies); glibc's
// scalar exp was most of the kernel's time at T = 256.
// Within a block, the products multiply the masked scores' zeros by the later rows' v and k: an
// inf or NaN there reaches the block's earlier rows as NaN (as a masked T x T product would
// reach every earlier row, PyTorch's composite attention included). Finite inputs are unaffected.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/eigen.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/packet_math.h"

namespace mg {

namespace {

struct Shape3 {
  int64_t b, t, c, d;
  int heads;
};

Shape3 dims(const Tensor& qkv, int heads) {
  return {qkv.size(0), qkv.size(1), qkv.size(2) / 3, qkv.size(2) / 3 / heads, heads};
}

// A head's T x D values of t (float32, bf16 or f16), row i starting at element first + i * stride,
// into the contiguous float32 matrix m; and back, rounded to t's dtype.
void gather(cpu::MatMap& m, const Tensor& t, int64_t first, int64_t stride) {
  const char* base = static_cast<const char*>(t.raw_data());
  const size_t size = dtype_size(t.dtype());
  for (int64_t i = 0; i < m.rows(); ++i) {
    cpu::widen_span(m.data() + i * m.cols(), base + static_cast<size_t>(first + i * stride) * size, t.dtype(), m.cols());
  }
}

void scatter(Tensor& t, int64_t first, int64_t stride, const cpu::MatMap& m) {
  char* base = static_cast<char*>(t.raw_data());
  const size_t size = dtype_size(t.dtype());
  for (int64_t i = 0; i < m.rows(); ++i) {
    cpu::narrow_span(base + static_cast<size_t>(first + i * stride) * size, t.dtype(), m.data() + i * m.cols(), m.cols());
  }
}

}  // namespace

// Query rows go in blocks of kRows: a block's scores are products with the keys up to its last
// row only, so the causal half of the T x T products (all zeros) is not computed, and the
// workspace is kRows x T. Each (sample, head) still runs alone and in a fixed order.
constexpr int64_t kRows = 64;

template <>
bool attention_forward<Cpu>(Tensor& y, Tensor& lse, const Tensor& qkv, int heads, const AttentionDropout& drop) {
  const Shape3 s = dims(qkv, heads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  float* pl = lse.data<float>();
  cpu::parallel_for(s.b * heads, 1, [&](int64_t p0, int64_t p1) {
    Tensor ws = Tensor::empty({std::min(kRows, s.t), s.t}), head = Tensor::empty({4, s.t, s.d});
    cpu::MatMap q(head.data<float>(), s.t, s.d), k(q.data() + s.t * s.d, s.t, s.d), v(k.data() + s.t * s.d, s.t, s.d),
        out(v.data() + s.t * s.d, s.t, s.d);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b = p / heads, h = p % heads;
      const int64_t off = b * s.t * 3 * s.c + h * s.d;
      gather(q, qkv, off, 3 * s.c);
      gather(k, qkv, off + s.c, 3 * s.c);
      gather(v, qkv, off + 2 * s.c, 3 * s.c);
      float* lrow = pl + p * s.t;
      for (int64_t t0 = 0; t0 < s.t; t0 += kRows) {
        const int64_t rows = std::min(kRows, s.t - t0), keys = t0 + rows;  // rows [t0, keys), keys [0, keys)
        cpu::MatMap sc(ws.data<float>(), rows, keys);
        sc.noalias() = (q.middleRows(t0, rows) * k.topRows(keys).transpose()) * scale;
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t t = t0 + r;
          float* row = sc.data() + r * keys;
          // p = e^(s - m) / sum; the sum in double, in order. A NaN score, or an infinite maximum,
          // makes the row and its log-sum-exp NaN; a score of -inf gives p = 0.
          const float m = cpu::max_packets(row, t + 1);
          const cpu::Packet pm = Eigen::internal::pset1<cpu::Packet>(m);
          cpu::map_packets(row, row, t + 1, [&](cpu::Packet x) { return cpu::exp_or_zero(Eigen::internal::psub(x, pm)); });
          double sum = 0;
          for (int64_t j = 0; j <= t; ++j) sum += row[j];
          lrow[t] = m + static_cast<float>(std::log(sum));
          const float inv = static_cast<float>(1.0 / sum);
          for (int64_t j = 0; j <= t; ++j) row[j] *= inv;
          if (drop.p > 0.0f) {
            for (int64_t j = 0; j <= t; ++j) row[j] *= attention_keep(drop, b, h, t, j, heads, s.t);
          }
          for (int64_t j = t + 1; j < keys; ++j) row[j] = 0.0f;
        }
        out.middleRows(t0, rows).noalias() = sc * v.topRows(keys);
      }
      scatter(y, b * s.t * s.c + h * s.d, s.c, out);
    }
  });
  return false;  // backward reads no y
}

// y is not read: E_t comes from the recomputed probabilities.
template <>
void attention_backward<Cpu>(Tensor& dqkv, const Tensor& dy, const Tensor& qkv, const Tensor&, const Tensor& lse,
                             int heads, const AttentionDropout& drop) {
  const Shape3 s = dims(qkv, heads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  const float* pl = lse.data<float>();
  cpu::parallel_for(s.b * heads, 1, [&](int64_t p0, int64_t p1) {
    const int64_t block = std::min(kRows, s.t), n = s.t * s.d;
    Tensor ws = Tensor::empty({2, block, s.t}), head = Tensor::empty({7, s.t, s.d});
    float* at = head.data<float>();
    cpu::MatMap q(at, s.t, s.d), k(at + n, s.t, s.d), v(at + 2 * n, s.t, s.d), g(at + 3 * n, s.t, s.d),
        dq(at + 4 * n, s.t, s.d), dk(at + 5 * n, s.t, s.d), dv(at + 6 * n, s.t, s.d);
    std::vector<float> keep(drop.p > 0.0f ? static_cast<size_t>(s.t) : 0);  // a row's mask, drawn once
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b = p / heads, h = p % heads;
      const int64_t off = b * s.t * 3 * s.c + h * s.d, yoff = b * s.t * s.c + h * s.d;
      gather(q, qkv, off, 3 * s.c);
      gather(k, qkv, off + s.c, 3 * s.c);
      gather(v, qkv, off + 2 * s.c, 3 * s.c);
      gather(g, dy, yoff, s.c);
      const float* lrow = pl + p * s.t;
      // dk and dv gather every later block's rows: zero, then added block by block, in order.
      dk.setZero();
      dv.setZero();
      for (int64_t t0 = 0; t0 < s.t; t0 += kRows) {
        const int64_t rows = std::min(kRows, s.t - t0), keys = t0 + rows;
        cpu::MatMap pm(ws.data<float>(), rows, keys), dp(ws.data<float>() + block * s.t, rows, keys);
        const auto qb = q.middleRows(t0, rows), gb = g.middleRows(t0, rows);
        // p from the scores and the saved log-sum-exp.
        pm.noalias() = (qb * k.topRows(keys).transpose()) * scale;
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t t = t0 + r;
          float* row = pm.data() + r * keys;
          const cpu::Packet l = Eigen::internal::pset1<cpu::Packet>(lrow[t]);
          cpu::map_packets(row, row, t + 1, [&](cpu::Packet x) { return cpu::exp_or_zero(Eigen::internal::psub(x, l)); });
          for (int64_t j = t + 1; j < keys; ++j) row[j] = 0.0f;
        }
        dp.noalias() = gb * v.topRows(keys).transpose();
        if (drop.p == 0.0f) dv.topRows(keys).noalias() += pm.transpose() * gb;
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t t = t0 + r;
          float *prow = pm.data() + r * keys, *drow = dp.data() + r * keys;
          if (drop.p > 0.0f) {  // dp = M dp'; p stays for ds, p' = p M replaces it below for dv
            for (int64_t j = 0; j <= t; ++j) {
              keep[static_cast<size_t>(j)] = attention_keep(drop, b, h, t, j, heads, s.t);
              drow[j] *= keep[static_cast<size_t>(j)];
            }
          }
          double e = 0;  // E_t = sum_j p_tj dp_tj (= dy_t . y_t; this way a row of one term gets ds = 0 exactly)
          for (int64_t j = 0; j <= t; ++j) e += static_cast<double>(prow[j]) * drow[j];
          const float ef = static_cast<float>(e);
          for (int64_t j = 0; j < keys; ++j) drow[j] = prow[j] * (drow[j] - ef) * scale;  // ds / sqrt(D)
          if (drop.p > 0.0f) {
            for (int64_t j = 0; j <= t; ++j) prow[j] *= keep[static_cast<size_t>(j)];
          }
        }
        if (drop.p > 0.0f) dv.topRows(keys).noalias() += pm.transpose() * gb;
        dq.middleRows(t0, rows).noalias() = dp * k.topRows(keys);
        dk.topRows(keys).noalias() += dp.transpose() * qb;
      }
      scatter(dqkv, off, 3 * s.c, dq);
      scatter(dqkv, off + s.c, 3 * s.c, dk);
      scatter(dqkv, off + 2 * s.c, 3 * s.c, dv);
    }
  });
}

}  // namespace mg
