#include <minigrad/data/idx.h>

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>

#include <minigrad/core/error.h>
#include <minigrad/core/rng.h>

#include "util/file.h"

namespace mg::data {

namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzPtr = std::unique_ptr<gzFile_s, GzCloser>;

// deflate's largest expansion: a 258-byte match coded in 2 bits (RFC 1951; zlib's FAQ says
// 1032:1). A gzip file of n bytes cannot hold more than 1032 * n bytes of data.
constexpr uint64_t kMaxDeflateRatio = 1032;

// Note [gzip members]
// ~~~~~~~~~~~~~~~~~~~
// A gzip file (RFC 1952) is one or more members, one after another, and
// reads as their data concatenated: gzip(1) and Python's gzip module both read it so, and so
// does this reader. Like Python's (gzip.py, _GzipReader._read_eof) it also skips zero bytes
// after a member, the padding some tape and block tools leave. Anything else after a member is
// an error naming its byte offset: zlib's gzread ignored such trailing garbage silently (gzip(1)
// warns "trailing garbage ignored", Python raises BadGzipFile), and a file with bytes appended
// or spliced in is not the file it claims to be. Raw (uncompressed) files are read as they are.
//
// An IDX file, raw or gzip-compressed, as one stream of bytes.
class IdxStream {
 public:
  explicit IdxStream(const std::string& path)
      : path_(path), file_(open_regular_file(path, path)), in_(size_t{1} << 16) {
    fill();
    gzip_ = avail_ >= 2 && next_[0] == 0x1f && next_[1] == 0x8b;
    if (gzip_) {
      MG_CHECK(inflateInit2(&zs_, 16 + MAX_WBITS) == Z_OK, path_ << ": zlib could not start (out of memory?)");
    }
  }
  ~IdxStream() {
    if (gzip_) inflateEnd(&zs_);
  }
  IdxStream(const IdxStream&) = delete;
  IdxStream& operator=(const IdxStream&) = delete;

  bool gzip() const { return gzip_; }
  uint64_t file_size() const { return file_.size; }

  // Reads up to n bytes of data; fewer only at its end.
  size_t read(uint8_t* dst, size_t n) { return gzip_ ? inflate_into(dst, n) : copy_into(dst, n); }

 private:
  // The file offset of the next byte not yet consumed.
  uint64_t offset() const { return file_pos_ - avail_; }

  // Moves what is left of the input to the front of the buffer and reads more after it; returns
  // false when the file has no more.
  bool fill() {
    if (avail_ > 0) std::memmove(in_.data(), next_, avail_);
    next_ = in_.data();
    const size_t r = read_up_to(file_, in_.data() + avail_, in_.size() - avail_, path_);
    avail_ += r;
    file_pos_ += r;
    return r > 0;
  }

  size_t copy_into(uint8_t* dst, size_t n) {
    size_t got = 0;
    while (got < n && (avail_ > 0 || fill())) {
      const size_t k = std::min(n - got, avail_);
      std::memcpy(dst + got, next_, k);
      next_ += k;
      avail_ -= k;
      got += k;
    }
    return got;
  }

