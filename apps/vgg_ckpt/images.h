// vgg_ckpt's data: generated images (a pattern per class plus noise, made on demand) and the
// wrapper that makes an image folder's read errors name --data.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <minigrad/data/dataset.h>
#include <minigrad/data/image_folder.h>
#include <minigrad/minigrad.h>

#include "common/flags.h"

namespace images {

constexpr int64_t kNumClasses = 2;
constexpr int64_t kSyntheticSize = 64;  // samples per synthetic epoch (a larger batch: one batch)

// Sample i of the synthetic set: class i % 2; class 0 brightens towards the right, class 1
// towards the bottom, plus uniform noise drawn from (seed, i). ImageNet-normalised like files.
inline void synthetic_image(int64_t i, int64_t s, uint64_t seed, float* dst) {
  const int64_t label = i % kNumClasses;
  const uint64_t base = static_cast<uint64_t>(i) * 3 * s * s;
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t y = 0; y < s; ++y) {
      for (int64_t x = 0; x < s; ++x) {
        const int64_t k = (c * s + y) * s + x;
        const float ramp = static_cast<float>(label == 0 ? x : y) / static_cast<float>(std::max<int64_t>(1, s - 1));
        const float noise = mg::philox_uniform(seed, base + static_cast<uint64_t>(k));
        const float v = 0.6f * ramp + 0.4f * noise;
        dst[k] = (v - mg::data::kImageNetMean[c]) / mg::data::kImageNetStd[c];
      }
    }
  }
}

// The synthetic data set, made on demand: sample i is synthetic_image(i).
class SyntheticImages : public mg::data::Dataset {
 public:
  SyntheticImages(int64_t n, int64_t image_size, uint64_t seed) : n_(n), s_(image_size), seed_(seed) {}
  int64_t size() const override { return n_; }
  mg::Shape sample_shape() const override { return {3, s_, s_}; }

 private:
  void read(std::span<const int64_t> indices, int64_t, std::span<float> x, std::span<int64_t> y) const override {
    for (size_t k = 0; k < indices.size(); ++k) {
      synthetic_image(indices[k], s_, seed_ ^ 0xDA7Aull, x.data() + k * 3 * s_ * s_);
      y[k] = indices[k] % kNumClasses;
    }
  }

  int64_t n_, s_;
  uint64_t seed_;
};

// A data set whose read errors name the flag that gave it (a damaged image under --data).
class FlagErrors : public mg::data::Dataset {
 public:
  FlagErrors(std::shared_ptr<const mg::data::Dataset> inner, std::string flag) : inner_(std::move(inner)), flag_(std::move(flag)) {}
  int64_t size() const override { return inner_->size(); }
  mg::Shape sample_shape() const override { return inner_->sample_shape(); }

 private:
  void read(std::span<const int64_t> indices, int64_t epoch, std::span<float> x, std::span<int64_t> y) const override {
    for_flag(flag_.c_str(), [&] { inner_->read_batch(indices, epoch, x, y); });
  }
  std::shared_ptr<const mg::data::Dataset> inner_;
  std::string flag_;
};

}  // namespace images

namespace images {

struct Data {
  std::shared_ptr<const mg::data::Dataset> set;
  std::string description;
};

// --data DIR (class sub-folders of JPEG/PNG, flipped at random from the seed), or the generated
// set of max(64, a step's images) images.
inline Data load(const std::string& dir, int64_t image_size, uint64_t seed, int64_t step_images) {
  if (dir.empty()) {
    const int64_t n = std::max(kSyntheticSize, step_images);
    return {std::make_shared<SyntheticImages>(n, image_size, seed), "synthetic (" + std::to_string(n) + " images)"};
  }
  auto folder = for_flag("--data", [&] {
    return std::make_shared<mg::data::ImageFolder>(
        dir, mg::data::ImageFolderOptions{.image_size = image_size, .random_flip = true, .seed = seed});
  });
  MG_CHECK(folder->num_classes() == kNumClasses, "--data: expected " << kNumClasses << " class folders, found " << folder->num_classes());
  MG_CHECK(folder->size() >= step_images, "--data: " << folder->size() << " images, fewer than one batch of " << step_images
                                                      << "; use a smaller --batch-size");
  // A damaged image shows up when its batch is read, as an error naming --data.
  return {std::make_shared<FlagErrors>(folder, "--data"), dir + " (" + std::to_string(folder->size()) + " images)"};
}

}  // namespace images
