#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include <minigrad/core/tensor.h>
#include "core/parallel.h"
#include "kernels/cpu/eigen.h"
#include "kernels/cpu/half_rows.h"

#ifdef MINIGRAD_WITH_OPENBLAS
#include <cblas.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace mg::cpu {

namespace {

// Pieces of about this many multiply-adds (~0.1 ms on one AVX2 core): enough work per piece to
// hide the packing each SGEMM call repeats, enough pieces for a few cores.
constexpr int64_t kPieceFma = int64_t{1} << 21;
constexpr int64_t kMaxPieces = 16;
constexpr int64_t kPieceAlign = 16;

// The length of each piece when `len` rows or columns holding `fma` multiply-adds in all are cut
// into pieces of about kPieceFma (at most kMaxPieces): a multiple of `align`, at least `align`.
int64_t piece_length(int64_t len, int64_t fma, int64_t align) {
  const int64_t want = std::clamp<int64_t>(fma / kPieceFma, 1, kMaxPieces);
  return std::max<int64_t>((len + want - 1) / want + align - 1, align) / align * align;
}

#ifdef MINIGRAD_WITH_OPENBLAS
// OpenBLAS would start its own threads inside every call; ours already split the work.
void single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}
#endif

void eigen_product(const GemmArgs& g) {
  using Strided = Eigen::Map<const MatrixRM, 0, Eigen::OuterStride<>>;
  Eigen::Map<MatrixRM, 0, Eigen::OuterStride<>> C(static_cast<float*>(g.c), g.m, g.n, Eigen::OuterStride<>(g.ldc));
  const Strided A(static_cast<const float*>(g.a), g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k,
                  Eigen::OuterStride<>(g.lda));
  const Strided B(static_cast<const float*>(g.b), g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n,
                  Eigen::OuterStride<>(g.ldb));
  auto run = [&](const auto& a, const auto& b) {
    if (g.accumulate) C.noalias() += a * b;
    else C.noalias() = a * b;
  };
  if (g.trans_a && g.trans_b) run(A.transpose(), B.transpose());
  else if (g.trans_a) run(A.transpose(), B);
  else if (g.trans_b) run(A, B.transpose());
  else run(A, B);
}

#ifdef MINIGRAD_WITH_OPENBLAS
// Eigen unless MG_GEMM=openblas: measured faster in our pieces on the MLP and VGG steps (BENCHMARKS.md,
// "Which GEMM").
bool use_openblas() {
  static const bool yes = [] {
    const char* s = std::getenv("MG_GEMM");
    return s != nullptr && std::string(s) == "openblas";
  }();
  return yes;
}
#endif

void product(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
#ifdef MINIGRAD_WITH_OPENBLAS
  if (use_openblas()) {
    single_threaded_blas();
    cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), 1.0f,
                static_cast<const float*>(g.a), static_cast<int>(g.lda), static_cast<const float*>(g.b),
                static_cast<int>(g.ldb), g.accumulate ? 1.0f : 0.0f, static_cast<float*>(g.c), static_cast<int>(g.ldc));
    return;
  }
#endif
  eigen_product(g);
}

// ---- half operands (Note [half operands]) -------------------------------------------------------

const void* at(const void* p, DType t, int64_t i) { return static_cast<const char*>(p) + i * static_cast<int64_t>(dtype_size(t)); }
void* at(void* p, DType t, int64_t i) { return static_cast<char*>(p) + i * static_cast<int64_t>(dtype_size(t)); }

float widen_element(const void* p, DType t, int64_t i) {
  float v;
  widen_span(&v, at(p, t, i), t, 1);
  return v;
}

