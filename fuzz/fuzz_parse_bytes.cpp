// The byte-size parser (minigrad/util/bytes.h): parse_bytes on any text, format_bytes on what
// it returns. A plain decimal integer must come back as itself (to double precision, as the
// parser works in doubles). Seeds: make_corpus.cpp (parse_bytes/); dictionary: dicts/parse_bytes.dict.
#include <cctype>
#include <cmath>
#include <cstdlib>

#include <minigrad/util/bytes.h>

#include "fuzz_common.h"

namespace {

// The digits of a text that is only digits (with blanks around), else "".
std::string plain_integer(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n\v\f\r"), e = s.find_last_not_of(" \t\n\v\f\r");
  if (b == std::string::npos) return "";
  const std::string t = s.substr(b, e - b + 1);
  for (unsigned char ch : t) {
    if (!std::isdigit(ch)) return "";
  }
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  size_t bytes = 0;
  if (mg::fuzz::expect_mg_error([&] { bytes = mg::parse_bytes(text); })) return 0;
  MG_FUZZ_CHECK(bytes >= 1, "'" + text + "' parsed to 0 bytes");
  MG_FUZZ_CHECK(!mg::format_bytes(bytes).empty(), "format_bytes gave nothing");
  if (const std::string digits = plain_integer(text); !digits.empty()) {
    const double want = std::strtod(digits.c_str(), nullptr);
    const double got = static_cast<double>(bytes);
    MG_FUZZ_CHECK(std::abs(got - want) <= want * 0x1p-52,
                  "'" + text + "' parsed to " + std::to_string(bytes) + ", expected about " + digits);
  }
  return 0;
}
