// The usage example at the top of every public header (include/minigrad/), pasted verbatim into
// a function here, so that an example that no longer compiles fails the build (issue: the
// optimizer's example once used a range-for the DataLoader does not have). Each function first
// declares what the example assumes exists (a model, a batch, ...). Examples that need files
// (MNIST, an image folder) or minutes (VGG16 planning) are compiled, not run; the others run.
// When a header's example changes, paste it here again.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <minigrad/minigrad.h>

#include "helpers.h"

using mg::Tensor;
using mg::shape_str;

namespace {

mg::nn::Sequential small_model() {
  mg::nn::Sequential m;
  m.add<mg::nn::Flatten>();
  m.add<mg::nn::Linear>(784, 10);
  return m;
}

}  // namespace

TEST_CASE("core/autograd.h") {
  mg::nn::Sequential model = small_model();
  Tensor x = mg::test::rand_tensor({2, 784}, 1);
  Tensor loss = mg::cross_entropy(model.forward(x), Tensor::from_vector(std::vector<int64_t>{1, 2}, {2}));
  {
    mg::NoGradGuard no_grad;          // evaluation: nothing is recorded on the tape
    Tensor logits = model.forward(x);
  }
  loss.backward();                     // backward is a method of Tensor (minigrad/core/tensor.h)
}

TEST_CASE("core/checkpoint.h") {
  mg::nn::Linear block(5, 5);
  Tensor x = mg::test::rand_tensor({3, 5}, 2, true);
  Tensor y = mg::checkpoint([&](const std::vector<Tensor>& in) { return block.forward(in[0]); }, {x});
  CHECK(y.shape() == mg::Shape{3, 5});
}

TEST_CASE("core/error.h") {
  Tensor x = mg::test::rand_tensor({2, 3}, 3);
  MG_CHECK(x.dim() == 2, "linear: input must be 2-D, got shape " << shape_str(x.shape()));
}

TEST_CASE("core/memory.h") {
  auto train_step = [] { Tensor t = Tensor::zeros({256}); };
  mg::reset_peak_memory_stats(mg::Device::cpu());
  train_step();
  auto s = mg::memory_stats(mg::Device::cpu());
  std::printf("peak in use: %zu bytes\n", s.peak_in_use);
  CHECK(s.peak_in_use >= 256 * sizeof(float));
}

TEST_CASE("core/rng.h") {
  const uint64_t n = 10, i = 3;
  mg::Generator gen(42);
  uint64_t offset = gen.advance(n);          // reserve n draws, get their first counter
  float u = mg::philox_uniform(gen.seed(), offset + i);   // the i-th draw, in [0, 1)
  CHECK((u >= 0.0f && u < 1.0f));
}

TEST_CASE("core/tensor.h") {
  mg::Generator gen(1);
  Tensor x = mg::test::rand_tensor({4, 784}, 4), b = Tensor::zeros({512});
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {4});
  mg::Tensor w = mg::Tensor::randn({512, 784}, gen).requires_grad_();   // (out, in)
  mg::Tensor y = mg::relu(mg::linear(x, w, b));
  mg::cross_entropy(y, labels).backward();   // w.grad() now holds dL/dw
  CHECK(w.grad().defined());
}

TEST_CASE("cuda.h") {
  mg::cuda::set_tf32_matmul(true);        // linear may use TF32 tensor cores (default: off)
  mg::cuda::set_tf32_conv(false);         // conv2d in strict FP32 (default: TF32 allowed)
  mg::cuda::set_cudnn_benchmark(true);    // time cuDNN's algorithms once per shape
  mg::cuda::set_cudnn_deterministic(false); // admit non-deterministic cuDNN algorithms
  mg::cuda::set_tf32_matmul(false);
  mg::cuda::set_tf32_conv(true);
  mg::cuda::set_cudnn_benchmark(false);
  mg::cuda::set_cudnn_deterministic(true);
}

TEST_CASE("data/dataset.h") {
  mg::Tensor x = mg::Tensor::full({100, 3, 8, 8}, 0.5f);
  std::vector<int64_t> labels(100);
  for (int64_t i = 0; i < 100; ++i) labels[i] = i % 10;
  auto data = std::make_shared<mg::data::TensorDataset>(x, mg::Tensor::from_vector(labels, {100}));
  mg::data::Batch b = data->get_batch(std::vector<int64_t>{4, 2});  // b.x: (2, 3, 8, 8), b.y: (2)
  // mg::data::DataLoader(data, {.batch_size = 16}) walks it in epochs (minigrad/data/loader.h).
  CHECK(b.x.shape() == mg::Shape{2, 3, 8, 8});
}

[[maybe_unused]] static void idx_example() {  // needs data/mnist: compiled only
  mg::data::Splits s = mg::data::load_mnist("data/mnist");       // four standard file names
  mg::data::IdxDataset train = s.train.limit(8000);
  // train.pixels(): (N * 28 * 28) bytes; train.labels(): int64 0..9
  mg::data::Batch b = train.get_batch(std::vector<int64_t>{0, 7});  // b.x: (2, 1, 28, 28) float32
}