// Note [half scratch]
// ~~~~~~~~~~~~~~~~~~~~
// The float32 blocks of half operands are tensors the CPU allocator counts (Note [half operands]).
// In a parallel product they come from room the driver allocates for every slot before the pieces
// run (SlotRoom), not from each piece as it goes: pieces that happen to overlap in time, or not,
// under another load would otherwise change the bytes in use at the product's moment, and the
// planner's measurement of a unit would not be the step's (tests/test_precision.cpp saw 139 KB,
// 2.5% of the tiny GPT's bf16 peak, move with the machine's load). A serial product, which has
// nothing to overlap, takes tensors as it goes. sum_outer_products' panels (outer_block) and the
// padded group of a sample_rows product's last rows (padded_rows) come from the same kind of room,
// float32 or not: they were vectors no statistic saw, up to 0.4 MB a thread each.
struct Scratch {
  float* base = nullptr;
  int64_t size = 0, used = 0;
};

// Room for every slot of a parallel part of `pieces` pieces, `per_slot` floats each.
class SlotRoom {
 public:
  SlotRoom(int64_t pieces, int64_t per_slot) : per_(per_slot), slots_(parallel_slots(pieces)) {
    if (per_slot > 0) room_ = Tensor::empty({slots_ * per_slot}, TensorOptions{DType::f32, Device::cpu()});
  }
  // (A slot past those counted here would mean the thread count changed between the room and its
  // parallel part.)
  Scratch at(int slot) const {
    MG_CHECK(slot < slots_, "gemm: slot " << slot << " of a room made for " << slots_
                                          << " (the thread count changed during a product)");
    return room_.defined() ? Scratch{room_.data<float>() + slot * per_, per_, 0} : Scratch{};
  }

 private:
  int64_t per_, slots_;
  Tensor room_;
};

// Float32 blocks for one call: from the piece's scratch when it has one (what it took goes back at
// scope exit), else tensors of their own.
class Blocks {
 public:
  explicit Blocks(Scratch* s) : s_(s), mark_(s ? s->used : 0) {}
  ~Blocks() {
    if (s_) s_->used = mark_;
  }
  Blocks(const Blocks&) = delete;
  Blocks& operator=(const Blocks&) = delete;
  float* take(int64_t n) {
    if (s_ == nullptr) return own_.emplace_back(Tensor::empty({n}, TensorOptions{DType::f32, Device::cpu()})).data<float>();
    MG_CHECK(s_->used + n <= s_->size, "gemm: a block of " << n << " floats overflows its piece's room ("
                                                                         << s_->size - s_->used << " left)");
    float* p = s_->base + s_->used;
    s_->used += n;
    return p;
  }
  // rows x cols of p (leading dimension ld, dtype t) as a compact float32 block.
  float* widen(const void* p, DType t, int64_t rows, int64_t cols, int64_t ld) {
    float* o = take(rows * cols);
    for (int64_t r = 0; r < rows; ++r) widen_span(o + r * cols, at(p, t, r * ld), t, cols);
    return o;
  }

 private:
  Scratch* s_;
  int64_t mark_;
  std::vector<Tensor> own_;
};

// g's B as a float32 block, into f (when it is bf16/f16).
void widen_b(const GemmArgs& g, GemmArgs& f, Blocks& blocks) {
  if (g.b_type == DType::f32) return;
  const int64_t cols = g.trans_b ? g.k : g.n;
  f.b = blocks.widen(g.b, g.b_type, g.trans_b ? g.n : g.k, cols, g.ldb), f.ldb = cols, f.b_type = DType::f32;
}

// Rows of C per block in a sample_rows piece with half operands: a multiple of Eigen's row group (4).
constexpr int64_t kHalfRows = 32;
// Samples per chunk of a sum of outer products with half operands.
constexpr int64_t kHalfSamples = 64;

bool all_float(const GemmArgs& g) {
  return g.a_type == DType::f32 && g.b_type == DType::f32 && g.c_type == DType::f32 && g.c_init == nullptr;
}

// The floats a serial call with half operands takes at most, for C of rows x cols: B's block, and
// A's and C's for kHalfRows rows at a time (or all rows, when fewer).
int64_t half_block_floats(const GemmArgs& g, int64_t rows, int64_t cols) {
  if (all_float(g)) return 0;
  const int64_t r = rows > kHalfRows && g.sample_rows ? kHalfRows : rows;
  return g.k * cols + r * g.k + r * cols;
}

