// safetensors writer/reader (minigrad/nn/serialize.h): round trips, atomic writes, malformed files, load_into,
// and a cross-check of what we write with an independent reader and PyTorch
// (bench/reference/check_safetensors.py).
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "helpers.h"
#include <minigrad/nn/models.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/util/file.h>

namespace fs = std::filesystem;
using namespace mg;
using mg::test::rand_tensor;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("mg_test_serialize_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  // Names of everything in the directory (to spot leftover temporary files).
  std::vector<std::string> entries() const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(path)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }
};

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A hand-made file: an explicit header length (default: the JSON's), the JSON, then `buffer`.
std::string craft(const std::string& json, const std::string& buffer, int64_t header_len = -1) {
  const uint64_t n = header_len < 0 ? json.size() : static_cast<uint64_t>(header_len);
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + json + buffer;
}

std::string raw_bytes(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
}

// Loading `path` must throw mg::Error whose message names the file and contains `problem`.
void expect_load_error(const std::string& path, const std::string& problem) {
  INFO("file " << path << ", expected problem: " << problem);
  bool threw = false;
  try {
    nn::load_safetensors(path);
  } catch (const Error& e) {
    threw = true;
    const std::string msg = e.what();
    INFO("message: " << msg);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find(problem) != std::string::npos);
  }
  CHECK(threw);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("safetensors round trip: float32, int64, bf16, odd shapes, scalar, empty, metadata") {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  Tensor a = rand_tensor({3, 5}, 1);
  Tensor b = rand_tensor({7}, 2);
  Tensor c = rand_tensor({2, 3, 4}, 3);
  Tensor s = Tensor::from_vector(std::vector<float>{-2.5f}, {});
  Tensor e = Tensor::empty({0, 4});
  Tensor l = Tensor::from_vector(std::vector<int64_t>{9, -1, 0, 1LL << 40, 3, -7}, {6});
  Tensor h = Tensor::empty({5}, TensorOptions{DType::bf16});
  const uint16_t bf[5] = {0x3f80, 0xc000, 0x7f80, 0x0001, 0x4049};  // 1, -2, inf, subnormal, 3.14
  std::memcpy(h.raw_data(), bf, sizeof bf);
  const nn::NamedTensors in = {{"z.last_name_first", a}, {"b", b}, {"layer.3.c", c}, {"scalar", s},
                               {"empty", e}, {"labels", l}, {"half", h}};
  const nn::Metadata meta = {{"epoch", "3"}, {"note", "quote \" backslash \\ newline \n ünïcode"}};
  nn::save_safetensors(path, in, meta);

  // Layout: u64 header length, space-padded to 8 bytes, JSON object first.
  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);
  CHECK(bytes[8] == '{');
  size_t data_bytes = 0;
  for (auto& [name, t] : in) data_bytes += t.nbytes();
  CHECK(bytes.size() == 8 + n + data_bytes);

  nn::SafetensorsFile f = nn::load_safetensors(path);
  CHECK(f.metadata == meta);
  REQUIRE(f.tensors.size() == in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    INFO("tensor " << in[i].first);
    CHECK(f.tensors[i].first == in[i].first);  // file order = write order
    const Tensor& t = f.tensors[i].second;
    CHECK(t.shape() == in[i].second.shape());
    CHECK(t.dtype() == in[i].second.dtype());
    CHECK(t.device().is_cpu());
    CHECK(raw_bytes(t) == raw_bytes(in[i].second));
    CHECK(!t.shares_storage(in[i].second));
  }
  REQUIRE(f.find("labels") != nullptr);
  CHECK(f.find("labels")->to_vector<int64_t>() == l.to_vector<int64_t>());
  CHECK(f.find("nope") == nullptr);
  CHECK(dir.entries() == std::vector<std::string>{"t.safetensors"});

  // Overwrite with different content: the new file replaces the old one, nothing left behind.
  nn::save_safetensors(path, {{"only", b}});
  nn::SafetensorsFile g = nn::load_safetensors(path);
  REQUIRE(g.tensors.size() == 1);
  CHECK(g.metadata.empty());
  CHECK(test::bit_equal(g.tensors[0].second, b));
  CHECK(dir.entries() == std::vector<std::string>{"t.safetensors"});

  // No tensors at all is a valid file too.
  nn::save_safetensors(path, {}, {{"k", "v"}});
  nn::SafetensorsFile z = nn::load_safetensors(path);
  CHECK(z.tensors.empty());
  CHECK(z.metadata.at("k") == "v");
}

