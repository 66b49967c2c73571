// Image-classification data sets held in host memory: MNIST / FashionMNIST from IDX files, the
// real-MNIST split built from the 10k test set alone, and a generated MNIST-like set for when no
// real data is present.
//
//   mg::data::Splits s = mg::data::load_mnist("data/mnist");       // four standard file names
//   mg::data::Dataset train = s.train.limit(8000);
//   // train.images(): (N * 28 * 28) floats, (x / 255 - mean) / std; train.labels(): int64 0..9
//
// Pixels are kept as bytes and normalised when a batch is assembled (minigrad/data/loader.h), with the
// float expression (x / 255 - mean) / std, so every path (loader, tests, apps) gives the same floats.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mg::data {

struct Normalization {
  float mean = 0.1307f;  // MNIST's; FashionMNIST's is 0.2860 / 0.3530
  float std = 0.3081f;
};

class Dataset {
 public:
  Dataset() = default;
  // pixels: n * rows * cols bytes; labels: n values in [0, num_classes).
  Dataset(std::vector<uint8_t> pixels, std::vector<int64_t> labels, int64_t rows, int64_t cols,
          int64_t num_classes = 10, Normalization norm = {}, std::string name = "");

  int64_t size() const { return static_cast<int64_t>(labels_.size()); }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t features() const { return rows_ * cols_; }
  int64_t num_classes() const { return num_classes_; }
  const Normalization& normalization() const { return norm_; }
  void set_normalization(Normalization n) { norm_ = n; }
  const std::string& name() const { return name_; }

  const std::vector<uint8_t>& pixels() const { return pixels_; }
  const std::vector<int64_t>& labels() const { return labels_; }
  // Writes sample i's normalised pixels to dst[0 .. features()).
  void normalized_image(int64_t i, float* dst) const;

  // Samples [begin, end) as a new data set (copies).
  Dataset slice(int64_t begin, int64_t end) const;
  // The first min(n, size()) samples; n <= 0 means all.
  Dataset limit(int64_t n) const { return n <= 0 || n >= size() ? *this : slice(0, n); }

 private:
  std::vector<uint8_t> pixels_;
  std::vector<int64_t> labels_;
  int64_t rows_ = 0, cols_ = 0, num_classes_ = 10;
  Normalization norm_;
  std::string name_;
};

struct Splits {
  Dataset train, test;
  std::string description;  // where the data came from, for the apps to print
};

// Reads one IDX image/label pair and checks that they agree: 28x28 images, as many labels as
// images, labels in [0, 9]. Errors name the file and the problem.
Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path,
                      Normalization norm = {}, const std::string& name = "");

// The four standard files in `dir` (train-images-idx3-ubyte, train-labels-idx1-ubyte,
// t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each with or without .gz).
Splits load_mnist(const std::string& dir, Normalization norm = {});

// Real digits from the 10k test set alone (what ../shared/data/mnist holds): the first n_train
// images train, the rest are held out. Same split as scripts/make_mnist_split.py.
Splits load_mnist_test_split(const std::string& dir, int64_t n_train = 8000, Normalization norm = {});

// load_mnist when dir holds the training files, else load_mnist_test_split when it holds the
// t10k files only; throws otherwise.
Splits load_mnist_auto(const std::string& dir, Normalization norm = {});

// Deterministic MNIST-like data: 28x28 bytes, 10 classes, each class a smooth random prototype
// (a few strokes); each sample is its class prototype shifted by up to 2 pixels, with random
// stroke intensity and pixel noise. Learnable (an MLP reaches > 90%), not trivially separable.
// Pure function of (n, seed).
Dataset make_synthetic(int64_t n, uint64_t seed, Normalization norm = {});

}  // namespace mg::data
