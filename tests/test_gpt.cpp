// GPT-2 (minigrad/nn/models.h, Note [GPT-2 as a chain]) without a reference: exact checkpointing
// with transformer blocks as units, accumulation counting tokens, the same bits at any thread
// count, and errors. tests/test_gpt_torch.cpp checks the math against PyTorch.
#include <minigrad/minigrad.h>

#include "helpers.h"
#include "ops/op.h"
#include "optim/grad_buckets.h"

using namespace mg;

namespace {

const nn::GPTConfig kTiny{.vocab_size = 96, .block_size = 24, .n_layer = 3, .n_head = 2, .n_embd = 16};

Tensor random_tokens(int64_t b, int64_t t, uint64_t seed, int64_t vocab) {
  std::vector<int64_t> v(static_cast<size_t>(b * t));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x = static_cast<int64_t>(s % static_cast<uint64_t>(vocab));
  }
  return Tensor::from_vector(v, {b, t});
}

// Targets: the next token, with the last position of every sequence ignored (-100).
Tensor next_tokens(const Tensor& tokens) {
  const int64_t b = tokens.size(0), t = tokens.size(1);
  std::vector<int64_t> in = tokens.to_vector<int64_t>(), out(in.size(), -100);
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j + 1 < t; ++j) out[static_cast<size_t>(i * t + j)] = in[static_cast<size_t>(i * t + j + 1)];
  }
  return Tensor::from_vector(out, {b * t});
}

int64_t counted(const Tensor& targets) {
  int64_t n = 0;
  for (int64_t t : targets.to_vector<int64_t>()) n += t != -100;
  return n;
}

// `steps` AdamW steps on fixed batches; each step's batch of `batch` sequences is run as
// `batch / micro` micro-batches under the plan. With dropout, each micro-batch's forward runs in
// the step's sample window (Note [dropout by sample]), so a sample's masks do not depend on the split.
std::shared_ptr<nn::Sequential> train(const std::vector<nn::Segment>& plan, int64_t batch, int64_t micro, int steps,
                                      float dropout = 0.0f) {
  manual_seed(3);
  nn::GPTConfig config = kTiny;
  config.dropout = dropout;
  auto m = nn::make_gpt2(config);
  optim::AdamW opt(m->parameters(), {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f,
                                     .decay_matrices_only = true});
  optim::Accumulator acc(opt, {.steps = static_cast<int>(batch / micro), .clip_norm = 1.0f});
  for (int s = 0; s < steps; ++s) {
    const Tensor tokens = random_tokens(batch, 20, 10 + static_cast<uint64_t>(s), kTiny.vocab_size);
    for (int64_t k = 0; k < batch / micro; ++k) {
      const std::vector<int64_t> all = tokens.to_vector<int64_t>();
      const std::vector<int64_t> part(all.begin() + k * micro * 20, all.begin() + (k + 1) * micro * 20);
      const Tensor x = Tensor::from_vector(part, {micro, 20});
      const Tensor y = next_tokens(x);
      Tensor loss;
      {
        const SampleWindowGuard window = acc.sample_window(k * micro);  // rows, not the tokens acc counts
        loss = cross_entropy(nn::forward_with_plan(*m, plan, x).reshape({-1, kTiny.vocab_size}), y, Reduction::sum);
      }
      acc.backward(loss, counted(y));
    }
    REQUIRE(acc.ready());
    acc.step();
  }
  return m;
}

// Three steps of the tiny GPT through the Trainer (AdamW, batch 8, no tiles), its blocks' c_fc and
// GELU fused or not, their first residual add and ln_2 fused or not: the report and the
// parameters' bits.
std::pair<FitReport, std::vector<std::vector<uint8_t>>> fit_tiny_gpt(const char* plan, Precision p, bool fused_gelu,
                                                                     bool fused_residual) {
  test::TinyGpt gpt(false, fused_gelu, fused_residual);
  optim::AdamW opt(gpt.model->parameters(), {.lr = 1e-3f});
  Trainer t(*gpt.model, gpt.windows, opt,
            {.batch_size = 8, .checkpoint = plan, .epochs = 1, .max_steps = 3, .loss = gpt.loss(), .tiles = false,
             .precision = p, .progress = Progress::off});
  const FitReport r = t.fit();
  return {r, test::state_bits(*gpt.model)};
}

}  // namespace

TEST_CASE("make_gpt2: Hugging Face's names, tied head, shapes, nanoGPT's initialisation") {
  manual_seed(1);
  auto m = nn::make_gpt2(kTiny);
  const auto named = m->named_parameters();
  CHECK(named.front().first == "transformer.wte.weight");
  CHECK(named[1].first == "transformer.wpe.weight");
  CHECK(named[2].first == "transformer.h.0.ln_1.weight");
  CHECK(named.back().first == "transformer.ln_f.bias");
  auto has = [&](const std::string& n) {
    return std::any_of(named.begin(), named.end(), [&](const auto& e) { return e.first == n; });
  };
  CHECK(has("transformer.h.2.attn.c_attn.weight"));
  CHECK(has("transformer.h.2.mlp.c_proj.bias"));
  CHECK(!has("lm_head.weight"));  // tied to wte: one tensor, one parameter
  // 12 n_embd^2 + 13 n_embd per block, embeddings, final LayerNorm (GPT-2's count, head tied).
  const int64_t c = kTiny.n_embd;
  CHECK(m->parameter_count() == kTiny.n_layer * (12 * c * c + 13 * c) + (kTiny.vocab_size + kTiny.block_size) * c + 2 * c);
  const Tensor logits = m->forward(random_tokens(2, 7, 1, kTiny.vocab_size));
  CHECK(logits.shape() == Shape{2, 7, kTiny.vocab_size});
  // Weights N(0, 0.02): their spread, roughly.
  const std::vector<float> w = named.front().second.to_vector<float>();
  double sq = 0;
  for (float v : w) sq += static_cast<double>(v) * v;
  CHECK(std::sqrt(sq / static_cast<double>(w.size())) == doctest::Approx(0.02).epsilon(0.1));
  // The same count for GPT-2's own sizes is its published 124,439,808 (head tied); building that
  // model here would take seconds, so the formula checked above is evaluated.
  CHECK(12 * (12 * 768 * 768 + 13 * 768) + (50257 + 1024) * 768 + 2 * 768 == 124439808);
}