void gemm_serial_in(const GemmArgs& g, Scratch* scratch);

}  // namespace

void gemm_serial(const GemmArgs& g) { gemm_serial_in(g, nullptr); }

namespace {

void gemm_serial_in(const GemmArgs& g, Scratch* scratch) {
  if (all_float(g)) {
    if (g.k == 0) {  // an empty sum: C = 0, or C unchanged
      if (!g.accumulate) {
        float* c = static_cast<float*>(g.c);
        for (int64_t i = 0; i < g.m; ++i) std::fill(c + i * g.ldc, c + i * g.ldc + g.n, 0.0f);
      }
      return;
    }
    return product(g);
  }
  if (g.m == 0 || g.n == 0) return;
  // Note [half operands]: this piece's blocks in float32, the float32 product, C rounded back.
  GemmArgs f = g;
  Blocks blocks(scratch);
  if (g.sample_rows && g.m > kHalfRows) {
    // Rows of samples (a multiple of kRowGroup here) in blocks of kHalfRows: the same bits (Note
    // [rows that do not depend on the batch]), A's and C's copies a block's; B widened once.
    widen_b(g, f, blocks);
    for (int64_t r0 = 0; r0 < g.m; r0 += kHalfRows) {
      GemmArgs rows = f;
      rows.m = std::min(kHalfRows, g.m - r0);
      rows.a = at(g.a, g.a_type, g.trans_a ? r0 : r0 * g.lda);
      rows.c = at(g.c, g.c_type, r0 * g.ldc);
      gemm_serial_in(rows, scratch);
    }
    return;
  }
  if (g.a_type != DType::f32) {
    const int64_t cols = g.trans_a ? g.m : g.k;
    f.a = blocks.widen(g.a, g.a_type, g.trans_a ? g.k : g.m, cols, g.lda), f.lda = cols, f.a_type = DType::f32;
  }
  widen_b(g, f, blocks);
  const bool in_place = g.c_type == DType::f32 && g.c_init == nullptr;
  float* c = nullptr;
  if (!in_place) {
    if (g.c_init) {
      c = blocks.take(g.m * g.n);
      for (int64_t i = 0; i < g.m; ++i) std::copy(g.c_init, g.c_init + g.n, c + i * g.n);
    } else {
      c = g.accumulate ? blocks.widen(g.c, g.c_type, g.m, g.n, g.ldc) : blocks.take(g.m * g.n);
    }
    f.c = c, f.ldc = g.n, f.c_type = DType::f32, f.c_init = nullptr;
    f.accumulate = g.accumulate || g.c_init != nullptr;
  }
  gemm_serial_in(f, nullptr);  // all float32 now: takes nothing
  if (in_place) return;
  for (int64_t i = 0; i < g.m; ++i) narrow_span(at(g.c, g.c_type, i * g.ldc), g.c_type, c + i * g.n, g.n);
}

}  // namespace

