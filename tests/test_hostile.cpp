// Hostile input (issue 15): every class of malformed input the library reads, as rows of one
// table, so the list only grows. A row makes its input under a temporary folder, hands it to a
// reader, and passes when the reader throws mg::Error whose message contains the row's fragment
// AND names the input (the file's path, or the parameter). Anything else fails the row: no error
// (an accepted invalid input), another exception type, a message without the fragment or the
// name. A crash or a hang names the row on stderr (Note [row guard]).
//
// Families are generated (a valid file cut at every k-th byte, each header field replaced by each
// bad value), from valid inputs the library writes; the controls at the end show that those
// inputs are read whole, so every row is a corruption of something good. The command-line flags
// of the apps have their own table: tests/hostile_flags.sh.
//
// To add a case: one add(...) line in the family it belongs to (or a new family).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <typeinfo>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>

#include <minigrad/data/idx.h>
#include <minigrad/data/image_folder.h>
#include <minigrad/nn/models.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/optim/accumulate.h>
#include <minigrad/optim/train_state.h>
#include "helpers.h"

using namespace mg;
namespace fs = std::filesystem;

namespace {

// ---- the table ---------------------------------------------------------------------------------

struct Row {
  std::string name;  // unique; the row's folder is named after it
  // Makes the input in the (empty) folder `dir`; returns what the message must name: the input's
  // path, which `act` receives, or for an argument the parameter's name.
  std::function<std::string(const std::string& dir)> make;
  std::function<void(const std::string& subject)> act;  // the reader; must throw mg::Error
  std::string expect;                                     // a fragment of the message
};

using Table = std::vector<Row>;

void add(Table& t, std::string name, std::function<std::string(const std::string&)> make,
         std::function<void(const std::string&)> act, std::string expect) {
  t.push_back({std::move(name), std::move(make), std::move(act), std::move(expect)});
}

// "" when the row passes, else what went wrong.
std::string run_row(const Row& r, const std::string& subject) {
  try {
    r.act(subject);
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find(r.expect) == std::string::npos) return "the message lacks \"" + r.expect + "\": " + msg;
    if (msg.find(subject) == std::string::npos) return "the message does not name \"" + subject + "\": " + msg;
    return "";
  } catch (const std::exception& e) {
    return std::string("threw ") + typeid(e).name() + " instead of mg::Error: " + e.what();
  } catch (...) {
    return "threw something that is not a std::exception";
  }
  return "accepted: no error";
}

// Note [row guard]
// ~~~~~~~~~~~~~~~~
// A crash or a hang of one row must say which row. SIGALRM after kRowSeconds
// reports a hang and exits; a fatal signal reports the row, puts back the handler it replaced
// (doctest's, or a sanitizer's) and returns, so the signal comes again to that handler.
constexpr unsigned kRowSeconds = 30;
char g_row[256];
const int kFatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
struct sigaction g_old[64];

void say(const char* s) { [[maybe_unused]] ssize_t n = ::write(2, s, std::strlen(s)); }

void on_signal(int sig) {
  say("\ntest_hostile: row ");
  say(g_row);
  if (sig == SIGALRM) {
    say(" HUNG (no answer within the row's time limit, kRowSeconds)\n");
    ::_exit(3);
  }
  say(" CRASHED with a fatal signal\n");
  sigaction(sig, &g_old[sig], nullptr);
}

struct RowGuard {
  RowGuard() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (int s : kFatal) sigaction(s, &sa, &g_old[s]);
    sigaction(SIGALRM, &sa, &g_old[SIGALRM]);
  }
  ~RowGuard() {
    alarm(0);
    for (int s : kFatal) sigaction(s, &g_old[s], nullptr);
    sigaction(SIGALRM, &g_old[SIGALRM], nullptr);
  }
  void start(const std::string& row) {
    std::snprintf(g_row, sizeof g_row, "%s", row.c_str());
    alarm(kRowSeconds);
  }
};

// ---- files -------------------------------------------------------------------------------------

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

std::string be32(uint32_t v) {
  std::string s;
  for (int sh = 24; sh >= 0; sh -= 8) s.push_back(static_cast<char>(v >> sh));
  return s;
}

// The gzip-compressed form of `raw`, written by the library's own writer.
std::string gzip(const std::string& raw, const std::string& scratch_dir) {
  const std::string p = scratch_dir + "/scratch.gz";
  data::write_maybe_gz(p, raw);
  std::string out = slurp(p);
  fs::remove(p);
  return out;
}

// A folder holding one FIFO; returns its path.
std::string make_fifo(const std::string& dir, const std::string& name) {
  const std::string p = dir + "/" + name;
  REQUIRE(::mkfifo(p.c_str(), 0600) == 0);
  return p;
}

std::string make_folder(const std::string& dir, const std::string& name) {
  const std::string p = dir + "/" + name;
  fs::create_directories(p);
  return p;
}

std::string make_symlink(const std::string& dir, const std::string& name, const std::string& target) {
  const std::string p = dir + "/" + name;
  fs::create_symlink(target, p);
  return p;
}

// A file with the given bytes; returns its path.
std::function<std::string(const std::string&)> file(const std::string& name, std::string bytes) {
  return [name, bytes = std::move(bytes)](const std::string& dir) {
    spit(dir + "/" + name, bytes);
    return dir + "/" + name;
  };
}

// ---- safetensors -------------------------------------------------------------------------------

// A valid file the library writes: float32, int64 and bfloat16 tensors and metadata. The data
// bytes are never JSON whitespace, so a header length one too long is not valid JSON.
std::string valid_safetensors(const std::string& scratch) {
  Tensor w = Tensor::from_vector(std::vector<float>{1.1f, -2.2f, 3.3f, 4.4f, 5.5f, 6.6f}, {2, 3});
  Tensor b = Tensor::from_vector(std::vector<int64_t>{7, -8, 9, 10}, {4});
  Tensor h = Tensor::empty({5}, TensorOptions{DType::bf16});
  for (int i = 0; i < 5; ++i) static_cast<uint16_t*>(h.raw_data())[i] = static_cast<uint16_t>(0x3F80 + i);
  const std::string p = scratch + "/valid.safetensors";
  nn::save_safetensors(p, {{"w", w}, {"b", b}, {"h", h}}, {{"epoch", "3"}});
  std::string out = slurp(p);
  fs::remove(p);
  return out;
}

// A hand-made file: the 8-byte length of `json` (or `header_len`), the JSON, then `buffer`.
std::string craft(const std::string& json, const std::string& buffer, int64_t header_len = -1) {
  return le64(header_len < 0 ? json.size() : static_cast<uint64_t>(header_len)) + json + buffer;
}

// One tensor entry "w" with the given fields (raw JSON text each).
std::string entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"w":{"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}";
}

void load_st(const std::string& p) { nn::load_safetensors(p); }

