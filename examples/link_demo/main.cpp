// Trains a small MLP on XOR with the installed libminigrad; exits 0 when the loss went down.
#include <minigrad/minigrad.h>

#include <cstdio>

int main() {
  mg::manual_seed(0);
  auto model = mg::nn::make_mlp({2, 16, 2});  // Flatten, Linear, ReLU, Linear
  mg::optim::SGD opt(model->parameters(), {.lr = 0.5f, .momentum = 0.9f});
  mg::Tensor x = mg::Tensor::from_vector(std::vector<float>{0, 0, 0, 1, 1, 0, 1, 1}, {4, 2});
  mg::Tensor y = mg::Tensor::from_vector(std::vector<int64_t>{0, 1, 1, 0}, {4});
  float first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    opt.zero_grad();
    mg::Tensor loss = mg::cross_entropy(model->forward(x), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  std::printf("loss %.4f -> %.4f\n", first, last);
  mg::nn::save_safetensors("xor.safetensors", model->named_parameters());  // PyTorch reads it
  return last < first ? 0 : 1;
}
