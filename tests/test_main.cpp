// The main of every doctest executable. A test file may answer options of its own before doctest
// runs (test_ops --list) by defining mg::test::own_options: it returns the exit code when it
// handled the command line, or -1 to let doctest run the cases.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

namespace mg::test {
__attribute__((weak)) int own_options(int, char**) { return -1; }
}  // namespace mg::test

int main(int argc, char** argv) {
  const int handled = mg::test::own_options(argc, argv);
  if (handled >= 0) return handled;
  doctest::Context context(argc, argv);
  return context.run();
}
