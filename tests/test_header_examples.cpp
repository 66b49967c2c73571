// The usage example at the top of every public header (include/minigrad/), word for word: the
// build extracts each one into <header>.inc (tests/doc_examples.py), and the cases below include
// it between what it assumes exists (a model, a batch, ...) and checks of what it did. A changed
// example is tested as changed; one that no longer compiles fails the build, with the header's own
// file and line; a header's new example fails the build until a case here includes it. Examples
// that need files (MNIST, an image folder) or minutes (VGG16 planning, ResNet-18 training) are
// compiled, not run.
#include "minigrad.h.inc"  // the example of minigrad/minigrad.h: #include <minigrad/minigrad.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "helpers.h"

namespace {

mg::nn::Sequential small_model() {
  mg::nn::Sequential m;
  m.add<mg::nn::Flatten>();
  m.add<mg::nn::Linear>(784, 10);
  return m;
}

mg::Tensor labels_of(std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return mg::Tensor::from_vector(v, {n});
}

// Runs the rest of a case in a fresh temporary folder, and leaves it (removed) at the end.
struct InTempDir {
  std::filesystem::path dir, cwd = std::filesystem::current_path();
  explicit InTempDir(const std::string& name) : dir(std::filesystem::temp_directory_path() / name) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::filesystem::current_path(dir);
  }
  ~InTempDir() {
    std::filesystem::current_path(cwd);
    std::filesystem::remove_all(dir);
  }
};

}  // namespace

TEST_CASE("core/autocast.h") {
  mg::nn::Sequential model = small_model();
  mg::Tensor x = mg::test::rand_tensor({4, 784}, 1), y = labels_of({1, 2, 3, 4});
  mg::optim::SGD opt(model.parameters(), {.lr = 0.1f});
  const mg::Tensor w = model.parameters()[0];
  const std::vector<float> before = w.to_vector<float>();
#include "core/autocast.h.inc"
  CHECK(p == mg::Precision::bf16);
  CHECK(w.dtype() == mg::DType::f32);  // the master stays float32, and moved
  CHECK(w.to_vector<float>() != before);
}

TEST_CASE("core/autograd.h") {
  mg::nn::Sequential model = small_model();
  mg::Tensor x = mg::test::rand_tensor({2, 784}, 1);
  mg::Tensor loss = mg::cross_entropy(model.forward(x), labels_of({1, 2}));
#include "core/autograd.h.inc"
  for (const mg::Tensor& p : model.parameters()) CHECK(p.grad().defined());
}

TEST_CASE("core/checkpoint.h") {
  mg::nn::Linear block(5, 5);
  mg::Tensor x = mg::test::rand_tensor({3, 5}, 2, true);
#include "core/checkpoint.h.inc"
  CHECK(y.shape() == mg::Shape{3, 5});
  CHECK(y.to_vector<float>() == block.forward(x).to_vector<float>());
}

TEST_CASE("core/error.h") {
  auto check = [](const mg::Tensor& x) {
#include "core/error.h.inc"
  };
  CHECK_NOTHROW(check(mg::test::rand_tensor({2, 3}, 3)));
  CHECK_THROWS_WITH_AS(check(mg::test::rand_tensor({6}, 3)), doctest::Contains("input must be 2-D, got shape"),
                       mg::Error);
}

TEST_CASE("core/memory.h") {
  auto train_step = [] { mg::Tensor t = mg::Tensor::zeros({256}); };
#include "core/memory.h.inc"
  CHECK(s.peak_in_use >= 256 * sizeof(float));
}

TEST_CASE("core/profiler.h") {
  const mg::Tensor a = mg::test::rand_tensor({16, 16}, 4);
  auto train_step = [&] { mg::Tensor t = mg::relu(a); };
#include "core/profiler.h.inc"
  bool found = false;
  for (const mg::profiler::Row& r : mg::profiler::report()) {
    if (r.name == "relu" && r.pass == "forward") {
      found = true;
      CHECK(r.calls == 10);
    }
  }
  CHECK(found);
}

TEST_CASE("core/rng.h") {
  const uint64_t n = 10, i = 3;
#include "core/rng.h.inc"
  CHECK((u >= 0.0f && u < 1.0f));
  CHECK(gen.offset() >= offset + n);  // the n draws are reserved (in whole Philox blocks)
  CHECK(u == mg::philox_uniform(42, offset + i));
}