TEST_CASE("GPT: checkpointed training (blocks as units) gives the same bits for every plan, dropout or not") {
  for (const float dropout : {0.0f, 0.1f}) {
  CAPTURE(dropout);
  const auto ref = train({}, 4, 4, 2, dropout);
  manual_seed(3);
  auto probe = nn::make_gpt2(kTiny);
  const nn::ChainCost cost = nn::measure_chain(*probe, random_tokens(4, 20, 99, kTiny.vocab_size));
  CHECK(cost.units.size() == static_cast<size_t>(kTiny.n_layer) + 3);  // embeddings, blocks, ln_f, head
  const size_t lo = nn::min_feasible_peak(cost), hi = nn::plan_none(cost).predicted_peak;
  std::vector<std::vector<nn::Segment>> plans = {nn::plan_sqrt(cost).segments, nn::plan_min_peak(cost).segments,
                                                 {{1, 4}}, {{0, probe->size()}}};
  if (lo < hi) plans.push_back(nn::plan_budget(cost, lo + (hi - lo) / 2).segments);
  for (const auto& plan : plans) {
    const auto m = train(plan, 4, 4, 2, dropout);
    const auto a = m->state_dict(), b = ref->state_dict();
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first);
      CHECK(test::bit_equal(a[i].second, b[i].second));
    }
  }
  if (dropout > 0) {  // the masks were drawn: other weights than without dropout
    CHECK_FALSE(test::bit_equal(ref->state_dict()[2].second, train({}, 4, 4, 2)->state_dict()[2].second));
  }
  }
}

TEST_CASE("GPT: 4 micro-batches of 8 sequences equal one batch of 32, counting tokens, dropout or not") {
  for (const float dropout : {0.0f, 0.1f}) {
  CAPTURE(dropout);
  const auto big = train({}, 32, 32, 3, dropout), small = train({}, 32, 8, 3, dropout);
  const auto a = small->state_dict(), b = big->state_dict();
  double worst = 0;
  std::string worst_name;
  for (size_t i = 0; i < a.size(); ++i) {  // the key bias of c_attn within Adam's bound (3 steps of lr 1e-2): docs/gpt.md
    const double e = test::gpt_param_diff(a[i].first, a[i].second, b[i].second, kTiny.n_embd, 3 * 1e-2f);
    if (e > worst) worst = e, worst_name = a[i].first;
  }
  MESSAGE("4 x 8 against 32, three AdamW steps, dropout " << dropout << ": worst relative difference " << worst << " ("
                                                           << worst_name << ")");
  CHECK(worst < 1e-5);
  }
}

TEST_CASE("GPT: the same bits at 1, 2 and 3 threads (dropout 0.1)") {
  const int before = num_threads();
  std::vector<std::shared_ptr<nn::Sequential>> runs;
  for (int t : {1, 2, 3}) {
    set_num_threads(t);
    runs.push_back(train({}, 4, 2, 2, 0.1f));
  }
  set_num_threads(before);
  for (size_t r = 1; r < runs.size(); ++r) {
    const auto a = runs[r]->state_dict(), b = runs[0]->state_dict();
    for (size_t i = 0; i < a.size(); ++i) {
      INFO("threads " << r + 1 << ": " << a[i].first);
      CHECK(test::bit_equal(a[i].second, b[i].second));
    }
  }
}

TEST_CASE("GPT: clear errors") {
  manual_seed(2);
  auto m = nn::make_gpt2(kTiny);
  CHECK_THROWS_WITH_AS(m->forward(random_tokens(1, 25, 1, kTiny.vocab_size)),
                       doctest::Contains("longer than the context of 24"), Error);
  CHECK_THROWS_WITH_AS(m->forward(Tensor::from_vector(std::vector<int64_t>{1, 96}, {1, 2})),
                       doctest::Contains("index[1] = 96 is not a row"), Error);
  CHECK_THROWS_WITH_AS(m->forward(test::rand_tensor({1, 2}, 1)), doctest::Contains("expected int64 tokens"), Error);
  CHECK_THROWS_WITH_AS(nn::make_gpt2({.n_head = 5, .n_embd = 64}), doctest::Contains("must divide"), Error);
  CHECK_THROWS_WITH_AS(causal_self_attention(test::rand_tensor({1, 3, 10}, 2), 1), doctest::Contains("(B, T, 3C)"), Error);
  CHECK_THROWS_WITH_AS(causal_self_attention(test::rand_tensor({1, 3, 12}, 2), 3), doctest::Contains("3 heads do not divide"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(test::rand_tensor({2, 8}, 3), test::rand_tensor({7}, 4), Tensor()),
                       doctest::Contains("weight has shape [7], expected [8]"), Error);
  CHECK_THROWS_WITH_AS(embedding(test::rand_tensor({2}, 5), test::rand_tensor({4, 3}, 6)), doctest::Contains("indices must be int64"), Error);
  CHECK_THROWS_WITH_AS(embedding(Tensor::from_vector(std::vector<int64_t>{0}, {1}), test::rand_tensor({4}, 7)),
                       doctest::Contains("weight must be (V, C)"), Error);
  const Tensor logits = test::rand_tensor({3, 5}, 3);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{0, -1, 2}, {3})),
                       doctest::Contains("target[1] = -1"), Error);
}

