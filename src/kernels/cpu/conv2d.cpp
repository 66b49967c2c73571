// 2-D convolution on the CPU: oneDNN for convolutions with at least its channel block on either
// side (kernels/cpu/conv2d_onednn.h: one image per call, one piece per image, dW per image added in
// image order), otherwise im2col + SGEMM (kernels/cpu/gemm.h), in blocks of output rows, below.
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
// Threads (Note [fixed pieces] in core/parallel.h): forward runs one piece per (image, row block).
// Backward runs, in one parallel part, one piece per image for dx and one piece per group of input
// channels for dW: a dW piece builds the im2col rows of its channels only and adds every image and
// row block, in order, into its own columns of dW. Layers with few input channels (too few groups
// to keep the threads busy) instead give every image a dW piece of its own, a partial added into
// dW afterwards in image order, as oneDNN's layers do (in rounds of images: Note [dW partials in
// rounds]; oneDNN's dW only where an image has more than 64 output pixels). Images of at most 16
// output pixels take dW from chains of multiply-adds over (image, pixel) pairs instead, in a
// parallel part of its own (Note [dW of small images]); images of at most 4 run forward and dx
// as products over the whole batch (Note [small images as products over the batch]). The groups
// depend on one image's shape only, so every result has the same bits for any thread count. Each
// thread owns one column block buffer (allocated as a Tensor, so the CPU allocator counts it).
//
// Note [weight gradients in sample order]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// dW and db are added into the gradient buffer one image at a time, in image order, each image's
// term computed the same way whatever else is in the batch (its own row blocks in order; sums over
// pixels in fixed lanes, not in an order that depends on the address, as Eigen's vectorised sum
// does). So with an optimizer's buffer (accumulate), a batch split into consecutive parts (tiles
// of a checkpoint segment, Note [tiled segments] in minigrad/core/checkpoint.h, or micro-batches)
// leaves the same bits in dW and db as the batch in one call.
#include "kernels/conv2d.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/channels_last.h"
#include "kernels/cpu/conv2d_onednn.h"
#include "kernels/cpu/eigen.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/windows.h"
#include "kernels/relu.h"

namespace mg {

namespace {

struct ConvGeom {
  int64_t n, c, h, w, o, kh, kw, oh, ow, stride, pad;
  int64_t ckk() const { return c * kh * kw; }
  int64_t ohw() const { return oh * ow; }
  bool pointwise() const { return kh == 1 && kw == 1 && stride == 1 && pad == 0; }
  cpu::onednn::ConvShape onednn_shape(bool bias) const { return {c, h, w, o, kh, kw, oh, ow, stride, pad, bias}; }
  bool onednn() const { return cpu::onednn::applies(onednn_shape(false)); }
};

ConvGeom geometry(const Tensor& x, const Tensor& w, int64_t oh, int64_t ow, int stride, int pad) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), w.size(0), w.size(2), w.size(3),
          oh,        ow,        stride,    pad};
}

// Output columns j in [j0, j1) read input column j s - pad + q inside [0, W); the rest is padding.
void valid_cols(const ConvGeom& g, int64_t q, int64_t& j0, int64_t& j1) {
  std::tie(j0, j1) = cpu::window_outputs(q, g.pad, g.stride, g.w, g.ow);
}

