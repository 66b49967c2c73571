// The main of every doctest executable. A test file may answer options of its own before doctest
// runs (test_ops --list) by defining mg::test::own_options: it returns the exit code when it
// handled the command line, or -1 to let doctest run the cases.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

namespace mg::test {
__attribute__((weak)) int own_options(int, char**) { return -1; }
}  // namespace mg::test

int main(int argc, char** argv) {
  // A line at a time into a file too: a crash then loses at most a line, and a log that another
  // process writes into (compute-sanitizer) keeps the order of events (scripts/run_resumable.sh
  // counts the cases that ended before the one that broke).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int handled = mg::test::own_options(argc, argv);
  if (handled >= 0) return handled;
  doctest::Context context(argc, argv);
  return context.run();
}