void add_safetensors_rows(Table& t, const std::string& scratch) {
  const std::string valid = valid_safetensors(scratch);
  uint64_t n = 0;
  std::memcpy(&n, valid.data(), 8);
  const std::string json = valid.substr(8, n), data = valid.substr(8 + n);
  const std::string f32x6(24, '\x11');

  // Truncated at every 9th byte: in the length field, in the header, in the data.
  for (size_t cut = 0; cut < valid.size(); cut += 9) {
    const char* expect = cut < 8 ? "too short" : cut < 8 + n ? "is larger than the" : "run past the end";
    add(t, "st.truncated_at_" + std::to_string(cut), file("t.safetensors", valid.substr(0, cut)), load_st, expect);
  }
  add(t, "st.truncated_last_byte", file("t.safetensors", valid.substr(0, valid.size() - 1)), load_st, "run past the end");

  // The header length field, each bad value.
  const std::vector<std::pair<uint64_t, const char*>> lengths = {
      {0, "too small for a JSON object"},
      {1, "too small for a JSON object"},
      {2, "not valid JSON"},
      {n + 1, "not valid JSON"},
      {n + 8, "not valid JSON"},
      {valid.size() - 8, "not valid JSON"},
      {valid.size() - 7, "is larger than the"},
      {100'000'000, "is larger than the"},
      {100'000'001, "exceeds the format's limit"},
      {uint64_t{1} << 32, "exceeds the format's limit"},
      {uint64_t{1} << 63, "exceeds the format's limit"},
      {std::numeric_limits<uint64_t>::max(), "exceeds the format's limit"},
  };
  for (const auto& [len, expect] : lengths) {
    add(t, "st.header_length_" + std::to_string(len), file("t.safetensors", le64(len) + json + data), load_st, expect);
  }

  // The header's JSON.
  const std::vector<std::pair<std::string, const char*>> jsons = {
      {"{", "too small for a JSON object"},
      {R"({"w":)", "not valid JSON"},
      {R"({"w":{})", "not valid JSON"},
      {"{]", "not valid JSON"},
      {R"({"w":{"dtype":"F32",}})", "not valid JSON"},
      {R"({"a":1,})", "not valid JSON"},
      {"{} x", "not valid JSON"},
      {"{\"\xff\":{}}", "not valid JSON"},  // not UTF-8
      {R"({"w":NaN})", "not valid JSON"},
      {std::string("{\"w\"\0:1}", 8), "not valid JSON"},
      {"[1]", "must start with '{'"},
      {" {}", "must start with '{'"},
      {"null", "must start with '{'"},
      {R"({"w":1})", "entry must be an object"},
      {R"({"w":[]})", "entry must be an object"},
      {R"({"w":"F32"})", "entry must be an object"},
      {R"({"w":null})", "entry must be an object"},
      {"{}", "the format allows no trailing bytes"},  // 24 bytes of data that no tensor claims
  };
  for (size_t i = 0; i < jsons.size(); ++i) {
    add(t, "st.json_" + std::to_string(i), file("t.safetensors", craft(jsons[i].first, f32x6)), load_st, jsons[i].second);
  }

  // Each field of an entry replaced by each bad value.
  const std::string ok_shape = "[2,3]", ok_offsets = "[0,24]", ok_dtype = R"("F32")";
  const std::vector<std::pair<std::string, const char*>> dtypes = {
      {R"("I16")", "is not supported"},  {R"("f32")", "is not supported"},   {R"("F32 ")", "is not supported"},
      {R"("U8")", "is not supported"},   {R"("I32")", "is not supported"},   {R"("BOOL")", "is not supported"},
      {R"("F8_E4M3")", "is not supported"}, {R"("C64")", "is not supported"}, {R"("")", "is not supported"},
      {"32", "missing string field 'dtype'"}, {"null", "missing string field 'dtype'"},
      {"[]", "missing string field 'dtype'"}, {"{}", "missing string field 'dtype'"},
  };
  for (size_t i = 0; i < dtypes.size(); ++i) {
    add(t, "st.dtype_" + std::to_string(i), file("t.safetensors", craft(entry(dtypes[i].first, ok_shape, ok_offsets), f32x6)),
        load_st, dtypes[i].second);
  }
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::vector<std::pair<std::string, const char*>> shapes = {
      {"[-1,3]", "non-negative integers"},
      {"[2.5,3]", "non-negative integers"},
      {R"(["2",3])", "non-negative integers"},
      {"[1e3]", "non-negative integers"},
      {"[[2],3]", "non-negative integers"},
      {"[true]", "non-negative integers"},
      {"[2,3,0]", "needs 0"},
      {"[]", "needs 4"},
      {"[3,3]", "needs 36"},
      {"[9223372036854775808]", "too large"},
      {"[18446744073709551615]", "too large"},
      {"[4611686018427387904]", "overflows"},  // 2^62 float32s: 2^64 bytes
      {"[4294967296,4294967296]", "overflows"},
      {"[2147483648,2147483648,2]", "overflows"},
      {"[3037000500,3037000500]", "overflows"},
      {"[65536,65536,65536,65536,65536]", "overflows"},
      {"null", "missing array field 'shape'"},
      {R"("2,3")", "missing array field 'shape'"},
      {"{}", "missing array field 'shape'"},
      {"[[[[[2]]]]]", "nests deeper than 4 levels"},
      {deep, "nests deeper than 4 levels"},
  };
  for (size_t i = 0; i < shapes.size(); ++i) {
    add(t, "st.shape_" + std::to_string(i), file("t.safetensors", craft(entry(ok_dtype, shapes[i].first, ok_offsets), f32x6)),
        load_st, shapes[i].second);
  }
  const std::vector<std::pair<std::string, const char*>> offsets = {
      {"[0]", "must be an array [begin, end]"},
      {"[0,24,48]", "must be an array [begin, end]"},
      {"[]", "must be an array [begin, end]"},
      {"null", "must be an array [begin, end]"},
      {R"("0,24")", "must be an array [begin, end]"},
      {"[-1,23]", "non-negative integers"},
      {"[0.0,24]", "non-negative integers"},
      {R"(["0","24"])", "non-negative integers"},
      {"[24,0]", "end before they begin"},
      {"[0,23]", "span 23 bytes"},
      {"[0,25]", "span 25 bytes"},
      {"[1,25]", "run past the end"},
      {"[0,18446744073709551615]", "span 18446744073709551615 bytes"},
      {"[18446744073709551591,18446744073709551615]", "run past the end"},
      {"[0,[[[24]]]]", "nests deeper than 4 levels"},
      {"[0," + deep + "]", "nests deeper than 4 levels"},
  };
  for (size_t i = 0; i < offsets.size(); ++i) {
    add(t, "st.offsets_" + std::to_string(i), file("t.safetensors", craft(entry(ok_dtype, ok_shape, offsets[i].first), f32x6)),
        load_st, offsets[i].second);
  }
  // The buffer around one good entry.
  const std::string good = entry(ok_dtype, ok_shape, ok_offsets);
  add(t, "st.trailing_bytes", file("t.safetensors", craft(good, f32x6 + "junk")), load_st, "no trailing bytes");
  add(t, "st.short_buffer", file("t.safetensors", craft(good, f32x6.substr(0, 20))), load_st, "run past the end");
  add(t, "st.no_buffer", file("t.safetensors", craft(good, "")), load_st, "run past the end");

  // Two tensors: overlap, hole, duplicates.
  auto two = [](const std::string& a, const std::string& b) {
    return R"({"a":{"dtype":"F32","shape":[3],"data_offsets":)" + a + R"(},"b":{"dtype":"F32","shape":[3],"data_offsets":)" +
           b + "}}";
  };
  add(t, "st.overlap", file("t.safetensors", craft(two("[0,12]", "[8,20]"), f32x6)), load_st, "overlap the previous tensor");
  add(t, "st.same_range", file("t.safetensors", craft(two("[0,12]", "[0,12]"), f32x6)), load_st, "overlap the previous tensor");
  add(t, "st.hole", file("t.safetensors", craft(two("[0,12]", "[16,28]"), f32x6 + "abcd")), load_st, "leave a hole of 4 bytes");
  add(t, "st.hole_at_start", file("t.safetensors", craft(two("[12,24]", "[24,36]"), f32x6 + f32x6.substr(0, 12))), load_st,
      "leave a hole of 12 bytes after offset 0");
  add(t, "st.duplicate_name",
      file("t.safetensors", craft(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"w":{"dtype":"F32","shape":[3],"data_offsets":[12,24]}})", f32x6)),
      load_st, "tensor name 'w' appears twice");
  add(t, "st.duplicate_metadata",
      file("t.safetensors", craft(R"({"__metadata__":{},"__metadata__":{},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", f32x6)),
      load_st, "tensor name '__metadata__' appears twice");
  add(t, "st.duplicate_field",
      file("t.safetensors", craft(R"({"w":{"dtype":"F32","dtype":"I64","shape":[2,3],"data_offsets":[0,24]}})", f32x6)),
      load_st, "key 'dtype' appears twice");
  add(t, "st.duplicate_offsets",
      file("t.safetensors", craft(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24],"data_offsets":[0,24]}})", f32x6)),
      load_st, "key 'data_offsets' appears twice");
  add(t, "st.duplicate_metadata_key",
      file("t.safetensors", craft(R"({"__metadata__":{"k":"1","k":"2"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", f32x6)),
      load_st, "key 'k' appears twice");

  // Metadata.
  const std::vector<std::pair<std::string, const char*>> metas = {
      {"1", "must be an object of strings"},
      {R"(["a"])", "must be an object of strings"},
      {"null", "must be an object of strings"},
      {R"({"a":1})", "must be a string"},
      {R"({"a":null})", "must be a string"},
      {R"({"a":{"b":"c"}})", "must be a string"},
      {R"({"a":["b"]})", "must be a string"},
      {R"({"a":[[[["b"]]]]})", "nests deeper than 4 levels"},
      {R"({"a":)" + deep + "}", "nests deeper than 4 levels"},
  };
  for (size_t i = 0; i < metas.size(); ++i) {
    add(t, "st.metadata_" + std::to_string(i),
        file("t.safetensors", craft(R"({"__metadata__":)" + metas[i].first + R"(,"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", f32x6)),
        load_st, metas[i].second);
  }

  // What is not a regular file, or not there.
  add(t, "st.fifo", [](const std::string& d) { return make_fifo(d, "t.safetensors"); }, load_st, "not a regular file (a FIFO)");
  add(t, "st.folder", [](const std::string& d) { return make_folder(d, "t.safetensors"); }, load_st, "not a regular file (a folder)");
  add(t, "st.symlink_to_fifo", [](const std::string& d) { return make_symlink(d, "t.safetensors", make_fifo(d, "fifo")); },
      load_st, "not a regular file (a FIFO)");
  add(t, "st.dev_zero", [](const std::string&) { return std::string("/dev/zero"); }, load_st,
      "not a regular file (a character device)");
  add(t, "st.missing", [](const std::string& d) { return d + "/missing.safetensors"; }, load_st, std::strerror(ENOENT));
  add(t, "st.dangling_symlink", [](const std::string& d) { return make_symlink(d, "t.safetensors", d + "/nowhere"); },
      load_st, std::strerror(ENOENT));
  add(t, "st.empty", file("t.safetensors", ""), load_st, "too short: 0 bytes");
}

// ---- training state ----------------------------------------------------------------------------

// A run: a small MLP and its optimizer (Adam: moments; SGD: momentum buffers).
struct Run {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Optimizer> opt;
  explicit Run(bool adam) {
    manual_seed(11);
    model = nn::make_mlp({3, 4, 2});
    if (adam) {
      opt = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions{});
    } else {
      opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 0.1f, .momentum = 0.9f});
    }
  }
  // Everything a load could change: parameters, optimizer state and step count, the generator.
  std::vector<std::vector<float>> snapshot() const {
    std::vector<std::vector<float>> s;
    for (const auto& [name, p] : model->named_parameters()) s.push_back(p.to_vector<float>());
    for (const auto& [name, t] : opt->state_tensors()) s.push_back(t.to_vector<float>());
    s.push_back({static_cast<float>(opt->step_count()), static_cast<float>(default_generator().seed()),
                 static_cast<float>(default_generator().offset())});
    return s;
  }
};

