#include <minigrad/data/image_folder.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/rng.h>

// JPEG through libjpeg-turbo, PNG through stb_image (Note [image decoders]).
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE
#include <jpeglib.h>
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#include <stb/stb_image.h>

namespace mg::data {

namespace fs = std::filesystem;

namespace {

// 2^28 pixels (16384 x 16384): far beyond any training image, and 768 MiB decoded as RGB.
constexpr int64_t kMaxPixels = int64_t{1} << 28;
constexpr uintmax_t kMaxFileBytes = uintmax_t{1} << 30;

bool is_image(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

}  // namespace

ImageFolder::ImageFolder(const std::string& root, ImageFolderOptions opts) : opts_(opts) {
  MG_CHECK(opts.image_size >= 1, "ImageFolder: image_size must be >= 1, got " << opts.image_size);
  MG_CHECK(opts.max_pixels >= 1 && opts.max_pixels <= kMaxPixels,
           "ImageFolder: max_pixels must be in [1, " << kMaxPixels << "], got " << opts.max_pixels);
  std::error_code ec;
  MG_CHECK(fs::is_directory(root, ec), "ImageFolder: '" << root << "' is not a directory");
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) classes_.push_back(entry.path().filename().string());
  }
  std::sort(classes_.begin(), classes_.end());
  MG_CHECK(!classes_.empty(), "ImageFolder: '" << root
                                               << "' has no class sub-folders (expected root/<class>/<image>.jpg)");
  for (size_t c = 0; c < classes_.size(); ++c) {
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(fs::path(root) / classes_[c])) {
      if (entry.is_regular_file() && is_image(entry.path())) found.push_back(entry.path().string());
    }
    std::sort(found.begin(), found.end());
    for (auto& f : found) {
      files_.push_back(std::move(f));
      labels_.push_back(static_cast<int64_t>(c));
    }
  }
  MG_CHECK(!files_.empty(), "ImageFolder: no .jpg, .jpeg or .png files in the class folders of '" << root << "'");
}

bool ImageFolder::flipped(int64_t i, uint64_t epoch) const {
  if (!opts_.random_flip) return false;
  return (philox_u32(opts_.seed ^ 0x9E3779B97F4A7C15ull, (epoch << 32) + static_cast<uint64_t>(i)) & 1u) != 0;
}

void resize_rgb_bilinear(const uint8_t* src, int h, int w, int out, float* dst) {
  const float sy = static_cast<float>(h) / out, sx = static_cast<float>(w) / out;
  const size_t plane = static_cast<size_t>(out) * out;
  for (int oy = 0; oy < out; ++oy) {
    const float fy = std::max((oy + 0.5f) * sy - 0.5f, 0.0f);
    const int y0 = std::min(static_cast<int>(fy), h - 1), y1 = std::min(y0 + 1, h - 1);
    const float wy = fy - y0;
    for (int ox = 0; ox < out; ++ox) {
      const float fx = std::max((ox + 0.5f) * sx - 0.5f, 0.0f);
      const int x0 = std::min(static_cast<int>(fx), w - 1), x1 = std::min(x0 + 1, w - 1);
      const float wx = fx - x0;
      for (int c = 0; c < 3; ++c) {
        auto at = [&](int y, int x) { return static_cast<float>(src[(static_cast<size_t>(y) * w + x) * 3 + c]); };
        const float top = at(y0, x0) + (at(y0, x1) - at(y0, x0)) * wx;
        const float bot = at(y1, x0) + (at(y1, x1) - at(y1, x0)) * wx;
        dst[c * plane + static_cast<size_t>(oy) * out + ox] = (top + (bot - top) * wy) / 255.0f;
      }
    }
  }
}

