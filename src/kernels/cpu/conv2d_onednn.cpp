// oneDNN convolutions, one image per call (kernels/cpu/conv2d_onednn.h).
#include "kernels/cpu/conv2d_onednn.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <minigrad/core/error.h>

#ifdef MINIGRAD_WITH_ONEDNN
#include <omp.h>

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#endif

namespace mg::cpu::onednn {

namespace {
bool enabled_by_env() {
  static const bool enabled = [] {
    const char* s = std::getenv("MG_CPU_CONV");
    return !(s && std::string_view(s) == "gemm");
  }();
  return enabled;
}
}  // namespace

#ifdef MINIGRAD_WITH_ONEDNN

namespace {

using dnnl::memory;
using tag = memory::format_tag;
constexpr auto f32 = memory::data_type::f32;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// oneDNN's parallel regions on this thread run on one thread while it lives; the OpenMP setting
// the thread had is restored after.
class OneThread {
 public:
  OneThread() : before_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(before_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int before_;
};

int64_t floats(const memory::desc& d) { return static_cast<int64_t>((d.get_size() + 63) / 64 * 16); }

// A reorder from one layout to another, absent when the two are the same.
struct Reorder {
  std::optional<dnnl::reorder> prim;
  memory::desc from, to;
  Reorder(const memory::desc& f, const memory::desc& t) : from(f), to(t) {
    if (f != t) prim.emplace(dnnl::reorder::primitive_desc(engine(), f, engine(), t));
  }
  // Runs it from `src` into `scratch` (or just wraps src when no reorder is needed); returns the
  // memory in layout `to`.
  memory in(dnnl::stream& st, const float* src, float* scratch) const {
    memory m(from, engine(), const_cast<float*>(src));
    if (!prim) return m;
    memory out(to, engine(), scratch);
    prim->execute(st, m, out);
    return out;
  }
  int64_t scratch_floats() const { return prim ? floats(to) : 0; }
};

// The same for an output: the primitive writes into `scratch` in layout `from`, out() copies it
// to dst in layout `to`.
struct ReorderOut {
  std::optional<dnnl::reorder> prim;
  memory::desc from, to;
  ReorderOut(const memory::desc& f, const memory::desc& t) : from(f), to(t) {
    if (f != t) prim.emplace(dnnl::reorder::primitive_desc(engine(), f, engine(), t));
  }
  memory target(float* dst, float* scratch) const { return prim ? memory(from, engine(), scratch) : memory(to, engine(), dst); }
  void out(dnnl::stream& st, memory& m, float* dst) const {
    if (!prim) return;
    memory d(to, engine(), dst);
    prim->execute(st, m, d);
  }
  int64_t scratch_floats() const { return prim ? floats(from) : 0; }
};

}  // namespace

struct Conv::Impl {
  ConvShape s;
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd;
  dnnl::convolution_backward_weights bwd_weights;
  Reorder src_in, fwd_weights_in, bwd_weights_in, dst_grad_in_data, dst_grad_in_weights, src_in_weights;
  ReorderOut dst_out, src_grad_out, weights_grad_out;

  static dnnl::primitive_attr attr() {
    dnnl::primitive_attr a;
    a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return a;
  }
  static memory::desc md(memory::dims d, tag t) { return memory::desc(d, f32, t); }

  explicit Impl(const ConvShape& shape)
      : s(shape),
        fwd_pd(make_fwd(shape)),
        fwd(fwd_pd),
        bwd_data_pd(make_bwd_data(shape, fwd_pd)),
        bwd_data(bwd_data_pd),
        bwd_weights_pd(make_bwd_weights(shape, fwd_pd)),
        bwd_weights(bwd_weights_pd),
        src_in(user_src(), fwd_pd.src_desc()),
        fwd_weights_in(user_weights(), fwd_pd.weights_desc()),
        bwd_weights_in(user_weights(), bwd_data_pd.weights_desc()),
        dst_grad_in_data(user_dst(), bwd_data_pd.diff_dst_desc()),
        dst_grad_in_weights(user_dst(), bwd_weights_pd.diff_dst_desc()),
        src_in_weights(user_src(), bwd_weights_pd.src_desc()),
        dst_out(fwd_pd.dst_desc(), user_dst()),
        src_grad_out(bwd_data_pd.diff_src_desc(), user_src()),
        weights_grad_out(bwd_weights_pd.diff_weights_desc(), user_weights()) {}

  memory::desc user_src() const { return md({1, s.c, s.h, s.w}, tag::nchw); }
  memory::desc user_dst() const { return md({1, s.o, s.oh, s.ow}, tag::nchw); }
  memory::desc user_weights() const { return md({s.o, s.c, s.kh, s.kw}, tag::oihw); }

  static memory::dims strides(const ConvShape& s) { return {s.stride, s.stride}; }
  static memory::dims pads(const ConvShape& s) { return {s.pad, s.pad}; }
  // The bottom and right padding that give exactly oh x ow outputs (PyTorch's floor rule leaves
  // input rows unused, which oneDNN expresses as a smaller right padding).
  static memory::dims pads_r(const ConvShape& s) {
    return {(s.oh - 1) * s.stride + s.kh - s.h - s.pad, (s.ow - 1) * s.stride + s.kw - s.w - s.pad};
  }
  static memory::desc any(memory::dims d) { return memory::desc(d, f32, tag::any); }