  size_t inflate_into(uint8_t* dst, size_t n) {
    size_t got = 0;
    while (got < n && !ended_) {
      if (avail_ == 0) fill();
      zs_.next_in = next_;
      zs_.avail_in = static_cast<unsigned>(std::min<size_t>(avail_, 1u << 30));
      zs_.next_out = dst + got;
      zs_.avail_out = static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30));
      const unsigned in_before = zs_.avail_in, out_before = zs_.avail_out;
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      next_ += in_before - zs_.avail_in;
      avail_ -= in_before - zs_.avail_in;
      got += out_before - zs_.avail_out;
      MG_CHECK(rc == Z_OK || rc == Z_STREAM_END || rc == Z_BUF_ERROR,
               path_ << ": damaged gzip data near byte offset " << offset() << " ("
                     << (zs_.msg ? zs_.msg : "zlib error " + std::to_string(rc)) << ")");
      // No progress with room for output: the input ran out.
      MG_CHECK(rc != Z_BUF_ERROR || avail_ > 0, path_ << ": truncated gzip data: the file ends at byte "
                                                      << file_.size << " inside a compressed member");
      if (rc == Z_STREAM_END) after_member();
    }
    return got;
  }

  // Note [gzip members]: what may follow a member is another member, zero padding, or nothing.
  void after_member() {
    while ((avail_ > 0 || fill()) && next_[0] == 0) {
      ++next_;
      --avail_;
    }
    if (avail_ == 0) {
      ended_ = true;
      return;
    }
    if (avail_ < 2) fill();
    MG_CHECK(avail_ >= 2 && next_[0] == 0x1f && next_[1] == 0x8b,
             path_ << ": trailing bytes after the gzip data, at byte offset " << offset() << " of "
                   << file_.size << " (first byte 0x" << std::hex << int{next_[0]} << std::dec
                   << "): only another gzip member or zero padding may follow one; the file has "
                      "something appended or is damaged");
    MG_CHECK(inflateReset(&zs_) == Z_OK, path_ << ": zlib could not restart at byte offset " << offset());
  }

  std::string path_;
  ReadOnlyFile file_;
  std::vector<uint8_t> in_;
  uint8_t* next_ = nullptr;  // the unconsumed input: [next_, next_ + avail_)
  size_t avail_ = 0;
  uint64_t file_pos_ = 0;    // bytes of the file read into in_ so far
  bool gzip_ = false, ended_ = false;
  z_stream zs_{};
};

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s;
  for (int64_t d : dims) s += (s.empty() ? "" : " x ") + std::to_string(d);
  return s;
}

}  // namespace

IdxArray read_idx(const std::string& path, int expected_ndims) {
  IdxStream f(path);  // a regular file only (Note [opening regular files])
  uint8_t magic[4];
  const size_t got_magic = f.read(magic, 4);
  MG_CHECK(got_magic == 4, path << ": truncated: " << got_magic << " bytes, an IDX header needs at least 4");
  MG_CHECK(magic[0] == 0 && magic[1] == 0 && magic[2] == 0x08,
           path << ": wrong magic number 0x" << std::hex << be32(magic) << std::dec
                << ": expected 0x000008NN (unsigned-byte IDX); not an IDX file, or not MNIST data");
  const int ndims = magic[3];
  MG_CHECK(ndims == expected_ndims, path << ": wrong number of dimensions: the file has " << ndims
                                         << ", expected " << expected_ndims
                                         << (expected_ndims == 1 ? " (labels)" : " (images N x rows x cols)"));
  std::vector<uint8_t> hdr(4 * static_cast<size_t>(ndims));
  const size_t got_hdr = f.read(hdr.data(), hdr.size());
  MG_CHECK(got_hdr == hdr.size(), path << ": truncated header: " << got_hdr << " of " << hdr.size()
                                       << " bytes of dimension sizes");
  IdxArray a;
  uint64_t total = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint32_t n = be32(&hdr[4 * d]);
    MG_CHECK(n > 0 && n < (1u << 28), path << ": dimension " << d << " has size " << n
                                            << ", expected 1 .. 2^28");
    a.dims.push_back(n);
    total *= n;
    MG_CHECK(total <= (uint64_t{1} << 34), path << ": data would be larger than 16 GiB; not MNIST-like data");
  }
  // The header's promise is checked against what the file can hold before anything is
  // allocated: a 22-byte file, or a 1 kB gzip file, declaring gigabytes is refused here.
  const uint64_t header_bytes = 4 + hdr.size();
  if (f.gzip()) {
    const uint64_t limit = kMaxDeflateRatio * f.file_size();
    MG_CHECK(header_bytes + total <= limit,
             path << ": the dimension sizes " << dims_str(a.dims) << " declare " << total
                  << " data bytes, more than a " << f.file_size() << "-byte gzip file can hold (at most "
                  << limit << ": deflate expands at most " << kMaxDeflateRatio
                  << ":1); a damaged header or a gzip bomb");
  } else {
    MG_CHECK(header_bytes + total <= f.file_size(),
             path << ": truncated: " << f.file_size() - header_bytes << " data bytes, the header promises "
                  << total << " (" << dims_str(a.dims) << ")");
  }
  // Even so the buffer grows as data actually arrives: a gzip file may still end early.
  constexpr size_t kChunk = size_t{64} << 20;
  size_t got = 0;
  try {
    while (got < total) {
      const size_t want = std::min<uint64_t>(kChunk, total - got);
      a.bytes.resize(got + want);
      const size_t r = f.read(a.bytes.data() + got, want);
      got += r;
      if (r < want) break;
    }
  } catch (const std::bad_alloc&) {
    MG_FAIL(path << ": out of host memory after " << got << " of the " << total
                 << " data bytes the header promises");
  }
  a.bytes.resize(got);
  MG_CHECK(got == total, path << ": truncated: " << got << " data bytes, the header promises " << total << " ("
                              << dims_str(a.dims) << ")");
  uint8_t extra;
  MG_CHECK(f.read(&extra, 1) == 0, path << ": trailing bytes after the " << total
                                        << " data bytes the header promises (at byte offset "
                                        << header_bytes + total << (f.gzip() ? " of the decompressed data)" : ")"));
  return a;
}

