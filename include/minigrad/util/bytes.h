// Byte counts as people write and read them: a size from a flag or a plan spec, a size in a
// report.
//
//   size_t budget = mg::parse_bytes("1.5GiB");              // 1610612736
//   std::printf("%s\n", mg::format_bytes(budget).c_str());  // "1.50 GiB"
#pragma once

#include <cstddef>
#include <string>

namespace mg {

// "512MB", "1.5GiB", "100000", "64 KiB" -> bytes, rounded to the nearest byte. kB/MB/GB/TB (or
// k/m/g/t) are powers of 1000, KiB/MiB/GiB/TiB of 1024; case does not matter. Throws mg::Error
// on anything else and on sizes below one byte.
size_t parse_bytes(const std::string& text);

// Two decimals in the largest of KiB, MiB, GiB that fits ("12.30 MiB"); "512 B" below 1 KiB.
std::string format_bytes(size_t bytes);

}  // namespace mg
