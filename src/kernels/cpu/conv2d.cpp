// 2-D convolution on the CPU: im2col + Eigen GEMM, one image at a time, in blocks of output rows.
//   x: (N, C, H, W)   w: (O, C, KH, KW) viewed as W: (O, C KH KW)   b: (O)   y: (N, O, OH, OW)
//   col_n = im2col(x_n): (C KH KW, OH OW), col_n[(c,p,q), (i,j)] = x[n, c, i s - pad + p, j s - pad + q]
//                                          (0 where that falls in the padding)
//   forward:  Y_n = W col_n + b 1^T                          (=)
//   backward: dW = sum_n dY_n col_n^T                        (= or += when accumulate)
//             db = sum_n dY_n 1                              (= or += when accumulate)
//             dx_n = col2im(W^T dY_n)                        (=; col2im adds each column entry
//                                                             back to the pixel it came from)
// col_n is never built whole: it is built for a block of output rows at a time (a column block of
// Y_n), sized to stay in L2 (kColBlockBytes), so im2col's writes and the GEMM's reads of it hit the
// cache, and the workspace is small. A 1x1 kernel with stride 1 and no padding needs no im2col:
// col_n is x_n itself.
//
// Threads: images are split over OpenMP threads in static contiguous chunks; each thread owns one
// column block buffer (allocated as a Tensor so the CPU allocator counts it) and, in backward, one
// partial dW. Within a thread dW sums images, then row blocks, in order, and the partials are summed
// in thread order, so for a given thread count every run gives the same bits (Note [checkpoint
// replay] relies on that). With a single image (or one thread) the images run in order and Eigen
// threads the GEMM itself.
#include "kernels/conv2d.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/eigen.h"

namespace mg {

namespace {

struct ConvGeom {
  int64_t n, c, h, w, o, kh, kw, oh, ow, stride, pad;
  int64_t ckk() const { return c * kh * kw; }
  int64_t ohw() const { return oh * ow; }
  bool pointwise() const { return kh == 1 && kw == 1 && stride == 1 && pad == 0; }
};

ConvGeom geometry(const Tensor& x, const Tensor& w, int64_t oh, int64_t ow, int stride, int pad) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), w.size(0), w.size(2), w.size(3),
          oh,        ow,        stride,    pad};
}

// Smallest j >= 0 with j * s >= a (a may be negative).
int64_t first_at_least(int64_t a, int64_t s) { return a <= 0 ? 0 : (a + s - 1) / s; }

// Output columns j in [j0, j1) read input column j s - pad + q inside [0, W); the rest is padding.
void valid_cols(const ConvGeom& g, int64_t q, int64_t& j0, int64_t& j1) {
  j0 = std::min(first_at_least(g.pad - q, g.stride), g.ow);
  j1 = std::max(std::min(first_at_least(g.w + g.pad - q, g.stride), g.ow), j0);
}

// Output rows [i0, i1) of one image x: (C, H, W) as columns: col: (C KH KW, (i1 - i0) OW).
void im2col(float* col, const float* x, const ConvGeom& g, int64_t i0, int64_t i1) {
  const int64_t cols = (i1 - i0) * g.ow;
  for (int64_t c = 0; c < g.c; ++c) {
    const float* plane = x + c * g.h * g.w;
    for (int64_t p = 0; p < g.kh; ++p) {
      for (int64_t q = 0; q < g.kw; ++q) {
        float* row = col + ((c * g.kh + p) * g.kw + q) * cols;
        int64_t j0, j1;
        valid_cols(g, q, j0, j1);
        for (int64_t i = i0; i < i1; ++i) {
          float* dst = row + (i - i0) * g.ow;
          const int64_t ih = i * g.stride - g.pad + p;
          if (ih < 0 || ih >= g.h) {
            std::fill(dst, dst + g.ow, 0.0f);
            continue;
          }
          const float* src = plane + ih * g.w - g.pad + q;
          std::fill(dst, dst + j0, 0.0f);
          if (g.stride == 1) {
            std::memcpy(dst + j0, src + j0, static_cast<size_t>(j1 - j0) * sizeof(float));
          } else {
            for (int64_t j = j0; j < j1; ++j) dst[j] = src[j * g.stride];
          }
          std::fill(dst + j1, dst + g.ow, 0.0f);
        }
      }
    }
  }
}