void write_maybe_gz(const std::string& path, const std::string& bytes) {
  const bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  GzPtr f(gzopen(path.c_str(), gz ? "wb6" : "wbT"));  // T: transparent (raw) writing
  MG_CHECK(f != nullptr, path << ": cannot open for writing");
  size_t done = 0;
  while (done < bytes.size()) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(bytes.size() - done, 1u << 30));
    MG_CHECK(gzwrite(f.get(), bytes.data() + done, chunk) == static_cast<int>(chunk), path << ": write failed");
    done += chunk;
  }
  MG_CHECK(gzclose(f.release()) == Z_OK, path << ": close failed");
}

void write_idx(const std::string& path, const std::vector<int64_t>& dims, const uint8_t* bytes) {
  MG_CHECK(!dims.empty() && dims.size() < 256, "write_idx: " << dims.size() << " dimensions");
  std::string out = {0, 0, 0x08, static_cast<char>(dims.size())};
  size_t total = 1;
  for (int64_t d : dims) {
    MG_CHECK(d > 0, "write_idx: dimension sizes must be positive");
    const uint32_t n = static_cast<uint32_t>(d);
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>(n >> s));
    total *= static_cast<size_t>(d);
  }
  out.append(reinterpret_cast<const char*>(bytes), total);
  write_maybe_gz(path, out);
}

// ---- the data sets ------------------------------------------------------------------------------

IdxDataset::IdxDataset(std::vector<uint8_t> pixels, std::vector<int64_t> labels, int64_t rows, int64_t cols,
                       int64_t num_classes, Normalization norm, std::string name)
    : pixels_(std::move(pixels)),
      labels_(std::move(labels)),
      rows_(rows),
      cols_(cols),
      num_classes_(num_classes),
      norm_(norm),
      name_(std::move(name)) {
  MG_CHECK(rows > 0 && cols > 0, "IdxDataset: image size " << rows << "x" << cols);
  MG_CHECK(norm.std > 0.0f, "IdxDataset: normalisation std must be > 0, got " << norm.std);
  MG_CHECK(pixels_.size() == labels_.size() * static_cast<size_t>(rows * cols),
           "IdxDataset: " << pixels_.size() << " pixel bytes for " << labels_.size() << " images of "
                       << rows << "x" << cols);
  for (size_t i = 0; i < labels_.size(); ++i) {
    MG_CHECK(labels_[i] >= 0 && labels_[i] < num_classes,
             "IdxDataset: label " << i << " is " << labels_[i] << ", expected 0.." << num_classes - 1);
  }
}

void IdxDataset::normalized_image(int64_t i, float* dst) const {
  const int64_t f = features();
  const uint8_t* src = pixels_.data() + i * f;
  const float mean = norm_.mean, inv_std = 1.0f / norm_.std;
  for (int64_t k = 0; k < f; ++k) dst[k] = (static_cast<float>(src[k]) / 255.0f - mean) * inv_std;
}

