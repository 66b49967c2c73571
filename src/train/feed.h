// mg::Trainer's micro-batches read on a thread of their own and staged on the device one ahead
// (Note [prefetched micro-batches] in minigrad/train/trainer.h).
//
//   MicroBatchFeed feed(dev, specs);
//   feed.start(list, /*depth=*/2, read);   // the epoch's micro-batches, from a window on
//   for each micro-batch in the list:
//     std::vector<Tensor> xy = feed.take(first, rows);   // staged, or read now
//     feed.reserve_next();                               // before its kernels are queued
//     ... forward, backward ...
//     feed.pump();                                       // after them
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <vector>

#include <minigrad/core/tensor.h>

#include "core/staging.h"
#include "data/ahead.h"

namespace mg {

// A micro-batch of an epoch: rows [first, first + rows) of the window that starts at sample
// `start` of the epoch's order, which is optimizer step `step` of the run.
struct MicroBatch {
  int64_t step = 0, start = 0, first = 0, rows = 0;
};

class MicroBatchFeed {
 public:
  using Specs = std::function<std::vector<BatchStage::Spec>(int64_t rows)>;
  // Writes a micro-batch's tensors into host buffers, one per spec (on the reading thread).
  using Read = std::function<void(const MicroBatch&, std::vector<HostBuffer>&)>;

  MicroBatchFeed(Device device, Specs specs) : stage_(device), specs_(std::move(specs)) {}
  ~MicroBatchFeed() {
    try {
      stop();
    } catch (...) {  // a device error while a run ends: the error that ended it is the one to see
    }
  }

  // The micro-batches to come, in the order they will be taken, read `depth` ahead on a thread of
  // their own (0: when staged, on the caller's). Ends what an earlier list left.
  void start(std::vector<MicroBatch> list, int depth, Read read);
  // The next micro-batch of the list (it must be rows [first, first + rows) of its window) on the
  // device: staged already, or read and copied now. Rethrows its read's exception.
  std::vector<Tensor> take(int64_t first, int64_t rows);
  // Device memory for the micro-batch after the one taken, now; its copy queued when it is read.
  void reserve_next();
  // Queues the reserved micro-batch's copy if its host side has been read (never waits).
  void pump();
  void stop();

 private:
  // The reserved micro-batch's copy from the reader's next host buffers; a read error is kept.
  void send_read();

  BatchStage stage_;
  Specs specs_;
  std::vector<MicroBatch> list_;
  size_t taken_ = 0;                 // of the list
  data::ReadAhead<std::vector<HostBuffer>> reader_;
  std::exception_ptr error_;         // the staged micro-batch's read error, for its take()
};

}  // namespace mg