namespace {

// Note [rows that do not depend on the batch]: column pieces sized as if C had kNominalRows rows,
// starting at multiples of kColumnAlign (a multiple of Eigen's register block in columns of C on
// SSE, AVX2 and AVX-512: 12, 24 and 48 floats), row blocks of kRowBlock, and rows in groups of
// kRowGroup (Eigen's register block in rows of C: rows past the last full group take other paths).
constexpr int64_t kNominalRows = 32, kColumnAlign = 48, kRowBlock = 256, kRowGroup = 4;

// The floats padded_rows takes from its piece's room: a group's rows of A and of C.
int64_t padded_floats(int64_t k, int64_t cols) { return kRowGroup * (k + cols); }

// The last rows of C (fewer than kRowGroup) as the first rows of a full group, the rest zero; the
// group's copies from `scratch` (padded_floats(k, n) free there), so the allocator counts them (a
// Linear(25088, 4096) on an odd batch held 0.4 MB a thread no statistic saw).
void padded_rows(const GemmArgs& g, Scratch* scratch) {
  Blocks blocks(scratch);
  float* a = blocks.take(kRowGroup * g.k);
  float* c = blocks.take(kRowGroup * g.n);
  std::fill(a, a + kRowGroup * g.k, 0.0f);
  std::fill(c, c + kRowGroup * g.n, 0.0f);
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.k; ++j) a[i * g.k + j] = widen_element(g.a, g.a_type, g.trans_a ? j * g.lda + i : i * g.lda + j);
    if (g.c_init) std::copy(g.c_init, g.c_init + g.n, c + i * g.n);
    else if (g.accumulate) widen_span(c + i * g.n, at(g.c, g.c_type, i * g.ldc), g.c_type, g.n);
  }
  GemmArgs group = g;
  group.trans_a = false;
  group.m = kRowGroup;
  group.a = a;
  group.lda = g.k;
  group.a_type = DType::f32;
  group.c = c;
  group.ldc = g.n;
  group.c_type = DType::f32;
  group.c_init = nullptr;
  group.accumulate = g.accumulate || g.c_init != nullptr;
  gemm_serial(group);
  for (int64_t i = 0; i < g.m; ++i) narrow_span(at(g.c, g.c_type, i * g.ldc), g.c_type, c + i * g.n, g.n);
}

void gemm_sample_rows(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;  // no pieces (and no room for them)
  const int64_t width = piece_length(g.n, kNominalRows * g.n * std::max<int64_t>(g.k, 1), kColumnAlign);
  const int64_t col_pieces = (g.n + width - 1) / width, row_pieces = (g.m + kRowBlock - 1) / kRowBlock;
  const int64_t padded = g.m % kRowGroup != 0 && g.k > 0 ? padded_floats(g.k, width) : 0;  // the last block's odd rows
  const SlotRoom room(col_pieces * row_pieces, half_block_floats(g, std::min(kRowBlock, g.m), width) + padded);  // Note [half scratch]
  parallel_pieces(col_pieces * row_pieces, [&](int64_t piece, int slot) {
    Scratch scratch = room.at(slot);
    const int64_t r0 = piece / col_pieces * kRowBlock, c0 = piece % col_pieces * width;
    GemmArgs p = g;
    p.m = std::min(kRowBlock, g.m - r0) / kRowGroup * kRowGroup;
    p.n = std::min(width, g.n - c0);
    p.a = at(g.a, g.a_type, g.trans_a ? r0 : r0 * g.lda);
    p.b = at(g.b, g.b_type, g.trans_b ? c0 * g.ldb : c0);
    p.c = at(g.c, g.c_type, r0 * g.ldc + c0);
    if (g.c_init) p.c_init = g.c_init + c0;
    if (p.m > 0) gemm_serial_in(p, &scratch);
    GemmArgs rest = p;  // the rows after the last full group
    rest.m = std::min(kRowBlock, g.m - r0) - p.m;
    if (rest.m == 0) return;
    rest.a = at(p.a, g.a_type, g.trans_a ? p.m : p.m * g.lda);
    rest.c = at(p.c, g.c_type, p.m * g.ldc);
    if (rest.k == 0) return gemm_serial(rest);
    padded_rows(rest, &scratch);
  });
}

}  // namespace

void gemm(const GemmArgs& g) {
  if (g.sample_rows) return gemm_sample_rows(g);
  // Cut the longer side of C: the other operand's packing is what every piece repeats.
  const bool by_rows = g.m >= g.n;
  const int64_t len = by_rows ? g.m : g.n;
  const int64_t step = piece_length(len, g.m * g.n * std::max<int64_t>(g.k, 1), kPieceAlign);
  const int64_t pieces = (len + step - 1) / step;
  if (pieces <= 1) return gemm_serial(g);
  const SlotRoom room(pieces, half_block_floats(g, by_rows ? step : g.m, by_rows ? g.n : step));  // Note [half scratch]
  parallel_pieces(pieces, [&](int64_t piece, int slot) {
    Scratch scratch = room.at(slot);
    const int64_t begin = piece * step, size = std::min(step, len - begin);
    GemmArgs p = g;
    if (by_rows) {
      p.m = size;
      p.a = at(g.a, g.a_type, g.trans_a ? begin : begin * g.lda);
      p.c = at(g.c, g.c_type, begin * g.ldc);
    } else {
      p.n = size;
      p.b = at(g.b, g.b_type, g.trans_b ? begin * g.ldb : begin);
      p.c = at(g.c, g.c_type, begin);
      if (g.c_init) p.c_init = g.c_init + begin;
    }
    gemm_serial_in(p, &scratch);
  });
}

