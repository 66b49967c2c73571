// What the DataLoader reads: a data set of N samples, each an input tensor of a fixed shape and an
// int64 class label, fetched a batch at a time by sample indices. Map-style like PyTorch's
// torch.utils.data.Dataset, but batched, so that an implementation can gather, decode or normalise
// many samples in one call. The IDX data sets (minigrad/data/idx.h), image folders (minigrad/data/image_folder.h)
// and TensorDataset below implement it.
//
//   mg::Tensor x = mg::Tensor::full({100, 3, 8, 8}, 0.5f);
//   std::vector<int64_t> labels(100);
//   for (int64_t i = 0; i < 100; ++i) labels[i] = i % 10;
//   auto data = std::make_shared<mg::data::TensorDataset>(x, mg::Tensor::from_vector(labels, {100}));
//   mg::data::Batch b = data->get_batch(std::vector<int64_t>{4, 2});  // b.x: (2, 3, 8, 8), b.y: (2)
//   // mg::data::DataLoader(data, {.batch_size = 16}) walks it in epochs (minigrad/data/loader.h).
//
// Implementing one: override size(), sample_shape() and read(). read() gets indices already
// checked and writes into buffers the caller owns, so the loader can assemble batches on its
// prefetch thread in host memory the allocator does not count (Note [loader host buffers],
// minigrad/data/loader.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::data {

struct Batch {
  Tensor x, y;        // x: (B, sample shape...) float32; y: (B) int64
  int64_t index = 0;  // batch number within the epoch (set by the DataLoader)
  int64_t size() const { return y.defined() ? y.size(0) : 0; }
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual int64_t size() const = 0;
  // The shape of one input, e.g. {1, 28, 28}; the same for every sample.
  virtual Shape sample_shape() const = 0;
  int64_t sample_numel() const { return shape_numel(sample_shape()); }

  // Writes samples `indices`, in that order, to x (indices.size() * sample_numel() floats) and
  // y (indices.size() labels). `epoch` is for augmentations drawn from (seed, epoch, index), such
  // as an image folder's flips; data sets without any ignore it. Throws mg::Error for an index
  // outside [0, size()) or spans of the wrong size.
  void read_batch(std::span<const int64_t> indices, int64_t epoch, std::span<float> x,
                  std::span<int64_t> y) const;
  // The same as new CPU tensors: x (N, sample shape...) float32, y (N) int64.
  Batch get_batch(std::span<const int64_t> indices, int64_t epoch = 0) const;

 private:
  // Called by read_batch with valid indices and spans of the right size. It may run on a
  // DataLoader's prefetch thread while other threads use the data set: it must only read.
  virtual void read(std::span<const int64_t> indices, int64_t epoch, std::span<float> x,
                    std::span<int64_t> y) const = 0;
};

// Samples already in tensors: sample i is (inputs[i], targets[i]). CPU tensors are shared, not
// copied (changing them changes what the loader delivers); tensors on a GPU are copied to the CPU.
// Data read in windows, one per optimizer step, in order rather than by shuffled samples: a token
// stream read as llm.c reads it (mg::data::TokenBatches). mg::Trainer reads rows [first, first +
// count) of step `step`'s window of this rank; x and y on the host, y of any shape (a GPT's
// (rows, T) next tokens), the step's loss normalised by y's elements.
class WindowData {
 public:
  virtual ~WindowData() = default;
  virtual int64_t rows_per_window() const = 0;  // rows (sequences) of a window, on this rank
  virtual Batch window_rows(int64_t step, int64_t first, int64_t count) const = 0;
};

class TensorDataset : public Dataset {
 public:
  // inputs: (N, ...) float32 with at least one dimension; targets: (N) int64. Throws mg::Error
  // saying what was expected and what came.
  TensorDataset(const Tensor& inputs, const Tensor& targets);

  int64_t size() const override { return inputs_.size(0); }
  Shape sample_shape() const override { return Shape(inputs_.shape().begin() + 1, inputs_.shape().end()); }
  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  void read(std::span<const int64_t> indices, int64_t epoch, std::span<float> x,
            std::span<int64_t> y) const override;

  Tensor inputs_, targets_;
};

// Another data set's images (C, H, W) as channels last, (H, W, C): the input of a model built with
// Layout::nhwc (Note [channels last] in src/ops/conv2d.cpp), transposed on the host as each batch
// is read, so the device gets it ready.
//   auto data = std::make_shared<mg::data::ChannelsLast>(images);   // samples (H, W, C)
class ChannelsLast : public Dataset {
 public:
  // images: samples of three dimensions (C, H, W); throws mg::Error otherwise.
  explicit ChannelsLast(std::shared_ptr<const Dataset> images);

  int64_t size() const override { return images_->size(); }
  Shape sample_shape() const override;

 private:
  void read(std::span<const int64_t> indices, int64_t epoch, std::span<float> x,
            std::span<int64_t> y) const override;

  std::shared_ptr<const Dataset> images_;
};

}  // namespace mg::data
