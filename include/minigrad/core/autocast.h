// Mixed precision: a precision chosen once for a run, and the scope in which ops compute in it.
//
//   mg::Precision p = mg::parse_precision("bf16");   // fp32 | tf32 | bf16 | fp16
//   {
//     mg::AutocastGuard autocast(p);                 // forward (and backward) of a window
//     mg::Tensor loss = mg::cross_entropy(model.forward(x), y, mg::Reduction::sum);
//     loss.backward();                               // weight gradients land in the fp32 buffers
//   }
//   opt.step();                                      // updates the fp32 masters and their copies
//
// Note [autocast]
// ~~~~~~~~~~~~~~~~
// Parameters stay float32 (the masters) and the optimizer updates them; gradient buffers stay
// float32, so accumulation over micro-batches and the data-parallel reduction stay exact. While
// an AutocastGuard of bf16 or fp16 (the "low" dtype) is alive on a thread, every op looks up its
// row of the per-op table (OpDef::precision, src/ops/op.h):
//   - low (linear, matmul, conv2d, causal_self_attention): float32 inputs are rounded to the low
//     dtype first, parameters through a cache that makes one copy per optimizer step, shared by
//     the window's micro-batches (Optimizer::step refreshes the copies in place, the outermost
//     guard's end drops them; what it holds is autocast_cache_bytes(), and the planner counts it
//     in the fixed part from the start of a step); the output is low;
//   - fp32 (softmax, layer_norm, batch_norm, embedding): inputs as they come, the output low;
//   - follow (element-wise ops, pooling, dropout, views): the output is low when an input is;
//   - a loss (cross_entropy) returns float32.
// Every op computes in float32 whatever its dtypes: low-precision inputs are widened on load and
// outputs rounded to nearest even on store (src/ops/apply.cpp), so reductions, statistics and
// the loss are float32 sums over low-precision values. What backward needs is saved in the dtype
// it came in (low activations: half the bytes); output gradients flow in the dtype of the tensor
// they belong to (low for low activations), and a weight's gradient, computed from low
// activations and low output gradients in float32, is added into its float32 buffer. Recorded
// nodes remember the dtype they ran in, so a checkpoint's replay recomputes the same bits.
//
// tf32 is float32 storage with CUDA's TF32 tensor-core products (mg::cuda::set_tf32_*); on the CPU
// it computes as fp32. fp16 needs loss scaling (minigrad/optim/accumulate.h: a LossScaler).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <minigrad/core/dtype.h>

namespace mg {

class Tensor;

enum class Precision : uint8_t { fp32, tf32, bf16, fp16 };

Precision parse_precision(const std::string& s);  // "fp32", "tf32", "bf16", "fp16"; mg::Error otherwise
const char* precision_name(Precision p);
DType compute_dtype(Precision p);  // the low dtype of bf16 and fp16; f32 otherwise

class AutocastGuard {
 public:
  explicit AutocastGuard(Precision p) : AutocastGuard(compute_dtype(p)) {}
  explicit AutocastGuard(DType low);  // f32: autocast off inside the scope
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DType prev_;
};

DType autocast_dtype();  // this thread's low dtype; DType::f32 when autocast is off

// The low-precision copy of parameter w (a leaf that requires grad) for this optimizer step:
// made on first use, then the same tensor until clear_autocast_cache().
Tensor autocast_param(const Tensor& w, DType low);
void clear_autocast_cache();
// After an optimizer step: each copy takes its master's new values in place (the same bits as a
// fresh copy), so the copies are there from the start of the next window's forward, as the
// planner counts them (Note [autocast]); a copy something else holds (a graph kept with
// retain_graph) is dropped from the cache instead, and made again on next use.
void refresh_autocast_cache();
size_t autocast_cache_bytes();

}  // namespace mg
