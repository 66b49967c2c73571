// IDX files (the MNIST / FashionMNIST container, http://yann.lecun.com/exdb/mnist/): a 4-byte
// big-endian magic {0, 0, type, ndims}, ndims big-endian uint32 sizes, then the row-major data.
// Only type 0x08 (unsigned byte) is used by these data sets and only it is accepted. Files may be
// gzip-compressed or raw: zlib's gzread reads both.
//
//   mg::data::IdxArray img = mg::data::read_idx(dir + "/t10k-images-idx3-ubyte.gz", 3);
//   // img.dims == {10000, 28, 28}, img.bytes.size() == 7840000
//
// Every problem (missing file, wrong magic, wrong number of dimensions, truncated data, trailing
// bytes) throws mg::Error naming the file and what was expected.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mg::data {

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

}  // namespace mg::data
