// The one check of a plan's layer ranges, shared by the runner (against a Sequential) and the
// cost model (against a measured chain), so both reject a bad plan with the same words.
#pragma once

#include <cstddef>
#include <vector>

#include <minigrad/core/error.h>
#include <minigrad/nn/checkpoint_plan.h>

namespace mg::nn {

inline void check_segments(const std::vector<Segment>& segments, size_t num_layers, const char* who) {
  size_t prev_end = 0;
  for (const Segment& g : segments) {
    MG_CHECK(g.begin < g.end && g.end <= num_layers && g.begin >= prev_end,
             who << ": segments must be non-empty, increasing, disjoint layer ranges within [0, "
                 << num_layers << "); got [" << g.begin << ", " << g.end << ") after one ending at "
                 << prev_end);
    prev_end = g.end;
  }
}

}  // namespace mg::nn
