// mg::Trainer (Note [the trainer's step] in minigrad/train/trainer.h): the split does not
// change the bits, a batch that cannot fit is refused at once, and out of memory mid-epoch plus a
// resume from the save folder end with the bits of an uninterrupted run; an accumulation schedule
// with the epoch's short window kept is train_epoch's loop, bit for bit, across a resume.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "helpers.h"
#include <minigrad/core/memory.h>
#include <minigrad/data/loader.h>
#include <minigrad/nn/models.h>
#include <minigrad/train/trainer.h>

using namespace mg;

namespace {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

struct Uncap {
  ~Uncap() { set_memory_limit(Device::cpu(), 0); }
};

}  // namespace

TEST_CASE("Trainer: 16 x 4 and one micro-batch of 64 give the same bits over two epochs") {
  const auto data = test::random_dataset(256, {1, 8, 8}, 10, 3);
  std::vector<std::vector<uint8_t>> ref;
  for (int64_t micro : {0, 16, 24}) {  // 24: windows of 24, 24, 16
    manual_seed(11);
    auto m = nn::make_mlp({64, 32, 10});
    optim::SGD opt(m->parameters(), {.lr = 0.05f, .momentum = 0.9f});
    Trainer t(*m, data, opt, {.batch_size = 64, .micro_batch = micro, .epochs = 2, .clip_norm = 1.0f,
                                     .seed = 5, .progress = Progress::off});
    const FitReport r = t.fit();
    CHECK(r.steps == 2 * (256 / 64));
    CHECK(r.plan.micro_batch == (micro ? micro : 64));
    CHECK(r.plan.accumulation == (micro ? (64 + micro - 1) / micro : 1));
    const auto bits = test::state_bits(*m);
    if (ref.empty()) {
      ref = bits;
    } else {
      CHECK_MESSAGE(bits == ref, "micro-batch " << micro);
    }
  }
}

TEST_CASE("Trainer: plan() zeroes the gradient buffers, and a run from dirty ones has the bits of a clean one") {
  // Measuring then keeps no copy of them (MeasureOptions::gradients_zero); a window starts from
  // zero anyway, so what a user left in them before fit() never reaches a step.
  const auto data = test::random_dataset(128, {1, 8, 8}, 10, 3);
  std::vector<std::vector<uint8_t>> ref;
  for (bool dirty : {false, true}) {
    manual_seed(11);
    auto m = nn::make_mlp({64, 32, 10});
    optim::SGD opt(m->parameters(), {.lr = 0.05f, .momentum = 0.9f});
    if (dirty) {
      for (Tensor g : opt.grads()) g.fill_(3.0f);
    }
    Trainer t(*m, data, opt, {.batch_size = 32, .checkpoint = "min", .epochs = 1, .seed = 5, .progress = Progress::off});
    t.plan();
    for (const Tensor& g : opt.grads()) {
      const std::vector<float> v = g.to_vector<float>();
      CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }));
    }
    CHECK(t.plan_times().preflight_ms > 0);
    CHECK(t.plan_times().measure_ms > 0);
    t.fit();
    const auto bits = test::state_bits(*m);
    if (ref.empty()) {
      ref = bits;
    } else {
      CHECK(bits == ref);
    }
  }
}