void IdxDataset::read(std::span<const int64_t> indices, int64_t, std::span<float> x,
                      std::span<int64_t> y) const {
  const int64_t f = features();
  for (size_t k = 0; k < indices.size(); ++k) {
    normalized_image(indices[k], x.data() + k * f);
    y[k] = labels_[indices[k]];
  }
}

IdxDataset IdxDataset::slice(int64_t begin, int64_t end) const {
  MG_CHECK(0 <= begin && begin <= end && end <= size(),
           "IdxDataset::slice: [" << begin << ", " << end << ") of a data set of " << size());
  const int64_t f = features();
  std::vector<uint8_t> px(pixels_.begin() + begin * f, pixels_.begin() + end * f);
  std::vector<int64_t> lb(labels_.begin() + begin, labels_.begin() + end);
  return IdxDataset(std::move(px), std::move(lb), rows_, cols_, num_classes_, norm_, name_);
}

IdxDataset load_idx_pair(const std::string& images_path, const std::string& labels_path,
                         Normalization norm, const std::string& name) {
  IdxArray img = read_idx(images_path, 3);
  MG_CHECK(img.dims[1] == 28 && img.dims[2] == 28,
           images_path << ": wrong image size " << img.dims[1] << "x" << img.dims[2]
                       << ", expected 28x28 (MNIST / FashionMNIST)");
  IdxArray lab = read_idx(labels_path, 1);
  MG_CHECK(img.dims[0] == lab.dims[0], images_path << " has " << img.dims[0] << " images but "
                                                   << labels_path << " has " << lab.dims[0]
                                                   << " labels: image and label counts disagree");
  std::vector<int64_t> labels(lab.bytes.size());
  for (size_t i = 0; i < labels.size(); ++i) {
    MG_CHECK(lab.bytes[i] <= 9, labels_path << ": label " << i << " is " << int{lab.bytes[i]}
                                            << ", expected a class in 0..9");
    labels[i] = lab.bytes[i];
  }
  return IdxDataset(std::move(img.bytes), std::move(labels), 28, 28, 10, norm, name);
}

namespace {

// The file `base` or `base.gz` in dir; empty when neither exists.
std::string find_file(const std::string& dir, const std::string& base) {
  namespace fs = std::filesystem;
  for (const std::string& cand : {base + ".gz", base}) {
    const fs::path p = fs::path(dir) / cand;
    if (fs::exists(p)) return p.string();
  }
  return "";
}

std::string require_file(const std::string& dir, const std::string& base) {
  std::string p = find_file(dir, base);
  MG_CHECK(!p.empty(), dir << ": missing " << base << "[.gz] (expected the four standard MNIST file "
                           "names; scripts/get_data.sh says where to get them)");
  return p;
}

}  // namespace

Splits load_mnist(const std::string& dir, Normalization norm) {
  Splits s;
  s.train = load_idx_pair(require_file(dir, "train-images-idx3-ubyte"),
                          require_file(dir, "train-labels-idx1-ubyte"), norm, "train");
  s.test = load_idx_pair(require_file(dir, "t10k-images-idx3-ubyte"),
                         require_file(dir, "t10k-labels-idx1-ubyte"), norm, "test");
  s.description = dir + " (train " + std::to_string(s.train.size()) + ", test " +
                  std::to_string(s.test.size()) + ")";
  return s;
}

Splits load_mnist_test_split(const std::string& dir, int64_t n_train, Normalization norm) {
  IdxDataset all = load_idx_pair(require_file(dir, "t10k-images-idx3-ubyte"),
                                 require_file(dir, "t10k-labels-idx1-ubyte"), norm, "t10k");
  MG_CHECK(n_train > 0 && n_train < all.size(),
           dir << ": cannot split " << all.size() << " images into " << n_train << " to train and the rest held out");
  Splits s;
  s.train = all.slice(0, n_train);
  s.test = all.slice(n_train, all.size());
  s.description = dir + " test set split: first " + std::to_string(s.train.size()) + " train, last " +
                  std::to_string(s.test.size()) + " held out";
  return s;
}