// Output rows [i0, i1) of channels [c0, c1) of one image x: (C, H, W) as columns:
// col: ((c1 - c0) KH KW, (i1 - i0) OW).
void im2col(float* col, const float* x, const ConvGeom& g, int64_t i0, int64_t i1, int64_t c0, int64_t c1) {
  const int64_t cols = (i1 - i0) * g.ow;
  for (int64_t c = c0; c < c1; ++c) {
    const float* plane = x + c * g.h * g.w;
    for (int64_t p = 0; p < g.kh; ++p) {
      for (int64_t q = 0; q < g.kw; ++q) {
        float* row = col + (((c - c0) * g.kh + p) * g.kw + q) * cols;
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
          } else if (g.stride == 2) {
            // A stride known here is vectorised (loads and a permute); g.stride is gathered one by
            // one (a ResNet stem, 7x7 stride 2: 9% of a ResNet-50/8 step on the CPU).
            for (int64_t j = j0; j < j1; ++j) dst[j] = src[2 * j];
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

// im2col block size: L2-resident (the CPU this was tuned on has 1 MiB of L2 per core).
constexpr int64_t kColBlockBytes = 512 << 10;

// Output rows per im2col block: as many as fit in kColBlockBytes, at least one.
int64_t block_rows(const ConvGeom& g) {
  const int64_t row_bytes = std::max<int64_t>(g.ckk() * g.ow * static_cast<int64_t>(sizeof(float)), 1);
  return std::clamp<int64_t>(kColBlockBytes / row_bytes, 1, g.oh);
}

// dW is cut into groups of input channels of about this many multiply-adds each per image (the
// batch size must not change the grouping: Note [weight gradients in sample order]).
constexpr int64_t kDwPieceFma = int64_t{1} << 19;
constexpr int64_t kMaxDwPieces = 16;

// A group spans at least kMinDwColumns columns of dW (64 columns = 8 channels of a 3x3 kernel):
// narrower products run far below the SGEMM's rate.
constexpr int64_t kMinDwColumns = 64;

int64_t channels_per_dw_piece(const ConvGeom& g) {
  const int64_t fma = g.o * g.ohw() * g.ckk();
  const int64_t pieces = std::clamp<int64_t>(fma / kDwPieceFma, 1, kMaxDwPieces);
  const int64_t min_group = (kMinDwColumns + g.kh * g.kw - 1) / (g.kh * g.kw);
  return std::min(std::max((g.c + pieces - 1) / pieces, min_group), g.c);
}

// With fewer than kMinDwSpread channel groups (the first layers: 3 or 8 input channels), each
// image gets a dW piece of its own instead, a partial of the whole (small) dW.
constexpr int64_t kMinDwSpread = 4;

// Note [dW of small images]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// oneDNN's weight gradient is one image's term, a partial of all of dW, added into dW afterwards
// (Note [dW partials in rounds]). Where an image has few output pixels (the deep layers of VGG and
// ResNet at CIFAR sizes, 7 x 7 at 224) that is |W| written and read again per image for |W| x
// pixels multiply-adds: memory-bound. The channel-group GEMMs, which add each image into dW in
// place, are no better when an image has only a handful of pixels: for ResNet-18's 512 x 512 x 3 x
// 3 layers at 32 x 32 (1 pixel), a product with an inner dimension of 1 that reads and writes dW's
// 9.4 MB per image. Hence three regimes, chosen by one image's shape, never the batch (a split
// batch takes the same path, Note [weight gradients in sample order]); dx stays in oneDNN (or
// col2im) in all three, except on images of at most 4 pixels (Note [small images as products over
// the batch]):
// - at most kMaxChainPixels output pixels an image: dW from cpu::sum_outer_products over the
//   batch's (image, pixel) pairs in order (Note [sums in sample order] in kernels/cpu/gemm.h). Each
//   element of dW is one chain of fused multiply-adds, image after image, pixel after pixel, a tile
//   of dW held in registers while the pairs stream by. dw_chains lays the pairs out as rows (the
//   output gradient's O values, then the input's patch: im2row), kChainBytes of them at a time; a
//   later round, like a later part of a split batch, continues the chains from dW. The pieces, row
//   bands of dW, follow the shape.
// - at most kMaxGemmDwPixels: the channel-group GEMMs, each image added into its own columns of dW
//   in place;
// - more: oneDNN's dW per image where oneDNN runs the layer, else the channel-group GEMMs (or
//   per-image partials for layers with few input channels).
// Median step, `MG_NUM_THREADS=2 vgg_ckpt --model M --image-size S --batch-size B --steps 4`, AMD
// EPYC with AVX-512, kMaxGemmDwPixels 64, with no chains, then kMaxChainPixels 4, 16 and 64 (the
// peak in use beside it):
//   ResNet-18 32 x 32, batch 64:   210 ms 191 MiB, 145 ms 169 MiB, 135 ms 165 MiB, 135 ms 165 MiB
//   ResNet-18 64 x 64, batch 32:   210 ms 199 MiB, 194 ms 193 MiB, 192 ms 193 MiB, 222 ms 193 MiB
//   VGG16/8 32 x 32, batch 64:    36.9 ms 45 MiB, 35.8 ms 45 MiB, 35.1 ms 38 MiB, 37.7 ms 39 MiB
//   VGG16 32 x 32, batch 32:       718 ms,         655 ms,         653 ms,         668 ms (1591 MiB)
// At 64 pixels the pairs' rows cost more to lay out (im2row goes tap by tap) than the GEMMs lose.
// A limit that also asks for at least 2^16 weights above 4 pixels (2026-11-29, units' backward ms,
// alternating runs) gave ResNet-50/8's 4 x 4 stage (32 channels, 9k weights) back to the GEMMs:
// 8.1 -> 7.4 and 10.2 -> 7.1 ms; but VGG16/8's 4 x 4 layers (64 channels, 37k weights) lost, 2.8
// -> 5.4 and 3.0 -> 6.4 ms each. Not worth a second constant tuned between two models: left out.
// Before the chains (kMaxGemmDwPixels alone), 0 (oneDNN everywhere), 16, 64 and 256 pixels gave
// ResNet-18 32 x 32 598, 192, 197, 280 ms; 64 x 64 420, 285, 224, 262 ms; VGG16/8 59.6, 39.0,
// 38.9, 47.4 ms; VGG16 950, 733, 690, 699 ms.
constexpr int64_t kMaxChainPixels = 16;
constexpr int64_t kMaxGemmDwPixels = 64;
constexpr int64_t kChainBytes = int64_t{4} << 20;  // a round's rows of pairs: at most this, at least one image

// Note [dW partials in rounds]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A layer whose dW is made per image (oneDNN's, and those with few input channels) needs a
// partial dW per image before they are added in image order. All of a batch's at once cost
// N x |W|: for ResNet-18's 512 x 512 x 3 x 3 layers at batch 64, 604 MB of scratch in one
// backward, faulted in page by page, then summed one element at a time across 64 partials (a
// step at 32 x 32 took 2.3 s and peaked at 796 MB; 0.6 s and 229 MB in rounds, 2 threads).
// Backward now runs in rounds of dw_partial_images(|W|) images (a number from the shape, never
// the threads): each round's dW and dx pieces in one parallel part, then its partials added into
// dW, one after another, element by element. Every element still gets dW (or 0), then image 0's
// term, then image 1's, ...: the bits of adding all partials at once, and of any batch split
// (Note [weight gradients in sample order]).
constexpr int64_t kDwPartialBytes = int64_t{32} << 20;  // a round's partials: at most this,
constexpr int64_t kMinDwPartials = 4;                   // unless that leaves fewer than this

int64_t dw_partial_images(int64_t wsize) {
  return std::max(kMinDwPartials, kDwPartialBytes / std::max<int64_t>(wsize * static_cast<int64_t>(sizeof(float)), 1));
}

// Whether dW comes from chains of (image, pixel) pairs (Note [dW of small images]). (Forward and
// dx take products over the batch on fewer pixels still: small_products.)
bool small_images(const ConvGeom& g) { return g.ohw() <= kMaxChainPixels; }

// Whether oneDNN makes dW (Note [dW of small images]).
bool dw_in_onednn(const ConvGeom& g) { return g.ohw() > kMaxGemmDwPixels && g.onednn(); }

// Whether dW is made in per-image partials (oneDNN's, or the im2col path's for layers with too few
// channel groups) rather than added in place by channel groups or chains.
bool dw_per_image(const ConvGeom& g) {
  const int64_t group = channels_per_dw_piece(g);
  return !small_images(g) && (dw_in_onednn(g) || (g.c + group - 1) / group < kMinDwSpread);
}

// One image x: (C, H, W) as a patch row per output pixel, rows ld floats apart: the transpose of
// im2col's columns, C KH KW values a row (0 where a tap falls in the padding).
void im2row(float* dst, const float* x, const ConvGeom& g, int64_t ld) {
  for (int64_t i = 0; i < g.oh; ++i) {
    for (int64_t j = 0; j < g.ow; ++j) {
      float* row = dst + (i * g.ow + j) * ld;
      for (int64_t c = 0; c < g.c; ++c) {
        const float* plane = x + c * g.h * g.w;
        for (int64_t p = 0; p < g.kh; ++p) {
          float* taps = row + (c * g.kh + p) * g.kw;
          const int64_t ih = i * g.stride - g.pad + p;
          if (ih < 0 || ih >= g.h) {
            std::fill(taps, taps + g.kw, 0.0f);
            continue;
          }
          for (int64_t q = 0; q < g.kw; ++q) {
            const int64_t iw = j * g.stride - g.pad + q;
            taps[q] = iw >= 0 && iw < g.w ? plane[ih * g.w + iw] : 0.0f;
          }
        }
      }
    }
  }
}

// dW (+)= the chains of every (image, pixel) pair in order (Note [dW of small images]).
void dw_chains(Tensor& dw, const Tensor& dy, const Tensor& x, const ConvGeom& g, bool accumulate) {
  const int64_t pixels = g.ohw(), row = g.o + g.ckk();
  const int64_t round = std::clamp<int64_t>(kChainBytes / std::max<int64_t>(pixels * row * 4, 1), 1, g.n);
  Tensor rows = Tensor::empty({round * pixels, row});  // per pair: dy's O values, then the patch
  float* rp = rows.data<float>();
  const float* xp = x.data<float>();
  const float* dyp = dy.data<float>();
  for (int64_t n0 = 0; n0 < g.n; n0 += round) {
    const int64_t count = std::min(round, g.n - n0);
    cpu::parallel_for(count, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        float* dst = rp + i * pixels * row;
        // a row per pair holds its dy values first (lda = row), then its patch (ldb = row)
        for (int64_t p = 0; p < pixels; ++p) {
          for (int64_t k = 0; k < g.o; ++k) dst[p * row + k] = dyp[(n0 + i) * g.o * pixels + k * pixels + p];
        }
        im2row(dst + g.o, xp + (n0 + i) * g.c * g.h * g.w, g, row);
      }
    });
    cpu::sum_outer_products(count * pixels, g.o, g.ckk(), rp, row, rp + g.o, row, dw.data<float>(), g.ckk(),
                            accumulate || n0 > 0);
  }
}

// Note [small images as products over the batch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// oneDNN and the im2col path run a layer one image per piece, and each piece reads all of W: for
// ResNet-18's 512 x 512 x 3 x 3 layers at 32 x 32 (1 output pixel an image), 64 reads of W (and of
// oneDNN's reordered copy) for products of 1 column, and 8 of the 9 taps multiplied by padding.
// Where an image has at most kMaxProductPixels output pixels (dW runs in chains there: Note [dW of
// small images]), forward and dx run instead as products over the whole batch. The
// output pixels are grouped by the kernel taps that fall inside the image (tap_groups: with a
// 3 x 3 kernel and padding 1, one group for 1 x 1 images, 4 for 2 x 2); per group, with
// W_S the filters' columns of its taps (W itself where every tap counts, else a packed copy) and
// one row per (image, pixel) of the group, in that order:
//   forward:  Y_rows (pairs x O) = P (pairs x C |S|) W_S^T,  then y = Y_rows + b, scattered
//   dx:       D (pairs x C |S|)  = dY_rows (pairs x O) W_S,  then added into dx tap by tap
// P holds each pair's input patch over the group's taps only, so padding is never multiplied. The
// products' rows are samples (GemmArgs::sample_rows) and each dx element receives its terms in a
// fixed order (groups, pixels, taps), so an image's bits depend neither on the rest of its batch
// nor on the thread count, and rounds of kChainBytes of rows change nothing (test_conv_pool checks
// both, and y and dx against a direct loop in double).
// The limit, measured: forward / backward ms of the second block of each of ResNet-18's stages at
// 32 x 32, batch 64 (`MG_NUM_THREADS=2 vgg_ckpt --model resnet18 --image-size 32 --batch-size 64
// --steps 3 --json F`, the JSON's units; AMD EPYC with AVX-512), oneDNN per image against products
// for images of at most 1, 4 and 16 pixels; the better of two alternating runs:
//   stage (pixels, channels)  oneDNN        <= 1          <= 4          <= 16
//   2 (16, 128)               2.8 / 9.6     2.8 / 9.0     2.7 / 9.5     6.6 / 12.4
//   3 (4, 256)                4.2 / 8.3     4.1 / 8.3     3.7 / 7.8     3.7 / 7.7
//   4 (1, 512)                7.1 / 8.9     2.8 / 6.8     2.9 / 6.8     2.8 / 6.5
// All units summed: 120 and 127 ms with oneDNN, 108 and 102 at <= 1, 105 and 102 at <= 4, 130 and
// 112 at <= 16. At 16 pixels a 3 x 3 kernel makes 9 groups of small products, and oneDNN's direct
// kernels win. VGG16/8 and ResNet-50/8 (32 and 64 pixels) and VGG16 (32) were within the noise.

constexpr int64_t kMaxProductPixels = 4;
static_assert(kMaxProductPixels <= kMaxChainPixels, "small products take dW from the chains");
bool small_products(const ConvGeom& g) { return g.ohw() <= kMaxProductPixels; }

// The output pixels that see the same taps (p KW + q in order), in order of their first pixel.
struct TapGroup {
  std::vector<int64_t> taps, pixels;
};

std::vector<TapGroup> tap_groups(const ConvGeom& g) {
  std::vector<TapGroup> groups;
  for (int64_t pixel = 0; pixel < g.ohw(); ++pixel) {
    const int64_t i = pixel / g.ow, j = pixel % g.ow;
    std::vector<int64_t> taps;
    for (int64_t p = 0; p < g.kh; ++p) {
      const int64_t ih = i * g.stride - g.pad + p;
      for (int64_t q = 0; q < g.kw && ih >= 0 && ih < g.h; ++q) {
        const int64_t iw = j * g.stride - g.pad + q;
        if (iw >= 0 && iw < g.w) taps.push_back(p * g.kw + q);
      }
    }
    auto it = std::find_if(groups.begin(), groups.end(), [&](const TapGroup& t) { return t.taps == taps; });
    if (it == groups.end()) it = groups.insert(groups.end(), TapGroup{std::move(taps), {}});
    it->pixels.push_back(pixel);
  }
  return groups;
}

// The group's filters W_S (O, C |S|): W's columns of its taps (channel-major, as P's rows).
Tensor pack_taps(const Tensor& w, const ConvGeom& g, const std::vector<int64_t>& taps) {
  const int64_t kk = g.kh * g.kw, ts = static_cast<int64_t>(taps.size());
  Tensor ws = Tensor::empty({g.o, g.c * ts});
  const float* wp = w.data<float>();
  float* dst = ws.data<float>();
  cpu::parallel_for(g.o, cpu::items_per_piece(g.c * kk), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t c = 0; c < g.c; ++c) {
        for (int64_t t = 0; t < ts; ++t) dst[(o * g.c + c) * ts + t] = wp[(o * g.c + c) * kk + taps[t]];
      }
    }
  });
  return ws;
}

