// Products through cuBLASLt with fused epilogues: Note [cublaslt products] in
// src/kernels/cuda/cublaslt.h. C = op(A) op(B) + beta C (C is D), column-major as
// math::GemmCall describes it; the bias epilogue adds a vector of C's rows, the BGRADB epilogue
// writes one of C's columns (=).
#include <atomic>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublaslt.h"
#include "kernels/cuda/matmul_math.h"
#include "kernels/cuda/storage.cuh"

namespace mg::cuda {
namespace {

// The largest power of two, up to 256, that divides the address: the heuristic's alignment
// preferences (its default asks 256 bytes, which a tensor one float into its storage lacks).
uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

struct LtKey {
  int dev;
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc, batch, stride_a, stride_b, stride_c;
  DType ab, c;
  bool tf32;
  LtEpilogue epilogue;
  uint32_t align_a, align_b, align_c, align_bias, align_aux;
  bool operator==(const LtKey&) const = default;
};
struct LtKeyHash {
  size_t operator()(const LtKey& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t v : {int64_t{k.dev}, int64_t{k.trans_a}, int64_t{k.trans_b}, k.m, k.n, k.k, k.lda, k.ldb, k.ldc, k.batch,
                      k.stride_a, k.stride_b, k.stride_c, static_cast<int64_t>(k.ab), static_cast<int64_t>(k.c),
                      int64_t{k.tf32}, static_cast<int64_t>(k.epilogue), int64_t{k.align_a}, int64_t{k.align_b},
                      int64_t{k.align_c}, int64_t{k.align_bias}, int64_t{k.align_aux}})
      h = (h ^ static_cast<size_t>(v)) * 1099511628211ull;
    return h;
  }
};

struct LtChoice {
  bool usable = false;  // false: cuBLASLt offered no algorithm (Note [cublaslt products])
  cublasLtMatmulAlgo_t algo{};
  bool invalid = false;  // refused for a descriptor it called invalid, not for want of an algorithm
};

std::mutex g_mu;  // the cache and the refusal
std::unordered_map<LtKey, LtChoice, LtKeyHash> g_cache;
std::string g_refusal;
std::atomic<int64_t> g_runs{0}, g_refused{0}, g_invalid{0};

cublasLtEpilogue_t epilogue_of(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::bias_grad: return CUBLASLT_EPILOGUE_BGRADB;
    case LtEpilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

const char* epilogue_name(LtEpilogue e) {
  return e == LtEpilogue::bias ? "bias" : e == LtEpilogue::bias_grad ? "bgradb" : e == LtEpilogue::gelu_aux_bias ? "gelu_aux_bias" : "none";
}

// The descriptors of one product: the operation, the layouts of A, B and C (D shares C's: in
// place) and the heuristic's preferences (creating them is host work, a few microseconds).
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;

  LtDescs(const LtProduct& p, const void* pa, const void* pb, const void* pc, const void* bias, size_t workspace,
          const void* aux = nullptr) {
    try {  // a throwing constructor runs no destructor: release what was created
      MG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, compute_type(p.tf32), CUDA_R_32F));
      const int32_t ta = p.g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
      set(CUBLASLT_MATMUL_DESC_TRANSA, ta);
      set(CUBLASLT_MATMUL_DESC_TRANSB, tb);
      const uint32_t epilogue = epilogue_of(p.epilogue);
      set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
      if (p.epilogue != LtEpilogue::none) {
        // The heuristic reads the pointer's alignment, never its data.
        set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
        const int32_t bias_type = cuda_type(p.c);
        set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
      }
      if (p.epilogue == LtEpilogue::gelu_aux_bias) {  // the argument of gelu, laid out as D
        set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
        const int64_t aux_ld = math::gemm_c_shape(p.g).ld;
        set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
        const int32_t aux_type = cuda_type(p.c);
        set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, aux_type);
      }
      a = layout(p.ab, math::gemm_a_shape(p.g), p.batch, p.stride_a);
      b = layout(p.ab, math::gemm_b_shape(p.g), p.batch, p.stride_b);
      c = layout(p.c, math::gemm_c_shape(p.g), p.batch, p.stride_c);
      MG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const uint64_t ws = workspace;
      prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws);
      // Split-K partial sums of a 16-bit output in float32 only (Note [cublaslt products]).
      const uint32_t schemes =
          p.c == DType::f32 ? uint32_t{CUBLASLT_REDUCTION_SCHEME_MASK}
                            : uint32_t{CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE};
      prefer(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, schemes);
      prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(pa));
      prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(pb));
      prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(pc));
      prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(pc));
    } catch (...) {
      release();
      throw;
    }
  }
  ~LtDescs() { release(); }
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;

 private:
  template <class V> void set(cublasLtMatmulDescAttributes_t attr, const V& v) {
    MG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, attr, &v, sizeof(v)));
  }
  template <class V> void prefer(cublasLtMatmulPreferenceAttributes_t attr, const V& v) {
    MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v)));
  }
  static cublasLtMatrixLayout_t layout(DType dtype, const math::MatrixShape& s, int64_t batch, int64_t stride) {
    cublasLtMatrixLayout_t l = nullptr;
    MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, cuda_type(dtype), static_cast<uint64_t>(s.rows),
                                               static_cast<uint64_t>(s.cols), s.ld));
    if (batch > 1) {
      const int32_t count = static_cast<int32_t>(batch);
      const int64_t offset = stride;
      const cublasStatus_t st1 = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count));
      const cublasStatus_t st2 =
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset, sizeof(offset));
      if (st1 != CUBLAS_STATUS_SUCCESS || st2 != CUBLAS_STATUS_SUCCESS) {
        cublasLtMatrixLayoutDestroy(l);
        MG_CUBLAS_CHECK(st1 != CUBLAS_STATUS_SUCCESS ? st1 : st2);
      }
    }
    return l;
  }
  void release() noexcept {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

std::string describe(const LtProduct& p) {
  std::ostringstream os;
  os << "cuBLASLt product m=" << p.g.m << " n=" << p.g.n << " k=" << p.g.k << (p.g.trans_a ? " A^T" : "")
     << (p.g.trans_b ? " B^T" : "") << " batch " << p.batch << ", " << dtype_name(p.ab) << " operands, "
     << dtype_name(p.c) << " output, " << (p.tf32 ? "TF32" : "float32") << " compute, epilogue "
     << epilogue_name(p.epilogue);
  return os.str();
}

// cuBLASLt's first algorithm for the product, or none (refused).
LtChoice choose(cublasLtHandle_t h, const LtDescs& d, const LtProduct& p) {
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result, &count);
  if (st == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS) return {true, result.algo};
  LtChoice refused;
  refused.invalid = st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED;
  std::ostringstream why;
  why << describe(p) << ": no algorithm ("
      << (st != CUBLAS_STATUS_SUCCESS ? cublasGetStatusString(st) : count == 0 ? "none returned"
                                                                                : cublasGetStatusString(result.state))
      << "); "
      << (p.epilogue == LtEpilogue::none ? "cublasGemmEx runs it" : "the unfused kernels and cublasGemmEx run it");
  std::lock_guard<std::mutex> lock(g_mu);
  g_refusal = why.str();
  return refused;
}

}  // namespace