TEST_CASE("save_safetensors rejects bad names") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  Tensor a = rand_tensor({2}, 1);
  std::string msg = error_of([&] { nn::save_safetensors(path, {{"w", a}, {"w", a}}); });
  CHECK(msg.find("duplicate tensor name 'w'") != std::string::npos);
  msg = error_of([&] { nn::save_safetensors(path, {{"__metadata__", a}}); });
  CHECK(msg.find("reserved") != std::string::npos);
  msg = error_of([&] { nn::save_safetensors(path, {{"", a}}); });
  CHECK(msg.find("empty tensor name") != std::string::npos);
  msg = error_of([&] { nn::save_safetensors(path, {{"u", Tensor()}}); });
  CHECK(msg.find("undefined") != std::string::npos);
  CHECK(dir.entries().empty());
}

TEST_CASE("atomic writes: a failed write leaves the old file intact and no temporary file") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  Tensor old_t = rand_tensor({4, 3}, 5);
  nn::save_safetensors(path, {{"w", old_t}});
  const std::string old_bytes = read_bytes(path);

  SUBCASE("the write itself fails part-way (file size limit)") {
    // RLIMIT_FSIZE applies to root too; the write returns EFBIG once SIGXFSZ is ignored.
    struct rlimit saved {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
    auto saved_handler = ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = saved;
    small.rlim_cur = 4096;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    Tensor big = rand_tensor({64, 1000}, 6);
    const std::string msg = error_of([&] { nn::save_safetensors(path, {{"w", big}}); });
    ::setrlimit(RLIMIT_FSIZE, &saved);
    ::signal(SIGXFSZ, saved_handler);
    INFO(msg);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find(std::strerror(EFBIG)) != std::string::npos);
    CHECK(read_bytes(path) == old_bytes);
    CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});
  }
  SUBCASE("the rename fails (target is a directory)") {
    const std::string as_dir = dir.file("is_a_dir");
    fs::create_directory(as_dir);
    fs::create_directory(as_dir + "/child");  // a non-empty directory cannot be renamed over
    const std::string msg = error_of([&] { nn::save_safetensors(as_dir, {{"w", old_t}}); });
    INFO(msg);
    CHECK(msg.find(as_dir) != std::string::npos);
    CHECK(msg.find("renaming") != std::string::npos);
    CHECK(dir.entries() == std::vector<std::string>{"is_a_dir", "model.safetensors"});
    CHECK(read_bytes(path) == old_bytes);
  }
  SUBCASE("the directory does not exist") {
    const std::string missing = dir.file("no/such/dir/m.safetensors");
    const std::string msg = error_of([&] { nn::save_safetensors(missing, {{"w", old_t}}); });
    CHECK(msg.find(missing) != std::string::npos);
    CHECK(msg.find(std::strerror(ENOENT)) != std::string::npos);
  }
  SUBCASE("the directory is not writable") {
    if (::geteuid() == 0) {
      MESSAGE("running as root, which ignores directory permissions: unwritable-directory case skipped");
      return;
    }
    fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec, fs::perm_options::replace);
    const std::string msg = error_of([&] { nn::save_safetensors(path, {{"w", rand_tensor({9}, 7)}}); });
    fs::permissions(dir.path, fs::perms::owner_all, fs::perm_options::replace);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find(std::strerror(EACCES)) != std::string::npos);
    CHECK(read_bytes(path) == old_bytes);
    CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});
  }
}