// Input offset (within a channel's plane) of output pixel `pixel` at tap p KW + q.
int64_t tap_input(const ConvGeom& g, int64_t pixel, int64_t tap) {
  const int64_t ih = pixel / g.ow * g.stride - g.pad + tap / g.kw, iw = pixel % g.ow * g.stride - g.pad + tap % g.kw;
  return ih * g.w + iw;
}

// Runs body(group, C |S|, W_S, n0, count, scratch) over each group and round of images (rounds of
// at most kChainBytes of scratch, at least one image): C |S| + O floats of scratch for each of the
// round's (image, pixel) rows (a patch and an output, or an output gradient and a patch's).
template <typename F> void over_tap_groups(const Tensor& w, const ConvGeom& g, F&& body) {
  for (const TapGroup& grp : tap_groups(g)) {
    const int64_t ks = g.c * static_cast<int64_t>(grp.taps.size()), np = static_cast<int64_t>(grp.pixels.size());
    const Tensor packed = ks < g.ckk() ? pack_taps(w, g, grp.taps) : Tensor();
    const float* ws = packed.defined() ? packed.data<float>() : w.data<float>();
    const int64_t per_row = ks + g.o;
    const int64_t round = std::clamp<int64_t>(kChainBytes / std::max<int64_t>(np * per_row * 4, 1), 1, g.n);
    Tensor scratch = Tensor::empty({round * np * per_row});
    for (int64_t n0 = 0; n0 < g.n; n0 += round) body(grp, ks, ws, n0, std::min(round, g.n - n0), scratch.data<float>());
  }
}

