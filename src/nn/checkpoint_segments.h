// What the runner, the cost model and the joint planner share: the one check of a plan's layer
// ranges (against a Sequential or a measured chain, so both reject a bad plan with the same
// words), and the input a chain is measured on when only its shape is given.
#pragma once

#include <cstddef>
#include <vector>

#include <minigrad/core/error.h>
#include <minigrad/core/rng.h>
#include <minigrad/core/tensor.h>
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

// Uniform(-1, 1) values from a fixed generator, on the device of seq's parameters: the input of
// measure_chain(seq, shape) and of profile_chain(seq, sample_shape, ...).
inline Tensor probe_input(const Sequential& seq, const Shape& shape) {
  Device dev = Device::cpu();
  if (const std::vector<Tensor> params = seq.parameters(); !params.empty()) dev = params[0].device();
  Generator g(0x1234);
  return Tensor::uniform(shape, -1.0f, 1.0f, g, TensorOptions{DType::f32, dev});
}

}  // namespace mg::nn