TEST_CASE("core/tensor.h") {
  mg::Generator gen(1);
  mg::Tensor x = mg::test::rand_tensor({4, 784}, 4), b = mg::Tensor::zeros({512});
  mg::Tensor labels = labels_of({1, 2, 3, 4});
#include "core/tensor.h.inc"
  CHECK(w.grad().defined());
  CHECK(w.grad().shape() == w.shape());
}

TEST_CASE("core/threads.h") {
  const int old = mg::num_threads();
#include "core/threads.h.inc"
  CHECK(t == 1);
  mg::set_num_threads(old);
}

TEST_CASE("cuda.h") {  // the settings only: they apply when a CUDA device runs the ops
  const bool matmul = mg::cuda::tf32_matmul(), conv = mg::cuda::tf32_conv();
  const bool benchmark = mg::cuda::cudnn_benchmark(), deterministic = mg::cuda::cudnn_deterministic();
#include "cuda.h.inc"
  CHECK(mg::cuda::tf32_matmul());
  CHECK(!mg::cuda::tf32_conv());
  CHECK(mg::cuda::cudnn_benchmark());
  CHECK(!mg::cuda::cudnn_deterministic());
  mg::cuda::set_tf32_matmul(matmul);
  mg::cuda::set_tf32_conv(conv);
  mg::cuda::set_cudnn_benchmark(benchmark);
  mg::cuda::set_cudnn_deterministic(deterministic);
}

TEST_CASE("data/dataset.h") {
#include "data/dataset.h.inc"
  CHECK(b.x.shape() == mg::Shape{2, 3, 8, 8});
  CHECK(b.y.to_vector<int64_t>() == std::vector<int64_t>{4, 2});
}

[[maybe_unused]] static void idx_example() {  // needs data/mnist: compiled only
#include "data/idx.h.inc"
}

[[maybe_unused]] static void image_folder_example() {  // needs an image folder: compiled only
#include "data/image_folder.h.inc"
}

TEST_CASE("data/loader.h") {
#include "data/loader.h.inc"
  CHECK(loader.num_batches() == 63);  // 1000 = 62 x 16 + 8
  CHECK(loader.epoch() == 0);
}

TEST_CASE("data/tokens.h") {
  InTempDir tmp("mg_header_examples_tokens");
  std::vector<uint16_t> tokens(4 * 64 + 1);
  for (size_t k = 0; k < tokens.size(); ++k) tokens[k] = static_cast<uint16_t>(k * 7 % 50257);
  mg::data::save_token_file("tiny_shakespeare_train.bin", tokens);
#include "data/tokens.h.inc"
  CHECK(b.x.shape() == mg::Shape{4, 64});
  const std::vector<int64_t> x = b.x.to_vector<int64_t>(), y = b.y.to_vector<int64_t>();
  CHECK(x[1] == tokens[1]);
  CHECK(y[0] == x[1]);  // the next token
}

TEST_CASE("dist/dist.h") {  // no launcher here: a world of one, the same training loop
  int argc = 1;
  char name[] = "test_header_examples";
  char* args[] = {name, nullptr};
  char** argv = args;
  const mg::data::TensorDataset train(mg::test::rand_tensor({64, 1, 28, 28}, 3),
                                      mg::Tensor::from_vector(std::vector<int64_t>(64, 7), {64}));
#include "dist/dist.h.inc"
  CHECK(acc.steps_taken() == 2);
}

[[maybe_unused]] static void checkpoint_plan_example(const mg::Tensor& x) {  // a measured VGG16 step: compiled only
#include "nn/checkpoint_plan.h.inc"
}

TEST_CASE("nn/memory_report.h") {
#include "nn/memory_report.h.inc"
  size_t sum = 0;
  for (const mg::nn::MemoryTerm& t : r.terms) sum += t.bytes;
  CHECK(sum == plan.predicted_peak);
  CHECK(r.terms[0].bytes == (16 * 32 + 32 + 32 * 4 + 4) * sizeof(float));  // the parameters
}

TEST_CASE("nn/models.h") {
#include "nn/models.h.inc"
  auto count = [](const mg::nn::Sequential& m) {
    int64_t n = 0;
    for (const mg::Tensor& p : m.parameters()) n += p.numel();
    return n;
  };
  CHECK(count(*mlp) == 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10);
  CHECK(count(*resnet) == 25557032);  // torchvision's resnet50()
  CHECK(vgg->named_parameters().back().second.shape() == mg::Shape{2});  // 2 classes
}