namespace {

#ifdef __FMA__
inline float fmadd(float x, float y, float z) { return __builtin_fmaf(x, y, z); }
#else
inline float fmadd(float x, float y, float z) { return x * y + z; }
#endif

// A tile of R rows (of C) by kTileCols columns, held in registers while the samples stream by.
constexpr int64_t kTileRows = 6, kTileCols = 16;

template <int64_t R>
void outer_tile(int64_t n, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                bool accumulate) {
#if defined(__AVX2__) && defined(__FMA__)
  // Written out in 256-bit registers, one named variable per accumulator: compilers tuned for some
  // CPUs pick 128-bit vectors, and an array of accumulators was kept on the stack. Each lane is
  // one correctly rounded fused multiply-add, as in outer_edge.
  static_assert(R == 1 || R == 6);
  const auto load = [&](int64_t r, int64_t half) {
    return accumulate ? _mm256_loadu_ps(c + r * ldc + 8 * half) : _mm256_setzero_ps();
  };
  const auto store = [&](int64_t r, int64_t half, __m256 v) { _mm256_storeu_ps(c + r * ldc + 8 * half, v); };
  if constexpr (R == 1) {
    __m256 c0 = load(0, 0), c1 = load(0, 1);
    for (int64_t s = 0; s < n; ++s) {
      const __m256 x = _mm256_broadcast_ss(a + s * lda);
      c0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b + s * ldb), c0);
      c1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b + s * ldb + 8), c1);
    }
    store(0, 0, c0);
    store(0, 1, c1);
  } else {
    __m256 c00 = load(0, 0), c01 = load(0, 1), c10 = load(1, 0), c11 = load(1, 1), c20 = load(2, 0),
           c21 = load(2, 1), c30 = load(3, 0), c31 = load(3, 1), c40 = load(4, 0), c41 = load(4, 1),
           c50 = load(5, 0), c51 = load(5, 1);
    for (int64_t s = 0; s < n; ++s) {
      const __m256 b0 = _mm256_loadu_ps(b + s * ldb), b1 = _mm256_loadu_ps(b + s * ldb + 8);
      const float* as = a + s * lda;
      __m256 x = _mm256_broadcast_ss(as + 0);
      c00 = _mm256_fmadd_ps(x, b0, c00);
      c01 = _mm256_fmadd_ps(x, b1, c01);
      x = _mm256_broadcast_ss(as + 1);
      c10 = _mm256_fmadd_ps(x, b0, c10);
      c11 = _mm256_fmadd_ps(x, b1, c11);
      x = _mm256_broadcast_ss(as + 2);
      c20 = _mm256_fmadd_ps(x, b0, c20);
      c21 = _mm256_fmadd_ps(x, b1, c21);
      x = _mm256_broadcast_ss(as + 3);
      c30 = _mm256_fmadd_ps(x, b0, c30);
      c31 = _mm256_fmadd_ps(x, b1, c31);
      x = _mm256_broadcast_ss(as + 4);
      c40 = _mm256_fmadd_ps(x, b0, c40);
      c41 = _mm256_fmadd_ps(x, b1, c41);
      x = _mm256_broadcast_ss(as + 5);
      c50 = _mm256_fmadd_ps(x, b0, c50);
      c51 = _mm256_fmadd_ps(x, b1, c51);
    }
    store(0, 0, c00), store(0, 1, c01), store(1, 0, c10), store(1, 1, c11), store(2, 0, c20), store(2, 1, c21);
    store(3, 0, c30), store(3, 1, c31), store(4, 0, c40), store(4, 1, c41), store(5, 0, c50), store(5, 1, c51);
  }
