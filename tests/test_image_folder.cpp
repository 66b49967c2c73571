// minigrad/data/image_folder.h: decoding, resizing (against PyTorch's interpolate), ImageNet
// normalisation, reproducible flips, the folder through the DataLoader, and the errors for bad
// folders and files.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>

#include <minigrad/data/image_folder.h>
#include <minigrad/data/loader.h>
#include "helpers.h"

using namespace mg;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("mg_image_folder_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// An RGB image whose pixel (y, x, c) is a distinct function of its position.
std::vector<uint8_t> pattern(int h, int w, int salt) {
  std::vector<uint8_t> p(static_cast<size_t>(h) * w * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) p[(static_cast<size_t>(y) * w + x) * 3 + c] = static_cast<uint8_t>((y * 37 + x * 11 + c * 71 + salt) % 256);
  return p;
}

}  // namespace

TEST_CASE("resize_rgb_bilinear matches torch interpolate(bilinear, align_corners=False)") {
  // Golden values: F.interpolate(src.view(1,1,2,3), size=(4,4), mode='bilinear',
  // align_corners=False, antialias=False) / 255 with torch 1.13, src = [[10,200,30],[90,0,255]].
  const uint8_t gray[6] = {10, 200, 30, 90, 0, 255};
  std::vector<uint8_t> rgb;
  for (uint8_t v : gray) rgb.resize(rgb.size() + 3, v);
  const float golden[16] = {0.03921568766236305f, 0.5049019455909729f, 0.5343137383460999f, 0.11764705926179886f,
                            0.11764705926179886f, 0.4117647111415863f, 0.4944852888584137f, 0.3382352888584137f,
                            0.27450981736183167f, 0.22549019753932953f, 0.41482841968536377f, 0.779411792755127f,
                            0.3529411852359772f, 0.13235294818878174f, 0.375f, 1.0f};
  std::vector<float> out(3 * 16, -7.0f);
  data::resize_rgb_bilinear(rgb.data(), 2, 3, 4, out.data());
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 16; ++i) CHECK(out[c * 16 + i] == doctest::Approx(golden[i]).epsilon(1e-6));
  std::vector<float> one(3, -7.0f);
  data::resize_rgb_bilinear(rgb.data(), 2, 3, 1, one.data());
  CHECK(one[0] == doctest::Approx(100.0f / 255.0f));
}

