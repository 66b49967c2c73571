// The CPU kernels' threads: a small pool of our own, not OpenMP.
//
//   mg::cpu::parallel_for(n, grain, [&](int64_t begin, int64_t end) { ... });
//   const int slots = mg::cpu::parallel_slots(pieces);      // per-thread scratch: slots of it
//   mg::cpu::parallel_pieces(pieces, [&](int64_t piece, int slot) { ... });
//
// Note [fixed pieces]
// ~~~~~~~~~~~~~~~~~~~
// Work is cut into pieces whose bounds depend on the tensors' shapes only, never on the number
// of threads; any thread may run any piece. A piece writes its own outputs, and where pieces'
// results must be added (a weight gradient over images), they are added after the parallel part
// in piece order. So the bits of every result are the same with any number of threads; what the
// thread count changes is only who computes which piece. tests/test_threads.cpp trains with 1,
// 2 and 3 threads and compares the weights bit for bit.
//
// Note [waiting under load]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A parallel part is over when its pieces are done, not when every thread has arrived: the caller
// runs pieces too, and a worker that was descheduled (the machine is busy with other processes)
// and wakes late finds nothing left and goes back to sleep, holding nobody up. The only wait left
// is for a piece a worker started and was then descheduled in. Waits spin, 50 us for a worker and
// 100 us for the caller (kWorkerSpin, kCallerSpin in parallel.cpp: parallel parts follow each
// other closely within a step), and then sleep in the kernel, so a
// waiting thread does not take the core from the one it waits for. On top of that, the pool
// watches how long the caller waits for started pieces: when that exceeds a quarter of the
// parallel time over a window of parts, other processes are taking our cores, and it uses one
// thread fewer for a while before trying again (Note [backing off] in core/backoff.h). OpenMP's
// barrier, by contrast, waits for every thread of the team, spinning: with two busy processes
// on a 2-core machine a step took far longer with 2 threads than with 1 (measured: BENCHMARKS.md,
// "Figures behind the design notes").
#pragma once

#include <algorithm>
#include <cstdint>

namespace mg::cpu {

namespace detail {
using PieceFn = void (*)(void* ctx, int64_t piece, int slot);
void run_pieces(int64_t pieces, PieceFn fn, void* ctx);
}  // namespace detail

// Threads a parallel part of `pieces` pieces may use: slots 0 .. parallel_slots(pieces) - 1.
// 1 inside a piece (nested parts run on the calling thread).
int parallel_slots(int64_t pieces);

// Runs body(piece, slot) for every piece in [0, pieces), each exactly once, on up to
// parallel_slots(pieces) threads; slot says which thread (for per-thread scratch). Returns when
// all are done; the first exception a piece threw is rethrown here (the remaining pieces are
// skipped).
template <class F> void parallel_pieces(int64_t pieces, F&& body) {
  if (pieces <= 0) return;
  if (pieces == 1) return body(int64_t{0}, 0);
  detail::run_pieces(
      pieces, [](void* ctx, int64_t piece, int slot) { (*static_cast<F*>(ctx))(piece, slot); }, &body);
}

namespace detail {
// A range small enough for one piece, run by a function of its own, as a piece is. Inlined into
// its caller, GCC 12 left the body's `omp simd` loop scalar ("latch block not empty"): the Adam
// and SGD updates of every parameter under the grain ran element by element.
template <class F> [[gnu::noinline]] void run_range(F& body, int64_t n) { body(int64_t{0}, n, 0); }
}  // namespace detail

// body(begin, end, slot) over [0, n) in pieces of `grain` elements (the last may be shorter);
// slot, as parallel_pieces gives it, is in [0, parallel_for_slots(n, grain)) (for scratch
// allocated before the part: Note [half scratch] in kernels/cpu/gemm.cpp).
int parallel_for_slots(int64_t n, int64_t grain);

template <class F> void parallel_for_slot(int64_t n, int64_t grain, F&& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (n <= grain) return detail::run_range(body, n);
  parallel_pieces((n + grain - 1) / grain, [&](int64_t piece, int slot) {
    const int64_t begin = piece * grain;
    body(begin, std::min(begin + grain, n), slot);
  });
}

// body(begin, end) over [0, n) in pieces of `grain` elements (the last may be shorter).
template <class F> void parallel_for(int64_t n, int64_t grain, F&& body) {
  parallel_for_slot(n, grain, [&](int64_t begin, int64_t end, int) { body(begin, end); });
}

}  // namespace mg::cpu
