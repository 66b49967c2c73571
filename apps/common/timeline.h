// --timeline FILE, shared by vgg_ckpt and gpt_train: where each CUDA reduction ran against the
// backward that produced its gradients (Note [reduction timeline] in minigrad/dist/dist.h), and
// each copy of offloaded activations on the copy stream (Note [offload schedule]),
// written by rank 0 as a trace for chrome://tracing or ui.perfetto.dev; bench/timeline.py prints
// the overlap window by window.
//
//   check_timeline_flag(timeline_path, dev);   // before training: refuses what records nothing
//   mg::dist::record_timeline(true);
//   ... train ...
//   write_timeline(timeline_path);
#pragma once

#include <string>

#include <minigrad/core/error.h>
#include <minigrad/dist/dist.h>
#include <minigrad/util/file.h>

#include "common/ranks.h"

// `offload`: plans may offload on this device, whose copies the timeline shows too.
inline void check_timeline_flag(const std::string& path, mg::Device dev, bool offload = false) {
  if (path.empty()) return;
  MG_CHECK(dev.is_cuda(), "--timeline " << path << ": it records the reductions of CUDA tensors (NCCL), and the "
                          "device is " << dev.str() << ". ---> HINT: --device cuda");
  MG_CHECK(mg::dist::nccl_built(), "--timeline " << path << ": this build has no NCCL (MINIGRAD_NCCL=ON)");
  MG_CHECK(offload || mg::dist::active(), "--timeline " << path << ": a single process without a launcher reduces nothing. "
                               "---> HINT: start it under mpirun, or alone with MG_DIST_WORLD_OF_ONE=1 (NCCL over "
                               "one rank), or offload (--offload)");
  mg::check_writable(path, "--timeline");
}

inline void write_timeline(const std::string& path) {
  if (path.empty()) return;
  mg::dist::record_timeline(false);
  const std::vector<mg::dist::TimelineSpan> spans = mg::dist::timeline();
  if (!lead()) return;
  mg::write_file_atomic(path, mg::dist::timeline_trace_json(spans) + "\n");
  std::printf("timeline: %zu spans in %s (python3 bench/timeline.py %s)\n", spans.size(), path.c_str(), path.c_str());
}