TEST_CASE("cross_entropy with ignored rows equals the mean over the others") {
  const Tensor logits = test::rand_tensor({4, 6}, 5, true);
  const Tensor all = cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{1, -100, 3, -100}, {4}));
  const Tensor kept = test::rand_tensor({2, 6}, 5);
  const std::vector<float> l = logits.to_vector<float>();
  const Tensor two = cross_entropy(Tensor::from_vector(std::vector<float>(l.begin(), l.begin() + 6), {1, 6}),
                                   Tensor::from_vector(std::vector<int64_t>{1}, {1}), Reduction::sum);
  const Tensor four = cross_entropy(Tensor::from_vector(std::vector<float>(l.begin() + 12, l.begin() + 18), {1, 6}),
                                    Tensor::from_vector(std::vector<int64_t>{3}, {1}), Reduction::sum);
  CHECK(all.item() == doctest::Approx((two.item() + four.item()) / 2).epsilon(1e-6));
  (void)kept;
  all.backward();
  const std::vector<float> g = logits.grad().to_vector<float>();
  for (size_t j = 6; j < 12; ++j) CHECK(g[j] == 0.0f);   // an ignored row: no gradient
  for (size_t j = 18; j < 24; ++j) CHECK(g[j] == 0.0f);
  CHECK(std::isnan(cross_entropy(logits.detach(), Tensor::from_vector(std::vector<int64_t>{-100, -100, -100, -100}, {4})).item()));
}

// Note [chunked classifier] (src/ops/linear_cross_entropy.cpp): the fused head against linear +
// cross_entropy. One chunk gives their bits; more chunks give dx's bits (a row's logits do not
// depend on the other rows, Note [rows that do not depend on the batch]) and the loss and dw to
// float32 rounding; and the (N, V) logits are never held.
TEST_CASE("linear_cross_entropy equals linear + cross_entropy without holding the logits") {
  const Device cpu = Device::cpu();
  const int64_t n = 64, k = 32, v = 5003;
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = i % 7 == 3 ? -100 : (i * 7919) % v;  // some ignored
  const Tensor target = Tensor::from_vector(t, {n});
  struct Run {
    Tensor loss, dx, dw;
    size_t peak = 0;
  };
  auto run = [&](int64_t chunk_rows, bool fused, DType autocast) {
    Tensor x = test::rand_tensor({n, k}, 71, true), w = test::rand_tensor({v, k}, 72, true);
    const AutocastGuard guard(autocast);
    const size_t before = memory_stats(cpu).in_use;
    reset_peak_memory_stats(cpu);
    Tensor loss = fused ? linear_cross_entropy(x, w, target, -100, chunk_rows)
                        : cross_entropy(linear(x, w), target, Reduction::sum);
    loss.backward();
    clear_autocast_cache();
    return Run{loss, x.grad(), w.grad(), memory_stats(cpu).peak_in_use - before};
  };
  const Run plain = run(0, false, DType::f32), one = run(n, true, DType::f32), eight = run(8, true, DType::f32);
  CHECK(test::bit_equal(one.loss, plain.loss));
  CHECK(test::bit_equal(one.dx, plain.dx));
  CHECK(test::bit_equal(one.dw, plain.dw));
  CHECK(test::bit_equal(eight.dx, plain.dx));
  CHECK(eight.loss.item() == doctest::Approx(plain.loss.item()).epsilon(1e-6));
  CHECK(test::rel_err(eight.dw, plain.dw) < 1e-6);
  // Memory: linear + cross_entropy hold the logits and the probabilities at once (2 N V floats);
  // eight-row chunks hold 2 x 8 V beside dw and dx, and the panel of dw's chains (one piece here:
  // 8 rows of 96 floats, Note [half scratch] in kernels/cpu/gemm.cpp). One chunk holds 2 N V and dw
  // in backward, more than linear + cross_entropy: hence the default of at least four chunks.
  const size_t logits = static_cast<size_t>(n * v) * sizeof(float);
  MESSAGE("peak above the start: linear + cross_entropy " << plain.peak << " bytes, one chunk " << one.peak
                                                          << ", chunks of 8 rows " << eight.peak);
  CHECK(plain.peak >= 2 * logits);
  const size_t panel = 8 * 96 * sizeof(float);
  CHECK(eight.peak <= static_cast<size_t>(v * k + n * k + 2 * 8 * v) * sizeof(float) + panel + 64);
  CHECK(eight.peak + logits <= plain.peak);
  // Under bf16 autocast: the fused head's logits stay float32 on the CPU, linear's are rounded to
  // bf16, so they agree to bf16's rounding.
  const Run plain16 = run(0, false, DType::bf16), eight16 = run(8, true, DType::bf16);
  CHECK(eight16.loss.item() == doctest::Approx(plain16.loss.item()).epsilon(2e-3));
  CHECK(test::rel_err(eight16.dx, plain16.dx) < 2e-2);
  CHECK(test::rel_err(eight16.dw, plain16.dw) < 2e-2);
  // The same bits at 1 and 2 threads.
  set_num_threads(1);
  const Run serial = run(8, true, DType::f32);
  set_num_threads(2);
  CHECK(test::bit_equal(serial.loss, eight.loss));
  CHECK(test::bit_equal(serial.dx, eight.dx));
  CHECK(test::bit_equal(serial.dw, eight.dw));
}

