#include <minigrad/core/tensor.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <type_traits>
#include <numbers>

#include <minigrad/core/rng.h>

#include "core/allocator.h"
#include "core/parallel.h"
#include "core/tape.h"

namespace mg {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  for (int64_t d : s) {
    if (d == 0) return 0;
  }
  int64_t n = 1;
  for (int64_t d : s) {
    MG_CHECK(!__builtin_mul_overflow(n, d, &n),
             "shape " << shape_str(s) << " has more elements than an int64 can count");
  }
  return n;
}

StorageImpl::StorageImpl(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  data_ = allocator_for(device).allocate(nbytes);
}

StorageImpl::StorageImpl(size_t nbytes, InHostPool) : nbytes_(nbytes), device_(Device::cpu()), host_pool_(true) {
  data_ = host_pool().allocate(nbytes);
}

StorageImpl::~StorageImpl() { (host_pool_ ? host_pool() : allocator_for(device_)).deallocate(data_, nbytes_); }

Tensor Tensor::empty(const Shape& shape, const TensorOptions& opts) {
  for (int64_t d : shape) MG_CHECK(d >= 0, "tensor shape " << shape_str(shape) << " has a negative size");
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = opts.dtype;
  size_t nbytes = 0;
  MG_CHECK(!__builtin_mul_overflow(static_cast<size_t>(shape_numel(shape)), dtype_size(opts.dtype), &nbytes),
           "a " << dtype_name(opts.dtype) << " tensor of shape " << shape_str(shape)
                << " needs more bytes than a size_t can count");
  impl->storage = std::make_shared<StorageImpl>(nbytes, opts.device);
  impl->requires_grad = opts.requires_grad;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, const TensorOptions& opts) { return full(shape, 0.0f, opts); }
Tensor Tensor::ones(const Shape& shape, const TensorOptions& opts) { return full(shape, 1.0f, opts); }

Tensor Tensor::full(const Shape& shape, float value, const TensorOptions& opts) {
  Tensor t = empty(shape, opts);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape,
                           const TensorOptions& opts) {
  MG_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
           "from_vector: " << values.size() << " values for shape " << shape_str(shape));
  MG_CHECK(opts.dtype == DType::f32, "from_vector: float values need dtype float32");
  Tensor host = empty(shape, opts.with_device(Device::cpu()).with_requires_grad(false));
  if (!values.empty()) std::memcpy(host.raw_data(), values.data(), values.size() * sizeof(float));
  Tensor t = opts.device.is_cpu() ? host : host.to(opts.device);  // no second copy on the CPU
  t.requires_grad_(opts.requires_grad);
  return t;
}

Tensor Tensor::from_vector(const std::vector<int64_t>& values, const Shape& shape,
                           const TensorOptions& opts) {
  MG_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
           "from_vector: " << values.size() << " values for shape " << shape_str(shape));
  MG_CHECK(opts.dtype == DType::i64, "from_vector: int64 values need dtype int64");
  Tensor host = empty(shape, opts.with_device(Device::cpu()).with_requires_grad(false));
  if (!values.empty()) std::memcpy(host.raw_data(), values.data(), values.size() * sizeof(int64_t));
  return opts.device.is_cpu() ? host : host.to(opts.device);
}

namespace {

// A float32 tensor of `shape` whose elements [i0, i1) fill(p, i0, i1) writes, made on the host in
// parallel pieces and then moved to opts' device. Each element's draws are counter-based (philox
// at its own offset), so the bits do not depend on the thread count or the pieces.
template <class Fill> Tensor drawn(const Shape& shape, const TensorOptions& opts, const char* what, Fill&& fill) {
  MG_CHECK(opts.dtype == DType::f32, what << ": random values are float32, got dtype " << dtype_name(opts.dtype));
  Tensor host = Tensor::empty(shape, opts.with_device(Device::cpu()).with_requires_grad(false));
  float* p = host.data<float>();
  cpu::parallel_for(host.numel(), int64_t{1} << 14, [&](int64_t i0, int64_t i1) { fill(p, i0, i1); });
  Tensor t = opts.device.is_cpu() ? host : host.to(opts.device);
  t.requires_grad_(opts.requires_grad);
  return t;
}

}  // namespace

