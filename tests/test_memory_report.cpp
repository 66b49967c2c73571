// mg::nn::explain_memory (minigrad/nn/memory_report.h) through the Trainer, as --explain-memory
// prints it: on VGG16/8, ResNet-50/8 and the tiny GPT the terms sum to the predicted peak, and a
// real step's peak is that prediction (to 64 bytes). Offloaded plans report their host bytes, and
// the host pool's peak is them.
#include <algorithm>
#include <numeric>

#include "helpers.h"
#include <minigrad/data/tokens.h>
#include <minigrad/nn/memory_report.h>
#include <minigrad/train/trainer.h>

using namespace mg;

namespace {

size_t sum_of_terms(const nn::MemoryReport& r) {
  return std::accumulate(r.terms.begin(), r.terms.end(), size_t{0},
                         [](size_t s, const nn::MemoryTerm& t) { return s + t.bytes; });
}

// Plans, explains, trains two steps; checks the report against the plan and the measured peak.
void check_report(Trainer& t, const char* what) {
  const nn::TrainPlan& plan = t.plan();
  const nn::MemoryReport r = t.explain_memory();
  MESSAGE(std::string(what) << ": " << r.str());
  CHECK(sum_of_terms(r) == r.predicted_peak);
  CHECK(r.predicted_peak == plan.checkpoint.predicted_peak);
  CHECK(r.units.size() == t.cost().units.size());
  CHECK(r.host_bytes == plan.checkpoint.predicted_host_peak);
  CHECK_FALSE(r.advice.empty());
  reset_host_peak_memory_stats();
  const FitReport fit = t.fit();
  INFO(std::string(what) << ": measured " << fit.peak_in_use << ", predicted " << r.predicted_peak);
  // The step holds a few scalars the model does not count (the loss's sum and count of samples).
  const long off = static_cast<long>(fit.peak_in_use) - static_cast<long>(r.predicted_peak);
  CHECK(off >= 0);
  CHECK(off <= 64);
  CHECK(host_memory_stats().peak_in_use == r.host_bytes);
}

}  // namespace

TEST_CASE("explain_memory: VGG16/8, the terms are the predicted peak, and the step's peak is it") {
  const auto data = test::random_dataset(32, {3, 64, 64}, 2, 8);
  for (const char* plan : {"none", "sqrt", "[2,9)@host [9,16) [16,30)@host"}) {
    manual_seed(1);
    auto m = nn::make_vgg16(2, 8);
    optim::SGD opt(m->parameters(), {.lr = 0.001f, .momentum = 0.9f});
    Trainer t(*m, data, opt, {.batch_size = 16, .checkpoint = plan, .epochs = 1, .max_steps = 2,
                              .offload = nn::MeasureOptions::Offload::on, .progress = Progress::off});
    check_report(t, plan);
    const nn::MemoryReport r = t.explain_memory();
    if (std::string(plan).find("@host") != std::string::npos) {
      CHECK(r.host_bytes > 0);
      CHECK(r.units[4].choice == "offload");
      CHECK(r.units[4].offloaded > 0);
    }
    if (std::string(plan) == "none") {
      CHECK(r.units[0].choice == "keep");
      CHECK(r.terms[1].bytes == r.terms[0].bytes);  // gradient buffers as large as the parameters
    }
  }
}

TEST_CASE("explain_memory: ResNet-50/8 and the tiny GPT") {
  SUBCASE("ResNet-50/8 at 32x32, batch 8") {
    const auto data = test::random_dataset(16, {3, 32, 32}, 3, 9);
    manual_seed(2);
    auto m = nn::make_resnet50(3, 8);
    optim::SGD opt(m->parameters(), {.lr = 0.001f, .momentum = 0.9f});
    // [4,8) and sqrt can peak where unit 7 is replayed: its module holds its branch's output until
    // the add, a replay does not (Note [replay peak]). The first pass's forward peak taken for the
    // replay put them 16872 bytes above the step's peak once conv2d's small-image dW scratch
    // shrank (Note [dW of small images] in src/kernels/cpu/conv2d.cpp).
    for (const char* plan : {"sqrt", "[4,8)", "[0,4)@host [4,9) [9,14)@host"}) {
      Trainer t(*m, data, opt, {.batch_size = 8, .checkpoint = plan, .epochs = 1, .max_steps = 2,
                                .offload = nn::MeasureOptions::Offload::on, .progress = Progress::off});
      check_report(t, (std::string("ResNet-50/8, ") + plan).c_str());
      const nn::UnitCost& down = t.cost().units[7];  // Bottleneck(32, 16, stride=2, downsample)
      CHECK(down.replay_peak > 0);
      CHECK(down.replay_peak < down.fwd_peak);  // the module holds its branch's output until the add
    }
  }
  SUBCASE("tiny GPT (2 layers, width 64, vocabulary 512), 8 sequences of 64 tokens") {
    test::TinyGpt gpt;
    optim::AdamW opt(gpt.model->parameters(), {.lr = 1e-3f});
    for (const char* plan : {"none", "[0,2)@host [2,3)", "[1,3)@host"}) {
      Trainer t(*gpt.model, gpt.windows, opt,
                {.batch_size = 8, .checkpoint = plan, .epochs = 1, .max_steps = 2, .loss = gpt.loss(), .tiles = false,
                 .offload = nn::MeasureOptions::Offload::on, .progress = Progress::off});
      check_report(t, (std::string("tiny GPT, ") + plan).c_str());
      // Note [replay peak]: these modules hold nothing past its last reader, so a unit peaks as
      // high in its replay as in its first pass; the embedding's position ids, made by the first
      // pass and kept for the replay, count in both.
      for (const nn::UnitCost& u : t.cost().units) {
        CAPTURE(u.name);
        CHECK(u.replay_peak == u.fwd_peak);
      }
    }
  }
}

TEST_CASE("explain_memory with prefetch: the next micro-batch is a term, and the step's peak is the prediction") {
  // Note [prefetched micro-batches]: one more micro-batch (inputs and targets) on the device
  // through every step, in the plan's fixed part; on the CPU the same staging runs, so the
  // measured peak must still be the prediction (to 64 bytes), within a window of several
  // micro-batches and across windows.
  const auto data = test::random_dataset(48, {3, 64, 64}, 2, 10);
  for (const char* plan : {"none", "sqrt"}) {
    manual_seed(1);
    auto m = nn::make_vgg16(2, 8);
    optim::SGD opt(m->parameters(), {.lr = 0.001f, .momentum = 0.9f});
    Trainer t(*m, data, opt, {.batch_size = 16, .micro_batch = 8, .checkpoint = plan, .epochs = 1, .max_steps = 2,
                              .progress = Progress::off, .prefetch = Prefetch::on});
    t.plan();
    const nn::MemoryReport r = t.explain_memory();
    const auto staged = std::find_if(r.terms.begin(), r.terms.end(), [](const nn::MemoryTerm& term) {
      return term.name == "the next micro-batch";
    });
    REQUIRE(staged != r.terms.end());
    CHECK(staged->bytes == 8 * (3 * 64 * 64 * sizeof(float) + sizeof(int64_t)));
    CHECK(t.cost().staged_bytes == staged->bytes);
    check_report(t, (std::string("VGG16/8 with prefetch, ") + plan).c_str());
  }
}
