// Image classification from a folder of class sub-folders, as torchvision's ImageFolder
// (root/cat/001.jpg, root/cat/002.png, root/dog/a.jpeg, ...; the classes are the sorted folder
// names):
//
//   mg::data::ImageFolder ds("data/pets", {.image_size = 224, .seed = 1});
//   mg::data::Batch b = ds.get_batch(std::vector<int64_t>{0, 5, 9}, /*epoch=*/0);
//   // b.x: (3, 3, 224, 224) float32, b.y: (3) int64; a DataLoader over ds walks it in epochs
//
// Images are decoded with stb_image (JPEG, PNG; grey or RGBA become RGB), resized to
// image_size x image_size (bilinear, half-pixel centres, no crop), scaled to [0, 1], normalised
// with ImageNet's mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225), and flipped
// left-right with probability 1/2 when random_flip is on. A flip is a pure function of
// (seed, epoch, sample index), so a run is reproducible whatever the batch size. Files are
// decoded when a batch asks for them; nothing but the file list is held in memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <minigrad/data/dataset.h>

namespace mg::data {

struct ImageFolderOptions {
  int64_t image_size = 224;
  bool random_flip = true;
  uint64_t seed = 0;
  // A file whose header declares more pixels is refused before it is decoded. At most 2^28
  // (16384 x 16384, 768 MiB decoded); a lower limit bounds what one file of a few bytes can
  // cost in time and memory (fuzz/fuzz_image.cpp uses 2^16).
  int64_t max_pixels = int64_t{1} << 28;
};

inline constexpr float kImageNetMean[3] = {0.485f, 0.456f, 0.406f};
inline constexpr float kImageNetStd[3] = {0.229f, 0.224f, 0.225f};

class ImageFolder : public Dataset {
 public:
  // Scans root; throws mg::Error when it has no class sub-folder or no image.
  explicit ImageFolder(const std::string& root, ImageFolderOptions opts = {});

  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  Shape sample_shape() const override { return {3, opts_.image_size, opts_.image_size}; }
  int64_t num_classes() const { return static_cast<int64_t>(classes_.size()); }
  const std::vector<std::string>& classes() const { return classes_; }
  const std::string& path(int64_t i) const { return files_.at(static_cast<size_t>(i)); }
  int64_t label(int64_t i) const { return labels_.at(static_cast<size_t>(i)); }
  const ImageFolderOptions& options() const { return opts_; }

  // Whether sample i is flipped in `epoch`.
  bool flipped(int64_t i, uint64_t epoch) const;
  // Decodes sample i into dst[0 .. 3 S S) (CHW, normalised), flipped when `flip`.
  void load(int64_t i, bool flip, float* dst) const;

 private:
  // Sample indices[k] decoded, flipped when flipped(indices[k], epoch).
  void read(std::span<const int64_t> indices, int64_t epoch, std::span<float> x,
            std::span<int64_t> y) const override;

  ImageFolderOptions opts_;
  std::vector<std::string> classes_;
  std::vector<std::string> files_;
  std::vector<int64_t> labels_;
};

// Resizes an interleaved 8-bit RGB image (h, w, 3) to (3, out, out) floats in [0, 1], bilinear
// with half-pixel centres (PyTorch's interpolate(align_corners=False) without antialiasing).
void resize_rgb_bilinear(const uint8_t* src, int h, int w, int out, float* dst);

}  // namespace mg::data