[[maybe_unused]] static void image_folder_example() {  // needs an image folder: compiled only
  //   root/cat/001.jpg, root/cat/002.png, root/dog/a.jpeg, ...   (classes = sorted folder names)
  mg::data::ImageFolder ds("data/pets", {.image_size = 224, .seed = 1});
  mg::data::Batch b = ds.get_batch(std::vector<int64_t>{0, 5, 9}, /*epoch=*/0);
  // b.x: (3, 3, 224, 224) float32, b.y: (3) int64; a DataLoader over ds walks it in epochs
}

TEST_CASE("data/loader.h") {
  mg::Tensor images = mg::Tensor::full({1000, 1, 28, 28}, 0.5f);
  mg::Tensor labels = mg::Tensor::from_vector(std::vector<int64_t>(1000, 3), {1000});
  mg::data::TensorDataset train(images, labels);  // or an IdxDataset (minigrad/data/idx.h), ImageFolder, ...
  mg::data::DataLoader loader(train, {.batch_size = 16, .seed = 1, .device = mg::Device::cpu()});
  loader.start_epoch(/*epoch=*/0);
  mg::data::Batch b;
  while (loader.next(b)) { /* b.x: (B, 1, 28, 28) float32, b.y: (B) int64 */ }
}

TEST_CASE("dist/dist.h") {  // no launcher here: a world of one, the same training loop
  int argc = 1;
  char name[] = "test_header_examples";
  char* args[] = {name, nullptr};
  char** argv = args;
  const mg::data::TensorDataset train(mg::test::rand_tensor({64, 1, 28, 28}, 3),
                                      Tensor::from_vector(std::vector<int64_t>(64, 7), {64}));
  mg::dist::Session session(&argc, &argv);  // MPI_Init under mpirun; one process otherwise
  auto model = mg::nn::make_mlp({784, 512, 512, 10});
  mg::dist::check_same_parameters(model->named_parameters());  // the same model everywhere
  mg::dist::broadcast(model->parameters());                    // start from rank 0's weights
  mg::data::DataLoader loader(train, {.batch_size = 16, .shard = mg::dist::rank(),
                                      .num_shards = mg::dist::world_size()});
  mg::optim::SGD sgd(model->parameters(), {.lr = 0.01f});
  mg::optim::Accumulator acc(sgd, {.steps = 2});  // 2 ranks x 2 x 16 = one step of 64
  mg::optim::train_epoch(*model, loader, acc, /*epoch=*/0);
  CHECK(acc.steps_taken() == 2);
}

TEST_CASE("minigrad.h") {
  Tensor x = mg::test::rand_tensor({2, 784}, 5);
  Tensor y = Tensor::from_vector(std::vector<int64_t>{3, 7}, {2});
  mg::manual_seed(0);
  auto model = mg::nn::make_mlp({784, 512, 512, 10});
  mg::optim::SGD opt(model->parameters(), {.lr = 0.01f, .momentum = 0.9f});
  opt.zero_grad();
  mg::cross_entropy(model->forward(x), y).backward();
  opt.step();
}

[[maybe_unused]] static void checkpoint_plan_example() {  // a measured VGG16 step: compiled only
  Tensor x = Tensor::zeros({8, 3, 224, 224});
  auto vgg = mg::nn::make_vgg16(2, 8);
  mg::nn::ChainCost cost = mg::nn::measure_chain(*vgg, {8, 3, 224, 224});   // one measured step
  mg::nn::Plan plan = mg::nn::make_plan(cost, "budget=120MB");    // or none, sqrt, segments=4
  std::printf("%s, predicted peak %zu bytes\n", plan.str().c_str(), plan.predicted_peak);
  Tensor logits = mg::nn::forward_with_plan(*vgg, plan, x);
}

TEST_CASE("nn/models.h") {
  auto mlp = mg::nn::make_mlp({784, 512, 512, 10});      // Flatten, Linear, ReLU, ... Linear
  auto vgg = mg::nn::make_vgg16(2, 8);                    // torchvision layout, widths / 8
  auto resnet = mg::nn::make_resnet50(1000);               // torchvision's names: loads its weights
}

TEST_CASE("ops/ops.h: checkpoint_multi") {
  mg::nn::Conv2d down(3, 4, 3, 2, 1), up(4, 4, 3, 1, 1);
  Tensor x = mg::test::rand_tensor({2, 3, 8, 8}, 9, true);
  std::vector<Tensor> out = mg::checkpoint_multi([&](const std::vector<Tensor>& in) {
    Tensor skip = down.forward(in[0]);
    return std::vector<Tensor>{up.forward(skip), skip};
  }, {x});                                  // out[0]: the block's output, out[1]: the skip
  CHECK(out.size() == 2);
}

TEST_CASE("nn/module.h") {
  Tensor x = mg::test::rand_tensor({2, 1, 28, 28}, 6);
  mg::manual_seed(0);
  mg::nn::Sequential mlp;
  mlp.add<mg::nn::Flatten>();
  mlp.add<mg::nn::Linear>(784, 512);
  mlp.add<mg::nn::ReLU>();
  mlp.add<mg::nn::Linear>(512, 10);
  Tensor logits = mlp.forward(x);               // x: (N, 1, 28, 28)
  for (auto& [name, p] : mlp.named_parameters()) std::puts(name.c_str());  // "1.weight", ...
}