TEST_CASE("ImageFolder: classes, files, decoding, normalisation and flips") {
  TempDir dir;
  fs::create_directories(dir.path / "b_dogs");
  fs::create_directories(dir.path / "a_cats");
  const int s = 6;
  auto cat0 = pattern(s, s, 1), cat1 = pattern(9, 13, 2), dog0 = pattern(s, s, 3);
  REQUIRE(stbi_write_png((dir.path / "a_cats/0.png").c_str(), s, s, 3, cat0.data(), s * 3));
  REQUIRE(stbi_write_jpg((dir.path / "a_cats/1.JPG").c_str(), 13, 9, 3, cat1.data(), 95));
  REQUIRE(stbi_write_png((dir.path / "b_dogs/0.png").c_str(), s, s, 3, dog0.data(), s * 3));
  const uint8_t grey[4] = {0, 85, 170, 255};
  REQUIRE(stbi_write_png((dir.path / "b_dogs/grey.png").c_str(), 2, 2, 1, grey, 2));
  std::ofstream(dir.path / "b_dogs/readme.txt") << "not an image";

  data::ImageFolder ds(dir.path.string(), {.image_size = s, .random_flip = true, .seed = 5});
  CHECK(ds.classes() == std::vector<std::string>{"a_cats", "b_dogs"});
  CHECK(ds.size() == 4);
  CHECK(ds.label(0) == 0);
  CHECK(ds.label(1) == 0);
  CHECK(ds.label(2) == 1);
  CHECK(ds.label(3) == 1);

  // A PNG already at the target size: exactly (p / 255 - mean) / std, flipped or not.
  std::vector<float> img(3 * s * s, -99.0f), flipped(3 * s * s, -99.0f);
  ds.load(0, false, img.data());
  ds.load(0, true, flipped.data());
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < s; ++y)
      for (int x = 0; x < s; ++x) {
        const float p = static_cast<float>(cat0[(static_cast<size_t>(y) * s + x) * 3 + c]) / 255.0f;
        const float want = (p - data::kImageNetMean[c]) / data::kImageNetStd[c];
        CHECK(img[(c * s + y) * s + x] == want);
        CHECK(flipped[(c * s + y) * s + (s - 1 - x)] == want);
      }
  // Grey becomes RGB: the three channels hold the same pixel, each normalised with its own stats.
  std::vector<float> g(3 * s * s);
  ds.load(3, false, g.data());
  CHECK(g[0] * data::kImageNetStd[0] + data::kImageNetMean[0] ==
        doctest::Approx(g[s * s] * data::kImageNetStd[1] + data::kImageNetMean[1]));

  // Flips are a pure function of (seed, epoch, index), and both outcomes happen.
  int flips = 0;
  for (uint64_t e = 0; e < 8; ++e)
    for (int64_t i = 0; i < ds.size(); ++i) {
      CHECK(ds.flipped(i, e) == ds.flipped(i, e));
      flips += ds.flipped(i, e);
    }
  CHECK(flips > 0);
  CHECK(flips < 32);

  const data::Batch b = ds.get_batch(std::vector<int64_t>{2, 0, 1}, 3);
  const Tensor &x = b.x, &y = b.y;
  CHECK(x.shape() == Shape{3, 3, s, s});
  CHECK(y.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0});
  std::vector<float> first(3 * s * s);
  ds.load(2, ds.flipped(2, 3), first.data());
  auto xv = x.to_vector<float>();
  CHECK(std::equal(first.begin(), first.end(), xv.begin()));
  CHECK_THROWS_AS(ds.get_batch(std::vector<int64_t>{4}, 0), Error);
}

TEST_CASE("ImageFolder: errors name the folder or the file") {
  TempDir dir;
  CHECK_THROWS_WITH_AS(data::ImageFolder((dir.path / "missing").string()), doctest::Contains("is not a directory"), Error);
  CHECK_THROWS_WITH_AS(data::ImageFolder(dir.path.string()), doctest::Contains("no class sub-folders"), Error);
  fs::create_directories(dir.path / "only");
  CHECK_THROWS_WITH_AS(data::ImageFolder(dir.path.string()), doctest::Contains("no .jpg"), Error);
  std::ofstream(dir.path / "only/broken.jpg") << "definitely not a jpeg";
  data::ImageFolder ds(dir.path.string(), {.image_size = 4});
  std::vector<float> buf(48);
  CHECK_THROWS_WITH_AS(ds.load(0, false, buf.data()), doctest::Contains("broken.jpg"), Error);
  CHECK_THROWS_WITH_AS(ds.load(0, false, buf.data()), doctest::Contains("neither a JPEG nor a PNG"), Error);
}

