// The IDX reader (minigrad/data/idx.h): read_idx on any bytes, as labels (1-D) and as images
// (3-D); what it accepts is written back with write_idx and must read the same.
// Built twice (fuzz/CMakeLists.txt): fuzz_idx writes the input as "input.idx" and starts from raw
// seeds, fuzz_idx_gz as "input.idx.gz" from gzip seeds. The reader itself goes by the content
// (gzip's magic bytes), so what differs is the corpus: the raw target works on the header and
// the data, the gzip one on damaged compressed streams (bad deflate blocks, CRC and length
// trailers, concatenated members, trailing bytes: Note [gzip members] in src/data/idx.cpp).
// Seeds: make_corpus.cpp (idx/, idx_gz/).
#include <minigrad/data/idx.h>

#include "fuzz_common.h"

#ifndef MG_FUZZ_IDX_NAME
#error "define MG_FUZZ_IDX_NAME: the input's file name, input.idx or input.idx.gz"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mg::fuzz::write_input(MG_FUZZ_IDX_NAME, data, size);
  for (int ndims : {1, 3}) {
    mg::data::IdxArray a;
    if (mg::fuzz::expect_mg_error([&] { a = mg::data::read_idx(path, ndims); })) continue;
    MG_FUZZ_CHECK(a.dims.size() == static_cast<size_t>(ndims), "read_idx returned the wrong number of dimensions");
    size_t total = 1;
    for (int64_t d : a.dims) total *= static_cast<size_t>(d);
    MG_FUZZ_CHECK(a.bytes.size() == total, "read_idx returned a data size that is not the product of its dimensions");
    const std::string copy = mg::fuzz::scratch_dir() + "/copy_" MG_FUZZ_IDX_NAME;
    mg::data::write_idx(copy, a.dims, a.bytes.data());
    const mg::data::IdxArray b = mg::data::read_idx(copy, ndims);
    MG_FUZZ_CHECK(a.dims == b.dims && a.bytes == b.bytes, "an IDX array changed in a write/read round trip");
  }
  return 0;
}
