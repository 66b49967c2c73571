// The token file reader (minigrad/data/tokens.h): load_token_file on any bytes; what it accepts is
// written back with save_token_file and must read the same, and TokenBatches over it must give
// windows whose targets are the inputs shifted by one. Seeds: make_corpus.cpp (tokens/).
#include <minigrad/data/tokens.h>

#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mg::fuzz::write_input("input.bin", data, size);
  mg::data::TokenFile f;
  if (mg::fuzz::expect_mg_error([&] { f = mg::data::load_token_file(path); })) return 0;
  MG_FUZZ_CHECK(size == 1024 + 2 * f.tokens.size(), "load_token_file accepted a file whose size is not the header's count");
  const std::string copy = mg::fuzz::scratch_dir() + "/copy.bin";
  mg::data::save_token_file(copy, f.tokens);
  MG_FUZZ_CHECK(mg::data::load_token_file(copy).tokens == f.tokens, "tokens changed in a write/read round trip");
  if (f.tokens.size() >= 7) {
    mg::data::TokenBatches b(f.tokens, 2, 3);
    const mg::data::TokenBatch w = b.next();
    const std::vector<int64_t> x = w.x.to_vector<int64_t>(), y = w.y.to_vector<int64_t>();
    for (size_t i = 0; i + 1 < x.size(); ++i) MG_FUZZ_CHECK(y[i] == x[i + 1], "a window's targets are not its inputs shifted by one");
  }
  return 0;
}