void small_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g) {
  const int64_t hw = g.h * g.w, pixels = g.ohw();
  const float* xp = x.data<float>();
  const float* bp = b.defined() ? b.data<float>() : nullptr;
  float* yp = y.data<float>();
  over_tap_groups(w, g, [&](const TapGroup& grp, int64_t ks, const float* ws, int64_t n0, int64_t count,
                                     float* scratch) {
    const int64_t np = static_cast<int64_t>(grp.pixels.size()), ts = static_cast<int64_t>(grp.taps.size());
    float* patch = scratch;
    float* out = scratch + count * np * ks;
    cpu::parallel_for(count, cpu::items_per_piece(np * ks), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const float* xn = xp + (n0 + i) * g.c * hw;
        for (int64_t pp = 0; pp < np; ++pp) {
          float* row = patch + (i * np + pp) * ks;
          for (int64_t t = 0; t < ts; ++t) {
            const float* src = xn + tap_input(g, grp.pixels[pp], grp.taps[t]);
            for (int64_t c = 0; c < g.c; ++c) row[c * ts + t] = src[c * hw];
          }
        }
      }
    });
    cpu::gemm({.trans_b = true, .m = count * np, .n = g.o, .k = ks, .a = patch, .lda = ks, .b = ws, .ldb = ks,
               .c = out, .ldc = g.o, .sample_rows = true});
    cpu::parallel_for(count, cpu::items_per_piece(np * g.o), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        float* yn = yp + (n0 + i) * g.o * pixels;
        for (int64_t pp = 0; pp < np; ++pp) {
          const float* row = out + (i * np + pp) * g.o;
          const int64_t pixel = grp.pixels[pp];
          for (int64_t o = 0; o < g.o; ++o) yn[o * pixels + pixel] = bp ? row[o] + bp[o] : row[o];
        }
      }
    });
  });
}

