#include "optim/grad_buckets.h"

namespace mg::optim {

GradBuckets::GradBuckets(const std::vector<Tensor>& params, size_t bucket_bytes) {
  bucket_of_.resize(params.size());
  size_t bytes = 0;
  for (size_t k = params.size(); k-- > 0;) {
    if (buckets_.empty() || (bytes > 0 && bytes + params[k].nbytes() > bucket_bytes)) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().push_back(k);
    bytes += params[k].nbytes();
    bucket_of_[k] = buckets_.size() - 1;
    param_index_[params[k].impl_ptr().get()] = k;
  }
  reset();
}

void GradBuckets::reset() {
  waiting_.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) waiting_[b] = buckets_[b].size();
  reported_.assign(bucket_of_.size(), false);
  next_ = 0;
}

void GradBuckets::ready(const Tensor& p, const Launch& launch) {
  auto it = param_index_.find(p.impl_ptr().get());
  if (it == param_index_.end() || reported_[it->second]) return;
  reported_[it->second] = true;
  --waiting_[bucket_of_[it->second]];
  launch_ready(launch);
}

void GradBuckets::launch_ready(const Launch& launch) {
  while (next_ < buckets_.size() && waiting_[next_] == 0) launch(next_++);
}

void GradBuckets::launch_rest(const Launch& launch) {
  while (next_ < buckets_.size()) launch(next_++);
}

}  // namespace mg::optim
