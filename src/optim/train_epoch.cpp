// train_epoch: one epoch of micro-batches through an Accumulator.
#include <minigrad/optim/accumulate.h>

#include <chrono>

#include <minigrad/core/device.h>
#include <minigrad/dist/dist.h>
#include <minigrad/ops/ops.h>

namespace mg::optim {

EpochStats train_epoch(nn::Module& model, data::DataLoader& loader, Accumulator& acc, int64_t epoch,
                       const LossFn& loss_fn, const TrainCallbacks& callbacks) {
  MG_CHECK(acc.pending_micro_batches() == 0,
           "train_epoch: the accumulator has " << acc.pending_micro_batches() << " pending micro-batches; flush() first");
  const Reduction red = acc.options().normalize == Normalize::samples ? Reduction::sum : Reduction::mean;
  auto t0 = std::chrono::steady_clock::now();
  EpochStats st;
  const int64_t skipped0 = acc.skipped_steps();
  const bool dp = acc.data_parallel();
  if (dp) {
    const data::LoaderOptions& lo = loader.options();
    MG_CHECK(lo.num_shards == dist::world_size() && lo.shard == dist::rank(),
             "train_epoch: " << dist::world_size() << " processes train data-parallel, but rank " << dist::rank()
                 << "'s loader reads shard " << lo.shard << " of " << lo.num_shards
                 << ": each rank must read its own shard. ---> HINT: LoaderOptions{.shard = mg::dist::rank(), "
                    ".num_shards = mg::dist::world_size()}");
  }
  MG_CHECK(!dp || !callbacks.on_out_of_memory,
           "train_epoch: recovery from out-of-memory (TrainCallbacks::on_out_of_memory) is not supported under data "
           "parallelism: every rank would have to re-plan together");
  model.train();
  loader.start_epoch(epoch);
  // Note [data parallel step]: every rank walks as many micro-batch slots as the largest shard
  // has batches, and steps at the same slots; a shard that ran out adds nothing to the last one.
  int64_t slots = dp ? dist::all_reduce_max(loader.num_batches()) : loader.num_batches();
  int64_t window_first = 0;  // the pending window's first sample in the epoch's order
  data::Batch b;
  // BatchNorm's running statistics: each rank updates them from its own samples; after every step
  // all take rank 0's (dist::broadcast_buffers, as PyTorch's DDP), so the ranks evaluate alike.
  // Whether to is decided over all ranks, so that every rank makes the same calls (a rank whose
  // model lacks the buffers then hears so from broadcast_buffers instead of mismatching them).
  std::vector<std::pair<std::string, Tensor>> buffers;
  bool share_buffers = false;
  if (dp && dist::world_size() > 1) {
    buffers = model.named_buffers();
    share_buffers = dist::all_reduce_max(buffers.empty() ? 0 : 1) == 1;
  }
  auto after_step = [&](const StepInfo& info) {
    if (share_buffers) dist::broadcast_buffers(buffers);
    st.loss_sum += info.loss_sum;  // of every rank's samples, under data parallelism
    st.samples += info.samples;
    st.micro_batches += info.micro_batches;
    if (!info.skipped) ++st.optimizer_steps;
    if (callbacks.on_step) callbacks.on_step(info);
  };
  // A window redone after out of memory must not count its failed try in BatchNorm's running
  // statistics: they go back to what they were at the window's start.
  const std::vector<std::pair<std::string, Tensor>> own_buffers =
      callbacks.on_out_of_memory ? model.named_buffers() : std::vector<std::pair<std::string, Tensor>>();
  std::vector<Tensor> window_buffers;
  for (const auto& [name, t] : own_buffers) window_buffers.push_back(t.clone());
  for (int64_t slot = 0; slot < slots; ++slot) {
    if (slot % acc.steps() == 0) {
      for (size_t i = 0; i < window_buffers.size(); ++i) window_buffers[i].copy_(own_buffers[i].second);
    }
    if (loader.next(b)) {
      try {
        Tensor loss;
        {
          const SampleWindowGuard window = acc.sample_window();  // Note [dropout by sample]
          Tensor logits = model.forward(b.x);
          loss = loss_fn ? loss_fn(logits, b.y) : cross_entropy(logits, b.y, red);
        }
        acc.backward(loss, b.size());
      } catch (const OutOfMemoryError& e) {  // Note [recovering from out-of-memory]
        if (!callbacks.on_out_of_memory) throw;
        // The step's graph is gone with the try block; drop the window, re-plan, and redo it from
        // its first sample in micro-batches of the new size.
        const int64_t old_b = loader.options().batch_size, window = acc.steps() * old_b;
        acc.discard();
        for (size_t i = 0; i < window_buffers.size(); ++i) {
          Tensor t = own_buffers[i].second;
          t.copy_(window_buffers[i]);
        }
        const int64_t new_b = callbacks.on_out_of_memory(e, old_b);
        if (new_b == old_b) throw;
        MG_CHECK(new_b >= 1 && window % new_b == 0,
                 "train_epoch: after running out of memory, on_out_of_memory returned micro-batch "
                     << new_b << ", which does not divide the window of " << window << " samples (" << acc.steps()
                     << " x " << old_b << ")");
        b = data::Batch();
        loader.set_batch_size(new_b);
        loader.start_epoch(epoch, window_first / new_b);
        acc.set_steps(window / new_b);
        slots = loader.num_batches();
        slot = window_first / new_b - 1;  // the loop's ++ makes it the window's first micro-batch
        continue;
      }
      if (callbacks.on_micro_batch) callbacks.on_micro_batch(b);
    }
    if ((slot + 1) % acc.steps() == 0) {
      after_step(acc.step());
      window_first = (slot + 1) * loader.options().batch_size;
    }
  }
  StepInfo last;
  if (acc.flush(&last)) after_step(last);
  st.skipped_steps = acc.skipped_steps() - skipped0;
  // The last update is still running on a GPU: the epoch's time includes it.
  synchronize(loader.options().device);
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace mg::optim
