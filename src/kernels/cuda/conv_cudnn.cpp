// conv2d with its bias and a fused ReLU as one cuDNN graph (conv_cudnn.h):
//   y = relu(conv(x, w) + b)     x (N, C, H, W) or (N, H, W, C), w (O, C, KH, KW) or (O, KH, KW, C)
// The graph: conv_fprop (cross-correlation, the same padding and stride in H and W), a pointwise
// ADD of b (1, O, 1, 1), RELU_FWD; the sums and the intermediates in float32, x, w, b and y in
// their dtype (y rounded once). cuDNN's runtime fusion compiles it into one kernel, so y is written
// once instead of three times (the bias, the convolution adding to it, the ReLU).
// And its data gradient masked by the ReLU that made x (dgrad + dReLU; off unless
// set_cudnn_dgrad_fusion):
//   dx = x > 0 ? conv_transpose(dy, w) : 0
// The graph: conv_dgrad with dx's dimensions given (the frontend does not infer them: with a
// stride, several input sizes give dy's), then RELU_BWD with the gradient as its first input and
// x as its second; dx is rounded once, after the mask.
// A graph is built once per (device, graph, shapes, stride, pad, dtype, layout, bias, math,
// determinism, workspace limit) and kept with its workspace size; a case cuDNN refuses is remembered as refused
// and conv2d.cu runs the unfused kernels instead. Workspaces come from the caching allocator;
// every call runs on the device's stream (cudnn_handle, Note [cuda stream]).
#include "kernels/cuda/conv_cudnn.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <mutex>

#include "kernels/cuda/refusals.h"

#ifdef MINIGRAD_WITH_CUDNN_FRONTEND
#include <tuple>

#include <minigrad/cuda.h>
#include "kernels/cuda/frontend_graph.h"
#endif