#else
  float acc[R][kTileCols];
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < kTileCols; ++j) acc[r][j] = accumulate ? c[r * ldc + j] : 0.0f;
  }
  for (int64_t s = 0; s < n; ++s) {
    const float* bs = b + s * ldb;
    const float* as = a + s * lda;
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t j = 0; j < kTileCols; ++j) acc[r][j] = fmadd(as[r], bs[j], acc[r][j]);
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < kTileCols; ++j) c[r * ldc + j] = acc[r][j];
  }
#endif
}

// Any rows by `cols` < kTileCols columns: the same chains, one element at a time.
void outer_edge(int64_t n, int64_t rows, int64_t cols, const float* a, int64_t lda, const float* b, int64_t ldb,
                float* c, int64_t ldc, bool accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      float acc = accumulate ? c[r * ldc + j] : 0.0f;
      for (int64_t s = 0; s < n; ++s) acc = fmadd(a[s * lda + r], b[s * ldb + j], acc);
      c[r * ldc + j] = acc;
    }
  }
}

// Rows [0, rows) of C over columns [0, cols): full tiles, then the edges. The rows' `a` values are
// copied first, a chunk of kChunkRows rows at a time, into a contiguous (n x kTileRows) panel per
// tile row: read in place they sit lda floats apart, a stride (2 KiB for 512 outputs) that maps a
// tile's samples onto a few L1 sets, and the loads then miss. `panel` has room for
// panel_floats(n, rows): the caller's, from a SlotRoom, so the CPU allocator counts it (Note [half
// scratch]).
constexpr int64_t kChunkRows = 16 * kTileRows;

int64_t panel_floats(int64_t n, int64_t rows) { return std::max<int64_t>(n, 1) * std::min(kChunkRows, rows); }

// Samples per call of outer_block in the float32 sum_outer_products: a panel of at most 4096 x 96
// floats (1.5 MiB) a thread, where a dW over 16,384 tokens would take 6 MiB; each chunk after the
// first passes over C once more.
constexpr int64_t kPanelSamples = 4096;

void outer_block(int64_t n, int64_t rows, int64_t cols, const float* a, int64_t lda, const float* b, int64_t ldb,
                 float* c, int64_t ldc, bool accumulate, float* panel) {
  const int64_t full_cols = cols / kTileCols * kTileCols;
  for (int64_t r0 = 0; r0 < rows; r0 += kChunkRows) {
    const int64_t chunk = std::min(kChunkRows, rows - r0);
    // Panel t holds rows [r0 + t kTileRows, ...) as (n x width), width = kTileRows but the last.
    for (int64_t t0 = 0; t0 < chunk; t0 += kTileRows) {
      const int64_t width = std::min(kTileRows, chunk - t0);
      float* dst = panel + t0 * n;
      for (int64_t s = 0; s < n; ++s) {
        for (int64_t r = 0; r < width; ++r) dst[s * width + r] = a[s * lda + r0 + t0 + r];
      }
    }
    for (int64_t j = 0; j < full_cols; j += kTileCols) {
      for (int64_t t0 = 0; t0 < chunk; t0 += kTileRows) {
        const int64_t width = std::min(kTileRows, chunk - t0);
        const float* pa = panel + t0 * n;
        float* pc = c + (r0 + t0) * ldc + j;
        if (width == kTileRows) {
#if defined(__AVX2__) && defined(__FMA__)
          // The next tile's C rows (they are usually not in cache: a weight gradient is MiBs).
          if (accumulate && j + kTileCols < full_cols) {
            for (int64_t r = 0; r < kTileRows; ++r) {
              _mm_prefetch(reinterpret_cast<const char*>(pc + r * ldc + kTileCols), _MM_HINT_T0);
            }
          }
#endif
          outer_tile<kTileRows>(n, pa, kTileRows, b + j, ldb, pc, ldc, accumulate);
        } else {
          for (int64_t r = 0; r < width; ++r) outer_tile<1>(n, pa + r, width, b + j, ldb, pc + r * ldc, ldc, accumulate);
        }
      }
    }
  }
  if (full_cols < cols) {
    outer_edge(n, rows, cols - full_cols, a, lda, b + full_cols, ldb, c + full_cols, ldc, accumulate);
  }
}

}  // namespace