// gpt_train --fused-head on: the model ends at ln_f and the loss is the head too. The planner
// measures that loss (TrainerOptions::measure_loss): its predicted peak is the measured one, as
// for lm_head + cross_entropy, and lower; the losses are theirs to float32 rounding.
TEST_CASE("GPT with its head fused into the loss: the same losses, less memory, predicted = measured") {
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    for (const char* plan : {"none", "budget=5500KiB"}) {
      CAPTURE(std::string(precision_name(p)) + " " + plan);
      auto run = [&](bool fused) {
        test::TinyGpt gpt(fused);
        CHECK(gpt.model->named_parameters().front().first == "transformer.wte.weight");
        optim::AdamW opt(gpt.model->parameters(), {.lr = 1e-3f});
        Trainer t(*gpt.model, gpt.windows, opt,
                  {.batch_size = 8, .checkpoint = plan, .epochs = 1, .max_steps = 3, .loss = gpt.loss(),
                   .measure_loss = fused, .tiles = false, .precision = p, .progress = Progress::off});
        return t.fit();
      };
      const FitReport plain = run(false), fused = run(true);
      REQUIRE(fused.losses.size() == plain.losses.size());
      for (size_t i = 0; i < plain.losses.size(); ++i) {
        CHECK(fused.losses[i] == doctest::Approx(plain.losses[i]).epsilon(p == Precision::fp32 ? 1e-5 : 2e-2));
      }
      MESSAGE("peak: lm_head + cross_entropy " << plain.peak_in_use << " (predicted " << plain.plan.predicted_peak
                                               << "), fused " << fused.peak_in_use << " (predicted "
                                               << fused.plan.predicted_peak << ")");
      if (std::string(plan) == "none") {
        CHECK(fused.peak_in_use < plain.peak_in_use);
      } else {  // under one budget the room the head leaves goes to recomputing less
        CHECK(fused.peak_in_use <= 5500 * 1024);
        CHECK(fused.plan.checkpoint.recompute_flops <= plain.plan.checkpoint.recompute_flops);
      }
      CHECK(fused.peak_in_use >= fused.plan.predicted_peak);
      CHECK(fused.peak_in_use <= fused.plan.predicted_peak + 64);  // the scalars the harness holds, as in test_planner
    }
  }
}

// GPTEmbeddings makes its position ids in forward: an input without history, which a segment
// keeps for its replay where a plain step frees it with the embedding's node. measure_chain counts
// it (UnitCost::leaf_bytes); before, a segment from the embeddings peaked 4,108 bytes above the
// prediction (docs/gpt.md) and a budget plan could exceed its budget by them.
TEST_CASE("GPT plans with a segment from the embeddings: the position ids counted, the peak as predicted") {
  // The last two: the embeddings in tiles of 2 and 4 rows, whose first tile's position ids the
  // segment keeps for its replays.
  for (const char* plan : {"sqrt", "min", "segments=2", "[0,1)/2", "[0,1)/4 [1,2)"}) {
    CAPTURE(plan);
    test::TinyGpt gpt;
    optim::AdamW opt(gpt.model->parameters(), {.lr = 1e-3f});
    const bool tiled = plan[0] == '[';
    Trainer t(*gpt.model, gpt.windows, opt,
              {.batch_size = 8, .checkpoint = plan, .epochs = 1, .max_steps = 2, .loss = gpt.loss(), .tiles = tiled,
               .progress = Progress::off});
    const FitReport r = t.fit();
    REQUIRE(!r.plan.checkpoint.segments.empty());
    CHECK(r.plan.checkpoint.segments.front().tile_rows == (tiled ? plan[6] - '0' : 0));
    CHECK(r.plan.checkpoint.segments.front().begin == 0);
    CHECK(t.cost().units.front().leaf_bytes == 8 * 64 * 8);  // (B, T) int64 positions, saved by wpe's lookup too
    CHECK(t.cost().units.front().leaf_only_bytes == 0);
    INFO("measured " << r.peak_in_use << ", predicted " << r.plan.predicted_peak);
    CHECK(r.peak_in_use >= r.plan.predicted_peak);
    CHECK(r.peak_in_use <= r.plan.predicted_peak + 64);
  }
}

// Note [fused gelu]: c_fc and its GELU as linear_gelu run linear then gelu on the CPU: the unfused
// model's bits, the same names, and the planner's prediction holds.
TEST_CASE("GPT with c_fc and GELU fused: the unfused bits, fp32 and bf16, the peak as predicted") {
  auto run = [](bool fused, const char* plan, Precision p) { return fit_tiny_gpt(plan, p, fused, false); };
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    for (const char* plan : {"none", "sqrt"}) {
      CAPTURE(std::string(precision_name(p)) + " " + plan);
      const auto plain_run = run(false, plan, p), fused_run = run(true, plan, p);
      const FitReport &plain = plain_run.first, &fused = fused_run.first;
      CHECK(fused.losses == plain.losses);
      CHECK(fused_run.second == plain_run.second);
      INFO("measured " << fused.peak_in_use << ", predicted " << fused.plan.predicted_peak);
      CHECK(fused.peak_in_use >= fused.plan.predicted_peak);
      CHECK(fused.peak_in_use <= fused.plan.predicted_peak + 64);
      CHECK(fused.peak_in_use <= plain.peak_in_use);
    }
  }
}

