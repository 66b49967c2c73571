// Errors. Every failure the library can see is thrown as mg::Error; the library never exits or
// aborts, so the user's program decides what to do.
//
//   MG_CHECK(x.dim() == 2, "linear: input must be 2-D, got shape " << mg::shape_str(x.shape()));
//
// One family of check macros, generated from MG_CHECK_GEN: MG_CHECK here, MG_CUDA_CHECK,
// MG_CUBLAS_CHECK and MG_CUDNN_CHECK in src/kernels/cuda/cuda_check.h. Each message carries the
// failed expression, the file and line, and (for library calls) the library's own error string.
#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>

namespace mg {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// An allocation the device could not serve: the device is full, or the cap set with
// mg::set_memory_limit (minigrad/core/memory.h) would be passed. A training loop can catch it,
// release the step's graph and try again with less.
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(const std::string& what, size_t requested) : Error(what), requested_(requested) {}
  size_t requested() const { return requested_; }  // bytes of the allocation that failed

 private:
  size_t requested_;
};

namespace detail {
[[noreturn]] void throw_error(const char* expr, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace mg

// MG_CHECK_GEN(ok, expr_text, message-stream): throws mg::Error when `ok` is false.
#define MG_CHECK_GEN(ok, expr_text, msg)                                   \
  do {                                                                     \
    if (!(ok)) {                                                           \
      std::ostringstream mg_check_os_;                                     \
      mg_check_os_ << msg;                                                 \
      ::mg::detail::throw_error(expr_text, __FILE__, __LINE__, mg_check_os_.str()); \
    }                                                                      \
  } while (0)

#define MG_CHECK(cond, msg) MG_CHECK_GEN((cond), #cond, msg)
// An argument error where no expression is worth printing.
#define MG_FAIL(msg) MG_CHECK_GEN(false, nullptr, msg)
