#include <minigrad/data/dataset.h>

#include <cstring>

#include <minigrad/core/error.h>

namespace mg::data {

void Dataset::read_batch(std::span<const int64_t> indices, int64_t epoch, std::span<float> x,
                         std::span<int64_t> y) const {
  MG_CHECK(!indices.empty(), "Dataset::read_batch: no indices");
  MG_CHECK(epoch >= 0, "Dataset::read_batch: epoch " << epoch);
  const int64_t n = size(), numel = sample_numel();
  for (int64_t i : indices) {
    MG_CHECK(i >= 0 && i < n, "Dataset::read_batch: index " << i << " is outside a data set of " << n << " samples");
  }
  MG_CHECK(x.size() == indices.size() * static_cast<size_t>(numel) && y.size() == indices.size(),
           "Dataset::read_batch: " << indices.size() << " samples of shape " << shape_str(sample_shape())
                                   << " need " << indices.size() * static_cast<size_t>(numel) << " floats and "
                                   << indices.size() << " labels; got room for " << x.size() << " and "
                                   << y.size());
  read(indices, epoch, x, y);
}

Batch Dataset::get_batch(std::span<const int64_t> indices, int64_t epoch) const {
  const int64_t b = static_cast<int64_t>(indices.size());
  Shape xs = sample_shape();
  xs.insert(xs.begin(), b);
  Batch out;
  out.x = Tensor::empty(xs);
  out.y = Tensor::empty({b}, {DType::i64});
  read_batch(indices, epoch, {out.x.data<float>(), static_cast<size_t>(out.x.numel())},
             {out.y.data<int64_t>(), static_cast<size_t>(b)});
  return out;
}

TensorDataset::TensorDataset(const Tensor& inputs, const Tensor& targets) {
  MG_CHECK(inputs.defined() && targets.defined(), "TensorDataset: inputs and targets must be defined tensors");
  MG_CHECK(inputs.dim() >= 1, "TensorDataset: inputs must be (N, ...), one row per sample; got a 0-dimensional tensor");
  MG_CHECK(targets.dim() == 1, "TensorDataset: targets must be (N), one class label per sample; got shape "
                                   << shape_str(targets.shape()));
  MG_CHECK(inputs.size(0) == targets.size(0),
           "TensorDataset: " << inputs.size(0) << " inputs (shape " << shape_str(inputs.shape()) << ") but "
                             << targets.size(0) << " targets (shape " << shape_str(targets.shape())
                             << "): expected one target per input");
  MG_CHECK(inputs.dtype() == DType::f32,
           "TensorDataset: inputs must be float32, got " << dtype_name(inputs.dtype()));
  MG_CHECK(targets.dtype() == DType::i64,
           "TensorDataset: targets must be int64 class labels, got " << dtype_name(targets.dtype()));
  // Detached, so that holding a sample never keeps a tape alive.
  inputs_ = inputs.is_cuda() ? inputs.cpu() : inputs.detach();
  targets_ = targets.is_cuda() ? targets.cpu() : targets.detach();
}

void TensorDataset::read(std::span<const int64_t> indices, int64_t, std::span<float> x,
                         std::span<int64_t> y) const {
  const size_t numel = static_cast<size_t>(sample_numel());
  const float* src = inputs_.data<float>();
  const int64_t* labels = targets_.data<int64_t>();
  for (size_t k = 0; k < indices.size(); ++k) {
    std::memcpy(x.data() + k * numel, src + static_cast<size_t>(indices[k]) * numel, numel * sizeof(float));
    y[k] = labels[indices[k]];
  }
}

ChannelsLast::ChannelsLast(std::shared_ptr<const Dataset> images) : images_(std::move(images)) {
  MG_CHECK(images_, "ChannelsLast: the data set is null");
  MG_CHECK(images_->sample_shape().size() == 3, "ChannelsLast: expected images (C, H, W), got samples of shape "
                                                    << shape_str(images_->sample_shape()));
}

Shape ChannelsLast::sample_shape() const {
  const Shape s = images_->sample_shape();
  return {s[1], s[2], s[0]};
}

void ChannelsLast::read(std::span<const int64_t> indices, int64_t epoch, std::span<float> x,
                        std::span<int64_t> y) const {
  const Shape s = images_->sample_shape();
  const int64_t c = s[0], hw = s[1] * s[2], numel = c * hw;
  // One image at a time through a buffer of one image: read() may run beside other threads.
  std::vector<float> image(static_cast<size_t>(numel));
  for (size_t k = 0; k < indices.size(); ++k) {
    images_->read_batch(indices.subspan(k, 1), epoch, image, y.subspan(k, 1));
    float* out = x.data() + static_cast<int64_t>(k) * numel;
    for (int64_t p = 0; p < hw; ++p) {
      for (int64_t ch = 0; ch < c; ++ch) out[p * c + ch] = image[static_cast<size_t>(ch * hw + p)];
    }
  }
}

}  // namespace mg::data