TEST_CASE("Trainer: plan() again after it threw starts afresh, and the run has the bits of one that never failed") {
  // Under a cap the batch cannot fit, plan() throws; with the cap lifted, plan() again must not
  // carry what the failed attempt left: its copy of BatchNorm's buffers (read by every window),
  // pre-flight costs, re-plans.
  Uncap uncap;
  const auto data = test::random_dataset(64, {1, 8, 8}, 10, 3);
  const TrainerOptions o{.batch_size = 16, .checkpoint = "min", .epochs = 1, .seed = 5, .progress = Progress::off};
  std::vector<std::vector<uint8_t>> ref;
  std::string ref_plan;
  for (bool fail_first : {false, true}) {
    manual_seed(11);
    auto m = std::make_shared<nn::Sequential>();
    m->add<nn::Flatten>();
    m->add<nn::Linear>(64, 32);
    m->add<nn::BatchNorm1d>(32);
    m->add<nn::ReLU>();
    m->add<nn::Linear>(32, 10);
    optim::SGD opt(m->parameters(), {.lr = 0.05f, .momentum = 0.9f});
    Trainer t(*m, data, opt, o);
    if (fail_first) {
      set_memory_limit(Device::cpu(), memory_stats(Device::cpu()).in_use + 1024);
      CHECK_THROWS_AS(t.plan(), Error);
      set_memory_limit(Device::cpu(), 0);
    }
    const nn::TrainPlan p = t.plan();
    CHECK(t.replans().empty());
    const FitReport r = t.fit();
    CHECK(r.replans.empty());
    if (ref.empty()) {
      ref = test::state_bits(*m);
      ref_plan = p.str();
    } else {
      CHECK(p.str() == ref_plan);
      CHECK(test::state_bits(*m) == ref);
    }
  }
}

TEST_CASE("Trainer: 16 x 4 with offloaded and replayed segments gives the bits of one batch of 64") {
  // Exact accumulation under a plan that offloads (Note [offload]), dropout on: the same bits as
  // one micro-batch of 64 without checkpointing, and the host pool empty after each step.
  const auto data = test::random_dataset(128, {3, 32, 32}, 3, 4);
  std::vector<std::vector<uint8_t>> ref;
  for (const auto& [micro, plan] : std::vector<std::pair<int64_t, std::string>>{
           {0, "none"}, {16, "[0,5)@host [5,9) [9,16)@host"}, {16, "[2,12)@host"}}) {
    manual_seed(12);
    auto m = nn::make_vgg16(3, 16, 0.3f);
    optim::SGD opt(m->parameters(), {.lr = 0.01f, .momentum = 0.9f});
    Trainer t(*m, data, opt, {.batch_size = 64, .micro_batch = micro, .checkpoint = plan, .epochs = 1, .seed = 5,
                              .offload = nn::MeasureOptions::Offload::on, .progress = Progress::off});
    const FitReport r = t.fit();
    CHECK(r.steps == 2);
    CHECK(host_memory_stats().in_use == 0);
    const auto bits = test::state_bits(*m);
    if (ref.empty()) {
      ref = bits;
    } else {
      CHECK_MESSAGE(bits == ref, "micro-batch " << micro << ", plan " << plan);
    }
  }
}