Tensor Tensor::randn(const Shape& shape, Generator& gen, const TensorOptions& opts) {
  const uint64_t off = gen.advance(2 * static_cast<uint64_t>(shape_numel(shape))), seed = gen.seed();
  return drawn(shape, opts, "randn", [&](float* p, int64_t i0, int64_t i1) {
    // Box-Muller on two uniforms: element i takes draws off + 2i and off + 2i + 1.
    float u1 = 0;
    philox_uniforms(seed, off + 2 * static_cast<uint64_t>(i0), 2 * (i1 - i0), [&](int64_t k, float u) {
      if (k % 2 == 0) {
        u1 = u;
        return;
      }
      const double r = std::sqrt(-2.0 * std::log(1.0 - static_cast<double>(u1)));
      p[i0 + k / 2] = static_cast<float>(r * std::cos(2.0 * std::numbers::pi * u));
    });
  });
}

Tensor Tensor::uniform(const Shape& shape, float lo, float hi, Generator& gen,
                       const TensorOptions& opts) {
  const uint64_t off = gen.advance(static_cast<uint64_t>(shape_numel(shape))), seed = gen.seed();
  return drawn(shape, opts, "uniform", [&](float* p, int64_t i0, int64_t i1) {
    philox_uniforms(seed, off + static_cast<uint64_t>(i0), i1 - i0, [&](int64_t k, float u) { p[i0 + k] = lo + (hi - lo) * u; });
  });
}

int64_t Tensor::size(int64_t d) const {
  int64_t nd = dim();
  MG_CHECK(d >= -nd && d < nd, "dimension " << d << " out of range for shape " << shape_str(shape()));
  return shape()[d < 0 ? d + nd : d];
}

Device Tensor::device() const { return impl().storage->device(); }
void* Tensor::raw_data() const { return static_cast<char*>(impl().storage->data()) + impl().offset; }

bool Tensor::shares_storage(const Tensor& o) const {
  return defined() && o.defined() && impl().storage == o.impl().storage;
}

Tensor Tensor::to(Device d) const {
  Tensor out = empty(shape(), TensorOptions{dtype(), d, false});
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType t) const { return to(device(), t); }

Tensor Tensor::to(Device d, DType t) const {
  Tensor out = empty(shape(), TensorOptions{t, d, false});
  out.copy_(*this);
  return out;
}

Tensor Tensor::clone() const { return to(device()); }