bool lt_matmul(int device, const LtProduct& p, const void* a, const void* b, float beta, void* c, void* bias,
               void* aux) {
  MG_CHECK((p.epilogue == LtEpilogue::none) == (bias == nullptr),
           "cuBLASLt: a bias pointer goes with a bias epilogue, and only with one (" << describe(p) << ")");
  MG_CHECK((p.epilogue == LtEpilogue::gelu_aux_bias) == (aux != nullptr) && (aux == nullptr || beta == 0.0f),
           "cuBLASLt: an aux pointer goes with the gelu epilogue, and only with one, at beta 0 (" << describe(p) << ")");
  const LtKey key{device,      p.g.trans_a, p.g.trans_b, p.g.m,      p.g.n,        p.g.k,        p.g.lda,
                  p.g.ldb,     p.g.ldc,     p.batch,     p.stride_a, p.stride_b,   p.stride_c,   p.ab,
                  p.c,         p.tf32,      p.epilogue,  alignment(a), alignment(b), alignment(c),
                  bias ? alignment(bias) : 0u, aux ? alignment(aux) : 0u};
  if (p.epilogue == LtEpilogue::gelu_aux_bias && math::gemm_c_shape(p.g).ld % 8 != 0) {
    // cublasLt.h: the aux matrix's leading dimension must be divisible by 8.
    std::lock_guard<std::mutex> lock(g_mu);
    g_refusal = describe(p) + ": the GELU epilogue's aux leading dimension is not a multiple of 8";
    ++g_refused;
    return false;
  }
  LtChoice choice;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (auto it = g_cache.find(key); it != g_cache.end()) {
      choice = it->second;
      known = true;
    }
  }
  if (known && !choice.usable) {
    ++g_refused;
    if (choice.invalid) ++g_invalid;  // counted per call, as the refusals are
    return false;
  }
  Context& ctx = context(device);
  const LtDescs d(p, a, b, c, bias, ctx.workspace_bytes, aux);
  const cublasLtHandle_t h = cublaslt_handle(device);
  if (!known) {
    choice = choose(h, d, p);
    std::lock_guard<std::mutex> lock(g_mu);
    g_cache[key] = choice;
  }
  if (!choice.usable) {
    ++g_refused;
    if (choice.invalid) ++g_invalid;
    return false;
  }
  const float alpha = 1.0f;
  MG_CUBLAS_CHECK(cublasLtMatmul(h, d.op, &alpha, a, d.a, b, d.b, &beta, c, d.c, c, d.c, &choice.algo, ctx.workspace,
                                 ctx.workspace_bytes, ctx.stream));
  ++g_runs;
  return true;
}