Splits load_mnist_auto(const std::string& dir, Normalization norm) {
  MG_CHECK(std::filesystem::is_directory(dir), dir << ": not a folder");
  if (!find_file(dir, "train-images-idx3-ubyte").empty()) return load_mnist(dir, norm);
  if (!find_file(dir, "t10k-images-idx3-ubyte").empty()) return load_mnist_test_split(dir, 8000, norm);
  MG_FAIL(dir << ": no MNIST files (train-images-idx3-ubyte[.gz] ... or t10k-*); run scripts/get_data.sh");
}

namespace {

// Stroke prototypes: each class is 3 random line segments with a random thickness, drawn as a
// smooth intensity field in [0, 1].
struct Stroke {
  float x0, y0, x1, y1, width;
};

float seg_dist(float px, float py, const Stroke& s) {
  const float dx = s.x1 - s.x0, dy = s.y1 - s.y0;
  const float len2 = dx * dx + dy * dy;
  float t = len2 > 0 ? ((px - s.x0) * dx + (py - s.y0) * dy) / len2 : 0.0f;
  t = std::clamp(t, 0.0f, 1.0f);
  const float qx = s.x0 + t * dx - px, qy = s.y0 + t * dy - py;
  return std::sqrt(qx * qx + qy * qy);
}

}  // namespace

IdxDataset make_synthetic(int64_t n, uint64_t seed, Normalization norm) {
  MG_CHECK(n > 0, "make_synthetic: n must be > 0, got " << n);
  constexpr int kSide = 28, kClasses = 10, kStrokes = 3;
  // Class prototypes come from a stream of their own, so they are the same for every n.
  const uint64_t proto_key = seed * 0x9E3779B97F4A7C15ull + 0x5EED;
  uint64_t c = 0;
  auto proto_u = [&]() { return philox_uniform(proto_key, c++); };
  std::vector<std::vector<float>> protos(kClasses, std::vector<float>(kSide * kSide));
  for (int k = 0; k < kClasses; ++k) {
    Stroke st[kStrokes];
    for (Stroke& s : st) s = {5 + 18 * proto_u(), 5 + 18 * proto_u(), 5 + 18 * proto_u(),
                              5 + 18 * proto_u(), 1.0f + 1.2f * proto_u()};
    for (int y = 0; y < kSide; ++y)
      for (int x = 0; x < kSide; ++x) {
        float v = 0;
        for (const Stroke& s : st) v = std::max(v, std::clamp(1.5f - seg_dist(x, y, s) / s.width, 0.0f, 1.0f));
        protos[k][y * kSide + x] = v;
      }
  }
  std::vector<uint8_t> px(static_cast<size_t>(n) * kSide * kSide);
  std::vector<int64_t> labels(n);
  const uint64_t key = seed ^ 0xD1B54A32D192ED03ull;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t base = static_cast<uint64_t>(i) * 1024;  // 4 + 784 draws per sample fit
    auto u = [&](uint64_t j) { return philox_uniform(key, base + j); };
    const int k = static_cast<int>(philox_u32(key, base) % kClasses);
    const int sx = static_cast<int>(u(1) * 5) - 2, sy = static_cast<int>(u(2) * 5) - 2;
    const float ink = 0.6f + 0.4f * u(3);
    labels[i] = k;
    float noise[kSide * kSide];  // draws 4 .. 787, a Philox block per four
    philox_uniforms(key, base + 4, kSide * kSide, [&](int64_t j, float d) { noise[j] = d; });
    uint8_t* dst = px.data() + i * kSide * kSide;
    for (int y = 0; y < kSide; ++y)
      for (int x = 0; x < kSide; ++x) {
        const int ox = x - sx, oy = y - sy;
        float v = (ox >= 0 && ox < kSide && oy >= 0 && oy < kSide) ? protos[k][oy * kSide + ox] * ink : 0.0f;
        v += 0.35f * (noise[y * kSide + x] - 0.5f);
        dst[y * kSide + x] = static_cast<uint8_t>(std::lround(std::clamp(v, 0.0f, 1.0f) * 255.0f));
      }
  }
  return IdxDataset(std::move(px), std::move(labels), kSide, kSide, kClasses, norm, "synthetic");
}

}  // namespace mg::data