template <typename T> std::vector<T> Tensor::to_vector() const {
  Tensor host = device().is_cpu() ? *this : cpu();
  if constexpr (std::is_same_v<T, float>) {
    if (dtype() != DType::f32 && is_floating(dtype())) host = host.to(DType::f32);
  }
  const T* p = host.data<T>();
  return std::vector<T>(p, p + numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<double> Tensor::to_vector<double>() const;

float Tensor::item() const {
  MG_CHECK(numel() == 1, "item() needs a tensor with one element, got shape " << shape_str(shape()));
  if (dtype() == DType::i64) return static_cast<float>(to_vector<int64_t>()[0]);
  if (dtype() == DType::f64) return static_cast<float>(to_vector<double>()[0]);
  return to_vector<float>()[0];  // bf16 and f16 widened
}

std::string Tensor::str(int64_t edge) const {
  std::ostringstream os;
  os << "tensor([";
  const int64_t n = numel();
  std::vector<int64_t> shown;
  for (int64_t i = 0; i < n; ++i) {
    if (i < edge || i >= n - edge) shown.push_back(i);
  }
  auto put = [&](const auto& v) {
    for (size_t k = 0; k < shown.size(); ++k) {
      if (k > 0) os << (shown[k] != shown[k - 1] + 1 ? ", ..., " : ", ");
      os << v[static_cast<size_t>(shown[k])];
    }
  };
  if (dtype() == DType::i64) put(to_vector<int64_t>());
  else put(to_vector<float>());
  os << "], shape " << shape_str(shape()) << ", " << dtype_name(dtype()) << ", " << device().str() << ")";
  return os.str();
}

Tensor& Tensor::zero_() { return fill_(0.0f); }

Tensor& Tensor::fill_(float value) {
  if (dtype() == DType::i64) {
    MG_CHECK(device().is_cpu(), "fill_ on an int64 tensor is supported on CPU only");
    int64_t* p = data<int64_t>();
    for (int64_t i = 0; i < numel(); ++i) p[i] = static_cast<int64_t>(value);
    return *this;
  }
  if (dtype() == DType::f64) {
    MG_CHECK(device().is_cpu(), "fill_ on a float64 tensor is supported on CPU only");
    double* p = data<double>();
    for (int64_t i = 0; i < numel(); ++i) p[i] = value;
    return *this;
  }
  MG_CHECK(dtype() == DType::f32 || dtype() == DType::bf16 || dtype() == DType::f16,
           "fill_: unsupported dtype " << dtype_name(dtype()));
  if (numel() == 0) return *this;
  fill_kernel(*this, value);  // bf16 and f16: the value rounded once, in place on the device
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  MG_CHECK(src.shape() == shape() && (src.dtype() == dtype() || (is_floating(src.dtype()) && is_floating(dtype()))),
           "copy_: source " << shape_str(src.shape()) << " " << dtype_name(src.dtype())
                            << " into destination " << shape_str(shape()) << " "
                            << dtype_name(dtype()));
  if (src.dtype() != dtype()) {  // convert on the destination's device (Note [half conversions])
    if (numel() == 0) return *this;
    Tensor there = src.device() == device() ? src : src.to(device());
    convert_kernel(*this, there);
    return *this;
  }
  if (nbytes() == 0 || raw_data() == src.raw_data()) return *this;
  if (device().is_cpu() && src.device().is_cpu()) {
    std::memcpy(raw_data(), src.raw_data(), nbytes());
  } else {
    copy_kernel(*this, src);
  }
  return *this;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = this->impl().storage;
  impl->offset = this->impl().offset;
  impl->shape = shape();
  impl->dtype = dtype();
  return Tensor(std::move(impl));
}

Tensor rows_view(const Tensor& t, int64_t first, int64_t rows) {
  MG_CHECK(t.dim() >= 1 && first >= 0 && rows >= 0 && first + rows <= t.size(0),
           "rows_view: rows [" << first << ", " << first + rows << ") of a tensor of shape " << shape_str(t.shape()));
  Tensor v = t.detach();
  v.impl().shape[0] = rows;
  v.impl().offset += static_cast<size_t>(first) * (t.size(0) > 0 ? t.nbytes() / static_cast<size_t>(t.size(0)) : 0);
  return v;
}

Tensor& Tensor::requires_grad_(bool r) {
  MG_CHECK(!r || dtype() == DType::f32 || dtype() == DType::bf16 || dtype() == DType::f16,
           "requires_grad_: only float32, bfloat16 and float16 tensors can require grad, got " << dtype_name(dtype()));
  MG_CHECK(is_leaf(), "requires_grad_ can only be changed on a leaf tensor (this one was produced by "
                          << node_name(*grad_fn()) << ")");
  impl().requires_grad = r;
  return *this;
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined()) {
    MG_CHECK(g.shape() == shape() && g.device() == device(),
             "set_grad: gradient " << shape_str(g.shape()) << " on " << g.device().str()
                                   << " for tensor " << shape_str(shape()) << " on " << device().str());
  }
  impl().grad = g.impl_ptr();
}

void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  MG_CHECK(requires_grad(), "backward: tensor does not require grad and has no grad_fn");
  Tensor g = grad;
  if (!g.defined()) {
    MG_CHECK(numel() == 1, "backward: grad can be implicit only for a scalar, got shape "
                               << shape_str(shape()) << "; pass a gradient of that shape");
    g = Tensor::ones(shape(), TensorOptions{DType::f32, device()});
  }
  MG_CHECK(g.shape() == shape(), "backward: gradient shape " << shape_str(g.shape())
                                     << " does not match tensor shape " << shape_str(shape()));
  run_backward(*this, g, retain_graph);
}

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}
void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace mg