namespace mg::cuda {

namespace {
std::atomic<int64_t> g_ran{0}, g_dgrad_ran{0};
Refusals g_refusals, g_dgrad_refusals;  // the forward graph's, the dgrad graph's

bool refuse(std::string why) { return g_refusals.refuse(std::move(why)); }
bool refuse_dgrad(std::string why) { return g_dgrad_refusals.refuse(std::move(why)); }
}  // namespace

ConvFusionCounts conv_fusion_counts() {
  return {g_ran.load(), g_refusals.count(), g_dgrad_ran.load(), g_dgrad_refusals.count()};
}

std::string conv_fusion_refusal(bool dgrad) { return dgrad ? g_dgrad_refusals.last() : g_refusals.last(); }

#ifndef MINIGRAD_WITH_CUDNN_FRONTEND

bool conv_fusion_built() { return false; }
bool conv_bias_relu_forward(Tensor&, const Tensor&, const Tensor&, const Tensor&, int, int, bool) {
  return refuse("this build has no cuDNN frontend (docs/cuda.md, \"Fused ReLUs\")");
}
bool conv_dgrad_relu_backward(Tensor&, const Tensor&, const Tensor&, const Tensor&, int, int, bool) {
  return refuse_dgrad("this build has no cuDNN frontend (docs/cuda.md, \"Fused ReLUs\")");
}
std::string conv_fusion_check_description(const std::string&, int, const Shape&, const Shape&, int, int, DType, bool,
                                          bool, ConvGraph) {
  return "this build has no cuDNN frontend";
}

#else

namespace fe = cudnn_frontend;
using frontend::BuiltGraph;

bool conv_fusion_built() { return true; }

namespace {

enum : int64_t { kX = 1, kW, kB, kY, kDy, kDx };  // the tensors' ids in the variant pack

// The sizes in cuDNN's order: x (n, c, h, w), w (o, c, kh, kw), y (n, o, oh, ow).
struct FusionKey {
  int dev = 0;
  int64_t n = 0, c = 0, h = 0, w = 0, o = 0, kh = 0, kw = 0, oh = 0, ow = 0;
  int stride = 1, pad = 0;
  DType dtype = DType::f32;
  ConvGraph graph = ConvGraph::bias_relu_forward;
  bool nhwc = false, bias = false, strict = false, deterministic = true;
  size_t ws_limit = 0;
  auto tie() const {
    return std::tie(dev, n, c, h, w, o, kh, kw, oh, ow, stride, pad, dtype, graph, nhwc, bias, strict, deterministic,
                    ws_limit);
  }
  bool operator<(const FusionKey& k) const { return tie() < k.tie(); }
};

frontend::GraphCache<FusionKey>& graphs() {
  static auto* cache = new frontend::GraphCache<FusionKey>();  // never destroyed: frontend_graph.h
  return *cache;
}

// Where (a, b, c, d) in cuDNN's order lie in memory: channels first, or channels (b) last.
std::vector<int64_t> strides(int64_t, int64_t b, int64_t c, int64_t d, bool nhwc) {
  return nhwc ? std::vector<int64_t>{c * d * b, 1, d * b, b} : std::vector<int64_t>{b * c * d, c * d, d, 1};
}

fe::DataType_t io_type(DType t) {
  return t == DType::bf16 ? fe::DataType_t::BFLOAT16 : t == DType::f16 ? fe::DataType_t::HALF : fe::DataType_t::FLOAT;
}

// dx = conv_transpose(dy, w) * (x > 0), the graph's tensors x, w and dy already described.
void describe_dgrad_relu(fe::graph::Graph& g, const FusionKey& k, const std::shared_ptr<fe::graph::Tensor_attributes>& x,
                         const std::shared_ptr<fe::graph::Tensor_attributes>& w) {
  auto dy = g.tensor(fe::graph::Tensor_attributes().set_name("dy").set_uid(kDy).set_dim({k.n, k.o, k.oh, k.ow}).set_stride(
      strides(k.n, k.o, k.oh, k.ow, k.nhwc)));
  auto dz = g.conv_dgrad(dy, w,
                         fe::graph::Conv_dgrad_attributes()
                             .set_name("dgrad")
                             .set_padding({k.pad, k.pad})
                             .set_stride({k.stride, k.stride})
                             .set_dilation({1, 1}));
  dz->set_dim({k.n, k.c, k.h, k.w}).set_stride(strides(k.n, k.c, k.h, k.w, k.nhwc));
  // RELU_BWD: the incoming gradient first, then the forward's tensor whose sign masks it.
  auto dx = g.pointwise(dz, x, fe::graph::Pointwise_attributes().set_name("drelu").set_mode(fe::PointwiseMode_t::RELU_BWD));
  dx->set_output(true).set_name("dx").set_uid(kDx).set_dim({k.n, k.c, k.h, k.w}).set_stride(
      strides(k.n, k.c, k.h, k.w, k.nhwc)).set_data_type(io_type(k.dtype));
}

void describe(fe::graph::Graph& g, const FusionKey& k) {
  g.set_io_data_type(io_type(k.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto x = g.tensor(fe::graph::Tensor_attributes().set_name("x").set_uid(kX).set_dim({k.n, k.c, k.h, k.w}).set_stride(
      strides(k.n, k.c, k.h, k.w, k.nhwc)));
  auto w = g.tensor(fe::graph::Tensor_attributes().set_name("w").set_uid(kW).set_dim({k.o, k.c, k.kh, k.kw}).set_stride(
      strides(k.o, k.c, k.kh, k.kw, k.nhwc)));
  if (k.graph == ConvGraph::dgrad_relu) return describe_dgrad_relu(g, k, x, w);
  auto z = g.conv_fprop(x, w,
                        fe::graph::Conv_fprop_attributes()
                            .set_name("conv")
                            .set_padding({k.pad, k.pad})
                            .set_stride({k.stride, k.stride})
                            .set_dilation({1, 1})
                            .set_convolution_mode(fe::ConvolutionMode_t::CROSS_CORRELATION));
  if (k.bias) {
    // Strided as NVIDIA's fusion samples give a bias (channels innermost), in either layout.
    auto b = g.tensor(fe::graph::Tensor_attributes().set_name("b").set_uid(kB).set_dim({1, k.o, 1, 1}).set_stride(
        {k.o, 1, k.o, k.o}));
    z = g.pointwise(z, b, fe::graph::Pointwise_attributes().set_name("bias").set_mode(fe::PointwiseMode_t::ADD));
  }
  auto y = g.pointwise(z, fe::graph::Pointwise_attributes().set_name("relu").set_mode(fe::PointwiseMode_t::RELU_FWD));
  y->set_output(true).set_name("y").set_uid(kY).set_dim({k.n, k.o, k.oh, k.ow}).set_stride(
      strides(k.n, k.o, k.oh, k.ow, k.nhwc)).set_data_type(io_type(k.dtype));
}

const char* what(const FusionKey& k) {
  return k.graph == ConvGraph::dgrad_relu ? "dgrad+drelu graph" : "conv+bias+relu graph";
}

std::shared_ptr<const BuiltGraph> build(const FusionKey& k) {
  auto g = std::make_shared<fe::graph::Graph>();
  describe(*g, k);
  // The legacy path's rules (conv2d.cu): strict FP32 in FMA math only, deterministic engines by
  // default, workspaces within the limit.
  return frontend::build_graph(g, cudnn_handle(k.dev), what(k), {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK},
                               [&](fe::graph::Graph& graph) {
                                 if (k.strict) {
                                   graph.deselect_numeric_notes(
                                       {fe::NumericalNote_t::TENSOR_CORE, fe::NumericalNote_t::DOWN_CONVERT_INPUTS});
                                 }
                                 if (k.deterministic) graph.deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
                                 // A limit past int64's range (SIZE_MAX: none) is no limit.
                                 graph.deselect_workspace_greater_than(
                                     static_cast<int64_t>(std::min<size_t>(k.ws_limit, INT64_MAX)));
                               });
}

// The key of shapes as conv2d's tensors have them (channels last: x (N, H, W, C), w (O, KH, KW, C)).
FusionKey key_of(const Shape& x, const Shape& w, int stride, int pad, DType dtype, bool nhwc, bool bias, ConvGraph graph) {
  FusionKey k;
  k.graph = graph;
  const int at[4] = {0, nhwc ? 3 : 1, nhwc ? 1 : 2, nhwc ? 2 : 3};
  k.n = x[0], k.c = x[at[1]], k.h = x[at[2]], k.w = x[at[3]];
  k.o = w[0], k.kh = w[at[2]], k.kw = w[at[3]];
  k.oh = (k.h + 2 * pad - k.kh) / stride + 1;
  k.ow = (k.w + 2 * pad - k.kw) / stride + 1;
  k.stride = stride, k.pad = pad, k.dtype = dtype, k.nhwc = nhwc, k.bias = bias;
  return k;
}

// The key of a call on the device: the shapes, and the math, determinism and workspace rules now.
FusionKey device_key(const Tensor& x, const Tensor& w, int stride, int pad, bool nhwc, bool bias, ConvGraph graph) {
  FusionKey k = key_of(x.shape(), w.shape(), stride, pad, x.dtype(), nhwc, bias, graph);
  k.dev = device_of(x);
  k.strict = x.dtype() == DType::f32 && !tf32_conv();
  k.deterministic = cudnn_deterministic();
  k.ws_limit = conv_workspace_limit();
  return k;
}

}  // namespace

bool conv_bias_relu_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, int stride, int pad,
                            bool channels_last) {
  const DType dt = x.dtype();
  if (w.dtype() != dt || y.dtype() != dt || (b.defined() && b.dtype() != dt))
    return refuse("the tensors' dtypes differ");
  if (!frontend::aligned16({&y, &x, &w, &b})) return refuse("a tensor's data is not 16-byte aligned");
  const FusionKey k = device_key(x, w, stride, pad, channels_last, b.defined(), ConvGraph::bias_relu_forward);
  DeviceGuard guard(k.dev);
  const std::shared_ptr<const BuiltGraph> built = graphs().get(k, [&] { return build(k); });
  if (!built->graph) return refuse(built->why);
  std::unordered_map<int64_t, void*> pack{{kX, x.raw_data()}, {kW, w.raw_data()}, {kY, y.raw_data()}};
  if (b.defined()) pack.emplace(kB, b.raw_data());
  frontend::run_graph(*built, k.dev, pack, "conv2d on CUDA: cuDNN's fused conv+bias+relu graph");
  ++g_ran;
  return true;
}

bool conv_dgrad_relu_backward(Tensor& dx, const Tensor& dy, const Tensor& w, const Tensor& x, int stride, int pad,
                              bool channels_last) {
  const DType dt = x.dtype();
  if (w.dtype() != dt || dy.dtype() != dt || dx.dtype() != dt) return refuse_dgrad("the tensors' dtypes differ");
  if (!frontend::aligned16({&dx, &dy, &w, &x})) return refuse_dgrad("a tensor's data is not 16-byte aligned");
  const FusionKey k = device_key(x, w, stride, pad, channels_last, false, ConvGraph::dgrad_relu);
  DeviceGuard guard(k.dev);
  const std::shared_ptr<const BuiltGraph> built = graphs().get(k, [&] { return build(k); });
  if (!built->graph) return refuse_dgrad(built->why);
  std::unordered_map<int64_t, void*> pack{{kDy, dy.raw_data()}, {kW, w.raw_data()}, {kX, x.raw_data()},
                                          {kDx, dx.raw_data()}};
  frontend::run_graph(*built, k.dev, pack, "conv2d's backward on CUDA: cuDNN's fused dgrad+drelu graph");
  ++g_dgrad_ran;
  return true;
}

std::string conv_fusion_check_description(const std::string& device_json, int sm_version, const Shape& x, const Shape& w,
                                          int stride, int pad, DType dtype, bool channels_last, bool bias,
                                          ConvGraph graph) {
  const FusionKey k = key_of(x, w, stride, pad, dtype, channels_last, bias && graph == ConvGraph::bias_relu_forward, graph);
  return frontend::check_description(device_json, sm_version, what(k), [&](fe::graph::Graph& g) { describe(g, k); });
}

#endif  // MINIGRAD_WITH_CUDNN_FRONTEND

}  // namespace mg::cuda