void sum_outer_products(int64_t n, int64_t m, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                        float* c, int64_t ldc, bool accumulate) {
  if (m == 0 || k == 0) return;
  // Pieces: row bands of C, sized by the work (the samples stream once per band and tile column).
  const int64_t band = piece_length(m, m * k * std::max<int64_t>(n, 1), kTileRows);
  const int64_t bands = (m + band - 1) / band;
  const SlotRoom room(bands, panel_floats(std::min(n, kPanelSamples), band));
  parallel_pieces(bands, [&](int64_t piece, int slot) {
    const int64_t r0 = piece * band, r1 = std::min(r0 + band, m);
    float* panel = room.at(slot).base;
    // The samples in chunks, each continuing the chains from C (a float stored and loaded back: the
    // same bits as one pass), so the panel stays at most kPanelSamples rows.
    for (int64_t s0 = 0; s0 < std::max<int64_t>(n, 1); s0 += kPanelSamples) {
      outer_block(std::min(kPanelSamples, n - s0), r1 - r0, k, a + s0 * lda + r0, lda, b + s0 * ldb, ldb, c + r0 * ldc,
                  ldc, accumulate || s0 > 0, panel);
    }
  });
}

void sum_outer_products(int64_t n, int64_t m, int64_t k, const void* a, DType a_type, int64_t lda, const void* b,
                        DType b_type, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (a_type == DType::f32 && b_type == DType::f32) {
    return sum_outer_products(n, m, k, static_cast<const float*>(a), lda, static_cast<const float*>(b), ldb, c, ldc,
                              accumulate);
  }
  if (m == 0 || k == 0) return;
  // The pieces of the float32 call; each runs the samples in chunks of kHalfSamples, the first
  // onto C as asked and the rest onto C, with the chunk's columns of a and rows of b widened: every
  // element is still one chain of multiply-adds in sample order (Note [sums in sample order]).
  const int64_t band = piece_length(m, m * k * std::max<int64_t>(n, 1), kTileRows);
  const int64_t bands = (m + band - 1) / band;
  const SlotRoom room(bands, kHalfSamples * (band + k) + panel_floats(kHalfSamples, band));  // Note [half scratch]
  parallel_pieces(bands, [&](int64_t piece, int slot) {
    const int64_t r0 = piece * band, r1 = std::min(r0 + band, m);
    Scratch scratch = room.at(slot);
    for (int64_t s0 = 0; s0 < std::max<int64_t>(n, 1); s0 += kHalfSamples) {
      const int64_t samples = std::min(kHalfSamples, n - s0);
      Blocks blocks(&scratch);
      const float* pa = blocks.widen(at(a, a_type, s0 * lda + r0), a_type, samples, r1 - r0, lda);
      const float* pb = blocks.widen(at(b, b_type, s0 * ldb), b_type, samples, k, ldb);
      float* panel = blocks.take(panel_floats(samples, r1 - r0));
      outer_block(samples, r1 - r0, k, pa, r1 - r0, pb, k, c + r0 * ldc, ldc, accumulate || s0 > 0, panel);
    }
  });
}

#define MG_STR2(x) #x
#define MG_STR(x) MG_STR2(x)
const char* gemm_backend() {
#ifdef MINIGRAD_WITH_OPENBLAS
  if (use_openblas()) return "openblas " MINIGRAD_OPENBLAS_VERSION;
#endif
  return "eigen " MG_STR(EIGEN_WORLD_VERSION) "." MG_STR(EIGEN_MAJOR_VERSION) "." MG_STR(EIGEN_MINOR_VERSION);
}

}  // namespace mg::cpu