TEST_CASE("Trainer: a batch that cannot fit is refused at once, naming what it needs and what there is") {
  Uncap uncap;
  const auto data = test::random_dataset(64, {1, 8, 8}, 10, 4);
  const auto many = test::random_dataset(100000, {1, 8, 8}, 10, 4);
  auto m = nn::make_mlp({64, 256, 10});
  optim::SGD opt(m->parameters(), {.lr = 0.01f});
  // 8 MiB more than what the data sets and the model hold.
  set_memory_limit(Device::cpu(), memory_stats(Device::cpu()).in_use + (size_t{8} << 20));
  const std::string there = format_bytes(memory_capacity(Device::cpu()));
  const auto t0 = std::chrono::steady_clock::now();
  // A micro-batch of 100000 fixed under a budget of 8 MiB: its activations alone are far over it.
  // The check measures one sample and extrapolates: it does not try the batch.
  Trainer big(*m, many, opt, {.batch_size = 100000, .memory_budget = "8MiB", .micro_batch = 100000,
                              .progress = Progress::off});
  try {
    big.plan();
    FAIL("a micro-batch of 100000 was planned under 8 MiB");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(what.find("no plan fits a budget of 8.00 MiB: a micro-batch of 100000 samples needs about") !=
                      std::string::npos, what);
    CHECK_MESSAGE(what.find("a smaller micro-batch") != std::string::npos, what);
  }
  // Without a budget the same batch is planned jointly for what the device has (the cap), in
  // micro-batches: the samples of a step kept.
  Trainer split(*m, many, opt, {.batch_size = 100000, .progress = Progress::off});
  const nn::TrainPlan& p = split.plan();
  CHECK(p.effective_batch == 100000);
  CHECK(p.micro_batch < 100000);
  CHECK(p.predicted_peak <= memory_capacity(Device::cpu()));
  REQUIRE(split.replans().size() == 1);
  CHECK(split.replans()[0].step == -1);
  CHECK(split.replans()[0].cause.find("a micro-batch of 100000 samples needs about") != std::string::npos);
  CHECK(split.replans()[0].cause.find("has " + there) != std::string::npos);
  // A cap under what one sample needs: nothing fits, and the error says what there is.
  set_memory_limit(Device::cpu(), memory_stats(Device::cpu()).in_use + (size_t{64} << 10));
  Trainer none(*m, data, opt, {.batch_size = 64, .progress = Progress::off});
  CHECK_THROWS_WITH_AS(none.plan(), doctest::Contains("no plan fits what the device has"), Error);
  set_memory_limit(Device::cpu(), memory_stats(Device::cpu()).in_use + (size_t{8} << 20));
  // A budget under what one sample needs.
  Trainer tiny(*m, data, opt, {.batch_size = 64, .memory_budget = "100KB", .progress = Progress::off});
  try {
    tiny.plan();
    FAIL("planned under 100 KB");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("the memory budget is") != std::string::npos);
  }
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 10.0);
}

TEST_CASE("Trainer: ResNet-18 under a budget, out of memory mid-epoch and a resume: the bits of a run planned for the "
          "lower cap") {
  // Note [the trainer's step]: the micro-batch is fixed, so a re-plan changes only the checkpoint
  // plan, which changes no bit (checkpointing is exact), and BatchNorm sees the same micro-batches.
  Uncap uncap;
  const Device cpu = Device::cpu();
  const int64_t B = 8, micro = 4;
  const auto data = test::random_dataset(32, {3, 24, 24}, 10, 9);  // 4 steps per epoch
  auto fresh = [](uint64_t seed) {  // width / 4 at 24 x 24: narrower or smaller, the stem sets every plan's peak
    manual_seed(seed);
    return nn::make_resnet18(10, 4);
  };

  // The caps: above the plain step's predicted peak, and a quarter of the way from it down to the least.
  size_t high = 0, low = 0;
  {
    auto m = fresh(1);
    optim::SGD opt(m->parameters(), {.lr = 0.02f, .momentum = 0.9f});
    const nn::ChainCost cost = nn::measure_chain(*m, {micro, 3, 24, 24});
    const size_t floor = nn::min_feasible_peak(cost), full = nn::plan_none(cost).predicted_peak;
    REQUIRE(floor < full);
    high = full * 2;
    low = (floor + 3 * full) / 4;  // room for the trainer's copy of the buffers too
  }
  const TrainerOptions base{.batch_size = B, .micro_batch = micro, .epochs = 2, .seed = 7,
                                   .progress = Progress::off};

  // U: planned for the low cap from the start, never interrupted.
  std::vector<std::vector<uint8_t>> u_bits;
  std::string u_plan;
  {
    auto m = fresh(1);
    optim::SGD opt(m->parameters(), {.lr = 0.02f, .momentum = 0.9f});
    set_memory_limit(cpu, low);
    TrainerOptions o = base;
    o.memory_budget = std::to_string(low);
    Trainer t(*m, data, opt, o);
    const FitReport r = t.fit();
    set_memory_limit(cpu, 0);
    CHECK(r.replans.empty());
    CHECK(r.steps == 8);
    CHECK(r.peak_in_use <= low);
    CHECK_FALSE(r.plan.checkpoint.segments.empty());  // the low cap needs checkpointing
    u_plan = r.plan.str();
    u_bits = test::state_bits(*m);
  }

  // A: planned for the high budget; after its second step a callback lowers the cap, the third
  // runs out of memory, is re-planned and redone; the first epoch is saved, then the run stops.
  TempDir dir("mg_trainer_resume");
  {
    auto m = fresh(1);
    optim::SGD opt(m->parameters(), {.lr = 0.02f, .momentum = 0.9f});
    TrainerOptions o = base;
    o.memory_budget = std::to_string(high);
    o.epochs = 1;
    o.save_dir = dir.path.string();
    TrainerCallbacks cb{.on_step = [&](const StepReport& s) {
      if (s.step == 1) set_memory_limit(cpu, low);
    }};
    Trainer t(*m, data, opt, o, cb);
    CHECK(t.plan().checkpoint.segments.empty());  // the high budget: no checkpointing
    const FitReport r = t.fit();
    REQUIRE(r.replans.size() == 1);
    CHECK(r.replans[0].step == 2);
    CHECK(r.replans[0].memory == low);
    CHECK(r.replans[0].to == u_plan);
    CHECK(r.steps == 4);
    REQUIRE(r.epochs.size() == 1);
    CHECK(std::filesystem::exists(r.epochs[0].saved + ".safetensors"));
  }

  // A again, in a new process as far as the model knows (other initial weights): it resumes after
  // epoch 1 from the save folder and trains epoch 2 under the low budget. (No cap: on the CPU the
  // file's tensors, read while resuming, count in the same allocator as the steps.)
  set_memory_limit(cpu, 0);
  {
    auto m = fresh(99);
    optim::SGD opt(m->parameters(), {.lr = 0.02f, .momentum = 0.9f});
    TrainerOptions o = base;
    o.memory_budget = std::to_string(low);
    o.save_dir = dir.path.string();
    Trainer t(*m, data, opt, o);
    const FitReport r = t.fit();
    CHECK(r.resumed_from_epoch == 1);
    CHECK(r.steps == 4);
    CHECK(r.peak_in_use <= low);
    CHECK(r.plan.str() == u_plan);
    CHECK(test::state_bits(*m) == u_bits);
  }
}