// Note [adding into pending gradients]: each block's two layer_norms add their input's gradient
// into the residual stream's; the bits of separate gradients added in, through the Trainer. And
// Note [fused residual layer_norm]: the first residual add and ln_2 made together, the same bits.
TEST_CASE("GPT: residual-stream gradients added in place and a fused residual layer_norm: the same bits") {
  struct Restore {
    ~Restore() { set_add_into_pending(true); }
  } restore;
  auto run = [](bool add_into, const char* plan, Precision p, bool fused = false) {
    set_add_into_pending(add_into);
    return fit_tiny_gpt(plan, p, false, fused);
  };
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    for (const char* plan : {"none", "sqrt"}) {
      CAPTURE(std::string(precision_name(p)) + " " + plan);
      const auto off = run(false, plan, p), on = run(true, plan, p), fused = run(true, plan, p, true);
      CHECK(on.first.losses == off.first.losses);
      CHECK(on.second == off.second);
      CHECK(fused.first.losses == off.first.losses);
      CHECK(fused.second == off.second);
      for (const auto* r : {&on.first, &fused.first}) {
        INFO("measured " << r->peak_in_use << ", predicted " << r->plan.predicted_peak);
        CHECK(r->peak_in_use >= r->plan.predicted_peak);
        CHECK(r->peak_in_use <= r->plan.predicted_peak + 64);
        CHECK(r->peak_in_use <= off.first.peak_in_use);
      }
    }
  }
}

TEST_CASE("linear_cross_entropy: clear errors") {
  const Tensor x = test::rand_tensor({4, 8}, 1), w = test::rand_tensor({10, 8}, 2);
  const Tensor t = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {4});
  CHECK_THROWS_WITH_AS(linear_cross_entropy(x, test::rand_tensor({10, 7}, 2), t), doctest::Contains("weight (V, K)"), Error);
  CHECK_THROWS_WITH_AS(linear_cross_entropy(x, w.to(DType::bf16), t), doctest::Contains("one dtype"), Error);
  CHECK_THROWS_WITH_AS(linear_cross_entropy(x, w, Tensor::from_vector(std::vector<int64_t>{1, 2}, {2})),
                       doctest::Contains("of shape [4]"), Error);
  CHECK_THROWS_WITH_AS(linear_cross_entropy(x, w, Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 10}, {4})),
                       doctest::Contains("target[3] = 10"), Error);
  CHECK_THROWS_WITH_AS(linear_cross_entropy(x, w, t, -100, -1), doctest::Contains("chunk_rows"), Error);
}

namespace {

// A model's weights in Hugging Face's GPT-2 layout (Note [loading Hugging Face's GPT-2]): names
// without "transformer.", Conv1D weights transposed to (in, out), the mask buffers of older files,
// and lm_head.weight equal to wte.
nn::NamedTensors hf_tensors(nn::Sequential& m, int64_t block_size) {
  nn::NamedTensors out;
  for (const auto& [name, p] : m.state_dict()) {
    const std::string key = name.substr(std::string("transformer.").size());
    const bool conv1d = key.find("c_attn.weight") != std::string::npos || key.find("c_proj.weight") != std::string::npos ||
                        key.find("c_fc.weight") != std::string::npos;
    if (!conv1d) {
      out.emplace_back(key, p.clone());
      continue;
    }
    const int64_t rows = p.size(0), cols = p.size(1);
    const std::vector<float> v = p.to_vector<float>();
    std::vector<float> t(v.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = v[static_cast<size_t>(r * cols + c)];
    }
    out.emplace_back(key, Tensor::from_vector(t, {cols, rows}));
  }
  for (const auto& [name, p] : m.state_dict()) {
    if (name.find(".ln_1.weight") == std::string::npos) continue;  // one mask per block
    const std::string block = name.substr(std::string("transformer.").size(), name.find(".ln_1") - 12);
    out.emplace_back(block + ".attn.bias", Tensor::ones({1, 1, block_size, block_size}));
  }
  out.emplace_back("lm_head.weight", m.state_dict()[0].second.clone());  // wte
  return out;
}

void write_text(const std::string& path, const std::string& text) { mg::write_file_atomic(path, text); }

const char* kTinyHFConfig = R"({"model_type": "gpt2", "vocab_size": 96, "n_positions": 24, "n_layer": 3, "n_head": 2,
  "n_embd": 16, "n_inner": null, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
  "scale_attn_weights": true, "scale_attn_by_inverse_layer_idx": false, "attn_pdrop": 0.1})";

}  // namespace

