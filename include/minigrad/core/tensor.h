// Tensor: a reference-counted handle to contiguous storage with a shape, a dtype and a device,
// plus what the autograd tape needs (requires_grad, grad, the node that produced it).
//
//   mg::Tensor w = mg::Tensor::randn({512, 784}, gen).requires_grad_();   // (out, in)
//   mg::Tensor y = mg::relu(mg::linear(x, w, b));
//   mg::cross_entropy(y, labels).backward();   // w.grad() now holds dL/dw
//
// Copies of a Tensor share everything (like torch.Tensor). Storage returns to its device's
// allocator the moment the last tensor referring to it is gone.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/device.h>
#include <minigrad/core/memory.h>
#include <minigrad/core/dtype.h>
#include <minigrad/core/error.h>

namespace mg {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);  // "[64, 784]"
int64_t shape_numel(const Shape& s);

class Generator;
struct Node;

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool requires_grad = false;

  TensorOptions with_dtype(DType d) const { auto o = *this; o.dtype = d; return o; }
  TensorOptions with_device(Device d) const { auto o = *this; o.device = d; return o; }
  TensorOptions with_requires_grad(bool r) const { auto o = *this; o.requires_grad = r; return o; }
};

// A block of device memory, freed through its allocator when the last reference drops.
class StorageImpl {
 public:
  StorageImpl(size_t nbytes, Device device);
  // A block of the host pool (mg::host_memory_stats): an offloaded activation (Note [offload] in
  // minigrad/core/checkpoint.h). Its device() is the CPU.
  struct InHostPool {};
  StorageImpl(size_t nbytes, InHostPool);
  ~StorageImpl();
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool in_host_pool() const { return host_pool_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  bool host_pool_ = false;
};

struct TensorImpl {
  std::shared_ptr<StorageImpl> storage;
  size_t offset = 0;  // bytes from the storage's start (internal row views; 0 for every tensor users make)
  Shape shape;
  DType dtype = DType::f32;
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;  // leaf gradient (accumulated in place)
  std::shared_ptr<Node> grad_fn;     // null for leaves
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Factories. Every tensor is contiguous, row-major.
  static Tensor empty(const Shape& shape, const TensorOptions& opts = {});
  static Tensor zeros(const Shape& shape, const TensorOptions& opts = {});
  static Tensor ones(const Shape& shape, const TensorOptions& opts = {});
  static Tensor full(const Shape& shape, float value, const TensorOptions& opts = {});
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                            const TensorOptions& opts = {});
  static Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape,
                            const TensorOptions& opts = {DType::i64});
  // Normal(0, 1) and Uniform[lo, hi) from a counter-based generator (see minigrad/core/rng.h).
  static Tensor randn(const Shape& shape, Generator& gen, const TensorOptions& opts = {});
  static Tensor uniform(const Shape& shape, float lo, float hi, Generator& gen,
                        const TensorOptions& opts = {});

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  DType dtype() const { return impl().dtype; }
  Device device() const;
  bool is_cuda() const { return device().is_cuda(); }

  // Raw element pointer (device memory for CUDA tensors). Checks that T matches the dtype.
  template <typename T> T* data() const {
    MG_CHECK(dtype_of<T>() == dtype(), "tensor data<" << dtype_name(dtype_of<T>())
                                           << ">() on a tensor of dtype " << dtype_name(dtype()));
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const;

  // Copies (never aliasing, never recorded on the tape). to(DType) converts between the float
  // dtypes (f32, f64, bf16, f16), rounding to nearest even (Note [half conversions] in
  // src/kernels/convert.h): the same bits on every device.
  Tensor to(Device d) const;
  Tensor to(DType t) const;
  Tensor to(Device d, DType t) const;
  Tensor cpu() const { return to(Device::cpu()); }
  Tensor clone() const;  // same device, new storage, detached
  // The elements as T (a copy to the host first for a device tensor); T = float also reads the
  // other float dtypes, converted.
  template <typename T = float> std::vector<T> to_vector() const;
  float item() const;  // the single element, as float
  // "tensor([0.5, -1.25, ..., 3], shape [2, 3], bfloat16, cuda:0)": at most `edge` elements at
  // each end, the values as float (int64 as integers).
  std::string str(int64_t edge = 3) const;

  // In place, not recorded on the tape.
  Tensor& zero_();
  Tensor& fill_(float value);
  Tensor& copy_(const Tensor& src);  // same shape; any devices; float dtypes convert (as to(DType))

  // A tensor sharing this storage, with no history and requires_grad = false.
  Tensor detach() const;
  // Differentiable view with a new shape (one dimension may be -1).
  Tensor reshape(const Shape& shape) const;
  Tensor flatten(int64_t start_dim = 1) const;

  // Autograd.
  bool requires_grad() const { return impl().requires_grad; }
  Tensor& requires_grad_(bool r = true);
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  const std::shared_ptr<Node>& grad_fn() const { return impl().grad_fn; }
  Tensor grad() const { return Tensor(impl().grad); }  // undefined until a backward reaches it
  void set_grad(const Tensor& g) const;                     // g undefined clears it
  // Backpropagates from this tensor. A scalar gets d(self)=1; otherwise pass `grad` of our shape.
  void backward(const Tensor& grad = {}, bool retain_graph = false) const;

  bool same(const Tensor& o) const { return impl_ == o.impl_; }
  bool shares_storage(const Tensor& o) const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  TensorImpl& impl() const {
    MG_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return *impl_;
  }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// Element-wise helpers that go through the tape (see minigrad/ops/ops.h for the full op set).
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, float s);
Tensor operator*(float s, const Tensor& a);

}  // namespace mg