// A writer killed mid-save leaves its temporary (8 of 20 kills once left multi-MB files, never
// cleaned up). The next save of the same path removes those of processes that are gone, and
// leaves a live process's alone.
TEST_CASE("atomic writes: a dead writer's temporary is removed by the next write, a live one's is kept") {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  ::waitpid(child, nullptr, 0);  // now a pid with no process
  const std::string dead = path + ".tmp." + std::to_string(child) + ".0";
  const std::string live = path + ".tmp." + std::to_string(::getppid()) + ".3";
  const std::string other = dir.file("x.safetensors.tmp.") + std::to_string(child) + ".0";  // another target's
  for (const std::string& f : {dead, live, other}) write_bytes(f, std::string(1000, 'x'));
  nn::save_safetensors(path, {{"w", rand_tensor({3}, 1)}});
  CHECK_FALSE(std::filesystem::exists(dead));
  CHECK(std::filesystem::exists(live));
  CHECK(std::filesystem::exists(other));
  CHECK(nn::load_safetensors(path).tensors.size() == 1);
}

TEST_CASE("check_writable: an output path is checked before the work, naming the flag") {
  TempDir dir;
  mg::check_writable(dir.file("out.json"), "--json");  // fine: nothing thrown, nothing written
  CHECK_FALSE(std::filesystem::exists(dir.file("out.json")));
  CHECK_THROWS_WITH_AS(mg::check_writable(dir.file("no/such/folder/out.json"), "--json"),
                       doctest::Contains("--json"), Error);
  CHECK_THROWS_WITH_AS(mg::check_writable(dir.file("no/out.json"), "--json"), doctest::Contains("does not exist"), Error);
  CHECK_THROWS_WITH_AS(mg::check_writable(dir.file(""), "--json"), doctest::Contains("is a folder"), Error);
  if (geteuid() != 0) {  // root writes anywhere
    std::filesystem::create_directory(dir.file("ro"));
    std::filesystem::permissions(dir.file("ro"), std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    CHECK_THROWS_WITH_AS(mg::check_writable(dir.file("ro/out.json"), "--json"), doctest::Contains("cannot create files"), Error);
    std::filesystem::permissions(dir.file("ro"), std::filesystem::perms::owner_all);
  }
}

TEST_CASE("write_file_atomic writes bytes and replaces") {
  TempDir dir;
  const std::string path = dir.file("x.json");
  mg::write_file_atomic(path, "first");
  mg::write_file_atomic(path, std::string("sec\0ond", 7));
  CHECK(read_bytes(path) == std::string("sec\0ond", 7));
  CHECK(dir.entries() == std::vector<std::string>{"x.json"});
}

TEST_CASE("malformed safetensors files give mg::Error naming the file and the problem") {
  TempDir dir;
  const std::string f32x6(24, '\x11');
  const std::string good_json = R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";
  // Sanity: the crafted good file loads.
  write_bytes(dir.file("good.st"), craft(good_json, f32x6));
  CHECK(nn::load_safetensors(dir.file("good.st")).tensors.size() == 1);

  auto check = [&](const std::string& name, const std::string& bytes, const std::string& problem) {
    const std::string p = dir.file(name);
    write_bytes(p, bytes);
    expect_load_error(p, problem);
  };
  check("empty.st", "", "too short");
  check("short.st", "abcde", "too short");
  check("huge_header.st", craft(good_json, f32x6, int64_t{1} << 40), "exceeds the format's limit");
  check("header_past_end.st", craft(good_json, f32x6, 4000), "larger than the");
  check("bad_json.st", craft(R"({"w": {"dtype": "F32", "shape": [2,)", ""), "not valid JSON");
  check("not_object.st", craft(R"(["w"])", ""), "must start with '{'");
  check("offsets_past_end.st",
        craft(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", std::string(20, 'x')),
        "run past the end");
  check("unknown_dtype.st", craft(R"({"w":{"dtype":"Q4","shape":[2,3],"data_offsets":[0,24]}})", f32x6),
        "dtype 'Q4' is not supported");
  check("wrong_size.st", craft(R"({"w":{"dtype":"F32","shape":[2,4],"data_offsets":[0,24]}})", f32x6),
        "needs 32");
  check("dtype_size_mismatch.st", craft(R"({"w":{"dtype":"I64","shape":[2,3],"data_offsets":[0,24]}})", f32x6),
        "needs 48");
  check("reversed.st", craft(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", f32x6),
        "end before they begin");
  check("overlap.st",
        craft(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
              f32x6),
        "overlap");
  check("hole.st",
        craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})",
              f32x6),
        "hole");
  check("trailing.st", craft(good_json, f32x6 + "junk"), "no trailing bytes");
  check("duplicate.st",
        craft(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
              f32x6),
        "appears twice");
  check("negative_shape.st", craft(R"({"w":{"dtype":"F32","shape":[-2,3],"data_offsets":[0,24]}})", f32x6),
        "non-negative");
  check("missing_field.st", craft(R"({"w":{"dtype":"F32","data_offsets":[0,24]}})", f32x6), "'shape'");
  check("bad_metadata.st", craft(R"({"__metadata__":{"epoch":3}})", ""), "must be a string");
  // Nesting 100,000 deep once overflowed the stack (signal 11) while the value was printed.
  const std::string deep(100000, '[');
  check("deep_shape.st",
        craft(R"({"w":{"dtype":"F32","shape":)" + deep + std::string(100000, ']') + R"(,"data_offsets":[0,24]}})", f32x6),
        "nests deeper than 4 levels");
  check("deep_offsets.st",
        craft(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,)" + deep + std::string(100000, ']') + "]}}", f32x6),
        "nests deeper than 4 levels");
  expect_load_error(dir.file("does_not_exist.st"), std::strerror(ENOENT));

  // Truncations of a real file: inside the data, and inside the header.
  const std::string real = dir.file("real.st");
  nn::save_safetensors(real, {{"a", rand_tensor({5, 3}, 1)}, {"b", rand_tensor({4}, 2)}});
  const std::string bytes = read_bytes(real);
  check("trunc_data.st", bytes.substr(0, bytes.size() - 5), "run past the end");
  check("trunc_header.st", bytes.substr(0, 30), "larger than the");
}