TEST_CASE("load_gpt2_hf: Hugging Face's layout (Conv1D transposed, no prefix, mask buffers, tied head) loads exactly") {
  test::TempDir dir("gpt_hf");
  manual_seed(5);
  auto src = nn::make_gpt2(kTiny);
  REQUIRE(src->state_dict()[0].first == "transformer.wte.weight");
  nn::save_safetensors(dir / "model.safetensors", hf_tensors(*src, kTiny.block_size));
  write_text(dir / "config.json", kTinyHFConfig);

  const nn::GPTConfig c = nn::read_gpt2_hf_config(dir / "config.json");
  CHECK(c.vocab_size == 96);
  CHECK(c.block_size == 24);
  CHECK(c.n_layer == 3);
  CHECK(c.n_head == 2);
  CHECK(c.n_embd == 16);
  manual_seed(6);  // other initial weights: the load must replace every one
  auto loaded = nn::load_gpt2_hf(dir.path);
  const Tensor tokens = random_tokens(2, 20, 4, kTiny.vocab_size);
  CHECK(test::bit_equal(loaded->forward(tokens), src->forward(tokens)));

  // With the "transformer." prefix (GPT2LMHeadModel's save_pretrained) and without lm_head.
  nn::NamedTensors prefixed;
  for (auto& [k, t] : hf_tensors(*src, kTiny.block_size)) {
    if (k != "lm_head.weight") prefixed.emplace_back("transformer." + k, t);
  }
  nn::save_safetensors(dir / "prefixed.safetensors", prefixed);
  manual_seed(7);
  auto again = nn::make_gpt2(kTiny);
  nn::load_gpt2_hf_weights(*again, dir / "prefixed.safetensors");
  CHECK(test::bit_equal(again->forward(tokens), src->forward(tokens)));
}

TEST_CASE("load_gpt2_hf: clear errors, and a refused file leaves the model as it was") {
  test::TempDir dir("gpt_hf_bad");
  manual_seed(5);
  auto src = nn::make_gpt2(kTiny);
  const nn::NamedTensors good = hf_tensors(*src, kTiny.block_size);
  auto model = nn::make_gpt2(kTiny);
  const std::vector<float> before = model->state_dict()[3].second.to_vector<float>();

  auto refused = [&](nn::NamedTensors t, const std::string& what) {
    nn::save_safetensors(dir / "bad.safetensors", t);
    CHECK_THROWS_WITH_AS(nn::load_gpt2_hf_weights(*model, dir / "bad.safetensors"), doctest::Contains(what.c_str()), Error);
    CHECK(model->state_dict()[3].second.to_vector<float>() == before);
  };
  nn::NamedTensors t = good;
  t.erase(t.begin() + 5);
  refused(t, "missing from the file (1)");
  t = good;
  t.emplace_back("h.0.attn.extra", Tensor::ones({2}));
  refused(t, "unexpected in the file (1):\n    h.0.attn.extra [2]");
  t = good;
  for (auto& [k, v] : t) {
    if (k == "h.1.attn.c_attn.weight") v = Tensor::zeros({48, 16});  // nn.Linear's layout, not Conv1D's
  }
  refused(t, "h.1.attn.c_attn.weight: expected [16, 48] (Conv1D: in, out), file has [48, 16]");
  t = good;
  t.back().second = Tensor::zeros(t.back().second.shape());
  refused(t, "lm_head.weight differs from wte.weight");
  refused({{"weight", Tensor::ones({2})}}, "is not a GPT-2 checkpoint");
  t = good;
  for (auto& [k, v] : t) {
    if (k == "wpe.weight") v = Tensor::from_vector(std::vector<int64_t>(24 * 16, 1), {24, 16});
  }
  refused(t, "tensor 'wpe.weight' is int64; expected floating point");

  auto config_refused = [&](const std::string& json, const std::string& what) {
    write_text(dir / "config.json", json);
    CHECK_THROWS_WITH_AS(nn::read_gpt2_hf_config(dir / "config.json"), doctest::Contains(what.c_str()), Error);
  };
  config_refused("{\"vocab_size\": 96", "is not valid JSON");
  config_refused("[1, 2]", "expected a JSON object, got array");
  config_refused(R"({"vocab_size": 96, "n_positions": 24, "n_layer": 3, "n_embd": 16})", "has no \"n_head\"");
  config_refused(R"({"vocab_size": 96, "n_positions": 24, "n_layer": 3, "n_head": 2, "n_embd": 16.5})",
                 "\"n_embd\" must be a positive integer, got 16.5");
  config_refused(R"({"vocab_size": 96, "n_positions": 24, "n_layer": 3, "n_head": 3, "n_embd": 16})",
                 "n_head 3 does not divide n_embd 16");
  config_refused(R"({"vocab_size": 96, "n_positions": 24, "n_layer": 3, "n_head": 2, "n_embd": 16, "activation_function": "relu"})",
                 "\"activation_function\" is \"relu\"; this model supports \"gelu_new\"");
  config_refused(R"({"vocab_size": 96, "n_positions": 24, "n_layer": 3, "n_head": 2, "n_embd": 16, "layer_norm_epsilon": 1e-6})",
                 "this model's LayerNorm uses 1e-05");
  config_refused(R"({"vocab_size": 96, "n_positions": 24, "n_layer": 3, "n_head": 2, "n_embd": 16, "n_inner": 32})",
                 "\"n_inner\" is 32; this model supports 64");
  CHECK_THROWS_WITH_AS(nn::read_gpt2_hf_config(dir / "none.json"), doctest::Contains("cannot open"), Error);
  CHECK_THROWS_WITH_AS(nn::load_gpt2_hf(dir / "none"), doctest::Contains("is not a folder"), Error);
  CHECK_THROWS_WITH_AS(nn::load_gpt2_hf(dir.path), doctest::Contains("has no model.safetensors"), Error);
}