// The inverse scatter for output rows [i0, i1): dx: (C, H, W) += col2im(col), each pixel getting
// the column entries it fed, added in a fixed order (c, p, q, i, j).
void col2im_add(float* dx, const float* col, const ConvGeom& g, int64_t i0, int64_t i1) {
  const int64_t cols = (i1 - i0) * g.ow;
  for (int64_t c = 0; c < g.c; ++c) {
    float* plane = dx + c * g.h * g.w;
    for (int64_t p = 0; p < g.kh; ++p) {
      for (int64_t q = 0; q < g.kw; ++q) {
        const float* row = col + ((c * g.kh + p) * g.kw + q) * cols;
        int64_t j0, j1;
        valid_cols(g, q, j0, j1);
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t ih = i * g.stride - g.pad + p;
          if (ih < 0 || ih >= g.h) continue;
          const float* src = row + (i - i0) * g.ow;
          float* dst = plane + ih * g.w - g.pad + q;
          if (g.stride == 1) {
            for (int64_t j = j0; j < j1; ++j) dst[j] += src[j];
          } else {
            for (int64_t j = j0; j < j1; ++j) dst[j * g.stride] += src[j];
          }
        }
      }
    }
  }
}

// A column block of a row-major (rows, total_cols) matrix.
using BlockMap = Eigen::Map<cpu::MatrixRM, 0, Eigen::OuterStride<>>;
using ConstBlockMap = Eigen::Map<const cpu::MatrixRM, 0, Eigen::OuterStride<>>;

// im2col block size: L2-resident (the CPU this was tuned on has 1 MiB of L2 per core).
constexpr int64_t kColBlockBytes = 512 << 10;

// Output rows per im2col block: as many as fit in kColBlockBytes, at least one.
int64_t block_rows(const ConvGeom& g) {
  const int64_t row_bytes = std::max<int64_t>(g.ckk() * g.ow * static_cast<int64_t>(sizeof(float)), 1);
  return std::clamp<int64_t>(kColBlockBytes / row_bytes, 1, g.oh);
}

// Threads to split the batch over: no more than there are images.
int batch_threads(int64_t n) {
  return static_cast<int>(std::max<int64_t>(std::min<int64_t>(omp_get_max_threads(), n), 1));
}

}  // namespace

template <>
void conv2d_forward<Cpu>(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, int stride,
                         int pad) {
  const ConvGeom g = geometry(x, w, y.size(2), y.size(3), stride, pad);
  const int64_t img = g.c * g.h * g.w, out = g.o * g.ohw();
  const int threads = batch_threads(g.n);
  const bool pointwise = g.pointwise();
  const int64_t rows = block_rows(g), block = g.ckk() * rows * g.ow;
  Tensor ws = pointwise ? Tensor() : Tensor::empty({threads, block});
  const auto W = cpu::cmat(w, g.o, g.ckk());
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const float* bp = b.defined() ? b.data<float>() : nullptr;

  auto one_image = [&](int64_t n, int tid) {
    float* yn = yp + n * out;
    if (pointwise) {
      auto Y = cpu::MatMap(yn, g.o, g.ohw());
      Y.noalias() = W * cpu::ConstMatMap(xp + n * img, g.c, g.ohw());
      if (bp) Y.colwise() += cpu::ConstVecMap(bp, g.o);
      return;
    }
    float* col = ws.data<float>() + tid * block;
    for (int64_t i0 = 0; i0 < g.oh; i0 += rows) {
      const int64_t i1 = std::min(i0 + rows, g.oh), cols = (i1 - i0) * g.ow;
      im2col(col, xp + n * img, g, i0, i1);
      BlockMap Y(yn + i0 * g.ow, g.o, cols, Eigen::OuterStride<>(g.ohw()));
      Y.noalias() = W * cpu::ConstMatMap(col, g.ckk(), cols);
      if (bp) Y.colwise() += cpu::ConstVecMap(bp, g.o);  // while the block is in cache
    }
  };

  if (threads == 1) {
    for (int64_t n = 0; n < g.n; ++n) one_image(n, 0);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num();
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.n; ++n) one_image(n, tid);
  }
}

