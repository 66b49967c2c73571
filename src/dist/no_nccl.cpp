// mg::dist without NCCL (a CPU build, or NCCL not found): CUDA tensors cannot be reduced.
#include <minigrad/core/error.h>

#include "core/tape.h"
#include "dist/backend.h"

namespace mg::dist::detail {

bool nccl_built() { return false; }

void nccl_all_reduce(const std::vector<Tensor>& tensors, int, int size, double) {
  MG_FAIL("mg::dist::all_reduce: " << tensors.size() << " CUDA tensors over " << size
          << " ranks, but this build has no NCCL. ---> HINT: build with the CUDA backend and NCCL "
             "(MINIGRAD_NCCL=ON), or train data-parallel on the CPU");
}

void nccl_all_reduce_start(const std::vector<Tensor>& tensors, int rank, int size, double timeout_s) {
  nccl_all_reduce(tensors, rank, size, timeout_s);
}

void nccl_all_reduce_wait(double) {}

void nccl_broadcast(const std::vector<Tensor>& tensors, int, int, int size, double) {
  MG_FAIL("mg::dist::broadcast: " << tensors.size() << " CUDA tensors over " << size
          << " ranks, but this build has no NCCL (MINIGRAD_NCCL=ON)");
}

void nccl_shutdown(bool, double) {}

// No CUDA collectives to time (Note [reduction timeline]).
void nccl_record_timeline(bool) {}
void nccl_timeline_mark(std::string_view) {}
std::vector<TimelineSpan> nccl_timeline() { return {}; }

}  // namespace mg::dist::detail

namespace mg {
// The hooks of core/tape.h: no timeline without NCCL.
size_t timeline_span_begin(std::string, const char*, void*) { return 0; }
void timeline_span_end(size_t, void*) {}
}  // namespace mg
