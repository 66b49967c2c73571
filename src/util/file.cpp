// Note [opening regular files] and Note [atomic write] (util/file.h).
#include "util/file.h"

#include <minigrad/util/file.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <filesystem>

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

std::string errno_text(int err) { return std::strerror(err); }

// Writes all of [data, data + n) to fd; returns 0 or the errno of the failure.
int write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const size_t chunk = std::min<size_t>(n, size_t{1} << 30);
    const ssize_t w = ::write(fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

std::string dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Removes what earlier writers left behind in `dir` when they were killed mid-write: temporaries
// "<prefix><anything>.tmp.<pid>.<n>" whose process is gone. A live process's are left alone
// (another writer may be at work; at worst a reused pid keeps a stale file a while longer).
// Returns how many were removed.
int remove_stale_temporaries(const std::string& dir, const std::string& prefix) {
  namespace fs = std::filesystem;
  int removed = 0;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    const size_t tmp = f.rfind(".tmp.");
    if (tmp == std::string::npos || tmp == 0) continue;
    if (!prefix.empty() && (tmp != prefix.size() || f.compare(0, tmp, prefix) != 0)) continue;  // "<prefix>.tmp.*"
    const std::string rest = f.substr(tmp + 5);
    const size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string::npos) continue;
    if (rest.find_first_not_of("0123456789.") != std::string::npos) continue;
    long pid = 0;
    const auto [end, perr] = std::from_chars(rest.data(), rest.data() + dot, pid);
    if (perr != std::errc() || end != rest.data() + dot || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    if (!e.is_regular_file(ec)) continue;
    if (fs::remove(e.path(), ec)) ++removed;
  }
  return removed;
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

void write_atomic(const std::string& path, const std::function<int(const WriteBytes& write)>& emit) {
  MG_CHECK(!path.empty(), "write_atomic: empty path");
  remove_stale_temporaries(dir_of(path), std::filesystem::path(path).filename().string());
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    MG_FAIL("cannot write '" << path << "': creating temporary file '" << tmp
                             << "' failed: " << errno_text(err));
  }
  auto fail = [&](const char* what, int err) {
    ::close(fd);  // no-op effect if already closed: callers close only on the success path
    ::unlink(tmp.c_str());
    MG_FAIL("cannot write '" << path << "': " << what << " failed: " << errno_text(err)
                             << " (the previous file, if any, is unchanged)");
  };
  int err = emit([fd](const void* p, size_t n) { return write_all(fd, p, n); });
  if (err != 0) fail("writing", err);
  if (::fsync(fd) != 0) fail("fsync", errno);
  if (::close(fd) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    MG_FAIL("cannot write '" << path << "': close failed: " << errno_text(err)
                             << " (the previous file, if any, is unchanged)");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    MG_FAIL("cannot write '" << path << "': renaming '" << tmp << "' over it failed: "
                             << errno_text(err) << " (the previous file, if any, is unchanged)");
  }
  const std::string dir = dir_of(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    // Some file systems refuse fsync on a directory (EINVAL); the data itself is on disk then.
    const int rc = ::fsync(dfd);
    err = errno;
    ::close(dfd);
    MG_CHECK(rc == 0 || err == EINVAL,
             "wrote '" << path << "' but fsync of its directory '" << dir << "' failed: " << errno_text(err));
  }
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  write_atomic(path, [&](const auto& write) { return write(bytes.data(), bytes.size()); });
}

int remove_stale_temporaries(const std::string& dir) { return remove_stale_temporaries(dir, ""); }

void check_writable(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  MG_CHECK(!path.empty(), what << ": empty path");
  const std::string dir = dir_of(path);  // where write_atomic will create its temporary
  std::error_code ec;
  MG_CHECK(fs::is_directory(dir, ec), what << " " << path << ": the folder " << dir << " does not exist");
  MG_CHECK(!fs::is_directory(path, ec), what << " " << path << ": is a folder, expected a file name");
  MG_CHECK(access(dir.c_str(), W_OK | X_OK) == 0,
           what << " " << path << ": cannot create files in " << dir << " (" << std::strerror(errno) << ")");
}

}  // namespace mg