TEST_CASE("Trainer: an accumulation schedule with the short last window kept equals train_epoch's epochs") {
  // 200 samples, micro-batches of 16 (the last of an epoch 8), N = 4 in epoch 0 and 2 from epoch 1:
  // the Trainer's windows are train_epoch's over a DataLoader with the same seed, to the bit.
  const auto data = test::random_dataset(200, {1, 8, 8}, 10, 5);
  const optim::AccumulationSchedule sched = optim::AccumulationSchedule::parse("0:4,1:2");
  std::vector<std::vector<uint8_t>> ref;
  {
    manual_seed(3);
    auto m = nn::make_mlp({64, 32, 10});
    optim::SGD opt(m->parameters(), {.lr = 0.05f, .momentum = 0.9f});
    data::DataLoader loader(*data, {.batch_size = 16, .seed = 9});
    optim::Accumulator acc(opt, {.steps = 4});
    for (int64_t e = 0; e < 3; ++e) {
      acc.set_steps(sched.steps_for_epoch(e));
      optim::train_epoch(*m, loader, acc, e);
    }
    ref = test::state_bits(*m);
  }
  TempDir dir("mg_trainer_schedule");
  for (const bool split : {false, true}) {  // split: two epochs, then a fresh Trainer resumes from the file
    manual_seed(3);
    auto m = nn::make_mlp({64, 32, 10});
    optim::SGD opt(m->parameters(), {.lr = 0.05f, .momentum = 0.9f});
    TrainerOptions o{.batch_size = 16, .epochs = split ? 2 : 3, .accumulation = sched, .drop_last = false,
                     .seed = 9, .progress = Progress::off};
    o.signature = {{"config.lr", "0.05"}};
    if (split) o.save_dir = dir.path.string();
    FitReport r = Trainer(*m, data, opt, o).fit();
    CHECK(r.epochs[0].accumulation == 4);
    CHECK(r.epochs[0].steps == 4);   // 13 micro-batches: 4 + 4 + 4 + 1
    CHECK(r.epochs[0].micro_batches == 13);
    CHECK(r.epochs[0].samples == 200);
    CHECK(r.epochs[1].steps == 7);   // 13 micro-batches in windows of 2
    if (split) {
      auto m2 = nn::make_mlp({64, 32, 10});
      optim::SGD opt2(m2->parameters(), {.lr = 0.05f, .momentum = 0.9f});
      o.epochs = 3;
      o.save_dir.clear();
      Trainer t(*m2, data, opt2, o);
      CHECK(t.resume((dir.path / "epoch_2.safetensors").string()) == (dir.path / "epoch_2.state.safetensors").string());
      r = t.fit();
      CHECK(r.resumed_from_epoch == 2);
      CHECK(r.steps == 7);
      m = std::move(m2);
    }
    CHECK(test::state_bits(*m) == ref);
  }
  // A folder with no checkpoint, and a file that is not there, are errors naming them.
  auto m = nn::make_mlp({64, 32, 10});
  optim::SGD opt(m->parameters(), {.lr = 0.05f});
  Trainer t(*m, data, opt, {.batch_size = 16, .progress = Progress::off});
  std::filesystem::create_directories(dir.path / "empty");
  CHECK_THROWS_WITH_AS(t.resume((dir.path / "empty").string()), doctest::Contains("holds no complete epoch_K"), Error);
  CHECK_THROWS_AS(t.resume((dir.path / "epoch_9.safetensors").string()), Error);
}