// Dropout on the probabilities: dropout() of the (B*H, T, T) probabilities numbers its elements as
// the fused op numbers its mask (kernels/attention.h), so the same generator gives the same mask.
TEST_CASE("attention written with matmul, a -inf mask, softmax (and dropout) equals the fused causal_self_attention") {
  // T = 150: the CPU kernel's blocks of 64 query rows (three, the last short) against one T x T product.
  for (const int64_t t : {5, 150}) {
  for (const float drop : {0.0f, 0.3f}) {
  CAPTURE(t);
  CAPTURE(drop);
  const int64_t b = 2, heads = 2, d = 3, c = heads * d;
  const Tensor qkv = test::rand_tensor({b, t, 3 * c}, 41, true);
  const Tensor g = test::rand_tensor({b, t, c}, 42);
  Generator fused_gen(77), composite_gen(77);
  const Tensor y = causal_self_attention(qkv, static_cast<int>(heads), drop, &fused_gen);
  y.backward(g);
  const std::vector<float> x = qkv.to_vector<float>(), gv = g.to_vector<float>();
  // (B*H, T, D) q and v, (B*H, D, T) k^T, and the upstream gradient per head, on the host.
  auto at = [&](int64_t i, int64_t s, int64_t h, int64_t part, int64_t e) {
    return static_cast<size_t>((i * t + s) * 3 * c + part * c + h * d + e);
  };
  std::vector<float> q(b * heads * t * d), kt(q.size()), v(q.size()), gh(q.size()), mask(b * heads * t * t);
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t p = i * heads + h;
      for (int64_t s = 0; s < t; ++s) {
        for (int64_t e = 0; e < d; ++e) {
          q[static_cast<size_t>((p * t + s) * d + e)] = x[at(i, s, h, 0, e)];
          kt[static_cast<size_t>((p * d + e) * t + s)] = x[at(i, s, h, 1, e)];
          v[static_cast<size_t>((p * t + s) * d + e)] = x[at(i, s, h, 2, e)];
          gh[static_cast<size_t>((p * t + s) * d + e)] = gv[static_cast<size_t>((i * t + s) * c + h * d + e)];
        }
        for (int64_t j = 0; j < t; ++j) {
          mask[static_cast<size_t>((p * t + s) * t + j)] = j <= s ? 0.0f : -std::numeric_limits<float>::infinity();
        }
      }
    }
  }
  const Tensor tq = Tensor::from_vector(q, {b * heads, t, d}).requires_grad_(),
               tk = Tensor::from_vector(kt, {b * heads, d, t}).requires_grad_(),
               tv = Tensor::from_vector(v, {b * heads, t, d}).requires_grad_();
  const Tensor scores = add(scale(matmul(tq, tk), 1.0f / std::sqrt(static_cast<float>(d))),
                            Tensor::from_vector(mask, {b * heads, t, t}));
  const Tensor yh = matmul(dropout(softmax(scores), drop, &composite_gen), tv);
  yh.backward(Tensor::from_vector(gh, {b * heads, t, d}));
  // Compare per element: outputs, then dq, dk, dv against the fused op's dqkv.
  const std::vector<float> y_fused = y.to_vector<float>(), y_comp = yh.to_vector<float>(),
                           dx = qkv.grad().to_vector<float>(), dq = tq.grad().to_vector<float>(),
                           dk = tk.grad().to_vector<float>(), dv = tv.grad().to_vector<float>();
  double worst_y = 0, worst_g = 0;
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t p = i * heads + h;
      for (int64_t s = 0; s < t; ++s) {
        for (int64_t e = 0; e < d; ++e) {
          const size_t r = static_cast<size_t>((p * t + s) * d + e);
          worst_y = std::max<double>(worst_y, std::abs(y_comp[r] - y_fused[static_cast<size_t>((i * t + s) * c + h * d + e)]));
          worst_g = std::max<double>(worst_g, std::abs(dq[r] - dx[at(i, s, h, 0, e)]));
          worst_g = std::max<double>(worst_g, std::abs(dk[static_cast<size_t>((p * d + e) * t + s)] - dx[at(i, s, h, 1, e)]));
          worst_g = std::max<double>(worst_g, std::abs(dv[r] - dx[at(i, s, h, 2, e)]));
        }
      }
    }
  }
  MESSAGE("composite against fused attention, T = " << t << ", dropout " << drop << ": outputs " << worst_y << ", gradients " << worst_g
                                                          << " (largest difference)");
  CHECK(worst_y < 1e-6);
  CHECK(worst_g < 1e-6);
  if (drop > 0) CHECK(fused_gen.offset() == composite_gen.offset());
  }
  }
}

