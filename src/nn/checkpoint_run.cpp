// Running a checkpoint plan over a Sequential: PyTorch's checkpoint_sequential and any list of
// checkpointed layer ranges. Choosing the ranges is checkpoint_solver.cpp's job.
#include <minigrad/nn/checkpoint_plan.h>

#include <minigrad/core/checkpoint.h>

#include "core/tape.h"
#include "nn/checkpoint_segments.h"

namespace mg::nn {

Tensor forward_with_plan(Sequential& seq, const std::vector<Segment>& segments, const Tensor& x) {
  check_segments(segments, seq.size(), "forward_with_plan");
  // Layer by layer, so that each activation is dropped as soon as the next layer has run (a
  // forward_range(h, ...) call would hold h until the whole range is done).
  Tensor h = x;
  size_t pos = 0;
  // Note [offload schedule]: the end of each unit of the cost model (a view layer such as Flatten
  // belongs to the layer after it) releases what an offloaded segment before it copied out.
  auto run_plain = [&](size_t end) {
    for (; pos < end; ++pos) {
      h = seq[pos].forward(h);
      if (dynamic_cast<Flatten*>(&seq[pos]) == nullptr) offload_unit_end();
    }
  };
  for (const Segment& g : segments) {
    run_plain(g.begin);
    h = mg::checkpoint([&seq, g](const std::vector<Tensor>& in) { return seq.forward_range(in[0], g.begin, g.end); },
                       {h}, {.tile_rows = g.tile_rows, .offload = g.offload});
    offload_unit_end();
    pos = g.end;
  }
  run_plain(seq.size());
  if (h.grad_fn()) offload_chain_end(h.grad_fn());  // the first fetch waits for backward to get here
  return h;
}

std::vector<Segment> pytorch_segments(size_t num_layers, int64_t segments) {
  MG_CHECK(segments >= 1, "checkpoint_sequential: segments must be >= 1, got " << segments);
  MG_CHECK(static_cast<size_t>(segments) <= num_layers,
           "checkpoint_sequential: " << segments << " segments for " << num_layers << " layers");
  // torch/utils/checkpoint.py (1.13): segment_size = len // segments; the first segments - 1
  // chunks are checkpointed, the last chunk ("has to be non-volatile") runs normally.
  const size_t size = num_layers / static_cast<size_t>(segments);
  std::vector<Segment> out;
  for (size_t start = 0; start < size * static_cast<size_t>(segments - 1); start += size) {
    out.push_back({start, start + size});
  }
  return out;
}

Tensor checkpoint_sequential(Sequential& seq, int64_t segments, const Tensor& x) {
  return forward_with_plan(seq, pytorch_segments(seq.size(), segments), x);
}

}  // namespace mg::nn