TEST_CASE("Trainer: Normalize::micro_batches is the usual recipe, and a schedule longer than the data is refused") {
  const auto data = test::random_dataset(64, {1, 8, 8}, 10, 5);
  auto m = nn::make_mlp({64, 32, 10});
  optim::SGD opt(m->parameters(), {.lr = 0.05f});
  const FitReport r = Trainer(*m, data, opt, {.batch_size = 16, .micro_batch = 8, .normalize = optim::Normalize::micro_batches,
                                              .progress = Progress::off}).fit();
  CHECK(r.steps == 4);
  CHECK(std::isfinite(r.losses.back()));
  CHECK_THROWS_WITH_AS(Trainer(*m, data, opt, {.batch_size = 16, .accumulation = optim::AccumulationSchedule(8),
                                               .progress = Progress::off}),
                       doctest::Contains("makes a step of 128 samples, more than the data set's 64"), Error);
}

namespace {

// One training run's result: the weights' and buffers' bits and the losses, with prefetch on or off.
struct Run {
  std::vector<std::vector<uint8_t>> bits;
  std::vector<double> losses;
  FitReport report;
};

// The inner data set's samples, except one that cannot be read (a damaged file in an image folder).
class Unreadable : public data::Dataset {
 public:
  Unreadable(std::shared_ptr<const data::Dataset> inner, int64_t bad) : inner_(std::move(inner)), bad_(bad) {}
  int64_t size() const override { return inner_->size(); }
  Shape sample_shape() const override { return inner_->sample_shape(); }

 private:
  void read(std::span<const int64_t> indices, int64_t epoch, std::span<float> x, std::span<int64_t> y) const override {
    for (int64_t i : indices) MG_CHECK(i != bad_, "image " << i << " is damaged: not a JPEG file (malformed header)");
    inner_->read_batch(indices, epoch, x, y);
  }
  std::shared_ptr<const data::Dataset> inner_;
  int64_t bad_;
};

}  // namespace

