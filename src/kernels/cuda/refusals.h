// A fast path that may decline a case while its caller falls back (cuDNN's fused attention and
// fused convolution graphs): how many cases it declined, and why the last. Plain C++, thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

namespace mg::cuda {

class Refusals {
 public:
  // Counts a refusal and keeps its reason; returns false, for `return refusals.refuse(...)`.
  bool refuse(std::string why) {
    ++count_;
    std::lock_guard<std::mutex> lock(mu_);
    last_ = std::move(why);
    return false;
  }
  int64_t count() const { return count_.load(); }
  std::string last() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

 private:
  std::atomic<int64_t> count_{0};
  mutable std::mutex mu_;
  std::string last_;
};

}  // namespace mg::cuda