std::string lt_check_descriptors() {
  // Pointers are only looked at for their alignment: any aligned address will do.
  void* const fake = reinterpret_cast<void*>(uintptr_t{1} << 20);
  const int64_t n = 37, k = 53, m = 29;
  struct Call {
    math::GemmCall g;
    LtEpilogue epilogue;
  };
  const Call linear_calls[] = {{math::linear_forward_gemm(n, k, m), LtEpilogue::none},
                               {math::linear_forward_gemm(n, k, m), LtEpilogue::bias},
                               {math::linear_dx_gemm(n, k, m), LtEpilogue::none},
                               {math::linear_dw_gemm(n, k, m), LtEpilogue::none},
                               {math::linear_dw_gemm(n, k, m), LtEpilogue::bias_grad},
                               {math::linear_forward_gemm(n, k, m), LtEpilogue::gelu_aux_bias},
                               {math::linear_db_gemm(n, m), LtEpilogue::none}};
  const math::GemmCall matmul_calls[] = {math::matmul_forward_gemm(n, k, m), math::matmul_da_gemm(n, k, m),
                                         math::matmul_db_gemm(n, k, m)};
  struct Types {
    DType ab, c;
    bool tf32;
  };
  const Types types[] = {{DType::f32, DType::f32, false}, {DType::f32, DType::f32, true},
                         {DType::bf16, DType::bf16, false}, {DType::bf16, DType::f32, false},
                         {DType::f16, DType::f16, false}, {DType::f16, DType::f32, false}};
  try {
    for (const Types& t : types) {
      for (const Call& call : linear_calls) {
        const LtProduct p{call.g, t.ab, t.c, t.tf32, call.epilogue};
        const LtDescs d(p, fake, fake, fake, call.epilogue == LtEpilogue::none ? nullptr : fake, size_t{32} << 20,
                        call.epilogue == LtEpilogue::gelu_aux_bias ? fake : nullptr);
      }
      for (const math::GemmCall& g : matmul_calls) {
        const math::BatchStrides s = math::matmul_strides(g, n, k, m);
        const LtProduct p{g, t.ab, t.c, t.tf32, LtEpilogue::none, 4, s.a, s.b, s.c};
        const LtDescs d(p, fake, fake, fake, nullptr, size_t{4} << 20);
      }
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

LtCounts lt_counts() { return {g_runs.load(), g_refused.load(), g_invalid.load()}; }

std::string lt_refusal() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_refusal;
}

}  // namespace mg::cuda