namespace {

// The whole file, from a regular file only (a FIFO would block; a device would never end).
std::string read_image_file(const std::string& file) {
  std::error_code ec;
  const auto st = std::filesystem::status(file, ec);
  MG_CHECK(!ec && std::filesystem::is_regular_file(st),
           "ImageFolder: '" << file << "' is not a regular file" << (ec ? " (" + ec.message() + ")" : std::string()));
  const uintmax_t size = std::filesystem::file_size(file, ec);
  MG_CHECK(!ec && size <= kMaxFileBytes, "ImageFolder: '" << file << "' is " << size << " bytes, more than the limit of "
                                                          << kMaxFileBytes);
  std::ifstream in(file, std::ios::binary);
  MG_CHECK(in.good(), "ImageFolder: cannot open '" << file << "'");
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  MG_CHECK(static_cast<uintmax_t>(in.gcount()) == size, "ImageFolder: '" << file << "': read " << in.gcount() << " of " << size << " bytes");
  return bytes;
}

// Note [image decoders]
// ~~~~~~~~~~~~~~~~~~~~~~~
// JPEG files are decoded by libjpeg-turbo (Debian's libjpeg-dev), PNG files by stb_image (2.27,
// Debian's libstb-dev, compiled in here). Debian 12's stb_image JPEG decoder had two findings
// under fuzz/fuzz_image.cpp: a Huffman table of more than 256 codes made it write past its arrays,
// and entropy-coded data that does not match its tables made it shift by 32 bits or more
// (undefined behaviour). libjpeg-turbo refuses both, is fuzzed continuously by OSS-Fuzz, and is
// what PIL and torchvision decode JPEG with. Its warnings (corrupt data it would decode past, a
// premature end of the file) are errors here: a training set should not silently hold grey
// blocks. stb_image's PNG decoder is guarded by the chunk walk below.
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegError*>(c->err);
  c->err->format_message(c, e->message);
  std::longjmp(e->jump, 1);
}

void jpeg_message(j_common_ptr c, int level) {
  if (level < 0) jpeg_fail(c);  // a warning; trace messages (level >= 0) are ignored
}

enum class JpegStage { header, too_large, data, done };

struct JpegResult {
  JpegStage stage = JpegStage::header;  // where it stopped
  int width = 0, height = 0;
  char message[JMSG_LENGTH_MAX] = {};  // libjpeg's, when it failed
};

// Decodes a JPEG to 8-bit RGB in `rgb`, refusing more than max_pixels before decoding. No
// object with a destructor lives in this frame: libjpeg's errors longjmp back to setjmp here.
void decode_jpeg(const uint8_t* data, size_t size, int64_t max_pixels, std::vector<uint8_t>& rgb, JpegResult& r) {
  jpeg_decompress_struct cinfo;
  std::memset(&cinfo, 0, sizeof cinfo);
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.mgr.emit_message = jpeg_message;
  if (setjmp(err.jump)) {
    std::memcpy(r.message, err.message, sizeof r.message);
    jpeg_destroy_decompress(&cinfo);
    return;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  r.width = static_cast<int>(cinfo.image_width);
  r.height = static_cast<int>(cinfo.image_height);
  if (static_cast<int64_t>(r.width) * r.height > max_pixels) {
    r.stage = JpegStage::too_large;
    jpeg_destroy_decompress(&cinfo);
    return;
  }
  r.stage = JpegStage::data;
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  rgb.resize(static_cast<size_t>(r.width) * static_cast<size_t>(r.height) * 3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = rgb.data() + static_cast<size_t>(cinfo.output_scanline) * static_cast<size_t>(r.width) * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  r.stage = JpegStage::done;
}

// Note [PNG chunk walk]
// ~~~~~~~~~~~~~~~~~~~~~~~
// What is wrong with a PNG's chunk list, as "chunk IDAT declares 2147483520 bytes, 40 are left",
// or "" when every chunk fits in the file up to a complete IEND chunk (what follows IEND is
// ignored, as PIL does). Checked before stb_image sees the file, for two of its habits:
// - it grows its buffer to a chunk's declared length before it reads the chunk, so a 100-byte
//   file declaring an IDAT of 2 GiB had it allocate 2 GiB (found by fuzz/fuzz_image.cpp);
// - it stops at IEND's header and never reads its CRC, so a PNG cut by up to 4 bytes decoded
//   as whole.
std::string png_chunk_problem(const uint8_t* p, size_t n) {
  static const uint8_t kIend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xAE, 0x42, 0x60, 0x82};
  for (size_t at = 8; n - at >= 8;) {  // after the signature; a chunk is length, type, data, CRC
    const size_t len = (size_t{p[at]} << 24) | (size_t{p[at + 1]} << 16) | (size_t{p[at + 2]} << 8) | p[at + 3];
    std::string type(reinterpret_cast<const char*>(p + at + 4), 4);
    for (char& c : type) c = std::isalpha(static_cast<unsigned char>(c)) ? c : '?';
    if (type == "IEND") {
      return n - at >= 12 && std::memcmp(p + at, kIend, 12) == 0 ? "" : "its IEND chunk is cut short or altered";
    }
    const size_t left = n - at - 8;
    if (len > left) return "chunk " + type + " declares " + std::to_string(len) + " bytes, " + std::to_string(left) + " are left";
    if (left - len < 4) return "chunk " + type + " is cut inside its CRC";
    at += 12 + len;
  }
  return "its chunks do not reach an IEND chunk";
}

// stb_image's reason for a failure, in parentheses, or nothing when it gave none.
std::string stb_reason() {
  const char* r = stbi_failure_reason();
  return r && *r ? std::string(" (") + r + ")" : std::string();
}

}  // namespace

