// A training run's state in one safetensors file, to resume it bit for bit: the parameters, the
// optimizer's state tensors and step count, the epochs done, the positions of the default
// generator and of the model's own (Module::generators), and free-form metadata (the app's configuration, the accumulation schedule).
//
//   mg::optim::save_train_state(dir + "/epoch_3.state.safetensors", model, opt, {.epoch = 3});
//   mg::optim::TrainState st = mg::optim::load_train_state(path, model, opt);  // next epoch: st.epoch
//
// The sample order depends only on (seed, epoch) (Note [batch-size independent order],
// minigrad/data/loader.h), so the epoch count is the whole of the loader's position at an epoch boundary;
// `batches_done` is there for mid-epoch saves. Writes are atomic (minigrad/nn/serialize.h).
//
// An epoch is usually saved as a pair, the state and the weights alone (which PyTorch and
// load_into read); save_checkpoint writes the pair as one unit (Note [a pair of files as one unit]
// in src/optim/train_state.cpp), latest_checkpoint finds the newest complete one, and
// repair_checkpoints tidies a folder after a crash:
//
//   mg::optim::repair_checkpoints(dir);                         // at start, before writing there
//   std::string base = mg::optim::latest_checkpoint(dir);       // "dir/epoch_3", or "" if none
//   if (!base.empty()) mg::optim::load_train_state(base + ".state.safetensors", model, opt);
//   mg::optim::save_checkpoint(dir + "/epoch_4", model, opt, {.epoch = 4}, {{"model", "mlp"}});
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
// optimizer's step count, the default generator and the model's own. Throws mg::Error naming what does not fit.
TrainState load_train_state(const std::string& path, nn::Module& model, Optimizer& opt);

// Saves "<base>.state.safetensors" (as save_train_state) and then "<base>.safetensors" (the
// parameters under their own names, with `weights_metadata`). The weights file is written last:
// where it exists, its state exists and belongs to it.
void save_checkpoint(const std::string& base, const nn::Module& model, const Optimizer& opt,
                     TrainState state, const nn::Metadata& weights_metadata = {});

// The base ("<dir>/<name>") of the newest complete pair in `dir`: the largest (epoch,
// batches_done) among the training states that have their weights file beside them. Empty when
// there is none. Throws mg::Error naming a state file that cannot be read.
std::string latest_checkpoint(const std::string& dir);

struct CheckpointRepair {
  int temporaries_removed = 0;          // stale "*.tmp.<pid>.<n>" of dead writers
  std::vector<std::string> completed;   // weights files written from a state left alone by a crash
};
// After a crash during save_checkpoint: removes dead writers' temporaries from `dir` and writes
// the weights file of every training state whose weights file is missing (the state holds the
// parameters and the weights file's metadata), so that every state is a complete pair again.
CheckpointRepair repair_checkpoints(const std::string& dir);

}  // namespace mg::optim
