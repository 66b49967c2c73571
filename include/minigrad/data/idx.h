// IDX files (the MNIST / FashionMNIST container, http://yann.lecun.com/exdb/mnist/) and the
// in-memory data sets read from them: MNIST / FashionMNIST, the real-MNIST split built from the
// 10k test set alone, and a generated MNIST-like set for when no real data is present.
//
//   mg::data::Splits s = mg::data::load_mnist("data/mnist");       // four standard file names
//   mg::data::IdxDataset train = s.train.limit(8000);
//   // train.pixels(): (N * 28 * 28) bytes; train.labels(): int64 0..9
//   mg::data::Batch b = train.get_batch(std::vector<int64_t>{0, 7});  // b.x: (2, 1, 28, 28) float32
//
// The file format: a 4-byte big-endian magic {0, 0, type, ndims}, ndims big-endian uint32 sizes,
// then the row-major data. Only type 0x08 (unsigned byte) is used by these data sets and only it
// is accepted. Files may be raw or gzip-compressed, in one gzip member or several (read as gzip(1)
// and Python's gzip module read them: Note [gzip members] in src/data/idx.cpp). Every problem
// throws mg::Error naming the file and what was expected: a missing file, one that is not a
// regular file (a FIFO, a folder, a device), a wrong magic or number of dimensions, a size the
// file cannot hold (checked before anything is allocated), truncated data, damaged gzip data,
// trailing bytes after the data or after the gzip stream (with their byte offset).
//
// Pixels are kept as bytes and normalised when a batch is read, with the float expression
// (x / 255 - mean) / std, so every path (loader, tests, apps) gives the same floats.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <minigrad/data/dataset.h>

namespace mg::data {

// ---- the file format ----------------------------------------------------------------------------

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;  // row-major, dims' product of them
};

// Reads an unsigned-byte IDX file with `expected_ndims` dimensions (gzip or raw).
IdxArray read_idx(const std::string& path, int expected_ndims);

// Writes an unsigned-byte IDX file, gzip-compressed when `path` ends in ".gz". For tools and
// tests (scripts/make_mnist_split.py does the same in Python).
void write_idx(const std::string& path, const std::vector<int64_t>& dims, const uint8_t* bytes);

// Writes `bytes` to `path`, gzip-compressed when the name ends in ".gz" (tools and tests).
void write_maybe_gz(const std::string& path, const std::string& bytes);

// ---- the data sets ------------------------------------------------------------------------------

struct Normalization {
  float mean = 0.1307f;  // MNIST's; FashionMNIST's is 0.2860 / 0.3530
  float std = 0.3081f;
};

// Grey images of bytes with class labels, held in host memory. A sample's input is
// (1, rows, cols), normalised.
class IdxDataset : public Dataset {
 public:
  IdxDataset() = default;
  // pixels: n * rows * cols bytes; labels: n values in [0, num_classes).
  IdxDataset(std::vector<uint8_t> pixels, std::vector<int64_t> labels, int64_t rows, int64_t cols,
             int64_t num_classes = 10, Normalization norm = {}, std::string name = "");

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  Shape sample_shape() const override { return {1, rows_, cols_}; }
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
  IdxDataset slice(int64_t begin, int64_t end) const;
  // The first min(n, size()) samples; n <= 0 means all.
  IdxDataset limit(int64_t n) const { return n <= 0 || n >= size() ? *this : slice(0, n); }

 private:
  void read(std::span<const int64_t> indices, int64_t epoch, std::span<float> x,
            std::span<int64_t> y) const override;

  std::vector<uint8_t> pixels_;
  std::vector<int64_t> labels_;
  int64_t rows_ = 0, cols_ = 0, num_classes_ = 10;
  Normalization norm_;
  std::string name_;
};

struct Splits {
  IdxDataset train, test;
  std::string description;  // where the data came from, for the apps to print
};

// Reads one IDX image/label pair and checks that they agree: 28x28 images, as many labels as
// images, labels in [0, 9]. Errors name the file and the problem.
IdxDataset load_idx_pair(const std::string& images_path, const std::string& labels_path,
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
IdxDataset make_synthetic(int64_t n, uint64_t seed, Normalization norm = {});

}  // namespace mg::data