  static dnnl::convolution_forward::primitive_desc make_fwd(const ConvShape& s) {
    const auto src = any({1, s.c, s.h, s.w}), w = any({s.o, s.c, s.kh, s.kw}), dst = any({1, s.o, s.oh, s.ow});
    auto d = s.bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                      dnnl::algorithm::convolution_direct, src, w,
                                                      md({s.o}, tag::x), dst, strides(s), pads(s), pads_r(s))
                    : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                      dnnl::algorithm::convolution_direct, src, w, dst, strides(s),
                                                      pads(s), pads_r(s));
    return {d, attr(), engine()};
  }
  static dnnl::convolution_backward_data::primitive_desc make_bwd_data(
      const ConvShape& s, const dnnl::convolution_forward::primitive_desc& hint) {
    dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, any({1, s.c, s.h, s.w}),
                                            any({s.o, s.c, s.kh, s.kw}), any({1, s.o, s.oh, s.ow}), strides(s),
                                            pads(s), pads_r(s));
    return {d, attr(), engine(), hint};
  }
  static dnnl::convolution_backward_weights::primitive_desc make_bwd_weights(
      const ConvShape& s, const dnnl::convolution_forward::primitive_desc& hint) {
    dnnl::convolution_backward_weights::desc d(dnnl::algorithm::convolution_direct, any({1, s.c, s.h, s.w}),
                                               any({s.o, s.c, s.kh, s.kw}), any({1, s.o, s.oh, s.ow}), strides(s),
                                               pads(s), pads_r(s));
    return {d, attr(), engine(), hint};
  }
};

Conv::Conv(const ConvShape& s) {
  OneThread one;
  impl_ = std::make_unique<Impl>(s);
}
Conv::~Conv() = default;

const Conv& Conv::get(const ConvShape& s) {
  static std::mutex mu;
  static std::map<ConvShape, std::unique_ptr<Conv>> made;
  std::lock_guard lock(mu);
  auto& c = made[s];
  if (!c) {
    try {
      c.reset(new Conv(s));
    } catch (const dnnl::error& e) {
      made.erase(s);
      throw Error("oneDNN could not make a convolution for input (" + std::to_string(s.c) + ", " +
                  std::to_string(s.h) + ", " + std::to_string(s.w) + "), filters (" + std::to_string(s.o) + ", " +
                  std::to_string(s.c) + ", " + std::to_string(s.kh) + ", " + std::to_string(s.kw) + "): " + e.what());
    }
  }
  return *c;
}

int64_t Conv::forward_weights_floats() const { return floats(impl_->fwd_pd.weights_desc()); }
int64_t Conv::backward_weights_floats() const { return floats(impl_->bwd_data_pd.weights_desc()); }

namespace {
void reorder_weights(const Reorder& r, float* dst, const float* w) {
  OneThread one;
  dnnl::stream st(engine());
  if (!r.prim) {  // oneDNN takes them as they are
    std::memcpy(dst, w, r.from.get_size());
    return;
  }
  memory from(r.from, engine(), const_cast<float*>(w));
  memory to(r.to, engine(), dst);
  r.prim->execute(st, from, to);
  st.wait();
}
}  // namespace

void Conv::prepare_forward_weights(float* dst, const float* w) const { reorder_weights(impl_->fwd_weights_in, dst, w); }
void Conv::prepare_backward_weights(float* dst, const float* w) const {
  reorder_weights(impl_->bwd_weights_in, dst, w);
}

int64_t Conv::forward_scratch_floats() const {
  const Impl& p = *impl_;
  return p.src_in.scratch_floats() + p.dst_out.scratch_floats() + floats(p.fwd_pd.scratchpad_desc());
}

namespace {
// One image through a forward or input-gradient primitive: `in` reordered into the primitive's
// layout, the result written to `out` through a reorder when the layouts differ, the weights
// already prepared; scratch: the input's, then the output's, then the primitive's scratchpad.
void run_image(const dnnl::primitive& prim, const Reorder& in_r, int in_arg, const float* in,
               const memory::desc& weights_md, const float* weights, const ReorderOut& out_r, int out_arg,
               float* out, const memory::desc& pad_md, float* scratch, const memory::desc* bias_md = nullptr,
               const float* bias = nullptr) {
  OneThread one;
  dnnl::stream st(engine());
  float* out_scratch = scratch + in_r.scratch_floats();
  float* pad_scratch = out_scratch + out_r.scratch_floats();
  memory dst = out_r.target(out, out_scratch);
  std::unordered_map<int, memory> args = {{in_arg, in_r.in(st, in, scratch)},
                                          {DNNL_ARG_WEIGHTS, memory(weights_md, engine(), const_cast<float*>(weights))},
                                          {out_arg, dst},
                                          {DNNL_ARG_SCRATCHPAD, memory(pad_md, engine(), pad_scratch)}};
  if (bias_md) args.emplace(DNNL_ARG_BIAS, memory(*bias_md, engine(), const_cast<float*>(bias)));
  prim.execute(st, args);
  out_r.out(st, dst, out);
  st.wait();
}
}  // namespace

