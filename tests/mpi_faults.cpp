// A data-parallel training loop whose rank 1 misbehaves on purpose, for tests/mpi_faults.sh
// (Note [collectives never hang] in minigrad/dist/dist.h):
//   mpi_faults none   trains 40 steps and exits 0
//   mpi_faults throw  rank 1 throws mg::Error at step 5; it reports and calls abort_all
//   mpi_faults stall  rank 1 stops taking part at step 5 (alive, in no collective): rank 0's
//                     step times out with mg::Error after MG_DIST_TIMEOUT seconds
//   mpi_faults slow   rank 1 trains slowly (the script kills it with SIGKILL meanwhile)
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <minigrad/minigrad.h>

int main(int argc, char** argv) {
  mg::dist::Session session(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "none";
  const int rank = mg::dist::rank();
  try {
    mg::manual_seed(1);
    auto model = mg::nn::make_mlp({784, 64, 10});
    mg::dist::broadcast(model->parameters());
    mg::optim::SGD sgd(model->parameters(), {.lr = 0.1f});
    mg::optim::Accumulator acc(sgd, {.steps = 2});
    const mg::data::IdxDataset data = mg::data::make_synthetic(4096, 3);
    mg::data::DataLoader loader(data, {.batch_size = 8, .shard = rank, .num_shards = mg::dist::world_size()});
    int64_t steps = 0;
    mg::optim::TrainCallbacks cb;
    cb.on_step = [&](const mg::optim::StepInfo&) {
      ++steps;
      if (rank == 1 && steps == 5 && mode == "throw") MG_FAIL("rank 1 failed on purpose at step 5");
      if (rank == 1 && steps == 5 && mode == "stall") std::this_thread::sleep_for(std::chrono::hours(1));
      if (rank == 1 && mode == "slow") std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (rank == 0 && steps % 10 == 0) std::printf("step %lld\n", static_cast<long long>(steps));
      std::fflush(stdout);
    };
    for (int64_t e = 0; steps < 40; ++e) mg::optim::train_epoch(*model, loader, acc, e, {}, cb);
    if (rank == 0) std::printf("done: %lld steps\n", static_cast<long long>(steps));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_faults: rank %d: error: %s\n", rank, e.what());
    mg::dist::abort_all(3);
  }
  return 0;
}
