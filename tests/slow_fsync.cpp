// An LD_PRELOAD shim for tests/kill_during_save.sh: fsync() sleeps MG_SLOW_FSYNC_MS milliseconds
// (default 40) before doing its work, so that a save spans long enough for a kill -9 at a random
// moment to land inside it, as it would with a large model on a slow disk.
#include <dlfcn.h>

#include <cstdlib>
#include <ctime>

extern "C" int fsync(int fd) {
  using Fn = int (*)(int);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "fsync"));
  const char* env = std::getenv("MG_SLOW_FSYNC_MS");
  const long ms = env ? std::strtol(env, nullptr, 10) : 40;
  const timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, nullptr);
  return real(fd);
}
