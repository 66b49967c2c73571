// Opening input files that may be hostile (private to the library).
//
//   mg::ReadOnlyFile f = mg::open_regular_file(path, "safetensors file '" + path + "'");
//   // f.fd: a blocking descriptor of a regular file; f.size: its size in bytes
//
// Note [opening regular files]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A FIFO opened for reading blocks until a writer appears, and a
// device may never end, so a reader given one hangs. The file is opened with O_NONBLOCK (which
// returns at once for a FIFO) and checked with fstat on the descriptor itself (checking the
// path first and opening it after is a race); only then is O_NONBLOCK cleared.
#pragma once

#include <cstdint>
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

}  // namespace mg
