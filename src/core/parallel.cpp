// The CPU thread pool behind mg::cpu::parallel_pieces (Notes [fixed pieces] and [waiting under
// load] in parallel.h).
//
// One parallel part runs at a time. The caller publishes it in `next`, one 64-bit word:
//   bits 40..63: the next piece to hand out, 16..39: the number of pieces, 0..15: the slots that
//   may take part. A thread claims a piece by a compare-and-swap that raises the first field, and
//   only then reads the part's function (the swap's acquire pairs with the caller's release of the
//   word, so the fields it reads are this part's; and this part cannot end, and the next one
//   overwrite them, before the claimed piece is done). A worker that wakes after the part ended
//   fails to claim, whatever part it thought it saw, and goes back to waiting.
#include "core/parallel.h"
#include "core/backoff.h"

#include <minigrad/core/error.h>
#include <minigrad/core/threads.h>

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MG_CPU_RELAX() _mm_pause()
#else
#define MG_CPU_RELAX() ((void)0)
#endif

namespace mg {

namespace {

using clock = std::chrono::steady_clock;

// The default thread count (threads.h): OMP_NUM_THREADS, MG_NUM_THREADS, the usable cores.
int default_threads() {
  for (const char* var : {"OMP_NUM_THREADS", "MG_NUM_THREADS"}) {
    const char* s = std::getenv(var);
    if (s == nullptr || *s == '\0') continue;
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);  // "4" or OpenMP's list form "4,2": the first level
    if (end != s && v >= 1 && v <= 4096) return static_cast<int>(v);
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(CPU_COUNT(&set), 1);
  return static_cast<int>(std::max(std::thread::hardware_concurrency(), 1u));
}

std::atomic<int> g_threads{0};  // 0: not yet read from the environment

// How long a waiting thread spins before it sleeps (Note [waiting under load]).
constexpr auto kWorkerSpin = std::chrono::microseconds(50);
constexpr auto kCallerSpin = std::chrono::microseconds(100);

// Spins until ready() or `spin` has passed; false when it gave up.
template <class Ready> bool spin_until(Ready ready, clock::duration spin) {
  const clock::time_point until = clock::now() + spin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      MG_CPU_RELAX();
    }
    if (clock::now() >= until) return false;
  }
}

constexpr uint64_t kFieldMask = (uint64_t{1} << 24) - 1;
constexpr uint64_t encode(uint64_t index, uint64_t pieces, uint64_t slots) {
  return index << 40 | pieces << 16 | slots;
}

thread_local bool t_in_piece = false;

// CPU time of the calling thread.
int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