template <>
void conv2d_backward<Cpu>(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x,
                          const Tensor& w, int stride, int pad, bool accumulate) {
  const ConvGeom g = geometry(x, w, dy.size(2), dy.size(3), stride, pad);
  const int64_t img = g.c * g.h * g.w, out = g.o * g.ohw();
  const float* xp = x.data<float>();
  const float* dyp = dy.data<float>();

  if (db.defined()) {
    // Per channel, images in order: the same bits for any thread count.
    float* dbp = db.data<float>();
#pragma omp parallel for if (g.n * out > cpu::kParallelGrain)
    for (int64_t o = 0; o < g.o; ++o) {
      float s = 0.0f;
      for (int64_t n = 0; n < g.n; ++n) s += cpu::ConstArrMap(dyp + n * out + o * g.ohw(), g.ohw()).sum();
      dbp[o] = accumulate ? dbp[o] + s : s;
    }
  }
  if (g.n == 0 && dw.defined() && !accumulate) dw.zero_();
  if (g.n == 0 || (!dx.defined() && !dw.defined())) return;

  const int threads = batch_threads(g.n);
  const bool pointwise = g.pointwise();
  const int64_t rows = block_rows(g), block = g.ckk() * rows * g.ow, wsize = g.o * g.ckk();
  const auto W = cpu::cmat(w, g.o, g.ckk());
  Tensor ws = pointwise ? Tensor() : Tensor::empty({threads, block});
  // With one thread dW accumulates straight into dw; otherwise into per-thread partials.
  Tensor partial = dw.defined() && threads > 1 ? Tensor::empty({threads, wsize}) : Tensor();
  float* dxp = dx.defined() ? dx.data<float>() : nullptr;

  // `assign`: the first contribution to this thread's dW overwrites it.
  auto one_image = [&](int64_t n, int tid, bool assign) {
    const float* dyn = dyp + n * out;
    float* dxn = dxp ? dxp + n * img : nullptr;
    cpu::MatMap DW(dw.defined() ? (threads > 1 ? partial.data<float>() + tid * wsize : dw.data<float>())
                                : nullptr,
                   g.o, g.ckk());
    if (pointwise) {
      const cpu::ConstMatMap DY(dyn, g.o, g.ohw()), X(xp + n * img, g.c, g.ohw());
      if (dw.defined() && assign) DW.noalias() = DY * X.transpose();
      else if (dw.defined()) DW.noalias() += DY * X.transpose();
      if (dxn) cpu::MatMap(dxn, g.c, g.ohw()).noalias() = W.transpose() * DY;
      return;
    }
    if (dxn) std::fill(dxn, dxn + img, 0.0f);
    float* col = ws.data<float>() + tid * block;
    for (int64_t i0 = 0; i0 < g.oh; i0 += rows) {
      const int64_t i1 = std::min(i0 + rows, g.oh), cols = (i1 - i0) * g.ow;
      const ConstBlockMap DY(dyn + i0 * g.ow, g.o, cols, Eigen::OuterStride<>(g.ohw()));
      const cpu::ConstMatMap COL(col, g.ckk(), cols);
      if (dw.defined()) {
        im2col(col, xp + n * img, g, i0, i1);
        if (assign) DW.noalias() = DY * COL.transpose();
        else DW.noalias() += DY * COL.transpose();
        assign = false;
      }
      if (dxn) {
        cpu::MatMap(col, g.ckk(), cols).noalias() = W.transpose() * DY;
        col2im_add(dxn, col, g, i0, i1);
      }
    }
  };

  if (threads == 1) {
    for (int64_t n = 0; n < g.n; ++n) one_image(n, 0, n == 0 && !accumulate);
    return;
  }
  // Static contiguous chunks: thread t handles the same images every run.
#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num();
    bool first = true;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.n; ++n) {
      one_image(n, tid, first);
      first = false;
    }
    if (first && partial.defined()) cpu::ArrMap(partial.data<float>() + tid * wsize, wsize).setZero();
  }
  if (dw.defined()) {
    auto DW = cpu::arr(dw);
    for (int t = 0; t < threads; ++t) {
      const cpu::ConstArrMap P(partial.data<float>() + t * wsize, wsize);
      if (t == 0 && !accumulate) DW = P;
      else DW += P;
    }
  }
}

}  // namespace mg
