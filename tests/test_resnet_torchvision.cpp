// ResNet-18 against torchvision's (tests/reference/resnet18_torchvision.py writes the reference):
// its state_dict loads into make_resnet18 by name; the training-mode logits and loss, one SGD step
// (weights and BatchNorm running statistics) and the eval-mode logits after it match PyTorch's
// within 1e-4 relative (L2) on the CPU. The ctest entry (tests/CMakeLists.txt) runs the script
// first and passes its folder in MG_RESNET_REFERENCE; without it the test is skipped (77).
#include <cstdlib>
#include <filesystem>

#include <minigrad/minigrad.h>

#include "helpers.h"

using namespace mg;

namespace {

std::string reference_dir() {
  const char* dir = std::getenv("MG_RESNET_REFERENCE");
  return dir ? dir : "";
}

}  // namespace

TEST_CASE("torchvision ResNet-18: state_dict loads; logits, one SGD step and running statistics match PyTorch") {
  const std::string dir = reference_dir();
  if (dir.empty() || !std::filesystem::exists(dir + "/step.safetensors")) {
    MESSAGE("MG_RESNET_REFERENCE is not set to the folder of tests/reference/resnet18_torchvision.py: skipped");
    std::exit(77);
  }
  auto model = nn::make_resnet18(10);
  nn::load_into(*model, dir + "/init.safetensors");  // every name, shape and dtype, nothing more
  const nn::SafetensorsFile batch = nn::load_safetensors(dir + "/batch.safetensors");
  const nn::SafetensorsFile step = nn::load_safetensors(dir + "/step.safetensors");

  model->train();
  optim::SGD opt(model->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  opt.zero_grad();
  Tensor logits = model->forward(test::tensor_in(batch, "x"));
  const double logits_err = test::rel_err(logits, test::tensor_in(batch, "logits"));
  MESSAGE("training-mode logits: relative error " << logits_err);
  CHECK(logits_err < 1e-4);
  Tensor loss = cross_entropy(logits, test::tensor_in(batch, "target"));
  const double ref_loss = test::tensor_in(batch, "loss").to_vector<float>()[0];
  CHECK(std::abs(loss.item() - ref_loss) <= 1e-4 * std::abs(ref_loss));
  loss.backward();
  opt.step();

  double worst = 0;
  std::string worst_name;
  const auto state = model->state_dict();
  CHECK(state.size() == step.tensors.size());
  for (const auto& [name, t] : state) {
    INFO(name);
    const Tensor& ref = test::tensor_in(step, name);
    if (t.dtype() == DType::i64) {
      CHECK(t.to_vector<int64_t>() == ref.to_vector<int64_t>());  // num_batches_tracked: 1
      continue;
    }
    const double e = test::rel_err(t, ref);
    CHECK(e < 1e-4);
    if (e > worst) worst = e, worst_name = name;
  }
  MESSAGE("after one SGD step: worst relative error " << worst << " (" << worst_name << ")");
  CHECK(dynamic_cast<nn::BatchNorm&>((*model)[1]).num_batches_tracked() == 1);

  model->eval();
  NoGradGuard no_grad;
  const double eval_err = test::rel_err(model->forward(test::tensor_in(batch, "x")), test::tensor_in(batch, "eval_logits"));
  MESSAGE("eval-mode logits after the step: relative error " << eval_err);
  CHECK(eval_err < 1e-4);
}
