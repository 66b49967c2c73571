// Byte counts as people write and read them (<minigrad/util/bytes.h>).
#include <minigrad/util/bytes.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <regex>

#include <minigrad/core/error.h>

namespace mg {

size_t parse_bytes(const std::string& text) {
  static const std::regex re(R"(^\s*([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$)");
  std::smatch m;
  MG_CHECK(std::regex_match(text, m, re),
           "size: expected a number with an optional unit (B, kB, MB, GB, KiB, MiB, GiB), e.g. "
           "512MB or 1.5GiB; got '" << text << "'");
  std::string unit = m[3].str();
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char ch) { return std::tolower(ch); });
  double mult = 0;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kb") mult = 1e3;
  else if (unit == "m" || unit == "mb") mult = 1e6;
  else if (unit == "g" || unit == "gb") mult = 1e9;
  else if (unit == "t" || unit == "tb") mult = 1e12;
  else if (unit == "kib") mult = 1024.0;
  else if (unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  MG_CHECK(mult > 0, "size: unknown unit '" << m[3].str() << "' in '" << text
                                            << "' (use B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  // strtod, not stod: 400 digits are HUGE_VAL and "too large" here, not std::out_of_range. And
  // std::round, not llround: a long long ends at 9.2e18, and 1.6e19 came back as 2^63.
  const double v = std::strtod(m[1].str().c_str(), nullptr) * mult;
  MG_CHECK(v >= 1 && v < 1.8e19, "size: '" << text << "' is " << (v < 1 ? "below one byte" : "too large"));
  return static_cast<size_t>(std::round(v));
}

std::string format_bytes(size_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (size_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1 << 30));
  else if (bytes >= (size_t{1} << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1 << 20));
  else if (bytes >= 1024) std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024);
  else std::snprintf(buf, sizeof buf, "%zu B", bytes);
  return buf;
}

}  // namespace mg