TEST_CASE("load_into copies into the existing parameters and keeps optimizers valid") {
  TempDir dir;
  const std::string path = dir.file("mlp.safetensors");
  manual_seed(11);
  auto src = nn::make_mlp({6, 5, 3});
  nn::save_safetensors(path, src->named_parameters(), {{"epoch", "1"}});

  manual_seed(12);
  auto dst = nn::make_mlp({6, 5, 3});
  optim::SGD opt(dst->parameters(), {.lr = 0.1f});
  std::vector<void*> storage_before;
  for (const Tensor& p : dst->parameters()) storage_before.push_back(p.raw_data());
  CHECK(!test::bit_equal(dst->parameters()[0], src->parameters()[0]));

  nn::load_into(*dst, path);
  auto sp = src->named_parameters(), dp = dst->named_parameters();
  REQUIRE(sp.size() == dp.size());
  for (size_t i = 0; i < sp.size(); ++i) {
    INFO(sp[i].first);
    CHECK(dp[i].first == sp[i].first);
    CHECK(test::bit_equal(dp[i].second, sp[i].second));
    CHECK(dp[i].second.raw_data() == storage_before[i]);  // same storage: optimizer still points at it
    CHECK(dp[i].second.requires_grad());
  }
  // The optimizer updates the loaded values.
  Tensor x = rand_tensor({4, 6}, 3);
  Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 2, 1, 2}, {4});
  opt.zero_grad();
  cross_entropy(dst->forward(x), y).backward();
  opt.step();
  CHECK(!test::bit_equal(dst->parameters()[0], src->parameters()[0]));
  CHECK(test::max_abs_diff(dst->parameters()[0], src->parameters()[0]) < 0.5);
}