void small_backward_data(Tensor& dx, const Tensor& dy, const Tensor& w, const ConvGeom& g) {
  const int64_t hw = g.h * g.w, pixels = g.ohw();
  const float* dyp = dy.data<float>();
  float* dxp = dx.data<float>();
  dx.zero_();
  over_tap_groups(w, g, [&](const TapGroup& grp, int64_t ks, const float* ws, int64_t n0, int64_t count,
                                     float* scratch) {
    const int64_t np = static_cast<int64_t>(grp.pixels.size()), ts = static_cast<int64_t>(grp.taps.size());
    float* grad = scratch;
    float* d = scratch + count * np * g.o;
    cpu::parallel_for(count, cpu::items_per_piece(np * g.o), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const float* dyn = dyp + (n0 + i) * g.o * pixels;
        for (int64_t pp = 0; pp < np; ++pp) {
          float* row = grad + (i * np + pp) * g.o;
          for (int64_t o = 0; o < g.o; ++o) row[o] = dyn[o * pixels + grp.pixels[pp]];
        }
      }
    });
    cpu::gemm({.m = count * np, .n = ks, .k = g.o, .a = grad, .lda = g.o, .b = ws, .ldb = ks, .c = d, .ldc = ks,
               .sample_rows = true});
    cpu::parallel_for(count, cpu::items_per_piece(np * ks), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        float* dxn = dxp + (n0 + i) * g.c * hw;
        for (int64_t pp = 0; pp < np; ++pp) {
          const float* row = d + (i * np + pp) * ks;
          for (int64_t t = 0; t < ts; ++t) {
            float* dst = dxn + tap_input(g, grp.pixels[pp], grp.taps[t]);
            for (int64_t c = 0; c < g.c; ++c) dst[c * hw] += row[c * ts + t];
          }
        }
      }
    });
  });
}

// sum of p[0, n) in 8 fixed lanes, then the lanes in order: the same bits wherever p lies.
float sum_in_lanes(const float* p, int64_t n) {
  float lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += p[i + l];
  }
  for (int l = 0; i < n; ++i, ++l) lane[l] += p[i];
  float s = 0.0f;
  for (float v : lane) s += v;
  return s;
}

// The forward in oneDNN (kernels/cpu/conv2d_onednn.h): one piece per image.
void onednn_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g) {
  const auto& conv = cpu::onednn::Conv::get(g.onednn_shape(b.defined()));
  Tensor weights = Tensor::empty({conv.forward_weights_floats()});
  conv.prepare_forward_weights(weights.data<float>(), w.data<float>());
  const int64_t scratch = std::max<int64_t>(conv.forward_scratch_floats(), 1);
  Tensor ws = Tensor::empty({cpu::parallel_slots(g.n), scratch});
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const float* bp = b.defined() ? b.data<float>() : nullptr;
  cpu::parallel_pieces(g.n, [&](int64_t n, int slot) {
    conv.forward(yp + n * g.o * g.ohw(), xp + n * g.c * g.h * g.w, weights.data<float>(), bp,
                 ws.data<float>() + slot * scratch);
  });
}

