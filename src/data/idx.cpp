#include <minigrad/data/idx.h>

#include <zlib.h>

#include <memory>

#include <minigrad/core/error.h>

namespace mg::data {

namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzPtr = std::unique_ptr<gzFile_s, GzCloser>;

// Reads up to n bytes; returns how many came (fewer only at the end of the data).
size_t read_some(gzFile f, const std::string& path, uint8_t* dst, size_t n) {
  size_t got = 0;
  while (got < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30));
    const int r = gzread(f, dst + got, chunk);
    if (r < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      MG_FAIL(path << ": read error (" << (msg ? msg : "unknown") << "); is the gzip file damaged?");
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

IdxArray read_idx(const std::string& path, int expected_ndims) {
  GzPtr f(gzopen(path.c_str(), "rb"));
  MG_CHECK(f != nullptr, path << ": cannot open (does the file exist and is it readable?)");
  uint8_t magic[4];
  const size_t got_magic = read_some(f.get(), path, magic, 4);
  MG_CHECK(got_magic == 4, path << ": truncated: " << got_magic << " bytes, an IDX header needs at least 4");
  MG_CHECK(magic[0] == 0 && magic[1] == 0 && magic[2] == 0x08,
           path << ": wrong magic number 0x" << std::hex << be32(magic) << std::dec
                << ": expected 0x000008NN (unsigned-byte IDX); not an IDX file, or not MNIST data");
  const int ndims = magic[3];
  MG_CHECK(ndims == expected_ndims, path << ": wrong number of dimensions: the file has " << ndims
                                         << ", expected " << expected_ndims
                                         << (expected_ndims == 1 ? " (labels)" : " (images N x rows x cols)"));
  std::vector<uint8_t> hdr(4 * static_cast<size_t>(ndims));
  const size_t got_hdr = read_some(f.get(), path, hdr.data(), hdr.size());
  MG_CHECK(got_hdr == hdr.size(), path << ": truncated header: " << got_hdr << " of " << hdr.size()
                                       << " bytes of dimension sizes");
  IdxArray a;
  size_t total = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint32_t n = be32(&hdr[4 * d]);
    MG_CHECK(n > 0 && n < (1u << 28), path << ": dimension " << d << " has size " << n
                                            << ", expected 1 .. 2^28");
    a.dims.push_back(n);
    total *= n;
    MG_CHECK(total <= (size_t{1} << 34), path << ": data would be larger than 16 GiB; not MNIST-like data");
  }
  a.bytes.resize(total);
  const size_t got = read_some(f.get(), path, a.bytes.data(), total);
  MG_CHECK(got == total, path << ": truncated: " << got << " data bytes, the header promises " << total);
  uint8_t extra;
  MG_CHECK(read_some(f.get(), path, &extra, 1) == 0,
           path << ": trailing bytes after the " << total << " data bytes the header promises");
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

}  // namespace mg::data