TEST_CASE("load_into names what is missing, unexpected and mismatched, and changes nothing") {
  TempDir dir;
  const std::string path = dir.file("mlp.safetensors");
  manual_seed(1);
  auto src = nn::make_mlp({6, 5, 3});
  auto named = src->named_parameters();  // 1.weight [5,6], 1.bias [5], 3.weight [3,5], 3.bias [3]

  SUBCASE("wrong hidden width") {
    nn::save_safetensors(path, named);
    auto other = nn::make_mlp({6, 4, 3});
    auto before = other->parameters()[0].clone();
    const std::string msg = error_of([&] { nn::load_into(*other, path); });
    INFO(msg);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find("shape/dtype mismatch (3)") != std::string::npos);
    CHECK(msg.find("1.weight: model [4, 6] float32, file [5, 6] float32") != std::string::npos);
    CHECK(msg.find("3.weight: model [3, 4] float32, file [3, 5] float32") != std::string::npos);
    CHECK(msg.find("missing") == std::string::npos);
    CHECK(test::bit_equal(other->parameters()[0], before));
  }
  SUBCASE("missing and unexpected tensors") {
    nn::NamedTensors partial = {named[0], named[1], named[2]};
    partial.emplace_back("5.weight", rand_tensor({2, 3}, 4));
    nn::save_safetensors(path, partial);
    auto other = nn::make_mlp({6, 5, 3});
    auto before = other->parameters()[0].clone();
    const std::string msg = error_of([&] { nn::load_into(*other, path); });
    INFO(msg);
    CHECK(msg.find("missing from the file (1):\n    3.bias [3] float32") != std::string::npos);
    CHECK(msg.find("unexpected in the file (1):\n    5.weight [2, 3] float32") != std::string::npos);
    CHECK(msg.find("mismatch") == std::string::npos);
    CHECK(test::bit_equal(other->parameters()[0], before));
  }
  SUBCASE("dtype mismatch") {
    nn::NamedTensors wrong = named;
    wrong[1].second = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5}, {5});
    nn::save_safetensors(path, wrong);
    auto other = nn::make_mlp({6, 5, 3});
    const std::string msg = error_of([&] { nn::load_into(*other, path); });
    INFO(msg);
    CHECK(msg.find("1.bias: model [5] float32, file [5] int64") != std::string::npos);
  }
}

TEST_CASE("PyTorch reads what we write (bench/reference/check_safetensors.py)") {
  const std::string py = "/usr/bin/python3";
  if (::access(py.c_str(), X_OK) != 0) {
    MESSAGE("skipped: " << py << " not found");
    return;
  }
  if (std::system((py + " -c 'import numpy' >/dev/null 2>&1").c_str()) != 0) {
    MESSAGE("skipped: " << py << " has no numpy");
    return;
  }
  // Without torch (or the safetensors package) the script says so and runs its spec parser only.

  TempDir dir;
  const std::string path = dir.file("mlp.safetensors"), sidecar = dir.file("expect.json");
  manual_seed(3);
  const std::vector<int64_t> sizes = {13, 7, 5, 3};
  auto model = nn::make_mlp(sizes);
  const nn::Metadata meta = {{"format", "pt"}, {"epoch", "2"}};
  nn::save_safetensors(path, model->named_parameters(), meta);

  nlohmann::json expect;
  expect["mlp_sizes"] = sizes;
  expect["metadata"] = meta;
  expect["order"] = nlohmann::json::array();
  for (const auto& [name, p] : model->named_parameters()) {
    expect["order"].push_back(name);
    expect["tensors"][name] = {{"dtype", "F32"}, {"shape", p.shape()}, {"values", p.to_vector<float>()}};
  }
  std::ofstream(sidecar) << expect.dump();

  const std::string script = std::string(MG_SOURCE_DIR) + "/bench/reference/check_safetensors.py";
  const std::string cmd = py + " " + script + " " + path + " --expect " + sidecar;
  MESSAGE("running: " << cmd);
  const int rc = std::system(cmd.c_str());
  REQUIRE(WIFEXITED(rc));
  CHECK(WEXITSTATUS(rc) == 0);

  // Edge cases of the format: int64, bf16, a scalar, an empty tensor, no metadata.
  const std::string edge = dir.file("edge.safetensors"), edge_expect = dir.file("edge.json");
  Tensor h = Tensor::empty({3}, TensorOptions{DType::bf16});
  const uint16_t bf[3] = {0x3f80, 0xc020, 0x4049};  // 1, -2.5, 3.140625
  std::memcpy(h.raw_data(), bf, sizeof bf);
  nn::save_safetensors(edge, {{"labels", Tensor::from_vector(std::vector<int64_t>{4, -1, 1LL << 40}, {3})},
                              {"half", h},
                              {"scalar", Tensor::from_vector(std::vector<float>{0.125f}, {})},
                              {"empty", Tensor::empty({0, 4})}});
  nlohmann::json e2;
  e2["tensors"]["labels"] = {{"dtype", "I64"}, {"shape", {3}}, {"values", {4, -1, 1LL << 40}}};
  e2["tensors"]["half"] = {{"dtype", "BF16"}, {"shape", {3}}, {"values", {1.0, -2.5, 3.140625}}};
  e2["tensors"]["scalar"] = {{"dtype", "F32"}, {"shape", nlohmann::json::array()}, {"values", 0.125}};
  e2["tensors"]["empty"] = {{"dtype", "F32"}, {"shape", {0, 4}}, {"values", nlohmann::json::array()}};
  std::ofstream(edge_expect) << e2.dump();
  const int rc_edge = std::system((py + " " + script + " " + edge + " --expect " + edge_expect).c_str());
  REQUIRE(WIFEXITED(rc_edge));
  CHECK(WEXITSTATUS(rc_edge) == 0);

  // The checker is not a rubber stamp: a wrong expectation must fail it.
  expect["tensors"]["3.bias"]["values"][0] = expect["tensors"]["3.bias"]["values"][0].get<double>() + 1e-3;
  std::ofstream(sidecar, std::ios::trunc) << expect.dump();
  const int rc_bad = std::system((cmd + " --no-torch >/dev/null").c_str());
  REQUIRE(WIFEXITED(rc_bad));
  CHECK(WEXITSTATUS(rc_bad) == 1);
}

