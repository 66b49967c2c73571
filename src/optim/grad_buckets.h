// Gradient buckets whose reductions start during backward (Note [overlapped reduction] in
// minigrad/optim/accumulate.h).
#pragma once

#include <cstddef>
#include <functional>
#include <unordered_map>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::optim {

// The parameters cut into buckets of about `bucket_bytes`, last parameter first (backward's
// order), each bucket consecutive parameters. During a backward, ready(p) marks p's gradient
// final (a GradReadyHook's report); a bucket is launched once all its parameters are, and only
// after every bucket before it: every rank launches the same reductions in the same order,
// whatever order its backward finishes them in.
class GradBuckets {
 public:
  using Launch = std::function<void(size_t bucket)>;
  GradBuckets(const std::vector<Tensor>& params, size_t bucket_bytes);
  size_t size() const { return buckets_.size(); }
  // Indices into the parameter list, last parameter first.
  const std::vector<size_t>& bucket(size_t i) const { return buckets_[i]; }
  // A new backward: every bucket waits for its parameters again.
  void reset();
  // p's gradient is final: launches every bucket that can go now, in order. A tensor that is not
  // one of the parameters, or a parameter reported twice, is ignored.
  void ready(const Tensor& p, const Launch& launch);
  // Launches the buckets not launched yet, in order (parameters backward did not reach).
  void launch_rest(const Launch& launch);
  size_t launched() const { return next_; }

 private:
  void launch_ready(const Launch& launch);
  std::vector<std::vector<size_t>> buckets_;
  std::unordered_map<const TensorImpl*, size_t> param_index_;
  std::vector<size_t> bucket_of_;       // per parameter
  std::vector<size_t> waiting_;         // per bucket: parameters not reported yet
  std::vector<bool> reported_;          // per parameter
  size_t next_ = 0;                     // the first bucket not launched
};

}  // namespace mg::optim
