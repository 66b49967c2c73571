// Items of a sequence made on a thread of their own ahead of the caller, handed out in order: the
// DataLoader's batches (minigrad/data/loader.h) and mg::Trainer's micro-batches (Note
// [prefetched micro-batches] in minigrad/train/trainer.h).
//
//   ReadAhead<std::vector<float>> ahead;
//   ahead.start(n, /*depth=*/2, [&](int64_t i) { return read(i); });   // read() on the thread
//   while (!ahead.done()) use(ahead.take());                           // in order, waiting when needed
//
// Note [reading ahead]
// ~~~~~~~~~~~~~~~~~~~~
// make(0), make(1), ..., make(n - 1) run in order on one thread, which waits while `depth`
// items are made and not taken (so depth + 1 exist at most: one more in its hands). An exception
// make(i) throws is kept and rethrown, the same exception, by the take() of item i, after the
// items before it were taken: the caller sees a read error where it would have read the item
// itself, whichever thread read it. The thread makes nothing after it. depth 0: no thread; take()
// makes the item. stop() (also start() and the destructor) ends the thread after the make() under
// way and drops what was not taken.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include <minigrad/core/error.h>

namespace mg::data {

template <class T>
class ReadAhead {
 public:
  ReadAhead() = default;
  ~ReadAhead() { stop(); }
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  void start(int64_t n, int depth, std::function<T(int64_t)> make) {
    MG_CHECK(n >= 0 && depth >= 0, "ReadAhead: n = " << n << ", depth = " << depth);
    stop();
    make_ = std::move(make);
    n_ = n;
    depth_ = depth;
    next_ = 0;
    if (depth_ > 0 && n_ > 0) thread_ = std::thread([this] { run(); });
  }

  bool done() const { return next_ >= n_; }
  // take() would not wait (with depth 0 it makes the item itself, on the caller's thread).
  bool ready() {
    if (depth_ == 0) return true;
    std::lock_guard<std::mutex> lock(mu_);
    return !queue_.empty() || error_ != nullptr;
  }
  // The next item, in order; rethrows its make()'s exception.
  T take() {
    MG_CHECK(next_ < n_, "ReadAhead::take: all " << n_ << " items were taken");
    if (depth_ == 0) return make_(next_++);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty() || error_ != nullptr; });
    if (queue_.empty()) std::rethrow_exception(error_);  // the items before it were taken
    T item = std::move(queue_.front());
    queue_.pop_front();
    ++next_;
    cv_.notify_all();
    return item;
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
    queue_.clear();
    stop_ = false;
    error_ = nullptr;
    n_ = next_ = 0;
  }

 private:
  void run() {
    for (int64_t i = 0; i < n_; ++i) {
      T item;
      try {
        item = make_(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = std::current_exception();
        cv_.notify_all();
        return;
      }
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < depth_; });
      if (stop_) return;
      queue_.push_back(std::move(item));
      cv_.notify_all();
    }
  }

  std::function<T(int64_t)> make_;
  int64_t n_ = 0, next_ = 0;  // next_: the caller's; the thread counts its own
  int depth_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> queue_;
  std::exception_ptr error_;
  bool stop_ = false;
};

}  // namespace mg::data