// A valid state of a run after two steps on a fixed batch (so every state tensor is non-zero).
nn::SafetensorsFile valid_state(bool adam, const std::string& scratch) {
  Run r(adam);
  Tensor x = test::rand_tensor({5, 3}, 3);
  Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 1, 0, 1}, {5});
  for (int i = 0; i < 2; ++i) {
    r.opt->zero_grad();
    cross_entropy(r.model->forward(x), y).backward();
    r.opt->step();
  }
  const std::string p = scratch + "/valid.state.safetensors";
  optim::save_train_state(p, *r.model, *r.opt, {.epoch = 2, .extra = {{"config.lr", "0.1"}}});
  nn::SafetensorsFile f = nn::load_safetensors(p);
  fs::remove(p);
  return f;
}

// Loads into a fresh run; a failed load must leave the run as it was.
std::function<void(const std::string&)> load_state(bool adam) {
  return [adam](const std::string& p) {
    Run r(adam);
    const auto before = r.snapshot();
    try {
      optim::load_train_state(p, *r.model, *r.opt);
    } catch (const Error&) {
      if (r.snapshot() != before) throw std::logic_error("the failed load changed the run");
      throw;
    }
  };
}

// A state file: the valid one, changed by `edit`.
std::function<std::string(const std::string&)> state_file(const nn::SafetensorsFile& valid,
                                                           std::function<void(nn::SafetensorsFile&)> edit) {
  return [valid, edit = std::move(edit)](const std::string& dir) {
    nn::SafetensorsFile f = valid;
    for (auto& [name, t] : f.tensors) t = t.clone();  // the edit must not reach the shared copy
    edit(f);
    const std::string p = dir + "/epoch_2.state.safetensors";
    nn::save_safetensors(p, f.tensors, f.metadata);
    return p;
  };
}

