// Errors and devices: the little of core that is neither tensor nor tape.
#include <string_view>

#include <minigrad/core/device.h>
#include <minigrad/core/error.h>

#include "core/tape.h"

namespace mg {

namespace detail {

// The path of a library source relative to the repository (MG_SOURCE_ROOT is the repository
// root, with its trailing slash): an error names "src/ops/linear.cpp", not the build machine's
// absolute path. Files outside the tree (a user's, an installed header) keep their path.
static std::string_view source_relative(const char* file) {
  std::string_view f(file), root(MG_SOURCE_ROOT);
  if (f.substr(0, root.size()) == root) f.remove_prefix(root.size());
  return f;
}

void throw_error(const char* expr, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << msg;
  if (expr != nullptr) os << "\n  (check failed: " << expr << " at " << source_relative(file) << ":" << line << ")";
  throw Error(os.str());
}
}  // namespace detail

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    try {
      size_t used = 0;
      int idx = std::stoi(s.substr(5), &used);
      if (used == s.size() - 5 && idx >= 0) return cuda(idx);
    } catch (const std::exception&) {
    }
  }
  MG_FAIL("unknown device '" << s << "': expected cpu, cuda or cuda:N");
}

void synchronize(Device d) {
  if (d.is_cuda()) synchronize_cuda(d.index);
}

}  // namespace mg