void Conv::forward(float* y, const float* x, const float* weights, const float* b, float* scratch) const {
  const Impl& p = *impl_;
  const memory::desc bias_md = Impl::md({p.s.o}, tag::x);
  run_image(p.fwd, p.src_in, DNNL_ARG_SRC, x, p.fwd_pd.weights_desc(), weights, p.dst_out, DNNL_ARG_DST, y,
            p.fwd_pd.scratchpad_desc(), scratch, p.s.bias ? &bias_md : nullptr, b);
}

int64_t Conv::backward_data_scratch_floats() const {
  const Impl& p = *impl_;
  return p.dst_grad_in_data.scratch_floats() + p.src_grad_out.scratch_floats() + floats(p.bwd_data_pd.scratchpad_desc());
}

int64_t Conv::backward_weights_scratch_floats() const {
  const Impl& p = *impl_;
  return p.src_in_weights.scratch_floats() + p.dst_grad_in_weights.scratch_floats() +
         p.weights_grad_out.scratch_floats() + floats(p.bwd_weights_pd.scratchpad_desc());
}

void Conv::backward_data(float* dx, const float* dy, const float* weights, float* scratch) const {
  const Impl& p = *impl_;
  run_image(p.bwd_data, p.dst_grad_in_data, DNNL_ARG_DIFF_DST, dy, p.bwd_data_pd.weights_desc(), weights,
            p.src_grad_out, DNNL_ARG_DIFF_SRC, dx, p.bwd_data_pd.scratchpad_desc(), scratch);
}

void Conv::backward_weights(float* dw, const float* x, const float* dy, float* scratch) const {
  const Impl& p = *impl_;
  OneThread one;
  dnnl::stream st(engine());
  float* ddst_scratch = scratch + p.src_in_weights.scratch_floats();
  float* out_scratch = ddst_scratch + p.dst_grad_in_weights.scratch_floats();
  float* pad_scratch = out_scratch + p.weights_grad_out.scratch_floats();
  memory src = p.src_in_weights.in(st, x, scratch);
  memory ddst = p.dst_grad_in_weights.in(st, dy, ddst_scratch);
  memory dw_m = p.weights_grad_out.target(dw, out_scratch);
  p.bwd_weights.execute(st, {{DNNL_ARG_SRC, src},
                             {DNNL_ARG_DIFF_DST, ddst},
                             {DNNL_ARG_DIFF_WEIGHTS, dw_m},
                             {DNNL_ARG_SCRATCHPAD, memory(p.bwd_weights_pd.scratchpad_desc(), engine(), pad_scratch)}});
  p.weights_grad_out.out(st, dw_m, dw);
  st.wait();
}

namespace {
bool avx512() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto core = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
  return (isa & core) == core;  // avx512_core and its extensions (VNNI, BF16, AMX)
}
}  // namespace

int64_t channel_block() {
  static const int64_t block = avx512() ? 16 : 8;
  return block;
}

bool applies(const ConvShape& s) {
  return enabled_by_env() && std::max(s.c, s.o) >= channel_block() && s.h > 0 && s.w > 0 && s.oh > 0 && s.ow > 0;
}

const char* backend() {
  static const std::string v = [] {
    if (!enabled_by_env()) return std::string("im2col + sgemm");
    const dnnl_version_t* d = dnnl_version();
    return "onednn " + std::to_string(d->major) + "." + std::to_string(d->minor) + "." + std::to_string(d->patch) +
           (avx512() ? " (avx512_core)" : " (avx2 or older)") + " from " + std::to_string(channel_block()) +
           " channels, im2col + sgemm below";
  }();
  return v.c_str();
}

#else  // no oneDNN in this build: the im2col kernels do every convolution

struct Conv::Impl {};
bool applies(const ConvShape&) { return false && enabled_by_env(); }
int64_t channel_block() { return 0; }
const char* backend() { return "im2col + sgemm"; }
Conv::~Conv() = default;
const Conv& Conv::get(const ConvShape&) { throw Error("libminigrad was built without oneDNN"); }
int64_t Conv::forward_weights_floats() const { return 0; }
void Conv::prepare_forward_weights(float*, const float*) const {}
int64_t Conv::forward_scratch_floats() const { return 0; }
void Conv::forward(float*, const float*, const float*, const float*, float*) const {}
int64_t Conv::backward_weights_floats() const { return 0; }
void Conv::prepare_backward_weights(float*, const float*) const {}
int64_t Conv::backward_data_scratch_floats() const { return 0; }
int64_t Conv::backward_weights_scratch_floats() const { return 0; }
void Conv::backward_data(float*, const float*, const float*, float*) const {}
void Conv::backward_weights(float*, const float*, const float*, float*) const {}

#endif

}  // namespace mg::cpu::onednn