void forward_f32(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, int stride, int pad) {
  const ConvGeom g = geometry(x, w, y.size(2), y.size(3), stride, pad);
  if (small_products(g) && g.n > 0) return small_forward(y, x, w, b, g);  // Note [small images as products over the batch]
  if (g.onednn()) return onednn_forward(y, x, w, b, g);
  const int64_t img = g.c * g.h * g.w, out = g.o * g.ohw();
  const bool pointwise = g.pointwise();
  const int64_t rows = pointwise ? g.oh : block_rows(g), blocks = (g.oh + rows - 1) / rows;
  const int64_t block = g.ckk() * rows * g.ow, pieces = g.n * blocks;
  Tensor ws = pointwise ? Tensor() : Tensor::empty({cpu::parallel_slots(pieces), block});
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const float* bp = b.defined() ? b.data<float>() : nullptr;

  cpu::parallel_pieces(pieces, [&](int64_t piece, int slot) {
    const int64_t n = piece / blocks, i0 = piece % blocks * rows, i1 = std::min(i0 + rows, g.oh);
    const int64_t cols = (i1 - i0) * g.ow;
    float* yb = yp + n * out + i0 * g.ow;
    const float* col = xp + n * img;
    if (!pointwise) {
      float* buf = ws.data<float>() + slot * block;
      im2col(buf, xp + n * img, g, i0, i1, 0, g.c);
      col = buf;
    }
    if (bp) {  // the bias first, the product added onto it
      for (int64_t o = 0; o < g.o; ++o) std::fill(yb + o * g.ohw(), yb + o * g.ohw() + cols, bp[o]);
    }
    cpu::gemm_serial({.m = g.o, .n = cols, .k = g.ckk(), .a = w.data<float>(), .lda = g.ckk(), .b = col,
                      .ldb = cols, .c = yb, .ldc = g.ohw(), .accumulate = bp != nullptr});
  });
}