TEST_CASE("nn/serialize.h") {
  const auto dir = std::filesystem::temp_directory_path() / "mg_header_examples";
  std::filesystem::create_directories(dir);
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  mg::nn::Sequential model = small_model();
  mg::nn::save_safetensors("epoch_3.safetensors", model.named_parameters(), {{"epoch", "3"}});
  mg::nn::load_into(model, "epoch_3.safetensors");   // checks names, shapes, dtypes
  std::filesystem::current_path(cwd);
  std::filesystem::remove_all(dir);
}

TEST_CASE("ops/ops.h") {
  Tensor x = mg::test::rand_tensor({4, 784}, 7), w1 = mg::test::rand_tensor({512, 784}, 8, true);
  Tensor b1 = Tensor::zeros({512}), w2 = mg::test::rand_tensor({10, 512}, 9, true), b2 = Tensor::zeros({10});
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3}, {4});
  Tensor h = mg::relu(mg::linear(x, w1, b1));            // x: (N, 784), w1: (512, 784)
  Tensor loss = mg::cross_entropy(mg::linear(h, w2, b2), labels);   // mean over N
  loss.backward();
}

TEST_CASE("optim/accumulate.h and minigrad/optim/optimizer.h") {
  mg::nn::Sequential model = small_model();
  mg::Tensor images = mg::Tensor::full({40, 1, 28, 28}, 0.5f);
  mg::data::TensorDataset data(images, Tensor::from_vector(std::vector<int64_t>(40, 1), {40}));
  mg::data::DataLoader loader(data, {.batch_size = 8});
  const int64_t e = 0, epoch = 0;
  {
    mg::data::Batch b;
    mg::optim::SGD sgd(model.parameters(), {.lr = 0.01f});
    mg::optim::Accumulator acc(sgd, {.steps = 4, .clip_norm = 1.0f});
    for (loader.start_epoch(e); loader.next(b);) {
      acc.backward(mg::cross_entropy(model(b.x), b.y, mg::Reduction::sum), b.size());
      if (acc.ready()) acc.step();    // read losses and norm once, clip, step, zero
    }
    acc.flush();                      // the last, possibly shorter window
  }
  {
    mg::optim::SGD opt(model.parameters(), {.lr = 0.01f, .momentum = 0.9f});
    mg::data::Batch b;
    for (loader.start_epoch(epoch); loader.next(b);) {
      opt.zero_grad();
      mg::cross_entropy(model.forward(b.x), b.y).backward();
      opt.step();
    }
  }
}

TEST_CASE("optim/train_state.h") {
  const auto tmp = std::filesystem::temp_directory_path() / "mg_header_examples_state";
  std::filesystem::create_directories(tmp);
  const std::string dir = tmp.string(), path = dir + "/epoch_3.state.safetensors";
  mg::nn::Sequential model = small_model();
  mg::optim::SGD opt(model.parameters(), {.lr = 0.01f, .momentum = 0.9f});
  mg::optim::save_train_state(dir + "/epoch_3.state.safetensors", model, opt, {.epoch = 3});
  mg::optim::TrainState st = mg::optim::load_train_state(path, model, opt);  // next epoch: st.epoch
  CHECK(st.epoch == 3);
  std::filesystem::remove_all(tmp);
}

TEST_CASE("util/bytes.h") {
  size_t budget = mg::parse_bytes("1.5GiB");              // 1610612736
  std::printf("%s\n", mg::format_bytes(budget).c_str());  // "1.50 GiB"
  CHECK(budget == 1610612736u);
  CHECK(mg::format_bytes(budget) == "1.50 GiB");
}

TEST_CASE("util/file.h") {
  const auto dir = std::filesystem::temp_directory_path() / "mg_header_examples_file";
  std::filesystem::create_directories(dir / "out");
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  mg::check_writable("out/run.json", "--json");            // before hours of training
  mg::write_file_atomic("out/run.json", "{\"loss\": 0.1}\n");  // the old file or the new one
  std::filesystem::current_path(cwd);
  CHECK(std::filesystem::file_size(dir / "out/run.json") == 14);
  std::filesystem::remove_all(dir);
}

// train/trainer.h: ResNet-18 planned for 2 GiB and trained for three epochs: compiled, not run.
[[maybe_unused]] static void trainer_example(std::shared_ptr<const mg::data::Dataset> data) {
  auto model = mg::nn::make_resnet18(10, 8);
  mg::optim::SGD sgd(model->parameters(), {.lr = 0.01f, .momentum = 0.9f});
  mg::Trainer trainer(*model, data, sgd,
                             {.batch_size = 256, .memory_budget = "2GiB", .epochs = 3, .save_dir = "runs/a"});
  mg::FitReport r = trainer.fit();   // "micro-batch 64 x 4 (256 per step), checkpoint [0,3) ..."
}
