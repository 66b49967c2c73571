// A training run's state in one safetensors file, to resume it bit for bit: the parameters, the
// optimizer's state tensors and step count, the epochs done, the default generator's position,
// and free-form metadata (the app's configuration, the accumulation schedule).
//
//   mg::optim::save_train_state(dir + "/epoch_3.state.safetensors", model, opt, {.epoch = 3});
//   mg::optim::TrainState st = mg::optim::load_train_state(path, model, opt);  // next epoch: st.epoch
//
// The sample order depends only on (seed, epoch) (Note [batch-size independent order],
// minigrad/data/loader.h), so the epoch count is the whole of the loader's position at an epoch boundary;
// `batches_done` is there for mid-epoch saves. Writes are atomic (minigrad/nn/serialize.h).
#pragma once

#include <cstdint>
#include <string>

#include <minigrad/nn/module.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/optim/optimizer.h>

namespace mg::optim {

struct TrainState {
  int64_t epoch = 0;          // epochs completed
  int64_t batches_done = 0;   // batches of epoch `epoch` already consumed (0 at a boundary)
  int64_t step_count = 0;     // optimizer steps (filled in by save/load)
  uint64_t generator_seed = 0, generator_offset = 0;  // mg::default_generator() (filled in)
  nn::Metadata extra;         // anything else the caller wants back (strings)
};

// Tensors are stored as "param.<name>" and "optim.<name>"; metadata keys "minigrad.*" are ours.
void save_train_state(const std::string& path, const nn::Module& model, const Optimizer& opt,
                      TrainState state);
// Copies the file into model and optimizer (names, shapes and dtypes must match) and restores the
// optimizer's step count and the default generator. Throws mg::Error naming what does not fit.
TrainState load_train_state(const std::string& path, nn::Module& model, Optimizer& opt);

}  // namespace mg::optim