class Pool {
 public:
  // Runs a part; false when this thread cannot dispatch one now (another thread's part is
  // running), and the caller runs it alone.
  bool run(int64_t pieces, cpu::detail::PieceFn fn, void* ctx) {
    std::unique_lock<std::mutex> lock(dispatch_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    const clock::time_point start = clock::now();
    const int slots = static_cast<int>(std::min<int64_t>(backoff_.threads(num_threads(), start), pieces));
    if (slots <= 1) return false;
    ensure_workers(slots - 1);

    fn_ = fn;
    ctx_ = ctx;
    error_ = nullptr;
    longest_cpu_ns_.store(0, std::memory_order_relaxed);
    failed_.store(false, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    next_.store(encode(0, static_cast<uint64_t>(pieces), static_cast<uint64_t>(slots)), std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();

    const int64_t mine = work(0);
    const clock::time_point out = clock::now();
    const auto all_done = [&] { return done_.load(std::memory_order_acquire) == static_cast<uint32_t>(pieces); };
    if (!spin_until(all_done, kCallerSpin)) {
      for (uint32_t d; (d = done_.load(std::memory_order_acquire)) != static_cast<uint32_t>(pieces);) done_.wait(d);
    }
    const clock::time_point end = clock::now();
    // The stall (Note [backing off]): waiting beyond two of the caller's own pieces and beyond
    // the longest worker piece's CPU time, so that a last piece that simply runs longer than the
    // caller's (a part of two unequal pieces) is not one.
    const clock::duration own = mine > 0 ? (out - start) / mine : clock::duration{};
    const clock::duration longest = std::chrono::nanoseconds(longest_cpu_ns_.load(std::memory_order_acquire));
    backoff_.record(slots, end - start, std::max<clock::duration>(end - out - std::max(2 * own, longest), {}), end);
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  // Claims and runs pieces until none is left for `slot`; returns how many it ran.
  int64_t work(int slot) {
    int64_t ran = 0;
    uint64_t v = next_.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t index = v >> 40, pieces = (v >> 16) & kFieldMask, slots = v & 0xffff;
      if (index >= pieces || static_cast<uint64_t>(slot) >= slots) return ran;
      if (!next_.compare_exchange_weak(v, v + (uint64_t{1} << 40), std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        continue;
      }
      if (!failed_.load(std::memory_order_relaxed)) {
        t_in_piece = true;
        const int64_t c0 = slot != 0 ? thread_cpu_ns() : 0;  // a worker's piece: its CPU time
        try {
          fn_(ctx_, static_cast<int64_t>(index), slot);
        } catch (...) {
          std::lock_guard<std::mutex> g(error_mu_);
          if (!error_) error_ = std::current_exception();
          failed_.store(true, std::memory_order_relaxed);
        }
        if (slot != 0) {
          const int64_t cpu = thread_cpu_ns() - c0;
          int64_t seen = longest_cpu_ns_.load(std::memory_order_relaxed);
          while (cpu > seen && !longest_cpu_ns_.compare_exchange_weak(seen, cpu, std::memory_order_relaxed)) {
          }
        }
        t_in_piece = false;
      }
      ++ran;
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(pieces)) done_.notify_all();
      v = next_.load(std::memory_order_acquire);
    }
  }

  void worker_loop(int slot) {
    uint32_t seen = generation_.load(std::memory_order_acquire);
    for (;;) {
      const auto moved = [&] { return generation_.load(std::memory_order_acquire) != seen; };
      if (!spin_until(moved, kWorkerSpin)) generation_.wait(seen, std::memory_order_acquire);
      seen = generation_.load(std::memory_order_acquire);
      work(slot);
    }
  }

  // Workers live as long as the process (they sleep when idle); a forked child starts its own.
  void ensure_workers(int n) {
    const pid_t pid = getpid();
    if (pid != pid_) {  // the parent's threads do not exist in a forked child: forget them
      workers_.clear();
      pid_ = pid;
    }
    while (static_cast<int>(workers_.size()) < n) {
      const int slot = static_cast<int>(workers_.size()) + 1;
      auto* t = new std::thread([this, slot] { worker_loop(slot); });
      t->detach();
      workers_.push_back(t);
    }
  }

  std::mutex dispatch_;
  std::vector<std::thread*> workers_;
  pid_t pid_ = 0;
  std::atomic<uint32_t> generation_{0};
  std::atomic<uint64_t> next_{0};
  std::atomic<uint32_t> done_{0};
  std::atomic<bool> failed_{false};
  std::atomic<int64_t> longest_cpu_ns_{0};  // this part's longest worker piece, in its thread's CPU time
  cpu::detail::PieceFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::mutex error_mu_;
  std::exception_ptr error_;
  cpu::detail::Backoff backoff_;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: workers may still be asleep in it at exit
  return *p;
}

}  // namespace

void set_num_threads(int n) {
  MG_CHECK(n >= 1 && n <= 4096, "set_num_threads: expected a count in [1, 4096], got " << n);
  g_threads.store(n, std::memory_order_relaxed);
}

int num_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n == 0) {
    n = default_threads();
    g_threads.store(n, std::memory_order_relaxed);
  }
  return n;
}

namespace cpu {

int parallel_slots(int64_t pieces) {
  if (t_in_piece || pieces <= 1) return 1;
  return static_cast<int>(std::min<int64_t>(num_threads(), pieces));
}

int parallel_for_slots(int64_t n, int64_t grain) {
  grain = std::max<int64_t>(grain, 1);
  return n <= grain ? 1 : parallel_slots((n + grain - 1) / grain);
}

void detail::run_pieces(int64_t pieces, PieceFn fn, void* ctx) {
  MG_CHECK(pieces < static_cast<int64_t>(kFieldMask), "parallel part of " << pieces << " pieces, at most "
                                                                          << kFieldMask << " supported");
  if (!t_in_piece && pool().run(pieces, fn, ctx)) return;
  // Alone: inside a piece (nested), one thread, or another thread's part is running.
  const bool outer = !t_in_piece;
  t_in_piece = true;
  try {
    for (int64_t p = 0; p < pieces; ++p) fn(ctx, p, 0);
  } catch (...) {
    if (outer) t_in_piece = false;
    throw;
  }
  if (outer) t_in_piece = false;
}

}  // namespace cpu

}  // namespace mg
