// MicroBatchFeed (Note [prefetched micro-batches] in minigrad/train/trainer.h).
#include "train/feed.h"

#include <utility>

namespace mg {

void MicroBatchFeed::start(std::vector<MicroBatch> list, int depth, Read read) {
  stop();
  list_ = std::move(list);
  taken_ = 0;
  // The host side in the stage's buffers (page-locked for a GPU), one per tensor.
  reader_.start(static_cast<int64_t>(list_.size()), depth, [this, read = std::move(read)](int64_t i) {
    const MicroBatch& m = list_[static_cast<size_t>(i)];
    std::vector<HostBuffer> host;
    for (const BatchStage::Spec& s : specs_(m.rows)) host.push_back(stage_.host_buffer(s.nbytes()));
    read(m, host);
    return host;
  });
}

std::vector<Tensor> MicroBatchFeed::take(int64_t first, int64_t rows) {
  MG_CHECK(taken_ < list_.size() && list_[taken_].first == first && list_[taken_].rows == rows,
           "Trainer: internal error: micro-batch [" << first << ", " << first + rows << ") was not the next one to read");
  const auto id = static_cast<int64_t>(taken_);
  if (!stage_.holds(id)) stage_.reserve(id, specs_(rows));  // not read ahead: the first of a list
  if (!stage_.sent() && !error_) send_read();                 // waits for the reading thread
  if (error_) {  // Note [reading ahead]: the read's own error, where this micro-batch is read
    stage_.clear();
    std::rethrow_exception(std::exchange(error_, nullptr));
  }
  ++taken_;
  return stage_.take(id);
}

void MicroBatchFeed::reserve_next() {
  if (taken_ >= list_.size()) return;
  stage_.reserve(static_cast<int64_t>(taken_), specs_(list_[taken_].rows));
  pump();
}

void MicroBatchFeed::pump() {
  if (!stage_.holds(static_cast<int64_t>(taken_)) || stage_.sent() || error_ || !reader_.ready()) return;
  send_read();
}

void MicroBatchFeed::send_read() {
  try {
    stage_.send(reader_.take());
  } catch (...) {  // thrown again by the take() of this micro-batch
    error_ = std::current_exception();
  }
}

void MicroBatchFeed::stop() {
  reader_.stop();  // before the list its thread reads
  stage_.clear();
  list_.clear();
  taken_ = 0;
  error_ = nullptr;
}

}  // namespace mg
