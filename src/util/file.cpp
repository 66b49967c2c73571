// Note [opening regular files] (util/file.h).
#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <minigrad/core/error.h>

namespace mg {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

}  // namespace

ReadOnlyFile::~ReadOnlyFile() {
  if (fd >= 0) ::close(fd);
}

ReadOnlyFile open_regular_file(const std::string& path, const std::string& what) {
  ReadOnlyFile f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (f.fd < 0) {
    const int err = errno;
    MG_FAIL(what << ": cannot open: " << std::strerror(err));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    const int err = errno;
    MG_FAIL(what << ": cannot stat: " << std::strerror(err));
  }
  MG_CHECK(S_ISREG(st.st_mode), what << ": not a regular file (" << kind_of(st.st_mode) << ")");
  const int flags = ::fcntl(f.fd, F_GETFL);
  MG_CHECK(flags >= 0 && ::fcntl(f.fd, F_SETFL, flags & ~O_NONBLOCK) == 0,
           what << ": cannot clear O_NONBLOCK: " << std::strerror(errno));
  f.size = static_cast<uint64_t>(st.st_size);
  return f;
}

size_t read_up_to(const ReadOnlyFile& f, void* dst, size_t n, const std::string& what) {
  char* p = static_cast<char*>(dst);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(f.fd, p + got, std::min<size_t>(n - got, size_t{1} << 30));
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      MG_FAIL(what << ": read error: " << std::strerror(err));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

}  // namespace mg