TEST_CASE("Trainer: prefetching the next micro-batch changes no bit (accumulation, short last windows, windows)") {
  // Note [prefetched micro-batches]: on the CPU the same reading thread and staging run, with plain
  // copies, so the bits with prefetch on must be those with it off.
  auto run = [](auto make_model, std::shared_ptr<const data::Dataset> data, TrainerOptions o, Prefetch p) {
    manual_seed(21);
    auto m = make_model();
    optim::SGD opt(m->parameters(), {.lr = 0.05f, .momentum = 0.9f});
    o.prefetch = p;
    o.progress = Progress::off;
    Run r;
    r.report = Trainer(*m, data, opt, o).fit();
    CHECK(r.report.prefetch == (p == Prefetch::on));
    r.bits = test::state_bits(*m);
    r.losses = r.report.losses;
    return r;
  };
  SUBCASE("MLP: micro-batches of 24 in windows of 64 then 128 (a schedule), the epochs' short last windows kept") {
    // 200 samples: epoch 0 in windows of 64 (the last of 8), epoch 1 of 128 (the last of 72); the
    // micro-batches 24, 24, 16 per group of 64, the last ones shorter.
    const auto data = test::random_dataset(200, {1, 8, 8}, 10, 6);
    const TrainerOptions o{.batch_size = 64, .micro_batch = 24, .epochs = 2, .clip_norm = 1.0f,
                           .accumulation = optim::AccumulationSchedule::parse("0:1,1:2"), .drop_last = false, .seed = 4};
    auto mlp = [] { return nn::make_mlp({64, 32, 10}); };
    const Run off = run(mlp, data, o, Prefetch::off), on = run(mlp, data, o, Prefetch::on);
    CHECK(on.report.steps == 4 + 2);
    CHECK(on.losses == off.losses);
    CHECK(on.bits == off.bits);
    CHECK(on.report.step_data_ms.size() == 6);
    CHECK(on.report.step_system_allocs.size() == 6);
    // The host's issue time ends before step()'s read, the step's after its update: never longer.
    REQUIRE(on.report.step_issue_ms.size() == 6);
    for (size_t i = 0; i < 6; ++i) {
      CHECK(on.report.step_issue_ms[i] >= 0.0);
      CHECK(on.report.step_issue_ms[i] <= on.report.step_ms[i]);
    }
  }
  SUBCASE("VGG16/16 with dropout, a checkpoint plan, micro-batches of 12 in steps of 32, the last step of 8") {
    const auto data = test::random_dataset(72, {3, 32, 32}, 3, 7);
    const TrainerOptions o{.batch_size = 32, .micro_batch = 12, .checkpoint = "sqrt", .epochs = 1, .drop_last = false,
                           .seed = 2};
    auto vgg = [] { return nn::make_vgg16(3, 16, 0.3f); };
    const Run off = run(vgg, data, o, Prefetch::off), on = run(vgg, data, o, Prefetch::on);
    CHECK(on.report.steps == 3);
    CHECK(on.losses == off.losses);
    CHECK(on.bits == off.bits);
  }
  SUBCASE("a tiny GPT's windows of a token stream, micro-batches of 3 rows of 8") {
    std::vector<Run> runs;
    for (Prefetch p : {Prefetch::off, Prefetch::on}) {
      test::TinyGpt gpt;
      optim::AdamW opt(gpt.model->parameters(), {.lr = 1e-3f});
      const FitReport r = Trainer(*gpt.model, std::shared_ptr<const data::WindowData>(gpt.windows), opt,
                                  {.batch_size = 8, .micro_batch = 3, .max_steps = 3, .loss = gpt.loss(),
                                   .progress = Progress::off, .prefetch = p})
                              .fit();
      CHECK(r.steps == 3);
      runs.push_back({test::state_bits(*gpt.model), r.losses, r});
    }
    CHECK(runs[1].losses == runs[0].losses);
    CHECK(runs[1].bits == runs[0].bits);
  }
}