void backward_f32(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                  int stride, int pad, bool accumulate) {
  const ConvGeom g = geometry(x, w, dy.size(2), dy.size(3), stride, pad);
  const int64_t img = g.c * g.h * g.w, out = g.o * g.ohw(), kk = g.kh * g.kw;
  const float* xp = x.data<float>();
  const float* dyp = dy.data<float>();

  if (db.defined()) {
    float* dbp = db.data<float>();
    cpu::parallel_for(g.o, cpu::items_per_piece(g.n * g.ohw()), [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {  // Note [weight gradients in sample order]
        float s = accumulate ? dbp[o] : 0.0f;
        for (int64_t n = 0; n < g.n; ++n) s += sum_in_lanes(dyp + n * out + o * g.ohw(), g.ohw());
        dbp[o] = s;
      }
    });
  }
  if (g.n == 0 && dw.defined() && !accumulate) dw.zero_();
  if (g.n == 0 || (!dx.defined() && !dw.defined())) return;
  if (small_products(g)) {  // Note [small images as products over the batch]; dW in chains
    if (dw.defined()) dw_chains(dw, dy, x, g, accumulate);
    if (dx.defined()) small_backward_data(dx, dy, w, g);
    return;
  }
  if (dw.defined() && small_images(g)) {  // Note [dW of small images]; then dx alone
    dw_chains(dw, dy, x, g, accumulate);
    if (!dx.defined()) return;
    Tensor no_dw, no_db;
    return backward_f32(dx, no_dw, no_db, dy, x, w, stride, pad, accumulate);
  }

  // oneDNN (kernels/cpu/conv2d_onednn.h) does one image per call: dW pieces are one per image.
  const cpu::onednn::Conv* onednn = g.onednn() ? &cpu::onednn::Conv::get(g.onednn_shape(false)) : nullptr;
  const bool onednn_dw = dw_in_onednn(g);
  const bool pointwise = g.pointwise() && !onednn;
  const int64_t rows = pointwise ? g.oh : block_rows(g);
  // A thread's scratch: the largest of what its pieces need (oneDNN's dx and dW, our column blocks).
  const int64_t block = std::max({int64_t{1}, onednn && dx.defined() ? onednn->backward_data_scratch_floats() : 0,
                                  onednn_dw && dw.defined() ? onednn->backward_weights_scratch_floats() : 0,
                                  !onednn || (!onednn_dw && dw.defined()) ? g.ckk() * rows * g.ow : 0});
  const int64_t group = channels_per_dw_piece(g);
  const int64_t channel_groups = (g.c + group - 1) / group;
  const bool per_image = dw_per_image(g);  // dW pieces: per image, or per channel group
  const int64_t wsize = g.o * g.ckk();
  // Images per parallel part: all of them, but with per-image dW partials only as many as
  // dw_partial_images allows (Note [dW partials in rounds]).
  const int64_t round = dw.defined() && per_image ? std::min(g.n, dw_partial_images(wsize)) : g.n;
  // A round of `count` images: its dW pieces (per image, or per channel group), then its dx pieces.
  auto dw_pieces = [&](int64_t count) { return !dw.defined() ? 0 : per_image ? count : channel_groups; };
  const int64_t pieces = dw_pieces(round) + (dx.defined() ? round : 0);
  Tensor ws = pointwise ? Tensor() : Tensor::empty({cpu::parallel_slots(pieces), block});
  Tensor partial = dw.defined() && per_image ? Tensor::empty({round, wsize}) : Tensor();
  const float* wp = w.data<float>();
  Tensor onednn_weights;  // the filters in oneDNN's layout for the input gradient
  if (onednn && dx.defined()) {
    onednn_weights = Tensor::empty({onednn->backward_weights_floats()});
    onednn->prepare_backward_weights(onednn_weights.data<float>(), wp);
  }

  // dW's columns of channels [c0, c1) over images [n0, n1), every row block, in order, into dwp
  // (a row stride of ckk), added onto what it holds when `add`.
  auto dw_piece = [&](int64_t c0, int64_t c1, int64_t n0, int64_t n1, float* dwp, bool add, float* buf) {
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t i0 = 0; i0 < g.oh; i0 += rows) {
        const int64_t i1 = std::min(i0 + rows, g.oh), cols = (i1 - i0) * g.ow;
        const float* col = xp + n * img + c0 * g.h * g.w;
        if (!pointwise) {
          im2col(buf, xp + n * img, g, i0, i1, c0, c1);
          col = buf;
        }
        cpu::gemm_serial({.trans_b = true, .m = g.o, .n = (c1 - c0) * kk, .k = cols, .a = dyp + n * out + i0 * g.ow,
                          .lda = g.ohw(), .b = col, .ldb = pointwise ? g.ohw() : cols, .c = dwp + c0 * kk,
                          .ldc = g.ckk(), .accumulate = add});
        add = true;
      }
    }
  };
  // dx of image n: W^T dY block by block, each scattered back by col2im.
  auto dx_piece = [&](int64_t n, float* buf) {
    float* dxn = dx.data<float>() + n * img;
    const float* dyn = dyp + n * out;
    if (pointwise) {
      cpu::gemm_serial({.trans_a = true, .m = g.c, .n = g.ohw(), .k = g.o, .a = wp, .lda = g.ckk(), .b = dyn,
                        .ldb = g.ohw(), .c = dxn, .ldc = g.ohw()});
      return;
    }
    std::fill(dxn, dxn + img, 0.0f);
    for (int64_t i0 = 0; i0 < g.oh; i0 += rows) {
      const int64_t i1 = std::min(i0 + rows, g.oh), cols = (i1 - i0) * g.ow;
      cpu::gemm_serial({.trans_a = true, .m = g.ckk(), .n = cols, .k = g.o, .a = wp, .lda = g.ckk(),
                        .b = dyn + i0 * g.ow, .ldb = g.ohw(), .c = buf, .ldc = cols});
      col2im_add(dxn, buf, g, i0, i1);
    }
  };

  for (int64_t n0 = 0; n0 < g.n; n0 += round) {
    const int64_t count = std::min(round, g.n - n0);  // images in this round
    const int64_t dw_here = dw_pieces(count);
    cpu::parallel_pieces(dw_here + (dx.defined() ? count : 0), [&](int64_t piece, int slot) {
      float* buf = pointwise ? nullptr : ws.data<float>() + slot * block;
      if (piece >= dw_here) {
        const int64_t n = n0 + piece - dw_here;
        if (onednn) onednn->backward_data(dx.data<float>() + n * img, dyp + n * out, onednn_weights.data<float>(), buf);
        else dx_piece(n, buf);
      } else if (onednn_dw) {
        const int64_t n = n0 + piece;
        onednn->backward_weights(partial.data<float>() + piece * wsize, xp + n * img, dyp + n * out, buf);
      } else if (per_image) {
        dw_piece(0, g.c, n0 + piece, n0 + piece + 1, partial.data<float>() + piece * wsize, false, buf);
      } else {  // one round: every image
        const int64_t c0 = piece * group;
        dw_piece(c0, std::min(c0 + group, g.c), 0, g.n, dw.data<float>(), accumulate, buf);
      }
    });
    if (partial.defined()) {  // dw (+)= this round's partials, one after another: per element, in image order
      const bool fresh = n0 == 0 && !accumulate;
      float* dwp = dw.data<float>();
      const float* pp = partial.data<float>();
      cpu::parallel_for(wsize, cpu::kParallelGrain, [&](int64_t e0, int64_t e1) {
        float* d = dwp + e0;
        const int64_t len = e1 - e0;
        if (fresh) std::fill(d, d + len, 0.0f);
        for (int64_t k = 0; k < count; ++k) {
          const float* p = pp + k * wsize + e0;
#pragma omp simd
          for (int64_t e = 0; e < len; ++e) d[e] += p[e];
        }
      });
    }
  }
}

