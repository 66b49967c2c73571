// Trains an MLP with the installed libminigrad under a memory budget: the Trainer measures the
// model, chooses the micro-batch, the accumulation and the checkpoint plan that fit, and trains.
// Exits 0 when the loss went down.
#include <minigrad/minigrad.h>

#include <cstdio>
#include <memory>
#include <vector>

int main() {
  mg::manual_seed(0);
  // 2048 points in 64 dimensions; the class is the sign of their first coordinate.
  mg::Tensor x = mg::Tensor::randn({2048, 64}, mg::default_generator());
  const std::vector<float> xs = x.to_vector<float>();
  std::vector<int64_t> labels;
  for (size_t i = 0; i < xs.size(); i += 64) labels.push_back(xs[i] > 0 ? 1 : 0);
  auto data = std::make_shared<mg::data::TensorDataset>(x, mg::Tensor::from_vector(labels, {2048}));

  auto model = mg::nn::make_mlp({64, 512, 512, 512, 2});  // Flatten, Linear, ReLU, ..., Linear
  mg::optim::SGD opt(model->parameters(), {.lr = 0.05f, .momentum = 0.9f});
  mg::Trainer trainer(*model, data, opt, {.batch_size = 512, .memory_budget = "9MB", .epochs = 3});
  std::printf("plan for 9 MB: %s\n", trainer.plan().str().c_str());
  mg::FitReport r = trainer.fit();
  std::printf("loss %.4f -> %.4f, peak in use %zu bytes\n", r.losses.front(), r.losses.back(), r.peak_in_use);
  mg::nn::save_safetensors("mlp.safetensors", model->named_parameters());  // PyTorch reads it
  return r.losses.back() < r.losses.front() && r.peak_in_use <= 9'000'000 ? 0 : 1;
}
