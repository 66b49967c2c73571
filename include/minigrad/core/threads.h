// How many threads the CPU kernels use.
//
//   mg::set_num_threads(1);   // every CPU kernel runs on the calling thread alone
//   int t = mg::num_threads();
//
// The default is the OMP_NUM_THREADS environment variable when it is set (the variable other
// libraries read, so one setting covers them), otherwise MG_NUM_THREADS, otherwise the cores this
// process may run on. The count changes speed only, never results: every CPU kernel splits its
// work into pieces fixed by the tensors' shapes and adds partial results in a fixed order, so a
// run gives the same bits with any number of threads (Note [fixed pieces] in src/core/parallel.h;
// tests/test_threads.cpp checks 1, 2 and 3).
#pragma once

namespace mg {

// At least 1; a count above the cores available is allowed (and slower). Throws mg::Error on
// n < 1. Takes effect at the next kernel; not to be called while another thread runs kernels.
void set_num_threads(int n);
int num_threads();

}  // namespace mg
