// Gradient mode, and how a loss reduces its batch.
//
//   {
//     mg::NoGradGuard no_grad;          // evaluation: nothing is recorded on the tape
//     mg::Tensor logits = model.forward(x);
//   }
//   loss.backward();                     // backward is a method of mg::Tensor (minigrad/core/tensor.h)
//
// The tape itself (its nodes and the backward engine) is internal: src/core/tape.h.
#pragma once

#include <cstdint>
#include <functional>

namespace mg {

class Tensor;

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

// Note [gradient-ready hooks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// While a GradReadyHook is alive on a thread, the outermost backward on that thread calls it once
// for every leaf that requires grad and that the backward reaches, right after the last
// contribution of that backward was added into the leaf's grad(): from then on this backward
// changes it no more. A leaf used several times (a tied weight) is reported after its last use,
// a parameter used inside a checkpoint segment after the segment's replay and backward (every
// tile). Leaves are reported in the order backward finishes them, the last layer's first. The
// data-parallel Accumulator starts a gradient bucket's reduction from it while backward goes on
// (Note [overlapped reduction], minigrad/optim/accumulate.h).
//
//   mg::GradReadyHook hook([&](const mg::Tensor& p) { ready.push_back(p); });
//   loss.backward();
class GradReadyHook {
 public:
  using Fn = std::function<void(const Tensor& leaf)>;
  explicit GradReadyHook(Fn fn);
  ~GradReadyHook();
  GradReadyHook(const GradReadyHook&) = delete;
  GradReadyHook& operator=(const GradReadyHook&) = delete;
  static const Fn* current();  // this thread's innermost hook, or null

 private:
  Fn fn_;
  const Fn* previous_;
};

// How a loss combines the per-sample losses of its batch. The tape records it, so that gradient
// accumulation can refuse a mean-reduced loss (minigrad/optim/accumulate.h).
enum class Reduction : uint8_t { mean, sum };

}  // namespace mg
