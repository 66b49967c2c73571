// A doctest executable whose cases break their process on request, for tests/resume_tests.sh
// (scripts/run_resumable.sh): case 2 crashes under MG_FIXTURE_CRASH=1, and case 3 meets a
// "sticky CUDA error" under MG_FIXTURE_STICKY=1, after which every case in the process fails
// as a real CUDA context would make it; under MG_FIXTURE_TEARDOWN=1 the process crashes after its
// last case, outside any. Plain doctest, no libminigrad.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <csignal>
#include <cstdlib>
#include <stdexcept>

namespace {
bool poisoned = false;
bool asked(const char* name) { return std::getenv(name) != nullptr && std::getenv(name)[0] == '1'; }
struct Teardown {
  ~Teardown() {
    if (asked("MG_FIXTURE_TEARDOWN")) std::raise(SIGSEGV);
  }
} teardown;
void check_context() {
  if (poisoned) throw std::runtime_error("CUDA error: an illegal memory access was encountered (fixture)");
}
}  // namespace

TEST_CASE("fixture 1: passes") { CHECK(1 + 1 == 2); }

TEST_CASE("fixture 2: crashes when asked") {
  if (asked("MG_FIXTURE_CRASH")) std::raise(SIGSEGV);
  CHECK(true);
}

TEST_CASE("fixture 3: meets a sticky error when asked") {
  if (asked("MG_FIXTURE_STICKY")) poisoned = true;
  check_context();
}

TEST_CASE("fixture 4: fails only in a poisoned process") { check_context(); }

TEST_CASE("fixture 5, with a comma: fails only in a poisoned process") { check_context(); }
