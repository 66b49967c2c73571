// Gradient mode, and how a loss reduces its batch.
//
//   {
//     mg::NoGradGuard no_grad;          // evaluation: nothing is recorded on the tape
//     Tensor logits = model.forward(x);
//   }
//   loss.backward();                     // backward is a method of Tensor (minigrad/core/tensor.h)
//
// The tape itself (its nodes and the backward engine) is internal: src/core/tape.h.
#pragma once

#include <cstdint>

namespace mg {

// Gradient mode: ops record nothing while a NoGradGuard is alive (per thread).
class GradMode {
 public:
  static bool enabled();
  static void set_enabled(bool on);
};

class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// How a loss combines the per-sample losses of its batch. The tape records it, so that gradient
// accumulation can refuse a mean-reduced loss (minigrad/optim/accumulate.h).
enum class Reduction : uint8_t { mean, sum };

}  // namespace mg
