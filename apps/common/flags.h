// What the apps share about their command lines: flag values checked where CLI11's own checks
// let bad ones through, and errors that name the flag whose value they are about.
//
//   app.add_option("--lr", lr)->check(finite_in(0, FLT_MAX, "[0, 3.4e38]"));   // refuses nan, inf
//   app.add_option("--seed", seed)->check(unsigned64());                       // refuses -1
//   app.add_option("--json", path)->check(nonempty());                         // refuses ""
//   auto ds = for_flag("--data", [&] { return mg::data::load_mnist_auto(dir); });
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <limits>
#include <string>
#include <system_error>

#include <minigrad/core/error.h>

// Runs f; an error it throws is about the value of `flag`, and the message says which flag.
template <typename F>
auto for_flag(const char* flag, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    throw mg::Error(std::string(flag) + ": " + e.what());
  }
}

// A float flag: a finite number in [lo, hi]. CLI::Range lets NaN through (every comparison with
// it is false), and a float flag would take 1e39 as infinity.
inline CLI::Validator finite_in(double lo, double hi, const std::string& range) {
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        const bool ok = !s.empty() && end == s.c_str() + s.size() && std::isfinite(v) && v >= lo && v <= hi &&
                        std::abs(v) <= std::numeric_limits<float>::max();
        return ok ? std::string() : "Value " + s + " is not a finite number in " + range;
      },
      "FLOAT in " + range);
}

// A flag whose value names something (a file, a folder, a device): "" would otherwise read as
// "not given" and be ignored.
inline CLI::Validator nonempty() {
  return CLI::Validator([](std::string& s) { return s.empty() ? std::string("an empty value names nothing") : std::string(); },
                        "");
}

// An unsigned 64-bit flag, digits only: CLI11 reads "-1", and any number past 2^64, as 2^64 - 1
// without a word.
inline CLI::Validator unsigned64() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        const bool ok = !s.empty() && ec == std::errc() && end == s.data() + s.size();
        return ok ? std::string() : "Value " + s + " is not an integer in [0, 2^64)";
      },
      "UINT64");
}
