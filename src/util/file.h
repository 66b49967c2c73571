// Opening input files that may be hostile, and writing output files atomically (private to the
// library; the public part, write_file_atomic and the rest, is <minigrad/util/file.h>).
//
//   mg::ReadOnlyFile f = mg::open_regular_file(path, "safetensors file '" + path + "'");
//   // f.fd: a blocking descriptor of a regular file; f.size: its size in bytes
//   mg::write_atomic(path, [&](const auto& write) { return write(bytes.data(), bytes.size()); });
//
// Note [opening regular files]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A FIFO opened for reading blocks until a writer appears, and a
// device may never end, so a reader given one hangs. The file is opened with O_NONBLOCK (which
// returns at once for a FIFO) and checked with fstat on the descriptor itself (checking the
// path first and opening it after is a race); only then is O_NONBLOCK cleared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace mg {

// Owns the descriptor: closed when the object goes.
struct ReadOnlyFile {
  int fd = -1;
  uint64_t size = 0;
  ReadOnlyFile() = default;
  ReadOnlyFile(ReadOnlyFile&& o) noexcept : fd(o.fd), size(o.size) { o.fd = -1; }
  ReadOnlyFile& operator=(ReadOnlyFile&&) = delete;
  ~ReadOnlyFile();
};

// Opens `path` read-only. Throws mg::Error starting with `what` when it cannot be opened
// ("<what>: cannot open: No such file or directory") or is not a regular file
// ("<what>: not a regular file (a FIFO)").
ReadOnlyFile open_regular_file(const std::string& path, const std::string& what);

// Reads up to n bytes; fewer only at the end of the file. Throws mg::Error naming `what` on a
// read error.
size_t read_up_to(const ReadOnlyFile& f, void* dst, size_t n, const std::string& what);

// Note [atomic write]
// ~~~~~~~~~~~~~~~~~~~
// The bytes go to a uniquely named temporary file in the target's own directory (rename is
// atomic only within one file system), which is fsync'ed before it is renamed over the target;
// then the directory is fsync'ed so that the rename itself is durable. A crash at any point
// leaves the old file or the new one (and a temporary, which the next write of the same path
// removes once its process is gone). On any failure the temporary file is
// removed and mg::Error names the path and the system's reason.
//
// write_atomic's `emit(write)` produces the content by calling write(ptr, n) any number of
// times; write returns an errno value (0 on success) and emit stops at the first failure.
using WriteBytes = std::function<int(const void* data, size_t n)>;
void write_atomic(const std::string& path, const std::function<int(const WriteBytes& write)>& emit);

}  // namespace mg