Tensor& tensor_named(nn::SafetensorsFile& f, const std::string& name) {
  for (auto& [n, t] : f.tensors) {
    if (n == name) return t;
  }
  throw std::logic_error("test: no tensor " + name);
}

void add_train_state_rows(Table& t, const std::string& scratch) {
  const nn::SafetensorsFile adam = valid_state(true, scratch), sgd = valid_state(false, scratch);
  const auto load_adam = load_state(true);

  // Counts: digits only, within int64; the generator's seed and offset within uint64.
  const std::vector<std::string> bad_numbers = {"-1", "", "x", "1.5", "1e3", " 1", "1 ", "+1", "0x10", "99999999999999999999999"};
  for (const char* key : {"epoch", "batches_done", "step_count"}) {
    std::vector<std::string> values = bad_numbers;
    values.push_back("9223372036854775808");  // 2^63
    for (size_t i = 0; i < values.size(); ++i) {
      const std::string k = std::string("minigrad.") + key, v = values[i];
      add(t, "state." + std::string(key) + "_" + std::to_string(i), state_file(adam, [k, v](auto& f) { f.metadata[k] = v; }),
          load_adam, "\"" + k + "\" = \"" + v + "\" is not an integer in [0, 9223372036854775807]");
    }
  }
  for (const char* key : {"generator_seed", "generator_offset"}) {
    std::vector<std::string> values = bad_numbers;
    values.push_back("18446744073709551616");  // 2^64
    for (size_t i = 0; i < values.size(); ++i) {
      const std::string k = std::string("minigrad.") + key, v = values[i];
      add(t, "state." + std::string(key) + "_" + std::to_string(i), state_file(adam, [k, v](auto& f) { f.metadata[k] = v; }),
          load_adam, "\"" + k + "\" = \"" + v + "\" is not an integer in [0, 18446744073709551615]");
    }
  }
  for (const char* key : {"epoch", "batches_done", "step_count", "generator_seed", "generator_offset"}) {
    const std::string k = std::string("minigrad.") + key;
    add(t, "state.missing_" + std::string(key), state_file(adam, [k](auto& f) { f.metadata.erase(k); }), load_adam,
        "metadata \"" + k + "\" missing");
  }
  // The format tag.
  add(t, "state.format_missing", state_file(adam, [](auto& f) { f.metadata.erase("minigrad.format"); }), load_adam,
      "minigrad.format = \"<missing>\"");
  for (const char* tag : {"minigrad-train-state-0", "minigrad-train-state-2", "", "MINIGRAD-TRAIN-STATE-1"}) {
    const std::string v = tag;
    add(t, "state.format_" + (v.empty() ? std::string("empty") : v), state_file(adam, [v](auto& f) { f.metadata["minigrad.format"] = v; }),
        load_adam, "not a libminigrad training-state file (metadata minigrad.format = \"" + v + "\"");
  }
  add(t, "state.weights_file", state_file(adam, [](auto& f) { f.metadata.clear(); }), load_adam,
      "not a libminigrad training-state file");

  // Every tensor: in bfloat16, missing, holding NaN or infinity.
  for (size_t i = 0; i < adam.tensors.size(); ++i) {
    const std::string key = adam.tensors[i].first;
    add(t, "state.bf16_" + key, state_file(adam, [key](auto& f) {
          Tensor& x = tensor_named(f, key);
          Tensor b = Tensor::empty(x.shape(), TensorOptions{DType::bf16});
          for (int64_t j = 0; j < x.numel(); ++j) {
            uint32_t bits;
            std::memcpy(&bits, x.data<float>() + j, 4);
            static_cast<uint16_t*>(b.raw_data())[j] = static_cast<uint16_t>(bits >> 16);
          }
          x = b;
        }),
        load_adam, "tensor \"" + key + "\" is bfloat16");
    add(t, "state.missing_" + key, state_file(adam, [key](auto& f) {
          std::erase_if(f.tensors, [&](const auto& nt) { return nt.first == key; });
        }),
        load_adam, "tensor \"" + key + "\" is missing");
    const float bad = i % 3 == 0 ? NAN : i % 3 == 1 ? INFINITY : -INFINITY;
    const int64_t at = adam.tensors[i].second.numel() - 1;  // the last element: the index is reported
    std::ostringstream value;
    value << bad;
    add(t, "state.non_finite_" + key, state_file(adam, [key, bad, at](auto& f) { tensor_named(f, key).template data<float>()[at] = bad; }),
        load_adam, "tensor \"" + key + "\" holds " + value.str() + " at element " + std::to_string(at));
    if (key.ends_with(".exp_avg_sq")) {
      add(t, "state.negative_" + key, state_file(adam, [key](auto& f) { tensor_named(f, key).template data<float>()[1] = -1e-3f; }),
          load_adam, "tensor \"" + key + "\" holds -0.001 at element 1");
    }
  }
  add(t, "state.float64", state_file(adam, [](auto& f) {
        Tensor& x = f.tensors[0].second;
        Tensor d = Tensor::empty(x.shape(), TensorOptions{DType::f64});
        for (int64_t j = 0; j < x.numel(); ++j) d.data<double>()[j] = x.data<float>()[j];
        x = d;
      }),
      load_adam, "is float64");
  add(t, "state.int64", state_file(adam, [](auto& f) {
        Tensor& x = f.tensors[1].second;
        x = Tensor::zeros(x.shape(), TensorOptions{DType::i64});
      }),
      load_adam, "is int64");
  add(t, "state.transposed", state_file(adam, [](auto& f) {
        Tensor& x = f.tensors[0].second;
        x = Tensor::zeros({x.shape()[1], x.shape()[0]});
      }),
      load_adam, "the run expects float32");
  add(t, "state.flattened_moment", state_file(adam, [](auto& f) {
        Tensor& x = tensor_named(f, "optim.0.exp_avg");
        x = Tensor::zeros({x.numel()});
      }),
      load_adam, "the run expects float32");
  for (const char* extra : {"optim.99.exp_avg", "param.extra", "momentum"}) {
    const std::string k = extra;
    add(t, "state.unexpected_" + k, state_file(adam, [k](auto& f) { f.tensors.emplace_back(k, Tensor::zeros({2})); }), load_adam,
        "unexpected tensor \"" + k + "\"");
  }
  // A state saved by another optimizer.
  add(t, "state.sgd_into_adam", state_file(sgd, [](auto&) {}), load_adam, "tensor \"optim.0.exp_avg\" is missing");
  add(t, "state.adam_into_sgd", state_file(adam, [](auto&) {}), load_state(false), "tensor \"optim.0.momentum_buffer\" is missing");
  // Damaged files: cut short, not a file.
  for (int k = 1; k <= 4; ++k) {
    add(t, "state.truncated_" + std::to_string(k), [adam, k](const std::string& dir) {
          const std::string p = state_file(adam, [](auto&) {})(dir);
          fs::resize_file(p, fs::file_size(p) * k / 5);
          return p;
        },
        load_adam, "safetensors file");
  }
  add(t, "state.fifo", [](const std::string& d) { return make_fifo(d, "epoch_2.state.safetensors"); }, load_adam, "a FIFO");
  add(t, "state.garbage", file("epoch_2.state.safetensors", std::string(4096, '\x7f')), load_adam, "exceeds the format's limit");
}

