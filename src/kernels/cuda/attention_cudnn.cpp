// cuDNN's fused attention (SDPA, flash attention) for bf16/f16 qkv, through the cuDNN frontend's
// graph API (attention_cudnn.h). The math is kernels/attention.h's without dropout:
//   forward:   S = Q K^T / sqrt(D), causal (key j > query t masked), Stats = max + log(sum exp) per
//              row (natural log: our lse), O = softmax(S) V                     (y =, lse =)
//   backward:  E_t = dO_t . O_t, dS = P o (dO V^T - E) / sqrt(D),
//              dQ = dS K, dK = dS^T Q, dV = P^T dO                            (dqkv =, every slot)
// Q, K, V, O (and dQ, dK, dV, dO) are strided views of the packed tensors, no copies
// (math::sdpa_views in attention_math.h, checked on the CPU by test_cuda_kernel_math). The products
// run on tensor cores with float32 sums; cuDNN rounds P to the operands' dtype before P V (as
// FlashAttention does), so y differs from the float32 kernels on the same rounded inputs by about
// the dtype's rounding (docs/cuda.md, "Fused attention").
//
// A graph is built once per (device, B, H, T, D, dtype, direction, determinism) and kept with its
// workspace size; a case cuDNN refuses is remembered as refused. Workspaces come from the caching
// allocator; every call runs on the device's stream (cudnn_handle, Note [cuda stream]).
// Determinism: with cuda::cudnn_deterministic() (the default, Note [deterministic convolutions] in
// conv2d.cu) the backward graph sets SDPA_backward_attributes::set_deterministic_algorithm(true):
// on sm_90 the frontend then takes cuDNN's dP-workspace backward (B H T^2 bf16 of workspace, dQ
// summed without atomics); where cuDNN has no deterministic backward the graph fails its checks
// and our own kernels run instead.
#include "kernels/cuda/attention_cudnn.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <mutex>

#include "kernels/attention.h"
#include "kernels/cuda/attention_math.h"
#include "kernels/cuda/refusals.h"

#ifdef MINIGRAD_WITH_CUDNN_FRONTEND
#include <tuple>

#include <minigrad/cuda.h>
#include "kernels/cuda/frontend_graph.h"
#endif

namespace mg::cuda {

namespace {
std::atomic<int64_t> g_forward{0}, g_backward{0};
Refusals g_refusals;

bool refuse(std::string why) { return g_refusals.refuse(std::move(why)); }
}  // namespace

SdpaCounts sdpa_counts() { return {g_forward.load(), g_backward.load(), g_refusals.count()}; }

std::string sdpa_refusal() { return g_refusals.last(); }

#ifndef MINIGRAD_WITH_CUDNN_FRONTEND

bool sdpa_built() { return false; }
bool sdpa_forward(Tensor&, Tensor&, const Tensor&, int) {
  return refuse("this build has no cuDNN frontend (docs/cuda.md, \"Fused attention\")");
}
bool sdpa_backward(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int) {
  return refuse("this build has no cuDNN frontend (docs/cuda.md, \"Fused attention\")");
}
std::string sdpa_check_description(const std::string&, int, int64_t, int64_t, int64_t, int64_t, DType, bool, bool) {
  return "this build has no cuDNN frontend";
}

#else

namespace fe = cudnn_frontend;
using frontend::BuiltGraph;

bool sdpa_built() { return true; }

namespace {

// The tensors' ids in the graphs' variant packs.
enum : int64_t { kQ = 1, kK, kV, kO, kStats, kDo, kDq, kDk, kDv };

struct GraphKey {
  int dev;
  int64_t b, h, t, d;
  DType dtype;
  bool backward, deterministic;
  auto tie() const { return std::tie(dev, b, h, t, d, dtype, backward, deterministic); }
  bool operator<(const GraphKey& o) const { return tie() < o.tie(); }
};

frontend::GraphCache<GraphKey>& graphs() {
  static auto* cache = new frontend::GraphCache<GraphKey>();  // never destroyed: frontend_graph.h
  return *cache;
}

std::vector<int64_t> dims_of(const math::SdpaView& v) { return {v.dim[0], v.dim[1], v.dim[2], v.dim[3]}; }
std::vector<int64_t> strides_of(const math::SdpaView& v) {
  return {v.stride[0], v.stride[1], v.stride[2], v.stride[3]};
}

std::shared_ptr<fe::graph::Tensor_attributes> view_tensor(fe::graph::Graph& g, const char* name, int64_t uid,
                                                          const math::SdpaView& v) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims_of(v)).set_stride(
      strides_of(v)));
}

void set_view(fe::graph::Tensor_attributes& t, const char* name, int64_t uid, const math::SdpaView& v) {
  t.set_output(true).set_name(name).set_uid(uid).set_dim(dims_of(v)).set_stride(strides_of(v));
}

math::AttentionDims dims_of_key(const GraphKey& k) {
  return math::attention_dims(k.b, k.t, 3 * k.h * k.d, static_cast<int>(k.h), AttentionDropout{});
}