// stb_image reports its last decoder's complaint: a truncated JPEG once read "bad png sig". The
// format is named from the file's signature, and sizes are bounded before decoding.
TEST_CASE("ImageFolder: truncated files name their format; huge declared sizes are refused") {
  TempDir dir;
  fs::create_directories(dir.path / "c");
  std::vector<unsigned char> rgb(64 * 48 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<unsigned char>(i * 7);
  const std::string jpg = (dir.path / "c/a.jpg").string(), png = (dir.path / "c/b.png").string();
  REQUIRE(stbi_write_jpg(jpg.c_str(), 64, 48, 3, rgb.data(), 90) != 0);
  REQUIRE(stbi_write_png(png.c_str(), 64, 48, 3, rgb.data(), 64 * 3) != 0);
  data::ImageFolder ds(dir.path.string(), {.image_size = 8});
  std::vector<float> buf(3 * 8 * 8);
  ds.load(0, false, buf.data());  // both decode whole
  ds.load(1, false, buf.data());
  for (const std::string& f : {jpg, png}) fs::resize_file(f, fs::file_size(f) / 3);
  CHECK_THROWS_WITH_AS(ds.load(0, false, buf.data()), doctest::Contains("truncated JPEG"), Error);
  CHECK_THROWS_WITH_AS(ds.load(1, false, buf.data()), doctest::Contains("truncated PNG"), Error);
  // A PNG header declaring 16384 x 16385 pixels (768 MiB decoded): refused from the header.
  std::string huge(33, '\0');
  const unsigned char head[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R',
                                0, 0, 0x40, 0, 0, 0, 0x40, 1, 8, 2, 0, 0, 0};  // 16384 x 16385
  std::memcpy(huge.data(), head, sizeof head);
  std::ofstream(png, std::ios::binary | std::ios::trunc).write(huge.data(), static_cast<std::streamsize>(huge.size()));
  CHECK_THROWS_WITH_AS(ds.load(1, false, buf.data()), doctest::Contains("b.png' declares 16384x16385 pixels"), Error);
}

TEST_CASE("ImageFolder: max_pixels bounds what a header may declare") {
  TempDir dir;
  fs::create_directories(dir.path / "c");
  const std::vector<uint8_t> rgb = pattern(48, 64, 5);
  const std::string jpg = (dir.path / "c/a.jpg").string();
  REQUIRE(stbi_write_jpg(jpg.c_str(), 64, 48, 3, rgb.data(), 90) != 0);
  std::vector<float> buf(3 * 8 * 8);
  data::ImageFolder small(dir.path.string(), {.image_size = 8, .max_pixels = 64 * 48 - 1});
  CHECK_THROWS_WITH_AS(small.load(0, false, buf.data()),
                       doctest::Contains("declares 64x48 pixels, more than the limit of 3071"), Error);
  data::ImageFolder exact(dir.path.string(), {.image_size = 8, .max_pixels = 64 * 48});
  exact.load(0, false, buf.data());
  for (int64_t bad : {int64_t{0}, (int64_t{1} << 28) + 1}) {
    CHECK_THROWS_WITH_AS(data::ImageFolder(dir.path.string(), {.max_pixels = bad}),
                         doctest::Contains("max_pixels must be in [1, 268435456]"), Error);
  }
}

TEST_CASE("ImageFolder: a JPEG Huffman table of more than 256 codes is refused (found by fuzz_image)") {
  // Debian 12's stb_image wrote past its 257-entry arrays on such a table; libjpeg-turbo, which
  // decodes JPEG now (Note [image decoders] in src/data/image_folder.cpp), refuses it.
  TempDir dir;
  fs::create_directories(dir.path / "c");
  const std::vector<uint8_t> rgb = pattern(16, 16, 3);
  const std::string jpg = (dir.path / "c/a.jpg").string();
  REQUIRE(stbi_write_jpg(jpg.c_str(), 16, 16, 3, rgb.data(), 90) != 0);
  data::ImageFolder ds(dir.path.string(), {.image_size = 8});
  std::vector<float> buf(3 * 8 * 8);
  ds.load(0, false, buf.data());
  std::ifstream in(jpg, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  // A DHT segment after SOI: one AC table whose 16 counts add up to 510 codes.
  std::string dht = {'\xff', '\xc4', 0x02, 0x11, 0x10};
  for (int k = 0; k < 16; ++k) dht.push_back(k == 8 || k == 9 ? '\xff' : '\0');
  for (int k = 0; k < 510; ++k) dht.push_back(static_cast<char>(k % 200 + 1));
  bytes.insert(2, dht);
  std::ofstream(jpg, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  CHECK_THROWS_WITH_AS(ds.load(0, false, buf.data()), doctest::Contains("corrupt or truncated JPEG header (libjpeg: Bogus Huffman table definition)"), Error);
}

TEST_CASE("ImageFolder: a PNG chunk longer than the file is refused before decoding (found by fuzz_image)") {
  // stb_image grew its buffer to the declared length first: 2 GiB for a file of 70 bytes.
  TempDir dir;
  fs::create_directories(dir.path / "c");
  const std::vector<uint8_t> rgb = pattern(3, 5, 1);
  const std::string png = (dir.path / "c/a.png").string();
  REQUIRE(stbi_write_png(png.c_str(), 5, 3, 3, rgb.data(), 5 * 3) != 0);
  data::ImageFolder ds(dir.path.string(), {.image_size = 8});
  std::vector<float> buf(3 * 8 * 8);
  ds.load(0, false, buf.data());
  std::string bytes(33, '\0');  // the signature and the IHDR chunk, then an IDAT of 2^31 - 256 bytes
  std::ifstream(png, std::ios::binary).read(bytes.data(), 33);
  bytes += std::string("\x7f\xff\xff\x00IDAT", 8) + std::string(29, 'x');
  std::ofstream(png, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  CHECK_THROWS_WITH_AS(ds.load(0, false, buf.data()),
                       doctest::Contains("corrupt or truncated PNG (chunk IDAT declares 2147483392 bytes, 29 are left;"), Error);
}

TEST_CASE("ImageFolder through the DataLoader: epoch order, flips of that epoch, shards, prefetch") {
  TempDir dir;
  const int s = 5;
  for (int i = 0; i < 7; ++i) {
    const fs::path cls = dir.path / (i < 3 ? "ants" : "bees");
    fs::create_directories(cls);
    const auto px = pattern(4 + i, 9 - i, 10 * i + 1);
    REQUIRE(stbi_write_png((cls / (std::to_string(i) + ".png")).c_str(), 9 - i, 4 + i, 3, px.data(), (9 - i) * 3));
  }
  data::ImageFolder ds(dir.path.string(), {.image_size = s, .random_flip = true, .seed = 3});
  REQUIRE(ds.size() == 7);
  CHECK(ds.sample_shape() == Shape{3, s, s});
  const int64_t epoch = 2;
  const std::vector<int64_t> perm = data::epoch_permutation(7, 11, epoch);
  for (int prefetch : {0, 2}) {
    INFO("prefetch " << prefetch);
    data::DataLoader l(ds, {.batch_size = 3, .seed = 11, .prefetch = prefetch});
    l.start_epoch(epoch);
    data::Batch b;
    for (int64_t k = 0; k < 3; ++k) {
      REQUIRE(l.next(b));
      const std::vector<int64_t> idx(perm.begin() + 3 * k, perm.begin() + std::min<int64_t>(7, 3 * k + 3));
      const data::Batch want = ds.get_batch(idx, epoch);  // flips of this epoch
      CHECK(b.x.shape() == Shape{static_cast<int64_t>(idx.size()), 3, s, s});
      CHECK(test::bit_equal(b.x, want.x));
      CHECK(b.y.to_vector<int64_t>() == want.y.to_vector<int64_t>());
    }
    CHECK_FALSE(l.next(b));
  }
  // Some sample is flipped in this epoch and not in the next one: the loader passes its epoch on.
  bool differs = false;
  for (int64_t i = 0; i < 7; ++i) differs |= ds.flipped(i, epoch) != ds.flipped(i, epoch + 1);
  REQUIRE(differs);
  // Shard 1 of 2: positions 1, 3, 5 of the epoch, flattened.
  data::DataLoader half(ds, {.batch_size = 8, .seed = 11, .flatten = true, .shard = 1, .num_shards = 2});
  half.start_epoch(epoch);
  data::Batch b;
  REQUIRE(half.next(b));
  CHECK(b.x.shape() == Shape{3, 3 * s * s});
  const data::Batch odd = ds.get_batch(std::vector<int64_t>{perm[1], perm[3], perm[5]}, epoch);
  CHECK(test::bit_equal(b.x, odd.x.reshape({3, 3 * s * s})));
  // A file that does not decode: its name reaches next(), from the prefetch thread.
  std::ofstream(dir.path / "bees/zz_broken.png") << "not a png";
  data::ImageFolder with_broken(dir.path.string(), {.image_size = s});
  data::DataLoader l(with_broken, {.batch_size = 8, .shuffle = false});
  l.start_epoch(0);
  CHECK_THROWS_WITH_AS(l.next(b), doctest::Contains("zz_broken.png"), Error);
}