TEST_CASE("Trainer: a micro-batch that cannot be read throws its own error at its step, prefetched or not") {
  // The sample at position 40 of epoch 0's order is damaged: windows of 16 in micro-batches of 8,
  // so the error belongs to step 3's second micro-batch. Read ahead, it was met during step 3's
  // first micro-batch (or before); it must still surface at that step, as the same error, after
  // the steps before it were taken, with no crash and no hang.
  const auto inner = test::random_dataset(96, {1, 8, 8}, 10, 8);
  const int64_t bad = data::epoch_permutation(96, 3, 0)[40];
  const auto data = std::make_shared<Unreadable>(inner, bad);
  std::vector<std::string> errors;
  std::vector<std::vector<std::vector<uint8_t>>> bits;
  for (Prefetch p : {Prefetch::off, Prefetch::on}) {
    manual_seed(5);
    auto m = nn::make_mlp({64, 32, 10});
    optim::SGD opt(m->parameters(), {.lr = 0.05f, .momentum = 0.9f});
    int64_t steps = 0;
    TrainerCallbacks cb{.on_step = [&](const StepReport&) { ++steps; }};
    Trainer t(*m, data, opt, {.batch_size = 16, .micro_batch = 8, .epochs = 2, .seed = 3, .progress = Progress::off,
                              .prefetch = p},
              cb);
    try {
      t.fit();
      FAIL("the damaged sample was never read");
    } catch (const Error& e) {
      errors.push_back(e.what());
    }
    CHECK(steps == 2);  // steps 1 and 2 were taken, step 3 was not
    bits.push_back(test::state_bits(*m));
  }
  CHECK_MESSAGE(errors[0].find("image " + std::to_string(bad) + " is damaged") != std::string::npos, errors[0]);
  CHECK(errors[1] == errors[0]);
  CHECK(bits[1] == bits[0]);
}

TEST_CASE("Trainer: out of memory with prefetch on drops the staged micro-batch, redoes the window, keeps the bits") {
  // A cap lowered after step 2 makes step 3 run out of memory with the next micro-batch staged: it
  // is dropped before re-planning, and the window is read again in the new plan's micro-batches.
  // The run must re-plan at the same step as with prefetch off and end with the same bits.
  Uncap uncap;
  const Device cpu = Device::cpu();
  const auto data = test::random_dataset(64, {3, 32, 32}, 3, 9);  // 4 steps of 16
  size_t high = 0, low = 0;
  {
    manual_seed(1);
    auto m = nn::make_vgg16(3, 16);
    optim::SGD opt(m->parameters(), {.lr = 0.02f, .momentum = 0.9f});
    const nn::ChainCost cost = nn::measure_chain(*m, {8, 3, 32, 32});
    const size_t floor = nn::min_feasible_peak(cost), full = nn::plan_none(cost).predicted_peak;
    REQUIRE(floor < full);
    high = full * 2;
    low = (floor + 3 * full) / 4;
  }
  std::vector<std::vector<std::vector<uint8_t>>> bits;
  std::vector<size_t> peaks;  // step 1's, before the cap
  for (Prefetch p : {Prefetch::off, Prefetch::on}) {
    manual_seed(1);
    auto m = nn::make_vgg16(3, 16);
    optim::SGD opt(m->parameters(), {.lr = 0.02f, .momentum = 0.9f});
    TrainerCallbacks cb{.on_step = [&](const StepReport& s) {
      if (s.step == 1) set_memory_limit(cpu, low);
    }};
    Trainer t(*m, data, opt, {.batch_size = 16, .memory_budget = std::to_string(high), .micro_batch = 8, .epochs = 1,
                              .seed = 7, .progress = Progress::off, .prefetch = p},
              cb);
    const FitReport r = t.fit();
    set_memory_limit(cpu, 0);
    REQUIRE(r.replans.size() == 1);
    CHECK(r.replans[0].step == 2);
    CHECK(r.steps == 4);
    REQUIRE(r.step_peak_in_use.size() == 4);
    CHECK(r.step_peak_in_use[2] <= low);  // the redone step and the next, under the cap
    CHECK(r.step_peak_in_use[3] <= low);
    peaks.push_back(r.step_peak_in_use[0]);
    bits.push_back(test::state_bits(*m));
  }
  CHECK(bits[1] == bits[0]);
  CHECK(peaks[1] - peaks[0] == 8 * (3 * 32 * 32 * sizeof(float) + sizeof(int64_t)));  // the staged micro-batch
}