// The graph of key k, described (tensors, views, SDPA node); nothing asked of cuDNN yet.
void describe(fe::graph::Graph& g, const GraphKey& k) {
  const math::SdpaViews v = math::sdpa_views(dims_of_key(k));
  g.set_io_data_type(k.dtype == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const float scale = 1.0f / std::sqrt(static_cast<float>(k.d));
  auto q = view_tensor(g, "Q", kQ, v.q), kk = view_tensor(g, "K", kK, v.k), vv = view_tensor(g, "V", kV, v.v);
  if (!k.backward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("causal_self_attention")
                    .set_generate_stats(true)
                    .set_attn_scale(scale)
                    .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)  // causal: key j <= query t
                    .set_diagonal_band_right_bound(0);
    auto [o, stats] = g.sdpa(q, kk, vv, opts);
    set_view(*o, "O", kO, v.o);
    set_view(*stats, "Stats", kStats, v.stats);
    stats->set_data_type(fe::DataType_t::FLOAT);
  } else {
    auto o = view_tensor(g, "O", kO, v.o), d_o = view_tensor(g, "dO", kDo, v.o);
    auto stats = view_tensor(g, "Stats", kStats, v.stats);
    stats->set_data_type(fe::DataType_t::FLOAT);
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("causal_self_attention_backward")
                    .set_attn_scale(scale)
                    .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                    .set_diagonal_band_right_bound(0)
                    .set_deterministic_algorithm(k.deterministic);
    auto [dq, dk, dv] = g.sdpa_backward(q, kk, vv, o, d_o, stats, opts);
    set_view(*dq, "dQ", kDq, v.q);
    set_view(*dk, "dK", kDk, v.k);
    set_view(*dv, "dV", kDv, v.v);
  }
}

std::string what(const GraphKey& k) { return std::string(k.backward ? "backward" : "forward") + " graph"; }

// Describes the graph of key k and asks cuDNN for it; a refusal says which step refused.
std::shared_ptr<const BuiltGraph> build(const GraphKey& k) {
  auto g = std::make_shared<fe::graph::Graph>();
  describe(*g, k);
  return frontend::build_graph(g, cudnn_handle(k.dev), what(k), {fe::HeurMode_t::A});
}

// The key of a call, or a refusal before any graph: the dtype, the case (math::sdpa_takes), the
// alignment of every tensor's data.
bool key_for(GraphKey& k, const Tensor& qkv, int heads, bool backward, std::initializer_list<const Tensor*> ts) {
  const DType dt = qkv.dtype();
  if (dt != DType::bf16 && dt != DType::f16) return refuse("qkv is " + std::string(dtype_name(dt)));
  const math::AttentionDims s = math::attention_dims(qkv.size(0), qkv.size(1), qkv.size(2), heads, AttentionDropout{});
  if (!math::sdpa_takes(s)) return refuse("head size " + std::to_string(s.d) + " (cuDNN takes multiples of 8 up to 128)");
  if (!frontend::aligned16(ts)) return refuse("a tensor's data is not 16-byte aligned");
  k = GraphKey{device_of(qkv), s.b, heads, s.t, s.d, dt, backward, backward && cudnn_deterministic()};
  return true;
}

void run(const BuiltGraph& b, int dev, std::unordered_map<int64_t, void*>& pack, const char* pass) {
  frontend::run_graph(b, dev, pack, std::string("causal_self_attention on CUDA: cuDNN's fused attention ") + pass);
}

char* at(const Tensor& t, int64_t elems) { return static_cast<char*>(t.raw_data()) + elems * dtype_size(t.dtype()); }

}  // namespace

bool sdpa_forward(Tensor& y, Tensor& lse, const Tensor& qkv, int heads) {
  GraphKey k{};
  if (!key_for(k, qkv, heads, false, {&y, &lse, &qkv})) return false;
  DeviceGuard guard(k.dev);
  const std::shared_ptr<const BuiltGraph> b = graphs().get(k, [&] { return build(k); });
  if (!b->graph) return refuse(b->why);
  const math::SdpaViews v = math::sdpa_views(dims_of_key(k));
  std::unordered_map<int64_t, void*> pack{{kQ, at(qkv, v.q.offset)}, {kK, at(qkv, v.k.offset)},
                                          {kV, at(qkv, v.v.offset)}, {kO, y.raw_data()},
                                          {kStats, lse.raw_data()}};
  run(*b, k.dev, pack, "forward");
  ++g_forward;
  return true;
}

bool sdpa_backward(Tensor& dqkv, const Tensor& dy, const Tensor& qkv, const Tensor& y, const Tensor& lse, int heads) {
  GraphKey k{};
  if (!key_for(k, qkv, heads, true, {&dqkv, &dy, &qkv, &y, &lse})) return false;
  DeviceGuard guard(k.dev);
  const std::shared_ptr<const BuiltGraph> b = graphs().get(k, [&] { return build(k); });
  if (!b->graph) return refuse(b->why);
  const math::SdpaViews v = math::sdpa_views(dims_of_key(k));
  std::unordered_map<int64_t, void*> pack{
      {kQ, at(qkv, v.q.offset)},   {kK, at(qkv, v.k.offset)},   {kV, at(qkv, v.v.offset)},
      {kO, y.raw_data()},          {kDo, dy.raw_data()},        {kStats, lse.raw_data()},
      {kDq, at(dqkv, v.q.offset)}, {kDk, at(dqkv, v.k.offset)}, {kDv, at(dqkv, v.v.offset)}};
  run(*b, k.dev, pack, "backward");
  ++g_backward;
  return true;
}

std::string sdpa_check_description(const std::string& device_json, int sm_version, int64_t b, int64_t h, int64_t t,
                                   int64_t d, DType dtype, bool backward, bool deterministic) {
  const GraphKey k{0, b, h, t, d, dtype, backward, deterministic};
  return frontend::check_description(device_json, sm_version, what(k), [&](fe::graph::Graph& g) { describe(g, k); });
}

#endif  // MINIGRAD_WITH_CUDNN_FRONTEND

}  // namespace mg::cuda