void ImageFolder::load(int64_t i, bool flip, float* dst) const {
  const std::string& file = path(i);
  const std::string bytes = read_image_file(file);
  // The format is named from the file's own signature, whatever the decoder says.
  const auto* data = reinterpret_cast<const stbi_uc*>(bytes.data());
  const int len = static_cast<int>(bytes.size());
  const bool jpeg = bytes.size() >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
  const bool png = bytes.size() >= 8 && std::memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0;
  MG_CHECK(jpeg || png, "ImageFolder: '" << file << "' is neither a JPEG nor a PNG file (its first bytes are not "
                                             "either signature; empty or another format?)");
  int w = 0, h = 0;
  std::vector<uint8_t> jpeg_rgb;
  std::unique_ptr<stbi_uc, void (*)(void*)> png_rgb(nullptr, stbi_image_free);
  if (jpeg) {
    JpegResult r;
    decode_jpeg(data, bytes.size(), opts_.max_pixels, jpeg_rgb, r);
    MG_CHECK(r.stage != JpegStage::header,
             "ImageFolder: cannot decode '" << file << "': corrupt or truncated JPEG header (libjpeg: " << r.message << ")");
    MG_CHECK(r.stage != JpegStage::too_large, "ImageFolder: '" << file << "' declares " << r.width << "x" << r.height
                                                                << " pixels, more than the limit of " << opts_.max_pixels);
    MG_CHECK(r.stage == JpegStage::done,
             "ImageFolder: cannot decode '" << file << "': corrupt or truncated JPEG (libjpeg: " << r.message << ")");
    w = r.width;
    h = r.height;
  } else {
    int channels = 0;
    MG_CHECK(stbi_info_from_memory(data, len, &w, &h, &channels) == 1,
             "ImageFolder: cannot decode '" << file << "': corrupt PNG header" << stb_reason());
    MG_CHECK(static_cast<int64_t>(w) * h <= opts_.max_pixels,
             "ImageFolder: '" << file << "' declares " << w << "x" << h << " pixels, more than the limit of "
                              << opts_.max_pixels);
    const std::string chunk = png_chunk_problem(data, bytes.size());
    MG_CHECK(chunk.empty(), "ImageFolder: cannot decode '" << file << "': corrupt or truncated PNG (" << chunk << "; "
                                                           << bytes.size() << " bytes)");
    png_rgb.reset(stbi_load_from_memory(data, len, &w, &h, &channels, 3));
    MG_CHECK(png_rgb != nullptr, "ImageFolder: cannot decode '" << file << "': corrupt or truncated PNG" << stb_reason());
  }
  const uint8_t* pixels = jpeg ? jpeg_rgb.data() : png_rgb.get();
  const int s = static_cast<int>(opts_.image_size);
  resize_rgb_bilinear(pixels, h, w, s, dst);
  const size_t plane = static_cast<size_t>(s) * s;
  for (int c = 0; c < 3; ++c) {
    float* p = dst + c * plane;
    for (size_t k = 0; k < plane; ++k) p[k] = (p[k] - kImageNetMean[c]) / kImageNetStd[c];
    if (flip) {
      for (int y = 0; y < s; ++y) std::reverse(p + static_cast<size_t>(y) * s, p + static_cast<size_t>(y + 1) * s);
    }
  }
}

void ImageFolder::read(std::span<const int64_t> indices, int64_t epoch, std::span<float> x,
                       std::span<int64_t> y) const {
  const size_t numel = static_cast<size_t>(3 * opts_.image_size * opts_.image_size);
  for (size_t k = 0; k < indices.size(); ++k) {
    const int64_t i = indices[k];
    load(i, flipped(i, static_cast<uint64_t>(epoch)), x.data() + k * numel);
    y[k] = label(i);
  }
}

}  // namespace mg::data