// ---- IDX ---------------------------------------------------------------------------------------

std::string idx(uint32_t magic, const std::vector<uint32_t>& dims, size_t data_bytes, uint8_t mod = 251) {
  std::string s = be32(magic);
  for (uint32_t d : dims) s += be32(d);
  for (size_t i = 0; i < data_bytes; ++i) s.push_back(static_cast<char>(i % mod));
  return s;
}

void read_images(const std::string& p) { data::read_idx(p, 3); }
void read_labels(const std::string& p) { data::read_idx(p, 1); }

void add_idx_rows(Table& t, const std::string& scratch) {
  const std::string good = idx(0x803, {3, 28, 28}, 3 * 784);  // 16-byte header + 2352 bytes
  const std::string good_gz = gzip(good, scratch);

  // Magic numbers and type codes, raw and gzip-compressed.
  const std::vector<uint32_t> magics = {0x1f8b0803, 0x00000903, 0x00000B03, 0x00000C03, 0x00000D03, 0x00000E03,
                                        0x00000003, 0x08000003, 0xFFFFFFFF, 0x504B0304 /* zip */};
  for (uint32_t m : magics) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%x", m);
    const std::string bytes = idx(m, {3, 28, 28}, 3 * 784);
    // A raw file starting 1f 8b is a gzip file to any reader, and a damaged one.
    add(t, std::string("idx.magic_") + hex, file("images-idx3-ubyte", bytes), read_images,
        m >> 16 == 0x1f8b ? std::string("damaged gzip data") : std::string("wrong magic number 0x") + hex);
    add(t, std::string("idx.magic_gz_") + hex, [bytes](const std::string& d) { return file("images-idx3-ubyte.gz", gzip(bytes, d))(d); },
        read_images, std::string("wrong magic number 0x") + hex);
  }
  for (uint32_t nd : {0u, 1u, 2u, 4u, 255u}) {
    add(t, "idx.ndims_" + std::to_string(nd), file("images-idx3-ubyte", idx(0x800 + nd, std::vector<uint32_t>(std::min(nd, 4u), 2), 64)),
        read_images, "wrong number of dimensions: the file has " + std::to_string(nd));
  }
  // Dimension sizes.
  for (int d = 0; d < 3; ++d) {
    std::vector<uint32_t> dims = {3, 28, 28};
    dims[d] = 0;
    add(t, "idx.zero_dim_" + std::to_string(d), file("images-idx3-ubyte", idx(0x803, dims, 0)), read_images,
        "dimension " + std::to_string(d) + " has size 0");
    dims[d] = 1u << 28;
    add(t, "idx.huge_dim_" + std::to_string(d), file("images-idx3-ubyte", idx(0x803, dims, 0)), read_images,
        "dimension " + std::to_string(d) + " has size 268435456, expected 1 .. 2^28");
  }
  add(t, "idx.dim_uint32_max", file("images-idx3-ubyte", idx(0x803, {0xFFFFFFFFu, 28, 28}, 0)), read_images, "has size 4294967295");
  add(t, "idx.labels_zero", file("labels-idx1-ubyte", idx(0x801, {0}, 0)), read_labels, "dimension 0 has size 0");
  add(t, "idx.over_16GiB", file("images-idx3-ubyte", idx(0x803, {(1u << 28) - 1, (1u << 28) - 1, 2}, 0)), read_images,
      "larger than 16 GiB");
  // Promises the file cannot keep: refused before a byte of data is allocated.
  add(t, "idx.22_bytes_declaring_3GiB", file("images-idx3-ubyte", idx(0x803, {4000000, 28, 28}, 6)), read_images,
      "truncated: 6 data bytes, the header promises 3136000000");
  add(t, "idx.16GiB_no_data", file("images-idx3-ubyte", idx(0x803, {1u << 14, 1u << 10, 1u << 10}, 0)), read_images,
      "truncated: 0 data bytes, the header promises 17179869184");
  add(t, "idx.gz_declaring_3GiB", [](const std::string& d) { return file("images-idx3-ubyte.gz", gzip(idx(0x803, {4000000, 28, 28}, 6), d))(d); },
      read_images, "declare 3136000000 data bytes, more than a");
  add(t, "idx.gz_16GiB_no_data", [](const std::string& d) { return file("images-idx3-ubyte.gz", gzip(idx(0x803, {1u << 14, 1u << 10, 1u << 10}, 0), d))(d); },
      read_images, "deflate expands at most 1032:1");
  // A gzip bomb: 64 MiB of zeros after a header that declares one image.
  add(t, "idx.gzip_bomb", [](const std::string& d) {
        return file("images-idx3-ubyte.gz", gzip(idx(0x803, {1, 28, 28}, 0) + std::string(size_t{64} << 20, '\0'), d))(d);
      },
      read_images, "trailing bytes after the 784 data bytes the header promises");
  add(t, "idx.gzip_bomb_declared", [](const std::string& d) {
        return file("images-idx3-ubyte.gz", gzip(idx(0x803, {50000, 28, 28}, 0) + std::string(size_t{4} << 20, '\0'), d))(d);
      },
      read_images, "deflate expands at most 1032:1");
  // Truncated raw data, and the gzip file cut at every 97th byte.
  for (size_t cut : {size_t{0}, size_t{3}, size_t{4}, size_t{9}, size_t{16}, size_t{17}, size_t{1000}, good.size() - 1}) {
    const char* expect = cut < 4 ? "an IDX header needs at least 4" : cut < 16 ? "truncated header" : "truncated: ";
    add(t, "idx.raw_truncated_" + std::to_string(cut), file("images-idx3-ubyte", good.substr(0, cut)), read_images, expect);
  }
  for (size_t cut = 1; cut < good_gz.size(); cut += 97) {
    const char* expect = cut < 2 ? "an IDX header needs at least 4" : "truncated gzip data";
    add(t, "idx.gz_truncated_" + std::to_string(cut), file("images-idx3-ubyte.gz", good_gz.substr(0, cut)), read_images, expect);
  }
  add(t, "idx.gz_truncated_last_byte", file("images-idx3-ubyte.gz", good_gz.substr(0, good_gz.size() - 1)), read_images,
      "truncated gzip data");
  add(t, "idx.gz_short_data", [](const std::string& d) { return file("images-idx3-ubyte.gz", gzip(idx(0x803, {3, 28, 28}, 3 * 784 - 1), d))(d); },
      read_images, "truncated: 2351 data bytes, the header promises 2352");
  // After the gzip stream (Note [gzip members] in src/data/idx.cpp).
  const std::string offset = "at byte offset " + std::to_string(good_gz.size());
  const std::vector<std::pair<std::string, std::string>> trailers = {
      {"x", offset}, {"garbage", offset}, {"\x1f", offset}, {"PK\x03\x04", offset},
      {std::string("\0\0\0x", 4), "at byte offset " + std::to_string(good_gz.size() + 3)},
      {std::string(100, '\x01'), offset},
      {"\x1f\x8b", "truncated gzip data"},                 // the start of a member that never comes
      {std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage", 17), "damaged gzip data"},  // a member of garbage
  };
  for (size_t i = 0; i < trailers.size(); ++i) {
    add(t, "idx.gz_trailing_" + std::to_string(i), file("images-idx3-ubyte.gz", good_gz + trailers[i].first), read_images,
        trailers[i].second);
  }
  add(t, "idx.gz_second_member_with_more_data", [good_gz](const std::string& d) { return file("images-idx3-ubyte.gz", good_gz + gzip("x", d))(d); },
      read_images, "trailing bytes after the 2352 data bytes the header promises");
  add(t, "idx.raw_trailing", file("images-idx3-ubyte", good + "x"), read_images, "trailing bytes after the 2352 data bytes");
  // Damage inside the gzip file: the trailer's CRC and length, the method, the flags, the data.
  auto damaged = [&](const std::string& name, size_t at, char x, const char* expect) {
    std::string b = good_gz;
    b[at] = static_cast<char>(b[at] ^ x);
    add(t, "idx.gz_damaged_" + name, file("images-idx3-ubyte.gz", b), read_images, expect);
  };
  damaged("crc", good_gz.size() - 8, 0x01, "incorrect data check");
  damaged("length", good_gz.size() - 4, 0x01, "incorrect length check");
  damaged("method", 2, 0x0f, "unknown compression method");
  damaged("flags", 3, static_cast<char>(0xe0), "unknown header flags set");
  damaged("data", good_gz.size() / 2, 0x55, "damaged gzip data");
  // Labels, through load_idx_pair.
  auto pair_with_labels = [](const std::string& p) {
    const std::string dir = fs::path(p).parent_path().string();
    data::write_maybe_gz(dir + "/images-idx3-ubyte.gz", idx(0x803, {3, 28, 28}, 3 * 784));
    data::load_idx_pair(dir + "/images-idx3-ubyte.gz", p);
  };
  add(t, "idx.label_out_of_range", file("labels-idx1-ubyte", idx(0x801, {3}, 0) + std::string("\x01\x0a\x02", 3)), pair_with_labels,
      "label 1 is 10, expected a class in 0..9");
  add(t, "idx.label_255", file("labels-idx1-ubyte", idx(0x801, {3}, 0) + std::string("\x01\x02\xff", 3)), pair_with_labels, "label 2 is 255");
  add(t, "idx.label_count", file("labels-idx1-ubyte", idx(0x801, {2}, 2, 10)), pair_with_labels, "counts disagree");
  add(t, "idx.images_32x32", file("images-idx3-ubyte", idx(0x803, {3, 32, 32}, 3 * 1024)),
      [](const std::string& p) { data::load_idx_pair(p, p); }, "wrong image size 32x32");
  // What is not a regular file, or not there.
  add(t, "idx.fifo", [](const std::string& d) { return make_fifo(d, "images-idx3-ubyte"); }, read_images, "not a regular file (a FIFO)");
  add(t, "idx.fifo_gz", [](const std::string& d) { return make_fifo(d, "images-idx3-ubyte.gz"); }, read_images, "not a regular file (a FIFO)");
  add(t, "idx.folder", [](const std::string& d) { return make_folder(d, "images-idx3-ubyte"); }, read_images, "not a regular file (a folder)");
  add(t, "idx.symlink_to_fifo", [](const std::string& d) { return make_symlink(d, "images-idx3-ubyte", make_fifo(d, "fifo")); },
      read_images, "not a regular file (a FIFO)");
  add(t, "idx.dev_zero", [](const std::string&) { return std::string("/dev/zero"); }, read_images, "not a regular file (a character device)");
  add(t, "idx.missing", [](const std::string& d) { return d + "/images-idx3-ubyte.gz"; }, read_images, std::strerror(ENOENT));
}