TEST_CASE("nn/module.h") {
  mg::Tensor x = mg::test::rand_tensor({2, 1, 28, 28}, 6);
#include "nn/module.h.inc"
  CHECK(logits.shape() == mg::Shape{2, 10});
  CHECK(mlp.named_parameters().front().first == "1.weight");
}

TEST_CASE("nn/serialize.h") {
  InTempDir tmp("mg_header_examples_serialize");
  mg::nn::Sequential model = small_model();
  const std::vector<float> saved = model.parameters()[0].to_vector<float>();
  mg::nn::Sequential other = small_model();  // other weights, loaded over by the example
  {
    mg::nn::Sequential& model = other;
#include "nn/serialize.h.inc"
  }
  CHECK(other.parameters()[0].to_vector<float>() != saved);  // it saved `other` itself
  mg::nn::load_into(model, "epoch_3.safetensors");
  CHECK(model.parameters()[0].to_vector<float>() == other.parameters()[0].to_vector<float>());
  CHECK(mg::nn::read_safetensors_metadata("epoch_3.safetensors").at("epoch") == "3");
}

[[maybe_unused]] static void train_plan_example() {  // plans VGG16 at 224 x 224: compiled only
#include "nn/train_plan.h.inc"
}

TEST_CASE("ops/ops.h") {
  mg::Tensor x = mg::test::rand_tensor({4, 784}, 7), w1 = mg::test::rand_tensor({512, 784}, 8, true);
  mg::Tensor b1 = mg::Tensor::zeros({512}), w2 = mg::test::rand_tensor({10, 512}, 9, true);
  mg::Tensor b2 = mg::Tensor::zeros({10}), labels = labels_of({0, 1, 2, 3});
#include "ops/ops.h.inc"
  CHECK(std::isfinite(loss.item()));
  CHECK(w1.grad().defined());
  CHECK(w2.grad().defined());
}

TEST_CASE("optim/accumulate.h") {
  mg::nn::Sequential model = small_model();
  mg::data::TensorDataset data(mg::test::rand_tensor({40, 1, 28, 28}, 10),
                               mg::Tensor::from_vector(std::vector<int64_t>(40, 1), {40}));
  mg::data::DataLoader loader(data, {.batch_size = 8});
  const int64_t e = 0;
  mg::data::Batch b;
#include "optim/accumulate.h.inc"
  CHECK(acc.steps_taken() == 2);  // 5 micro-batches: a window of 4, then the flushed one
}

TEST_CASE("optim/optimizer.h") {
  mg::nn::Sequential model = small_model();
  mg::data::TensorDataset data(mg::test::rand_tensor({40, 1, 28, 28}, 11),
                               mg::Tensor::from_vector(std::vector<int64_t>(40, 1), {40}));
  mg::data::DataLoader loader(data, {.batch_size = 8});
  const int64_t epoch = 0;
  const std::vector<float> before = model.parameters()[0].to_vector<float>();
#include "optim/optimizer.h.inc"
  CHECK(model.parameters()[0].to_vector<float>() != before);
}

TEST_CASE("optim/train_state.h") {
  InTempDir tmp("mg_header_examples_state");
  const std::string dir = tmp.dir.string(), path = dir + "/epoch_3.state.safetensors";
  mg::nn::Sequential model = small_model();
  mg::optim::SGD opt(model.parameters(), {.lr = 0.01f, .momentum = 0.9f});
#include "optim/train_state.h.inc"
  CHECK(st.epoch == 3);
}

// ResNet-18 planned for 2 GiB and trained for three epochs: compiled, not run.
[[maybe_unused]] static void trainer_example(std::shared_ptr<const mg::data::Dataset> data) {
#include "train/trainer.h.inc"
}

TEST_CASE("util/bytes.h") {
#include "util/bytes.h.inc"
  CHECK(budget == 1610612736u);
  CHECK(mg::format_bytes(budget) == "1.50 GiB");
}

TEST_CASE("util/file.h") {
  InTempDir tmp("mg_header_examples_file");
  std::filesystem::create_directories("out");
#include "util/file.h.inc"
  CHECK(std::filesystem::file_size("out/run.json") == 14);
}
