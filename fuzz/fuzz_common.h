// What the fuzz targets share (docs/fuzzing.md): a scratch folder of the process's own, the
// input written to a file there, the one rule for exceptions, and the fixed model the
// safetensors and training-state targets load into (make_corpus.cpp writes seeds for it).
//
//   extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
//     const std::string path = mg::fuzz::write_input("input.idx", data, size);
//     mg::fuzz::expect_mg_error([&] { mg::data::read_idx(path, 3); });
//     return 0;
//   }
//
// Note [fuzz target rule]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Bad input is expected to end in mg::Error, the library's one exception. Anything else is a
// finding: another exception escapes the target (std::terminate, which libFuzzer reports as a
// deadly signal with the exception's type), and so do a crash, a hang (-timeout), an
// out-of-memory (-rss_limit_mb, -malloc_limit_mb), an AddressSanitizer or UndefinedBehaviorSanitizer
// report, and a failed MG_FUZZ_CHECK (a property a target checks on input the library accepted,
// or an mg::Error that admits a bug, as the planner's "internal error").
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <minigrad/core/error.h>

// A property of input the library accepted; on failure, prints it and aborts (a finding).
#define MG_FUZZ_CHECK(cond, what)                                                            \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "MG_FUZZ_CHECK failed at %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond, \
                   std::string(what).c_str());                                               \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

namespace mg::fuzz {

// The model of the safetensors and training-state targets: make_mlp(kModelSizes), parameters
// 1.weight (3, 4), 1.bias (3), 3.weight (2, 3), 3.bias (2).
inline const std::vector<int64_t> kModelSizes = {4, 3, 2};

// $TMPDIR, else /dev/shm (no disk I/O), else /tmp; then mg_fuzz_<pid>, removed at exit (a
// crash leaves it behind; it is small).
inline const std::string& scratch_dir() {
  // Never destroyed: the exit handler that removes the folder runs after static destructors.
  static const std::string* dir = [] {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path base = "/tmp";
    if (const char* t = std::getenv("TMPDIR"); t != nullptr && *t != '\0') base = t;
    else if (fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0) base = "/dev/shm";
    auto* d = new std::string((base / ("mg_fuzz_" + std::to_string(::getpid()))).string());
    fs::create_directories(*d);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(scratch_dir(), ignored);
    });
    return d;
  }();
  return *dir;
}

// scratch_dir()/name, holding exactly `data`. The readers take paths, so this is how an input
// reaches them; the name's extension is part of what a reader sees.
inline std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  MG_FUZZ_CHECK(f != nullptr, "cannot create " + path);
  const bool ok = size == 0 || std::fwrite(data, 1, size, f) == size;
  MG_FUZZ_CHECK(std::fclose(f) == 0 && ok, "cannot write " + path);
  return path;
}

// Runs f; an mg::Error is the expected outcome for bad input (Note [fuzz target rule]), and
// whether one came is returned. Every other exception passes through.
template <class F>
bool expect_mg_error(F&& f) {
  try {
    f();
    return false;
  } catch (const mg::Error&) {
    return true;
  }
}

}  // namespace mg::fuzz
