// The image decoder path of ImageFolder (minigrad/data/image_folder.h): the input is the one file
// of a one-class folder, and ImageFolder::load reads it as a batch would (the file checks, the
// signature sniffing, the size limits, stb_image's JPEG and PNG decoders, the resize, the
// normalisation and the flip). Seeds: make_corpus.cpp (image/); dictionary: dicts/image.dict.
//
// Size: the library accepts images of up to 2^28 pixels, and a JPEG header of a few dozen bytes
// can declare that many; stb_image then decodes them all, from zeros once the data runs out
// (37 s for 65520 x 1012 pixels under the sanitizers, the first hang this target reported). The
// folder here refuses more than kMaxPixels (ImageFolderOptions::max_pixels), so every input
// decodes in milliseconds and the decoders' paths, not their speed, are what is explored; the
// 2^28 check itself is tested in tests/test_image_folder.cpp.
#include <cmath>
#include <memory>
#include <vector>

#include <minigrad/data/image_folder.h>

#include "fuzz_common.h"

namespace {

constexpr int64_t kSize = 13;             // odd and small: the resize runs on every input, cheaply
constexpr int64_t kMaxPixels = 1 << 16;  // 256 x 256, 65536 x 1, ...

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string root = mg::fuzz::scratch_dir() + "/images";
  static const std::string file = [] {
    std::filesystem::create_directories(root + "/c");
    return mg::fuzz::write_input("images/c/input.png", nullptr, 0);  // ImageFolder lists it
  }();
  static const std::unique_ptr<mg::data::ImageFolder> folder =
      std::make_unique<mg::data::ImageFolder>(root, mg::data::ImageFolderOptions{.image_size = kSize, .max_pixels = kMaxPixels});
  MG_FUZZ_CHECK(folder->size() == 1 && folder->path(0) == file, "the folder lists " + folder->path(0));

  mg::fuzz::write_input("images/c/input.png", data, size);
  std::vector<float> out(3 * kSize * kSize, NAN);
  if (mg::fuzz::expect_mg_error([&] { folder->load(0, size % 2 == 1, out.data()); })) return 0;
  // Pixels in [0, 1], normalised with ImageNet's mean and std: finite, within [-2.2, 2.7].
  for (float v : out) MG_FUZZ_CHECK(std::isfinite(v) && v > -2.2f && v < 2.7f, "a decoded value is " + std::to_string(v));
  return 0;
}