// bf16/f16 (Note [half operands] in kernels/cpu/gemm.h): the float32 kernels above on chunks of
// images widened in turn (the filters whole: they are small), each chunk's output rounded back.
// Every image's output and input gradient is its own (pieces per image), and dW and db add the
// images in image order across chunks as within one (Note [weight gradients in sample order]):
// the bits of the whole batch widened at once.
bool any_half(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->defined() && cpu::is_half(t->dtype())) return true;
  }
  return false;
}

// Images per chunk: float32 copies of an image's x and y (or dy), and in backward its dW partial
// (`per_image_extra` floats) where the layer makes dW per image. Counted for every layer, that
// cut ResNet-18's 512-channel layers, whose dW is added in place (Note [dW of small images]), into
// chunks of 2 images, each re-preparing oneDNN's filters: its bf16 step at 32 x 32, batch 64,
// took 452 ms against float32's 230.
int64_t image_chunk(const Tensor& x, const Tensor& y, int64_t per_image_extra = 0) {
  const int64_t n = x.size(0), per_image = n == 0 ? 0 : 4 * ((x.numel() + y.numel()) / n + per_image_extra);
  return cpu::half_chunk_rows(n, per_image);
}

}  // namespace

template <>
void conv2d_forward<Cpu>(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, int stride, int pad,
                         bool channels_last, bool relu) {
  if (channels_last) {  // Note [channels last on the CPU]
    Tensor yf = cpu::channels_first_empty(y);
    conv2d_forward<Cpu>(yf, cpu::channels_first_copy(x), cpu::channels_first_copy(w), b, stride, pad, false, relu);
    return cpu::store_channels_last(y, yf);
  }
  if (relu) {  // Note [fused relu]: the ReLU kernel in place, the unfused bits
    conv2d_forward<Cpu>(y, x, w, b, stride, pad, false, false);
    return relu_forward<Cpu>(y, y);
  }
  if (!any_half({&y, &x, &w, &b})) return forward_f32(y, x, w, b, stride, pad);
  const Tensor w32 = cpu::widened(w), b32 = b.defined() ? cpu::widened(b) : Tensor();
  const int64_t n = x.size(0), chunk = image_chunk(x, y);
  for (int64_t n0 = 0; n0 < n; n0 += chunk) {
    const int64_t rows = std::min(chunk, n - n0);
    const Tensor x32 = cpu::widen_rows(x, n0, rows);
    Tensor y32 = Tensor::empty({rows, y.size(1), y.size(2), y.size(3)});
    forward_f32(y32, x32, w32, b32, stride, pad);
    cpu::store_rows(y, n0, y32);
  }
}

template <>
void conv2d_backward<Cpu>(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x,
                          const Tensor& w, int stride, int pad, bool accumulate, bool channels_last, bool mask_dx) {
  if (mask_dx && dx.defined()) {  // the ReLU's mask after the sums, as the ReLU's backward applies it
    MG_CHECK(dx.dtype() == x.dtype(), "conv2d: a dx masked by x must have x's dtype " << dtype_name(x.dtype()) << ", got "
                                                                                      << dtype_name(dx.dtype()));
    conv2d_backward<Cpu>(dx, dw, db, dy, x, w, stride, pad, accumulate, channels_last, false);
    relu_backward<Cpu>(dx, dx, x);
    return;
  }
  if (channels_last) {  // Note [channels last on the CPU]; an accumulated dW goes in as it is
    Tensor dxf = cpu::channels_first_empty(dx);
    Tensor dwf = accumulate ? cpu::channels_first_copy(dw) : cpu::channels_first_empty(dw);
    conv2d_backward<Cpu>(dxf, dwf, db, cpu::channels_first_copy(dy), cpu::channels_first_copy(x),
                         cpu::channels_first_copy(w), stride, pad, accumulate, false);
    if (dx.defined()) cpu::store_channels_last(dx, dxf);
    if (dw.defined()) cpu::store_channels_last(dw, dwf);
    return;
  }
  if (!any_half({&dx, &dw, &db, &dy, &x, &w})) return backward_f32(dx, dw, db, dy, x, w, stride, pad, accumulate);
  const Tensor w32 = cpu::widened(w);
  // A bf16 weight's own gradient (not a float32 buffer's sum) is summed in float32, then rounded.
  Tensor dw32 = cpu::float32_sum(dw), db32 = cpu::float32_sum(db);
  const bool partials = dw.defined() && dw_per_image(geometry(x, w, dy.size(2), dy.size(3), stride, pad));
  const int64_t n = x.size(0), chunk = image_chunk(x, dy, partials ? w.numel() : 0);
  bool add = accumulate;
  for (int64_t n0 = 0; n0 < std::max<int64_t>(n, 1); n0 += chunk) {
    const int64_t rows = std::min(chunk, n - n0);
    const Tensor x32 = cpu::widen_rows(x, n0, rows), dy32 = cpu::widen_rows(dy, n0, rows);
    Tensor dx32 = dx.defined() ? Tensor::empty(x32.shape()) : Tensor();
    backward_f32(dx32, dw32, db32, dy32, x32, w32, stride, pad, add);
    if (dx.defined()) cpu::store_rows(dx, n0, dx32);
    add = true;
  }
  cpu::store_sum(dw, dw32);
  cpu::store_sum(db, db32);
}

}  // namespace mg
