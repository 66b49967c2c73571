// mnist_ga's data and evaluation: the MNIST splits (a folder, the shared copy, or generated data),
// the test set's loss and accuracy, and the weights --compare names.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <minigrad/data/idx.h>
#include <minigrad/data/loader.h>
#include <minigrad/minigrad.h>

#include "common/flags.h"

namespace mnist {

namespace fs = std::filesystem;

// The shared data folder: ../shared/data/mnist from the working folder or from the repository
// root (the binary lives in <repo>/<build>/bin).
inline std::string find_shared(const char* argv0) {
  std::vector<fs::path> cands = {"../shared/data/mnist", "../../shared/data/mnist", "../../../shared/data/mnist"};
  std::error_code ec;
  fs::path exe = fs::canonical("/proc/self/exe", ec);
  if (ec) exe = fs::absolute(argv0, ec);
  if (!ec) cands.push_back(exe.parent_path().parent_path().parent_path().parent_path() / "shared/data/mnist");
  for (const fs::path& p : cands) {
    if (fs::exists(p / "t10k-images-idx3-ubyte.gz") || fs::exists(p / "train-images-idx3-ubyte.gz")) {
      return fs::weakly_canonical(p).string();
    }
  }
  return "";
}

struct DataFlags {
  std::string dir, dataset = "mnist";
  bool synthetic = false;
  int64_t limit_train = 0, limit_test = 0;
};

// --data DIR (the four standard IDX names, or only t10k-* which is then split 8,000 / rest);
// without it ../shared/data/mnist when present, else generated data (--synthetic forces it).
inline mg::data::Splits load(const DataFlags& f, uint64_t seed, const char* argv0) {
  const mg::data::Normalization norm = f.dataset == "fashion" ? mg::data::Normalization{0.2860f, 0.3530f}
                                                              : mg::data::Normalization{0.1307f, 0.3081f};
  mg::data::Splits splits;
  std::string dir = f.dir;
  if (dir.empty() && !f.synthetic && f.dataset == "mnist") dir = find_shared(argv0);
  if (!dir.empty() && !f.synthetic) {
    splits = f.dir.empty() ? mg::data::load_mnist_auto(dir, norm)
                           : for_flag("--data", [&] { return mg::data::load_mnist_auto(dir, norm); });
    splits.description = f.dataset + " from " + splits.description;
  } else {
    const int64_t n_train = f.limit_train > 0 ? f.limit_train : 8000;
    const int64_t n_test = f.limit_test > 0 ? f.limit_test : 2000;
    mg::data::IdxDataset all = mg::data::make_synthetic(n_train + n_test, seed + 1000, norm);
    splits.train = all.slice(0, n_train);
    splits.test = all.slice(n_train, n_train + n_test);
    splits.description = std::string("GENERATED synthetic MNIST-like data (") +
                         (f.synthetic ? "--synthetic" : f.dataset == "fashion" ? "no --data for fashion" : "no real data found") +
                         "): " + std::to_string(n_train) + " train, " + std::to_string(n_test) + " test";
  }
  splits.train = splits.train.limit(f.limit_train);
  splits.test = splits.test.limit(f.limit_test);
  return splits;
}

struct EvalResult {
  double loss = 0, accuracy = 0;
};

// The test set's mean loss and accuracy (%), in batches of `batch`, halved until they fit the
// device (under --memory-limit, say): evaluation keeps no state, so a batch that ran out of memory
// is simply run again smaller.
inline EvalResult evaluate(mg::nn::Module& model, const mg::data::Dataset& test, mg::Device dev, int64_t& batch) {
  for (;;) {
    try {
      mg::NoGradGuard ng;
      model.eval();
      mg::data::DataLoader loader(test, {.batch_size = batch, .shuffle = false, .device = dev});
      loader.start_epoch(0);
      mg::data::Batch b;
      double loss = 0;
      int64_t correct = 0;
      while (loader.next(b)) {
        mg::Tensor logits = model.forward(b.x);
        loss += mg::cross_entropy(logits, b.y, mg::Reduction::sum).item();
        const std::vector<float> l = logits.to_vector<float>();
        const std::vector<int64_t> y = b.y.to_vector<int64_t>();
        const int64_t c = logits.size(1);
        for (size_t i = 0; i < y.size(); ++i) {
          const float* row = l.data() + i * c;
          correct += std::max_element(row, row + c) - row == y[i];
        }
      }
      model.train();
      return {loss / static_cast<double>(test.size()), 100.0 * static_cast<double>(correct) / static_cast<double>(test.size())};
    } catch (const mg::OutOfMemoryError&) {
      model.train();
      if (batch == 1) throw;
      batch = (batch + 1) / 2;
    }
  }
}

// The weights --compare names, checked against the model before training: every parameter
// present with its shape, as float32.
inline mg::nn::SafetensorsFile load_compare(const std::string& path, const mg::nn::Module& model) {
  mg::nn::SafetensorsFile f = mg::nn::load_safetensors(path);
  for (auto& [name, p] : model.named_parameters()) {
    const mg::Tensor* t = f.find(name);
    MG_CHECK(t && t->shape() == p.shape() && t->dtype() == p.dtype(),
             path << " has no tensor " << name << " of shape " << mg::shape_str(p.shape()) << " float32"
                  << (t ? " (it has " + mg::shape_str(t->shape()) + " " + mg::dtype_name(t->dtype()) + ")" : ""));
  }
  return f;
}

// The largest |w - w'| over the model's parameters and the file's.
inline double max_abs_diff(const mg::nn::Module& model, const mg::nn::SafetensorsFile& f) {
  double d = 0;
  for (auto& [name, p] : model.named_parameters()) {
    const std::vector<float> a = p.to_vector<float>(), b = f.find(name)->to_vector<float>();
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, static_cast<double>(std::abs(a[i] - b[i])));
  }
  return d;
}

}  // namespace mnist