TEST_CASE("we read what safetensors.torch.save_file writes") {
  const std::string py = "/usr/bin/python3";
  if (::access(py.c_str(), X_OK) != 0 ||
      std::system((py + " -c 'import torch, safetensors.torch' >/dev/null 2>&1").c_str()) != 0) {
    MESSAGE("skipped: " << py << " with torch and safetensors not available");
    return;
  }
  TempDir dir;
  const std::string path = dir.file("from_torch.safetensors");
  const std::string cmd = py + " -c \"import torch; from safetensors.torch import save_file; save_file({"
                          "'w': torch.arange(-3, 3, dtype=torch.float32).reshape(2, 3) / 4, "
                          "'labels': torch.tensor([7, -2, 5]), 's': torch.tensor(2.5), 'e': torch.zeros(0, 4), "
                          "'h': torch.tensor([1.0, -2.5], dtype=torch.bfloat16)}, '" + path + "', metadata={'k': 'v'})\"";
  REQUIRE(std::system(cmd.c_str()) == 0);
  nn::SafetensorsFile f = nn::load_safetensors(path);
  CHECK(f.metadata == nn::Metadata{{"k", "v"}});
  REQUIRE(f.tensors.size() == 5);
  REQUIRE(f.find("w") != nullptr);
  CHECK(f.find("w")->shape() == Shape{2, 3});
  CHECK(f.find("w")->to_vector<float>() == std::vector<float>{-0.75f, -0.5f, -0.25f, 0.0f, 0.25f, 0.5f});
  CHECK(f.find("labels")->to_vector<int64_t>() == std::vector<int64_t>{7, -2, 5});
  CHECK(f.find("s")->shape().empty());
  CHECK(f.find("s")->item() == 2.5f);
  CHECK(f.find("e")->shape() == Shape{0, 4});
  REQUIRE(f.find("h")->dtype() == DType::bf16);
  const uint16_t want[2] = {0x3f80, 0xc020};
  CHECK(std::memcmp(f.find("h")->raw_data(), want, sizeof want) == 0);
}

TEST_CASE("save and load_into keep CUDA parameters on their device") {
  if (!cuda_available()) {
    MESSAGE("skipped: no CUDA device");
    return;
  }
  TempDir dir;
  const std::string path = dir.file("gpu.safetensors");
  manual_seed(21);
  auto src = nn::make_mlp({9, 4, 2});
  src->to(Device::cuda());
  nn::save_safetensors(path, src->named_parameters());  // copies to host to write
  manual_seed(22);
  auto dst = nn::make_mlp({9, 4, 2});
  dst->to(Device::cuda());
  std::vector<void*> before;
  for (const Tensor& p : dst->parameters()) before.push_back(p.raw_data());
  nn::load_into(*dst, path);
  auto sp = src->parameters(), dp = dst->parameters();
  for (size_t i = 0; i < sp.size(); ++i) {
    CHECK(dp[i].is_cuda());
    CHECK(dp[i].raw_data() == before[i]);
    CHECK(test::bit_equal(dp[i].cpu(), sp[i].cpu()));
  }
}