// ---- images ------------------------------------------------------------------------------------

constexpr int kW = 64, kH = 48;

std::vector<unsigned char> pixels() {
  std::vector<unsigned char> rgb(kW * kH * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<unsigned char>((i * 7) ^ (i >> 5));
  return rgb;
}

std::string encoded(bool jpeg, const std::string& scratch) {
  const std::string p = scratch + (jpeg ? "/x.jpg" : "/x.png");
  const auto rgb = pixels();
  REQUIRE((jpeg ? stbi_write_jpg(p.c_str(), kW, kH, 3, rgb.data(), 90) : stbi_write_png(p.c_str(), kW, kH, 3, rgb.data(), kW * 3)) != 0);
  std::string out = slurp(p);
  fs::remove(p);
  return out;
}

// An image file in a class folder of its own: <dir>/root/c/<name>.
std::function<std::string(const std::string&)> image(const std::string& name, std::string bytes) {
  return [name, bytes = std::move(bytes)](const std::string& dir) {
    fs::create_directories(dir + "/root/c");
    return file(name, bytes)(dir + "/root/c");
  };
}

// Decodes the one image of the folder that holds `p`.
void load_image(const std::string& p) {
  data::ImageFolder ds(fs::path(p).parent_path().parent_path().string(), {.image_size = 8});
  std::vector<float> buf(3 * 8 * 8);
  ds.load(0, false, buf.data());
}

// The folder is scanned while `p` is a valid image, which `replace` then turns into something
// else (the scan lists regular files only).
std::function<void(const std::string&)> load_replaced(std::string valid, std::function<void(const std::string&)> replace) {
  return [valid = std::move(valid), replace = std::move(replace)](const std::string& p) {
    spit(p, valid);
    data::ImageFolder ds(fs::path(p).parent_path().parent_path().string(), {.image_size = 8});
    fs::remove(p);
    replace(p);
    std::vector<float> buf(3 * 8 * 8);
    ds.load(0, false, buf.data());
  };
}

// Offset just past the first marker `m` (0xFF m) of a JPEG.
size_t after_marker(const std::string& jpg, unsigned char m) {
  for (size_t i = 2; i + 1 < jpg.size(); ++i) {
    if (static_cast<unsigned char>(jpg[i]) == 0xFF && static_cast<unsigned char>(jpg[i + 1]) == m) return i + 2;
  }
  throw std::logic_error("test: no JPEG marker");
}

void add_image_rows(Table& t, const std::string& scratch) {
  const std::string jpg = encoded(true, scratch), png = encoded(false, scratch);
  // SOF0: length(2) precision(1) height(2) width(2) components(1 + 3 x 3); stbi_info needs all 17
  const size_t sof = after_marker(jpg, 0xC0);
  // Truncated at 30 points each: the format is named, whatever the decoder last complained of.
  for (int k = 1; k <= 30; ++k) {
    const size_t cut = jpg.size() * k / 31;
    add(t, "img.jpeg_truncated_" + std::to_string(cut), image("a.jpg", jpg.substr(0, cut)), load_image,
        cut < sof + 17 ? "corrupt or truncated JPEG header" : "corrupt or truncated JPEG");
  }
  for (size_t cut : {jpg.size() - 1, jpg.size() - 2}) {
    add(t, "img.jpeg_truncated_" + std::to_string(cut), image("a.jpg", jpg.substr(0, cut)), load_image, "corrupt or truncated JPEG");
  }
  for (int k = 1; k <= 30; ++k) {
    const size_t cut = png.size() * k / 31;
    add(t, "img.png_truncated_" + std::to_string(cut), image("a.png", png.substr(0, cut)), load_image,
        cut < 29 ? "corrupt PNG header" : "truncated PNG");
  }
  for (size_t back = 1; back <= 12; ++back) {  // inside the IEND chunk, which stb_image never reads whole
    add(t, "img.png_cut_by_" + std::to_string(back), image("a.png", png.substr(0, png.size() - back)), load_image, "truncated PNG");
  }
  // Signatures.
  const std::vector<std::pair<std::string, std::string>> sigs = {
      {"gif.jpg", "GIF89a\x40\x00\x30\x00"}, {"bmp.png", "BM\x36\x00\x00\x00"}, {"empty.jpg", ""},
      {"text.png", "definitely not a picture"}, {"png_typo.png", "\x89PNX\r\n\x1a\n" + png.substr(8)},
      {"jpeg_two_bytes.jpg", "\xFF\xD8"}, {"jpeg_bad_third.jpg", std::string("\xFF\xD8\x00", 3) + jpg.substr(3)},
  };
  for (const auto& [name, bytes] : sigs) {
    add(t, "img.signature_" + name, image(name, bytes), load_image, "is neither a JPEG nor a PNG file");
  }
  // Declared sizes.
  auto png_declaring = [&](uint32_t w, uint32_t h) {
    std::string b = png;
    const std::string wh = be32(w) + be32(h);
    b.replace(16, 8, wh);
    return b;
  };
  add(t, "img.png_16384x16385", image("a.png", png_declaring(16384, 16385)), load_image, "declares 16384x16385 pixels");
  add(t, "img.png_65535x65535", image("a.png", png_declaring(65535, 65535)), load_image, "corrupt PNG header");
  add(t, "img.png_zero_width", image("a.png", png_declaring(0, 48)), load_image, "corrupt PNG header");
  add(t, "img.png_2^31_wide", image("a.png", png_declaring(0x80000000u, 1)), load_image, "corrupt PNG header");
  auto jpeg_declaring = [&](uint16_t w, uint16_t h) {
    std::string b = jpg;
    b[sof + 3] = static_cast<char>(h >> 8), b[sof + 4] = static_cast<char>(h);
    b[sof + 5] = static_cast<char>(w >> 8), b[sof + 6] = static_cast<char>(w);
    return b;
  };
  add(t, "img.jpeg_65500x65500", image("a.jpg", jpeg_declaring(65500, 65500)), load_image, "declares 65500x65500 pixels");
  add(t, "img.jpeg_20000x20000", image("a.jpg", jpeg_declaring(20000, 20000)), load_image, "declares 20000x20000 pixels");
  add(t, "img.jpeg_zero_height", image("a.jpg", jpeg_declaring(64, 0)), load_image, "corrupt or truncated JPEG header (libjpeg: Empty JPEG image");
  add(t, "img.over_1GiB", [png](const std::string& dir) {
        const std::string p = image("big.png", png)(dir);
        fs::resize_file(p, (uintmax_t{1} << 30) + 1);  // sparse: no disk used
        return p;
      },
      load_image, "more than the limit of 1073741824");
  // What is not a regular file by the time it is read.
  add(t, "img.fifo", image("a.png", ""), load_replaced(png, [](const std::string& p) { REQUIRE(::mkfifo(p.c_str(), 0600) == 0); }),
      "is not a regular file");
  add(t, "img.folder", image("a.png", ""), load_replaced(png, [](const std::string& p) { fs::create_directory(p); }),
      "is not a regular file");
  add(t, "img.symlink_to_dev_zero", image("a.jpg", ""), load_replaced(jpg, [](const std::string& p) { fs::create_symlink("/dev/zero", p); }),
      "is not a regular file");
  add(t, "img.gone", image("a.jpg", ""), load_replaced(jpg, [](const std::string&) {}), "is not a regular file");
}

// ---- hyper-parameters --------------------------------------------------------------------------

std::vector<Tensor> params() { return {Tensor::zeros({3}).requires_grad_()}; }

void add_hyper_parameter_rows(Table& t) {
  // Each row: the parameter (what the message must name), the value as printed, the optimizer.
  auto row = [&](const std::string& name, const std::string& param, const std::string& expect,
                 std::function<void()> construct) {
    add(t, "hyper." + name, [param](const std::string&) { return param; }, [construct](const std::string&) { construct(); }, expect);
  };
  for (float v : {NAN, INFINITY, -INFINITY, -1.0f, -1e-30f}) {
    std::ostringstream s;
    s << v;
    row("sgd_lr_" + s.str(), "lr", "SGD: lr = " + s.str() + ", expected a finite number >= 0",
        [v] { optim::SGD(params(), {.lr = v}); });
    row("adam_lr_" + s.str(), "lr", "Adam: lr = " + s.str() + ", expected a finite number >= 0",
        [v] { optim::Adam(params(), {.lr = v}); });
    row("set_lr_" + s.str(), "lr", "SGD: lr = " + s.str(), [v] { optim::SGD(params(), {}).set_lr(v); });
  }
  for (float v : {-0.1f, 1.5f, NAN, INFINITY}) {
    std::ostringstream s;
    s << v;
    row("sgd_momentum_" + s.str(), "momentum", "SGD: momentum = " + s.str() + ", expected a number in [0, 1]",
        [v] { optim::SGD(params(), {.momentum = v}); });
    row("sgd_dampening_" + s.str(), "dampening", "SGD: dampening = " + s.str() + ", expected a number in [0, 1]",
        [v] { optim::SGD(params(), {.dampening = v}); });
  }
  for (float v : {-1.0f, NAN, INFINITY}) {
    std::ostringstream s;
    s << v;
    row("sgd_weight_decay_" + s.str(), "weight_decay", "SGD: weight_decay = " + s.str(),
        [v] { optim::SGD(params(), {.weight_decay = v}); });
    row("adamw_weight_decay_" + s.str(), "weight_decay", "AdamW: weight_decay = " + s.str(),
        [v] { optim::AdamW(params(), {.weight_decay = v}); });
  }
  for (float v : {1.0f, -0.1f, NAN, 1.5f}) {
    std::ostringstream s;
    s << v;
    row("adam_beta1_" + s.str(), "beta1", "Adam: beta1 = " + s.str() + ", expected a number in [0, 1)",
        [v] { optim::Adam(params(), {.beta1 = v}); });
    row("adam_beta2_" + s.str(), "beta2", "Adam: beta2 = " + s.str() + ", expected a number in [0, 1)",
        [v] { optim::Adam(params(), {.beta2 = v}); });
  }
  for (float v : {0.0f, -1e-8f, NAN, INFINITY}) {
    std::ostringstream s;
    s << v;
    row("adam_eps_" + s.str(), "eps", "Adam: eps = " + s.str() + ", expected a finite number > 0",
        [v] { optim::Adam(params(), {.eps = v}); });
  }
  for (float v : {-1.0f, NAN, INFINITY, -INFINITY}) {
    std::ostringstream s;
    s << v;
    row("clip_norm_" + s.str(), "clip_norm", "clip_norm must be >= 0 (0 = off), got " + s.str(), [v] {
      optim::SGD sgd(params(), {});
      optim::Accumulator(sgd, {.clip_norm = v});
    });
  }
  for (int64_t v : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    row("accumulate_steps_" + std::to_string(v), "steps", "must be >= 1, got " + std::to_string(v), [v] {
      optim::SGD sgd(params(), {});
      optim::Accumulator(sgd, {.steps = v});
    });
  }
}

struct TempDir {
  std::string path;
  TempDir() {
    path = (fs::temp_directory_path() / ("mg_test_hostile_" + std::to_string(::getpid()))).string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("hostile input: every row is refused with mg::Error naming the input and the problem") {
  TempDir tmp;
  const std::string scratch = tmp.path + "/scratch";
  fs::create_directories(scratch);
  Table table;
  add_safetensors_rows(table, scratch);
  add_train_state_rows(table, scratch);
  add_idx_rows(table, scratch);
  add_image_rows(table, scratch);
  add_hyper_parameter_rows(table);

  // MG_HOSTILE_ROWS=idx. runs the rows whose names contain "idx." only.
  const char* only = std::getenv("MG_HOSTILE_ROWS");
  std::set<std::string> names;
  size_t ran = 0, failed = 0;
  RowGuard guard;
  for (const Row& r : table) {
    REQUIRE_MESSAGE(names.insert(r.name).second, "two rows are named " << r.name);
    if (only && r.name.find(only) == std::string::npos) continue;
    ++ran;
    guard.start(r.name);
    const std::string dir = tmp.path + "/" + std::to_string(names.size());
    fs::create_directories(dir);
    const std::string subject = r.make(dir);
    const std::string problem = run_row(r, subject);
    alarm(0);
    CHECK_MESSAGE(problem.empty(), "row " << r.name << ": " << problem);
    if (!problem.empty()) {
      ++failed;
      std::cout.flush();  // seen even if a later row hangs (Note [row guard] exits without flushing)
    }
    fs::remove_all(dir);
  }
  std::printf("test_hostile: %zu rows (malformed files and arguments) of %zu run, %zu failed; no crash, no hang\n", ran,
              table.size(), failed);
  CHECK(table.size() >= 200);
}

// The inputs the rows corrupt are good ones: each is read whole.
TEST_CASE("hostile input: the valid inputs behind the rows are accepted") {
  TempDir tmp;
  const std::string scratch = tmp.path;
  {
    const std::string p = file("v.safetensors", valid_safetensors(scratch))(scratch);
    CHECK(nn::load_safetensors(p).tensors.size() == 3);
  }
  for (bool adam : {true, false}) {
    const nn::SafetensorsFile f = valid_state(adam, scratch);
    const std::string p = state_file(f, [](auto&) {})(scratch);
    Run r(adam);
    CHECK(optim::load_train_state(p, *r.model, *r.opt).epoch == 2);
    CHECK(r.opt->step_count() == 2);
  }
  {
    const std::string good = idx(0x803, {3, 28, 28}, 3 * 784);
    const std::string gz = gzip(good, scratch);
    // Raw; gzip; two gzip members; zero padding after the stream; a member after zero padding:
    // all read as Python's gzip module reads them (Note [gzip members] in src/data/idx.cpp).
    const std::vector<std::string> forms = {good, gz, gzip(good.substr(0, 100), scratch) + gzip(good.substr(100), scratch),
                                            gz + std::string(100, '\0'),
                                            gzip(good.substr(0, 7), scratch) + std::string(3, '\0') + gzip(good.substr(7), scratch)};
    for (size_t i = 0; i < forms.size(); ++i) {
      INFO("form " << i);
      const std::string p = file("images-idx3-ubyte" + std::to_string(i), forms[i])(scratch);
      const data::IdxArray a = data::read_idx(p, 3);
      CHECK(a.dims == std::vector<int64_t>{3, 28, 28});
      CHECK(std::string(a.bytes.begin(), a.bytes.end()) == good.substr(16));
    }
  }
  for (bool jpeg : {true, false}) {
    const std::string p = image(jpeg ? "a.jpg" : "a.png", encoded(jpeg, scratch))(scratch + (jpeg ? "/j" : "/p"));
    CHECK_NOTHROW(load_image(p));
  }
  {
    const std::string p = image("a.png", encoded(false, scratch) + "trailing data after IEND")(scratch + "/q");
    CHECK_NOTHROW(load_image(p));
  }
  // The edges of each range.
  auto sgd = [] { optim::SGD(params(), {.lr = 0.0f, .momentum = 1.0f, .dampening = 1.0f}); };
  auto adam = [] { optim::Adam(params(), {.lr = 0.0f, .beta1 = 0.0f, .beta2 = 0.0f, .eps = 1e-30f}); };
  auto no_clip = [] {
    optim::SGD s(params(), {});
    optim::Accumulator(s, {.clip_norm = 0.0f});
  };
  CHECK_NOTHROW(sgd());
  CHECK_NOTHROW(adam());
  CHECK_NOTHROW(no_clip());
}
