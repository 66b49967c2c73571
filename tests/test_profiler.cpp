// The op profiler (minigrad/core/profiler.h): what it counts, under which pass, and when.
#include <doctest/doctest.h>

#include <chrono>
#include <minigrad/minigrad.h>

#include "helpers.h"

using namespace mg;

namespace {

const profiler::Row* find(const std::vector<profiler::Row>& rows, const std::string& name, const std::string& pass) {
  for (const profiler::Row& r : rows) {
    if (r.name == name && r.pass == pass) return &r;
  }
  return nullptr;
}

int64_t calls(const std::vector<profiler::Row>& rows, const std::string& name, const std::string& pass) {
  const profiler::Row* r = find(rows, name, pass);
  return r ? r->calls : 0;
}

}  // namespace

TEST_CASE("profiler: every op of a training step by pass, the optimizer's scopes, nothing outside start and stop") {
  manual_seed(1);
  auto model = nn::make_mlp({6, 8, 8, 3});  // Flatten, Linear, ReLU, Linear, ReLU, Linear
  optim::SGD opt(model->parameters(), {.lr = 0.1f});
  const Tensor x = test::rand_tensor({5, 6}, 2);
  const Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 2, 1, 1, 0}, {5});
  auto step = [&] {
    Tensor loss = cross_entropy(model->forward(x), y);
    loss.backward();
    opt.step();
    opt.zero_grad();
  };
  step();  // before start(): not counted
  profiler::start();
  CHECK(profiler::recording());
  const auto t0 = std::chrono::steady_clock::now();
  step();
  step();
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  profiler::stop();
  step();  // after stop(): not counted
  CHECK_FALSE(profiler::recording());

  const std::vector<profiler::Row> rows = profiler::report();
  CHECK(calls(rows, "linear", "forward") == 6);
  CHECK(calls(rows, "linear", "backward") == 6);
  CHECK(calls(rows, "relu", "forward") == 4);
  CHECK(calls(rows, "relu", "backward") == 4);
  CHECK(calls(rows, "cross_entropy", "forward") == 2);
  CHECK(calls(rows, "cross_entropy", "backward") == 2);
  CHECK(calls(rows, "optimizer.step", "") == 2);
  CHECK(calls(rows, "optimizer.zero_grad", "") == 2);
  CHECK(calls(rows, "linear", "replay") == 0);
  double total = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    CAPTURE(rows[i].name);
    CHECK(rows[i].device == "cpu");
    CHECK(rows[i].ms >= 0.0);
    if (i > 0) CHECK(rows[i].ms <= rows[i - 1].ms);  // the longest first
    total += rows[i].ms;
  }
  CHECK(total <= wall_ms);
  const std::string t = profiler::table(rows);
  CHECK(t.find("cross_entropy") != std::string::npos);
  CHECK(t.find("optimizer.step") != std::string::npos);
  CHECK(t.find("total") != std::string::npos);
  CHECK(profiler::report().size() == rows.size());  // reading again gives the same

  profiler::start();  // forgets
  CHECK(profiler::report().empty());
  profiler::stop();
}

TEST_CASE("profiler: a checkpointed segment's forward run again in backward counts as replay") {
  const Tensor w = test::rand_tensor({4, 3}, 3, true), b = test::rand_tensor({4}, 4, true);
  const Tensor x = test::rand_tensor({2, 3}, 5, true);
  profiler::start();
  Tensor h = checkpoint([&](const std::vector<Tensor>& in) { return relu(linear(in[0], w, b)); }, {x});
  h.backward(Tensor::ones(h.shape()));
  profiler::stop();
  const std::vector<profiler::Row> rows = profiler::report();
  CHECK(calls(rows, "linear", "forward") == 1);
  CHECK(calls(rows, "linear", "replay") == 1);
  CHECK(calls(rows, "linear", "backward") == 1);
  CHECK(calls(rows, "relu", "replay") == 1);
  CHECK(calls(rows, "relu", "backward") == 1);
}

TEST_CASE("profiler: a scope inside a counted one counts for the outer only; one opened before start() is not counted") {
  profiler::start();
  {
    const profiler::Scope outer("outer", Device::cpu());
    const profiler::Scope inner("inner", Device::cpu());
    relu(test::rand_tensor({3}, 6));
  }
  std::vector<profiler::Row> rows = profiler::report();
  CHECK(calls(rows, "outer", "") == 1);
  CHECK(calls(rows, "inner", "") == 0);
  CHECK(calls(rows, "relu", "forward") == 0);
  {
    const profiler::Scope early("early", Device::cpu());
    profiler::start();  // a new recording: "early" began in the old one
    const profiler::Scope later("later", Device::cpu());
  }
  rows = profiler::report();
  CHECK(calls(rows, "early", "") == 0);
  CHECK(calls(rows, "later", "") == 0);  // nested in "early", which holds the depth
  {
    const profiler::Scope after("after", Device::cpu());
  }
  CHECK(calls(profiler::report(), "after", "") == 1);  // the depth came back to 0
  profiler::stop();
}

TEST_CASE("profiler: an op that throws inside a span leaves the depth as it was; a span open at stop() still counts") {
  profiler::start();
  CHECK_THROWS_AS(linear(test::rand_tensor({2, 3}, 7), test::rand_tensor({4, 5}, 8)), Error);  // K differs
  relu(test::rand_tensor({3}, 9));  // counted: the failed op's span closed
  {
    const profiler::Scope open("open", Device::cpu());
    profiler::stop();
    relu(test::rand_tensor({3}, 10));  // inside "open": not counted apart
  }
  const profiler::Scope after_stop("after_stop", Device::cpu());
  const std::vector<profiler::Row> rows = profiler::report();
  CHECK(calls(rows, "linear", "forward") == 1);  // the throwing call, timed up to its throw
  CHECK(calls(rows, "relu", "forward") == 1);
  CHECK(calls(rows, "open", "") == 1);
  CHECK(calls(rows, "after_stop", "") == 0);
}

TEST_CASE("profiler: resume() adds to what was recorded; what ran while stopped is not counted") {
  profiler::start();
  relu(test::rand_tensor({3}, 11));
  profiler::stop();
  relu(test::rand_tensor({3}, 12));  // stopped: not counted
  {
    const profiler::Scope opened_while_stopped("stopped", Device::cpu());
    profiler::resume();
    relu(test::rand_tensor({3}, 13));  // counted: the scope opened while stopped holds nothing
  }
  profiler::stop();
  std::vector<profiler::Row> rows = profiler::report();
  CHECK(calls(rows, "relu", "forward") == 2);
  CHECK(calls(rows, "stopped", "") == 0);
  profiler::resume();
  profiler::resume();  // already recording: nothing changes
  {
    const profiler::Scope counted("counted", Device::cpu());
  }
  profiler::stop();
  rows = profiler::report();
  CHECK(calls(rows, "relu", "forward") == 2);  // kept across stop and resume
  CHECK(calls(rows, "counted", "") == 1);
}