TEST_CASE("matmul, softmax and attention dropout: shapes, errors, and a masked row") {
  CHECK(matmul(test::rand_tensor({2, 3, 4}, 1), test::rand_tensor({2, 4, 5}, 2)).shape() == Shape{2, 3, 5});
  CHECK_THROWS_WITH_AS(matmul(test::rand_tensor({2, 3, 4}, 1), test::rand_tensor({3, 4, 5}, 2)),
                       doctest::Contains("same leading dimensions, got a [2, 3, 4] and b [3, 4, 5]"), Error);
  CHECK_THROWS_WITH_AS(matmul(test::rand_tensor({3, 4}, 1), test::rand_tensor({3, 5}, 2)),
                       doctest::Contains("expected a (..., M, K) and b (..., K, N)"), Error);
  CHECK_THROWS_WITH_AS(matmul(test::rand_tensor({4}, 1), test::rand_tensor({4}, 2)), doctest::Contains("matmul"), Error);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> p = softmax(Tensor::from_vector(std::vector<float>{0.0f, -inf, std::log(3.0f), -inf}, {1, 4})).to_vector<float>();
  CHECK(p[0] == doctest::Approx(0.25f));
  CHECK(p[1] == 0.0f);
  CHECK(p[2] == doctest::Approx(0.75f));
  CHECK(p[3] == 0.0f);
  CHECK(std::isnan(softmax(Tensor::from_vector(std::vector<float>{-inf, -inf}, {2})).to_vector<float>()[0]));
  CHECK_THROWS_WITH_AS(softmax(Tensor::from_vector(std::vector<float>{1.0f}, {})), doctest::Contains("at least one dimension"),
                       Error);
  CHECK_THROWS_WITH_AS(causal_self_attention(test::rand_tensor({1, 3, 12}, 2), 2, 1.0f),
                       doctest::Contains("dropout p must be in [0, 1), got 1"), Error);
  CHECK_THROWS_WITH_AS(causal_self_attention(test::rand_tensor({3, 12}, 2), 2, 0.1f), doctest::Contains("(B, T, 3C)"), Error);
}

TEST_CASE("gradient-ready hooks on GPT: the tied wte once, after its last use (the embedding), with a plan or not") {
  manual_seed(2);
  auto m = nn::make_gpt2(kTiny);
  const Tensor x = random_tokens(2, 12, 5, kTiny.vocab_size), y = next_tokens(x);
  const std::vector<Tensor> params = m->parameters();
  for (const std::vector<nn::Segment>& plan : {std::vector<nn::Segment>{}, {{1, 3}}, {{0, 2}, {3, 6}}}) {
    for (const Tensor& q : params) q.set_grad(Tensor());
    std::vector<std::pair<Tensor, Tensor>> reported;
    {
      GradReadyHook hook([&](const Tensor& leaf) { reported.emplace_back(leaf, leaf.grad().clone()); });
      cross_entropy(nn::forward_with_plan(*m, plan, x).reshape({-1, kTiny.vocab_size}), y).backward();
    }
    REQUIRE(reported.size() == params.size());
    for (const auto& [param, grad_then] : reported) CHECK(test::bit_equal(grad_then, param.grad()));
    const Tensor& wte = params[0];  // transformer.wte.weight: the head uses it first in backward
    size_t at = reported.size();
    for (size_t i = 0; i < reported.size(); ++i) if (reported[i].first.same(wte)) at = i;
    CHECK(at >= reported.size() - 2);  // with wpe, the last two reported
  }
}

// Note [overlapped reduction]: the buckets the data-parallel Accumulator reduces during the last
// micro-batch's backward (on NCCL). Here on the CPU with a recording launch: each bucket once, in
// order, only when every gradient in it is final, most of them while backward still runs.
TEST_CASE("gradient buckets: launched in order, once, when their gradients are final, during backward") {
  manual_seed(2);
  auto m = nn::make_gpt2(kTiny);
  const Tensor x = random_tokens(2, 12, 5, kTiny.vocab_size), y = next_tokens(x);
  const std::vector<Tensor> params = m->parameters();
  size_t total = 0;
  for (const Tensor& p : params) total += p.nbytes();
  optim::GradBuckets buckets(params, total / 6);  // about 6 buckets
  REQUIRE(buckets.size() >= 5);
  std::vector<size_t> seen;
  for (size_t i = 0; i < buckets.size(); ++i) {
    for (size_t k : buckets.bucket(i)) seen.push_back(k);
    for (size_t j = 1; j < buckets.bucket(i).size(); ++j) CHECK(buckets.bucket(i)[j] == buckets.bucket(i)[j - 1] - 1);
  }
  CHECK(seen.size() == params.size());  // every parameter once, last first
  CHECK(seen.front() == params.size() - 1);
  for (const std::vector<nn::Segment>& plan : {std::vector<nn::Segment>{}, {{1, 4}}}) {
    for (const Tensor& q : params) q.set_grad(Tensor());
    buckets.reset();
    std::vector<size_t> order;
    std::vector<std::vector<Tensor>> at_launch;
    bool in_backward = true;
    size_t during = 0;
    const optim::GradBuckets::Launch launch = [&](size_t i) {
      order.push_back(i);
      during += in_backward;
      std::vector<Tensor> g;
      for (size_t k : buckets.bucket(i)) g.push_back(params[k].grad().clone());
      at_launch.push_back(g);
    };
    {
      GradReadyHook hook([&](const Tensor& p) { buckets.ready(p, launch); });
      cross_entropy(nn::forward_with_plan(*m, plan, x).reshape({-1, kTiny.vocab_size}), y).backward();
    }
    in_backward = false;
    buckets.launch_rest(launch);
    REQUIRE(order.size() == buckets.size());
    for (size_t i = 0; i < order.size(); ++i) {
      CHECK(order[i] == i);
      for (size_t j = 0; j < buckets.bucket(i).size(); ++j) {
        CHECK(test::bit_equal(at_launch[i][j], params[buckets.bucket(i)[j]].grad()));
      }
    }
    // wte (parameter 0, in the last bucket) is final only after the embedding, the last node of
    // backward: still inside it, so every bucket goes during backward.
    MESSAGE("plan " << plan.size() << " segment(s): " << during << " of " << buckets.size() << " buckets launched during backward");
    CHECK(during == buckets.size());
    CHECK(buckets.launched() == buckets.size());
  }
}
