// The training-state reader (minigrad/optim/train_state.h): load_train_state on any bytes, into
// a fixed model with SGD (momentum) and with Adam; what it accepts is saved and loaded again.
// Seeds: make_corpus.cpp (train_state/); dictionary: dicts/train_state.dict.
#include <memory>

#include <minigrad/core/rng.h>
#include <minigrad/nn/models.h>
#include <minigrad/optim/train_state.h>

#include "fuzz_common.h"

namespace {

// A state that loaded is saved and loaded again, and reads back the same.
void round_trip(const mg::optim::TrainState& st, mg::nn::Module& model, mg::optim::Optimizer& opt) {
  const std::string copy = mg::fuzz::scratch_dir() + "/copy.state.safetensors";
  mg::optim::save_train_state(copy, model, opt, st);
  const mg::optim::TrainState back = mg::optim::load_train_state(copy, model, opt);
  MG_FUZZ_CHECK(back.epoch == st.epoch && back.batches_done == st.batches_done &&
                    back.step_count == st.step_count && back.generator_seed == st.generator_seed &&
                    back.generator_offset == st.generator_offset && back.extra == st.extra,
                "a training state changed in a save/load round trip");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::shared_ptr<mg::nn::Sequential> model = mg::nn::make_mlp(mg::fuzz::kModelSizes);
  static mg::optim::SGD sgd(model->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  static mg::optim::Adam adam(model->parameters(), {});
  const std::string path = mg::fuzz::write_input("input.state.safetensors", data, size);
  for (mg::optim::Optimizer* opt : {static_cast<mg::optim::Optimizer*>(&sgd), static_cast<mg::optim::Optimizer*>(&adam)}) {
    mg::optim::TrainState st;
    if (mg::fuzz::expect_mg_error([&] { st = mg::optim::load_train_state(path, *model, *opt); })) continue;
    round_trip(st, *model, *opt);
  }
  return 0;
}
