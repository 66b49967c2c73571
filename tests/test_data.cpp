// data/: IDX reading and its errors, data sets, TensorDataset and its checks, the loader's order
// (Note [batch-size independent order]) and shards (Note [shards]) over any Dataset, prefetching,
// and the real MNIST split when ../shared/data/mnist is present.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <type_traits>

#include <minigrad/data/idx.h>
#include <minigrad/data/loader.h>
#include <minigrad/data/tokens.h>
#include "helpers.h"

using namespace mg;
namespace fs = std::filesystem;

namespace {

using test::TempDir;

void be32(std::string& s, uint32_t v) {
  for (int sh = 24; sh >= 0; sh -= 8) s.push_back(static_cast<char>((v >> sh) & 0xFF));
}

void write_bytes(const std::string& path, const std::string& bytes) { data::write_maybe_gz(path, bytes); }

std::string idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims, size_t data_bytes, uint8_t fill_mod = 251) {
  std::string s;
  be32(s, magic);
  for (uint32_t d : dims) be32(s, d);
  for (size_t i = 0; i < data_bytes; ++i) s.push_back(static_cast<char>(i % fill_mod));
  return s;
}

// A valid pair of n images and labels (labels i % 10).
void write_pair(const TempDir& dir, const std::string& prefix, uint32_t n, bool gz) {
  const std::string ext = gz ? ".gz" : "";
  write_bytes(dir / (prefix + "-images-idx3-ubyte" + ext), idx_bytes(0x803, {n, 28, 28}, size_t{n} * 784));
  write_bytes(dir / (prefix + "-labels-idx1-ubyte" + ext), idx_bytes(0x801, {n}, n, 10));
}

}  // namespace

TEST_CASE("IDX: gzip and raw files read the same, and write_idx round-trips") {
  TempDir dir("data_idx");
  for (bool gz : {true, false}) {
    write_pair(dir, gz ? "gz" : "raw", 37, gz);
  }
  auto a = data::read_idx(dir / "gz-images-idx3-ubyte.gz", 3);
  auto b = data::read_idx(dir / "raw-images-idx3-ubyte", 3);
  CHECK(a.dims == std::vector<int64_t>{37, 28, 28});
  CHECK(a.bytes == b.bytes);
  CHECK(a.bytes[785] == 785 % 251);
  data::write_idx(dir / "copy.gz", a.dims, a.bytes.data());
  data::write_idx(dir / "copy", a.dims, a.bytes.data());
  CHECK(data::read_idx(dir / "copy.gz", 3).bytes == a.bytes);
  CHECK(data::read_idx(dir / "copy", 3).bytes == a.bytes);
  CHECK(fs::file_size(dir / "copy") == 16 + a.bytes.size());  // raw: no gzip header
  data::IdxDataset d = data::load_idx_pair(dir / "gz-images-idx3-ubyte.gz", dir / "gz-labels-idx1-ubyte.gz");
  CHECK(d.size() == 37);
  CHECK(d.labels()[13] == 3);
}

TEST_CASE("IDX: each malformed file raises mg::Error naming the file and the problem") {
  TempDir dir("data_bad");
  write_pair(dir, "good", 20, true);
  const std::string good_img = dir / "good-images-idx3-ubyte.gz", good_lab = dir / "good-labels-idx1-ubyte.gz";
  struct Case {
    const char* name;
    std::string bytes;
    bool is_images;
    const char* expect;
  };
  std::string trailing = idx_bytes(0x803, {20, 28, 28}, 20 * 784 + 5);
  std::string bad_label = idx_bytes(0x801, {20}, 20, 10);
  bad_label[8 + 7] = 10;  // label 7 out of range
  const std::vector<Case> cases = {
      {"magic.gz", idx_bytes(0x1f8b0803, {20, 28, 28}, 20 * 784), true, "wrong magic"},
      {"type.gz", idx_bytes(0x0D03, {20, 28, 28}, 20 * 784), true, "wrong magic"},  // float data
      {"labels_as_images.gz", idx_bytes(0x801, {20}, 20), true, "wrong number of dimensions"},
      {"images_as_labels.gz", idx_bytes(0x803, {20, 28, 28}, 20 * 784), false, "wrong number of dimensions"},
      {"size.gz", idx_bytes(0x803, {20, 32, 32}, 20 * 1024), true, "wrong image size 32x32"},
      {"zero_dim.gz", idx_bytes(0x803, {0, 28, 28}, 0), true, "has size 0"},
      {"truncated.gz", idx_bytes(0x803, {20, 28, 28}, 20 * 784 - 100), true, "truncated"},
      {"truncated_raw", idx_bytes(0x803, {20, 28, 28}, 19 * 784), true, "truncated"},
      {"header_only", std::string("\0\0\x08", 3), true, "truncated"},
      {"short_header", idx_bytes(0x803, {20}, 0), true, "truncated header"},
      {"trailing.gz", trailing, true, "trailing bytes"},
      {"count.gz", idx_bytes(0x801, {19}, 19, 10), false, "counts disagree"},
      {"label.gz", bad_label, false, "label 7 is 10"},
  };
  for (const Case& c : cases) {
    INFO("case " << c.name);
    const std::string path = dir / c.name;
    write_bytes(path, c.bytes);
    const std::string img = c.is_images ? path : good_img;
    const std::string lab = c.is_images ? good_lab : path;
    CHECK_THROWS_WITH_AS(data::load_idx_pair(img, lab), doctest::Contains(c.expect), Error);
    CHECK_THROWS_WITH_AS(data::load_idx_pair(img, lab), doctest::Contains(c.name), Error);  // names the file
  }
  CHECK_THROWS_WITH_AS(data::read_idx(dir / "missing.gz", 1), doctest::Contains("cannot open"), Error);
  // A FIFO once blocked the reader forever; a folder is no file either.
  REQUIRE(mkfifo((dir / "fifo-images-idx3-ubyte").c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(data::read_idx(dir / "fifo-images-idx3-ubyte", 3), doctest::Contains("not a regular file"), Error);
  CHECK_THROWS_WITH_AS(data::read_idx(dir.path, 3), doctest::Contains("not a regular file"), Error);
  // A 16-byte header promising 3.1 GB and nothing after it: refused as truncated, without first
  // allocating (and zeroing) what the header promises. The process's peak resident memory is
  // the witness: it once grew by the full 3.1 GB here.
  {
    write_bytes(dir / "promise_raw", idx_bytes(0x803, {4000000, 28, 28}, 0));
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);
    CHECK_THROWS_WITH_AS(data::read_idx(dir / "promise_raw", 3), doctest::Contains("truncated: 0 data bytes"), Error);
    getrusage(RUSAGE_SELF, &after);
    CHECK((after.ru_maxrss - before.ru_maxrss) * 1024L < 256L << 20);  // ru_maxrss is in KiB
  }
  // A damaged gzip stream (valid header, garbage inside).
  std::string gz;
  {
    write_bytes(dir / "tmp.gz", idx_bytes(0x803, {20, 28, 28}, 20 * 784));
    std::ifstream in(dir / "tmp.gz", std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(in), {});
    for (size_t i = 20; i < gz.size() - 10; i += 7) gz[i] = static_cast<char>(gz[i] ^ 0x5A);
    std::ofstream(dir / "damaged.gz", std::ios::binary).write(gz.data(), static_cast<std::streamsize>(gz.size()));
  }
  CHECK_THROWS_WITH_AS(data::read_idx(dir / "damaged.gz", 3), doctest::Contains("damaged.gz"), Error);
  // A folder without the standard names.
  CHECK_THROWS_WITH_AS(data::load_mnist(dir.path), doctest::Contains("missing train-"), Error);
  CHECK_THROWS_WITH_AS(data::load_mnist_auto(dir.path), doctest::Contains("no MNIST files"), Error);
}

TEST_CASE("MNIST folders: the four standard names, and the split of a test set alone") {
  TempDir dir("data_mnist");
  write_pair(dir, "train", 50, true);
  write_pair(dir, "t10k", 30, false);
  auto s = data::load_mnist(dir.path);
  CHECK(s.train.size() == 50);
  CHECK(s.test.size() == 30);
  TempDir only_test("data_only_test");
  write_pair(only_test, "t10k", 30, true);
  auto sp = data::load_mnist_test_split(only_test.path, 24);
  CHECK(sp.train.size() == 24);
  CHECK(sp.test.size() == 6);
  CHECK(sp.test.labels()[0] == 24 % 10);  // the held-out part is the END of the file
  CHECK(data::load_mnist_auto(dir.path).train.size() == 50);
  CHECK_THROWS_AS(data::load_mnist_test_split(only_test.path, 30), Error);
}

TEST_CASE("normalisation is (x / 255 - mean) / std") {
  std::vector<uint8_t> px(2 * 4);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 37);
  data::IdxDataset d(px, {3, 9}, 2, 2, 10, {0.1307f, 0.3081f});
  std::vector<float> out(4, -999.0f);
  d.normalized_image(1, out.data());
  for (int k = 0; k < 4; ++k) CHECK(out[k] == doctest::Approx((px[4 + k] / 255.0 - 0.1307) / 0.3081).epsilon(1e-6));
  CHECK_THROWS_AS(data::IdxDataset(px, {3, 10}, 2, 2), Error);  // label out of range
  CHECK_THROWS_AS(data::IdxDataset(px, {3}, 2, 2), Error);      // count mismatch
}

TEST_CASE("synthetic data is deterministic, balanced, and depends on the seed") {
  auto a = data::make_synthetic(500, 1), b = data::make_synthetic(500, 1), c = data::make_synthetic(500, 2);
  CHECK(a.pixels() == b.pixels());
  CHECK(a.labels() == b.labels());
  CHECK(a.pixels() != c.pixels());
  CHECK(data::make_synthetic(100, 1).pixels() ==
        std::vector<uint8_t>(a.pixels().begin(), a.pixels().begin() + 100 * 784));  // prefix-stable
  std::vector<int> count(10);
  for (int64_t y : a.labels()) count[y]++;
  for (int k = 0; k < 10; ++k) CHECK(count[k] > 25);
  std::set<int> values(a.pixels().begin(), a.pixels().end());
  CHECK(values.size() > 100);  // not binary: strokes, ink and noise
}

TEST_CASE("epoch permutations: a permutation, a function of (seed, epoch) only") {
  auto p = data::epoch_permutation(1001, 5, 0);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1001; ++i) REQUIRE(sorted[i] == i);
  CHECK(p == data::epoch_permutation(1001, 5, 0));
  CHECK(p != data::epoch_permutation(1001, 5, 1));
  CHECK(p != data::epoch_permutation(1001, 6, 0));
  int fixed = 0;
  for (int64_t i = 0; i < 1001; ++i) fixed += p[i] == i;
  CHECK(fixed < 10);  // shuffled (a random permutation has ~1 fixed point)
  // Roughly uniform: each sample's position over many epochs averages to the middle.
  double mean_pos0 = 0;
  for (int e = 0; e < 400; ++e) {
    auto q = data::epoch_permutation(11, 3, e);
    mean_pos0 += std::find(q.begin(), q.end(), 0) - q.begin();
  }
  CHECK(mean_pos0 / 400 == doctest::Approx(5.0).epsilon(0.12));
}

namespace {

// All (label, first pixel byte) pairs an epoch delivers, in order, and the batch sizes.
struct Seen {
  std::vector<int64_t> labels;
  std::vector<float> first_pixels;
  std::vector<int64_t> sizes;
};

Seen walk(const data::IdxDataset& d, data::LoaderOptions o, int64_t epoch) {
  data::DataLoader l(d, o);
  l.start_epoch(epoch);
  Seen s;
  data::Batch b;
  while (l.next(b)) {
    REQUIRE(b.x.size(0) == b.size());
    s.sizes.push_back(b.size());
    auto y = b.y.to_vector<int64_t>();
    auto x = b.x.to_vector<float>();
    const int64_t f = x.size() / y.size();
    for (size_t i = 0; i < y.size(); ++i) {
      s.labels.push_back(y[i]);
      s.first_pixels.push_back(x[i * f + 300]);
    }
  }
  CHECK(s.sizes.size() == static_cast<size_t>(l.num_batches()));
  return s;
}

}  // namespace

TEST_CASE("loader: the sample order does not depend on the batch size, prefetching, or the epoch order") {
  const data::IdxDataset d = data::make_synthetic(1003, 4);
  const Seen s64 = walk(d, {.batch_size = 64, .seed = 9}, 2);
  for (int64_t bs : {1, 7, 16, 64, 1003, 5000}) {
    for (int prefetch : {0, 1, 3}) {
      INFO("batch " << bs << " prefetch " << prefetch);
      Seen s = walk(d, {.batch_size = bs, .seed = 9, .prefetch = prefetch}, 2);
      CHECK(s.labels == s64.labels);
      CHECK(s.first_pixels == s64.first_pixels);
      CHECK(s.sizes.back() == (1003 % bs == 0 ? bs : (bs > 1003 ? 1003 : 1003 % bs)));
    }
  }
  // Other epochs and seeds reorder; unshuffled is the file order.
  CHECK(walk(d, {.batch_size = 64, .seed = 9}, 3).labels != s64.labels);
  CHECK(walk(d, {.batch_size = 64, .seed = 10}, 2).labels != s64.labels);
  Seen plain = walk(d, {.batch_size = 100, .shuffle = false}, 0);
  CHECK(std::vector<int64_t>(plain.labels.begin(), plain.labels.end()) == d.labels());
  // Every sample exactly once.
  std::multiset<float> a(s64.first_pixels.begin(), s64.first_pixels.end()), b(plain.first_pixels.begin(), plain.first_pixels.end());
  CHECK(a == b);
  // Restarting an epoch mid-way (and jumping between epochs) does not disturb the order.
  data::DataLoader l(d, {.batch_size = 16, .seed = 9});
  data::Batch bt;
  l.start_epoch(0);
  REQUIRE(l.next(bt));
  l.start_epoch(2, 10);  // skip the first 10 batches of epoch 2
  REQUIRE(l.next(bt));
  CHECK(bt.index == 10);
  CHECK(bt.y.to_vector<int64_t>()[0] == s64.labels[160]);
}

TEST_CASE("loader: shapes, drop_last, flatten, errors") {
  const data::IdxDataset d = data::make_synthetic(100, 4);
  data::DataLoader l(d, {.batch_size = 32, .drop_last = true});
  CHECK(l.num_batches() == 3);
  CHECK(l.num_samples() == 96);
  Seen s = walk(d, {.batch_size = 32, .drop_last = true}, 0);
  CHECK(s.sizes == std::vector<int64_t>{32, 32, 32});
  data::DataLoader f(d, {.batch_size = 10, .flatten = true});
  f.start_epoch(0);
  data::Batch b;
  REQUIRE(f.next(b));
  CHECK(b.x.shape() == Shape{10, 784});
  CHECK(b.y.dtype() == DType::i64);
  data::DataLoader img(d, {.batch_size = 10});
  img.start_epoch(0);
  REQUIRE(img.next(b));
  CHECK(b.x.shape() == Shape{10, 1, 28, 28});
  CHECK(b.x.dtype() == DType::f32);
  data::DataLoader fresh(d, {.batch_size = 10});
  CHECK_THROWS_WITH_AS(fresh.next(b), doctest::Contains("start_epoch"), Error);
  CHECK_THROWS_AS(data::DataLoader(d, {.batch_size = 0}), Error);
  CHECK_THROWS_AS(data::DataLoader(d, {.batch_size = 101, .drop_last = true}), Error);
  CHECK_THROWS_AS(fresh.start_epoch(0, 11), Error);
  // Destroying a loader mid-epoch stops its prefetch thread cleanly.
  {
    data::DataLoader mid(d, {.batch_size = 1, .prefetch = 2});
    mid.start_epoch(0);
    REQUIRE(mid.next(b));
  }
  if (!cuda_available()) MESSAGE("no CUDA device: batches on CUDA not tested here");
}

namespace {

// n samples of shape (2, 3): element k of sample i is i + (k + 1) / 8 (exact in float32), its
// label (7 i + 3) % 10. A sample's first element names it.
data::TensorDataset numbered(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n) * 6);
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < 6; ++k) x[i * 6 + k] = static_cast<float>(i) + static_cast<float>(k + 1) / 8.0f;
    y[i] = (7 * i + 3) % 10;
  }
  return data::TensorDataset(Tensor::from_vector(x, {n, 2, 3}), Tensor::from_vector(y, {n}));
}

// The samples of each batch of an epoch of a numbered() data set, checking every element and
// label on the way.
std::vector<std::vector<int64_t>> batches_of(const data::Dataset& d, data::LoaderOptions o, int64_t epoch) {
  data::DataLoader l(d, o);
  l.start_epoch(epoch);
  std::vector<std::vector<int64_t>> out;
  data::Batch b;
  while (l.next(b)) {
    REQUIRE(b.x.shape() == (o.flatten ? Shape{b.size(), 6} : Shape{b.size(), 2, 3}));
    REQUIRE(b.index == static_cast<int64_t>(out.size()));
    const auto x = b.x.to_vector<float>();
    const auto y = b.y.to_vector<int64_t>();
    std::vector<int64_t> ids;
    for (size_t j = 0; j < y.size(); ++j) {
      const int64_t i = static_cast<int64_t>(x[j * 6]);
      for (int k = 0; k < 6; ++k) REQUIRE(x[j * 6 + k] == static_cast<float>(i) + static_cast<float>(k + 1) / 8.0f);
      REQUIRE(y[j] == (7 * i + 3) % 10);
      ids.push_back(i);
    }
    out.push_back(ids);
  }
  CHECK(static_cast<int64_t>(out.size()) == l.num_batches());
  return out;
}

std::vector<int64_t> concat(const std::vector<std::vector<int64_t>>& bs) {
  std::vector<int64_t> all;
  for (const auto& b : bs) all.insert(all.end(), b.begin(), b.end());
  return all;
}

// Throws when asked for sample `bad`.
class Faulty : public data::Dataset {
 public:
  explicit Faulty(int64_t bad) : bad_(bad) {}
  int64_t size() const override { return 40; }
  Shape sample_shape() const override { return {3}; }

 private:
  void read(std::span<const int64_t> indices, int64_t, std::span<float> x, std::span<int64_t> y) const override {
    for (size_t k = 0; k < indices.size(); ++k) {
      MG_CHECK(indices[k] != bad_, "Faulty: sample " << indices[k] << " is unreadable");
      for (int j = 0; j < 3; ++j) x[k * 3 + j] = static_cast<float>(indices[k]);
      y[k] = 1;
    }
  }
  int64_t bad_;
};

}  // namespace

TEST_CASE("TensorDataset through the loader: epoch_permutation's order for any batch size, prefetch or not") {
  const data::TensorDataset d = numbered(203);
  CHECK(d.size() == 203);
  CHECK(d.sample_shape() == Shape{2, 3});
  const std::vector<int64_t> perm = data::epoch_permutation(203, 9, 4);
  // INT64_MAX once overflowed the loader's batch arithmetic; it is one batch of everything.
  for (int64_t bs : {int64_t{1}, int64_t{16}, int64_t{203}, int64_t{500}, std::numeric_limits<int64_t>::max()}) {
    for (int prefetch : {0, 2}) {
      INFO("batch " << bs << " prefetch " << prefetch);
      const auto bs_seen = batches_of(d, {.batch_size = bs, .seed = 9, .prefetch = prefetch}, 4);
      CHECK(concat(bs_seen) == perm);
      CHECK(static_cast<int64_t>(bs_seen.back().size()) == (bs > 203 ? 203 : 203 % bs == 0 ? bs : 203 % bs));
    }
  }
  std::vector<int64_t> file_order(203);
  for (int64_t i = 0; i < 203; ++i) file_order[i] = i;
  CHECK(concat(batches_of(d, {.batch_size = 50, .shuffle = false, .flatten = true}, 0)) == file_order);
  CHECK(concat(batches_of(d, {.batch_size = 50, .seed = 9}, 5)) != perm);

  // get_batch: the samples asked for, in that order.
  const data::Batch b = d.get_batch(std::vector<int64_t>{202, 0, 202}, 0);
  CHECK(b.x.shape() == Shape{3, 2, 3});
  CHECK(b.y.to_vector<int64_t>() == std::vector<int64_t>{(7 * 202 + 3) % 10, 3, (7 * 202 + 3) % 10});
  CHECK(b.x.to_vector<float>()[6] == 0.125f);
}

TEST_CASE("loader shards: a partition of every epoch; batch k of W shards is batch k of batch size W * B") {
  const data::TensorDataset d = numbered(103);
  const int64_t kShards = 4, kBatch = 5;
  const std::vector<int64_t> perm = data::epoch_permutation(103, 2, 1);
  std::vector<std::vector<std::vector<int64_t>>> shard(kShards);
  for (int64_t s = 0; s < kShards; ++s) {
    INFO("shard " << s);
    shard[s] = batches_of(d, {.batch_size = kBatch, .seed = 2, .shard = s, .num_shards = kShards}, 1);
    std::vector<int64_t> want;
    for (size_t p = s; p < perm.size(); p += kShards) want.push_back(perm[p]);
    CHECK(concat(shard[s]) == want);  // positions s, s + W, ...
    const data::LoaderOptions no_prefetch{.batch_size = kBatch, .seed = 2, .prefetch = 0, .shard = s, .num_shards = kShards};
    CHECK(concat(batches_of(d, no_prefetch, 1)) == want);
    data::DataLoader l(d, {.batch_size = kBatch, .seed = 2, .shard = s, .num_shards = kShards});
    CHECK(l.num_samples() == (s < 3 ? 26 : 25));
    CHECK(l.num_batches() == (s < 3 ? 6 : 5));
  }
  // Each sample in exactly one shard.
  std::multiset<int64_t> seen;
  for (const auto& sh : shard) for (int64_t i : concat(sh)) seen.insert(i);
  CHECK(seen.size() == 103);
  CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == 103);
  // Batch k of the shards together = batch k of one loader of batch 20, the short last one too.
  const auto whole = batches_of(d, {.batch_size = kShards * kBatch, .seed = 2}, 1);
  REQUIRE(whole.size() == 6);
  for (size_t k = 0; k < whole.size(); ++k) {
    std::vector<int64_t> together;
    for (const auto& sh : shard) {
      if (k < sh.size()) together.insert(together.end(), sh[k].begin(), sh[k].end());
    }
    std::sort(together.begin(), together.end());
    std::vector<int64_t> want = whole[k];
    std::sort(want.begin(), want.end());
    CHECK(together == want);
  }
  // Unshuffled, drop_last per shard.
  CHECK(concat(batches_of(d, {.batch_size = 3, .shuffle = false, .shard = 1, .num_shards = 50}, 0)) ==
        std::vector<int64_t>{1, 51, 101});
  data::DataLoader dl(d, {.batch_size = kBatch, .drop_last = true, .shard = 3, .num_shards = kShards});
  CHECK(dl.num_batches() == 5);
  CHECK(dl.num_samples() == 25);
  // Bad shard options.
  CHECK_THROWS_WITH_AS(data::DataLoader(d, {.shard = 4, .num_shards = 4}), doctest::Contains("shard 4 of 4"), Error);
  CHECK_THROWS_WITH_AS(data::DataLoader(d, {.shard = -1, .num_shards = 4}), doctest::Contains("0 <= shard"), Error);
  CHECK_THROWS_AS(data::DataLoader(d, {.num_shards = 0}), Error);
  CHECK_THROWS_WITH_AS(data::DataLoader(d, {.shard = 103, .num_shards = 104}), doctest::Contains("is empty"), Error);
  CHECK_THROWS_WITH_AS(data::DataLoader(d, {.batch_size = 30, .drop_last = true, .shard = 0, .num_shards = 4}),
                       doctest::Contains("this shard"), Error);
}

TEST_CASE("TensorDataset: shapes and dtypes are checked, saying what was expected and what came") {
  const Tensor x = test::rand_tensor({10, 3}, 1);
  const Tensor y = Tensor::from_vector(std::vector<int64_t>(10, 2), {10});
  CHECK_NOTHROW(data::TensorDataset(x, y));
  const Tensor y9 = Tensor::from_vector(std::vector<int64_t>(9, 2), {9});
  CHECK_THROWS_WITH_AS(data::TensorDataset(x, y9), doctest::Contains("10 inputs (shape [10, 3]) but 9 targets"), Error);
  CHECK_THROWS_WITH_AS(data::TensorDataset(x, y.reshape({10, 1})),
                       doctest::Contains("targets must be (N), one class label per sample; got shape [10, 1]"), Error);
  CHECK_THROWS_WITH_AS(data::TensorDataset(Tensor::full({}, 1.5f), y), doctest::Contains("0-dimensional"), Error);
  CHECK_THROWS_WITH_AS(data::TensorDataset(y, y), doctest::Contains("inputs must be float32, got int64"), Error);
  CHECK_THROWS_WITH_AS(data::TensorDataset(x, test::rand_tensor({10}, 2)),
                       doctest::Contains("targets must be int64 class labels, got float32"), Error);
  CHECK_THROWS_AS(data::TensorDataset(Tensor(), y), Error);
  // Loader and read_batch errors.
  const data::TensorDataset d(x, y);
  CHECK_THROWS_WITH_AS(d.get_batch(std::vector<int64_t>{3, 10}),
                       doctest::Contains("index 10 is outside a data set of 10"), Error);
  CHECK_THROWS_WITH_AS(d.get_batch(std::vector<int64_t>{}), doctest::Contains("no indices"), Error);
  std::vector<float> small(5);
  std::vector<int64_t> labels(2);
  CHECK_THROWS_WITH_AS(d.read_batch(std::vector<int64_t>{0, 1}, 0, small, labels),
                       doctest::Contains("need 6 floats and 2 labels; got room for 5 and 2"), Error);
  // The inputs are shared (a CPU tensor is not copied) and detached.
  CHECK(d.inputs().shares_storage(x));
  const Tensor y4 = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3}, {4});
  const data::TensorDataset dw(test::rand_tensor({4, 2}, 3, true), y4);
  CHECK_FALSE(dw.inputs().requires_grad());
}

TEST_CASE("loader lifetimes: a shared_ptr keeps the data set alive; a temporary is refused at compile time") {
  static_assert(std::is_constructible_v<data::DataLoader, const data::TensorDataset&, data::LoaderOptions>);
  static_assert(std::is_constructible_v<data::DataLoader, std::shared_ptr<data::TensorDataset>, data::LoaderOptions>);
  static_assert(!std::is_constructible_v<data::DataLoader, data::TensorDataset, data::LoaderOptions>);
  static_assert(!std::is_constructible_v<data::DataLoader, data::IdxDataset, data::LoaderOptions>);
  auto owned = std::make_shared<data::TensorDataset>(numbered(37));
  std::weak_ptr<data::TensorDataset> watch = owned;
  {
    data::DataLoader l(std::move(owned), {.batch_size = 4, .seed = 1, .prefetch = 3});
    CHECK_FALSE(watch.expired());  // the loader's reference is the only one left
    l.start_epoch(0);
    data::Batch b;
    int64_t samples = 0;
    while (l.next(b)) samples += b.size();
    CHECK(samples == 37);
    CHECK(&l.dataset() == watch.lock().get());
  }
  CHECK(watch.expired());
  CHECK_THROWS_WITH_AS(data::DataLoader(std::shared_ptr<const data::Dataset>(), {}), doctest::Contains("null"), Error);
}

TEST_CASE("loader: a data set's error on the prefetch thread reaches next(), with its message") {
  const Faulty d(13);
  for (int prefetch : {0, 2}) {
    INFO("prefetch " << prefetch);
    data::DataLoader l(d, {.batch_size = 8, .shuffle = false, .prefetch = prefetch});
    l.start_epoch(0);
    data::Batch b;
    REQUIRE(l.next(b));
    CHECK(b.x.shape() == Shape{8, 3});
    CHECK(b.x.to_vector<float>()[3] == 1.0f);
    CHECK_THROWS_WITH_AS(l.next(b), doctest::Contains("sample 13 is unreadable"), Error);
  }
}

TEST_CASE("real MNIST (../shared/data/mnist): the 8,000 / 2,000 split") {
  const std::string dir = std::string(MG_SHARED_DATA_DIR) + "/mnist";
  if (!fs::exists(dir + "/t10k-images-idx3-ubyte.gz")) {
    MESSAGE("skipped: " << dir << " has no MNIST test set");
    return;
  }
  auto s = data::load_mnist_auto(dir);
  CHECK(s.train.size() == 8000);
  CHECK(s.test.size() == 2000);
  std::vector<int> count(10);
  for (int64_t y : s.train.labels()) count[y]++;
  for (int k = 0; k < 10; ++k) CHECK(count[k] > 600);
  // The official file's first label is 7 and its last is 6.
  CHECK(s.train.labels()[0] == 7);
  CHECK(s.test.labels().back() == 6);
  double mean = 0;
  for (uint8_t p : s.train.pixels()) mean += p / 255.0;
  mean /= static_cast<double>(s.train.pixels().size());
  CHECK(mean == doctest::Approx(0.1301).epsilon(0.01));  // measured with numpy: 0.13009
}

TEST_CASE("token files (llm.c's .bin): round trip, and every malformed header is a clear error") {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("mg_tokens_" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  std::vector<uint16_t> tokens(300);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7919) % 65536);
  const std::string path = dir + "/t.bin";
  data::save_token_file(path, tokens);
  CHECK(fs::file_size(path) == 1024 + 2 * tokens.size());
  const data::TokenFile f = data::load_token_file(path);
  CHECK(f.tokens == tokens);
  CHECK(f.max_token() == *std::max_element(tokens.begin(), tokens.end()));

  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& name, const std::string& b) {
    std::ofstream(dir + "/" + name, std::ios::binary | std::ios::trunc) << b;
    return dir + "/" + name;
  };
  std::string bad_magic = bytes;
  bad_magic[0] = 1;
  CHECK_THROWS_WITH_AS(data::load_token_file(write("magic.bin", bad_magic)), doctest::Contains("expected 20240520"), Error);
  std::string bad_version = bytes;
  bad_version[4] = 2;
  CHECK_THROWS_WITH_AS(data::load_token_file(write("version.bin", bad_version)), doctest::Contains("version 2, expected 1"), Error);
  CHECK_THROWS_WITH_AS(data::load_token_file(write("short.bin", bytes.substr(0, bytes.size() - 1))),
                       doctest::Contains("the header says 300 tokens"), Error);
  CHECK_THROWS_WITH_AS(data::load_token_file(write("long.bin", bytes + "xy")), doctest::Contains("the file has 1626 bytes"), Error);
  CHECK_THROWS_WITH_AS(data::load_token_file(write("header.bin", bytes.substr(0, 100))), doctest::Contains("shorter than the 1024-byte header"), Error);
  std::string negative = bytes;
  negative[11] = static_cast<char>(0x80);
  CHECK_THROWS_WITH_AS(data::load_token_file(write("negative.bin", negative)), doctest::Contains("tokens"), Error);
  CHECK_THROWS_WITH_AS(data::load_token_file(dir + "/missing.bin"), doctest::Contains("cannot open"), Error);
  fs::remove_all(dir);
}

TEST_CASE("TokenBatches: llm.c's windows, next-token targets, shards, epochs, vocabulary") {
  std::vector<uint16_t> tokens(50);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i);
  data::TokenBatches b(tokens, 2, 4);
  const data::TokenBatch w0 = b.next(), w1 = b.next();
  CHECK(w0.x.shape() == Shape{2, 4});
  CHECK(w0.x.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(w0.y.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(w1.x.to_vector<int64_t>()[0] == 8);
  // Two shards read disjoint windows: rank 0 windows 0, 2, ...; rank 1 windows 1, 3, ...
  data::TokenBatches r0(tokens, 2, 4, 0, 2), r1(tokens, 2, 4, 1, 2);
  CHECK(r0.next().x.to_vector<int64_t>()[0] == 0);
  CHECK(r1.next().x.to_vector<int64_t>()[0] == 8);
  CHECK(r0.next().x.to_vector<int64_t>()[0] == 16);
  CHECK(r1.next().x.to_vector<int64_t>()[0] == 24);
  // 50 tokens hold 6 windows of 8 (+1); the 7th starts the next epoch at the beginning.
  for (int k = 0; k < 4; ++k) b.next();
  CHECK(b.epoch() == 0);
  CHECK(b.next().x.to_vector<int64_t>()[0] == 0);
  CHECK(b.epoch() == 1);
  CHECK_THROWS_WITH_AS(data::TokenBatches(tokens, 7, 8), doctest::Contains("fewer than one step"), Error);
  data::TokenBatches small_vocab(tokens, 2, 4, 0, 1, 5);
  CHECK_THROWS_WITH_AS(small_vocab.next(), doctest::Contains("outside the vocabulary of 5"), Error);
}

namespace {

// The micro-batches `parts`, one after another, hold the tokens and targets of `all`.
void check_same_tokens(const std::vector<data::TokenBatch>& parts, const data::TokenBatch& all) {
  std::vector<int64_t> x, y;
  for (const auto& p : parts) {
    for (int64_t v : p.x.to_vector<int64_t>()) x.push_back(v);
    for (int64_t v : p.y.to_vector<int64_t>()) y.push_back(v);
  }
  CHECK(x == all.x.to_vector<int64_t>());
  CHECK(y == all.y.to_vector<int64_t>());
}

}  // namespace

TEST_CASE("TokenBatches::next_split: a window cut into micro-batches, the last the remainder, same tokens") {
  std::vector<uint16_t> tokens(100);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7) % 100);
  data::TokenBatches whole(tokens, 8, 3, 1, 2), split(tokens, 8, 3, 1, 2);
  for (int w = 0; w < 3; ++w) {  // 100 tokens hold 4 windows of 24 (+1), 2 per shard: the third read starts epoch 1
    const data::TokenBatch all = whole.next();
    const std::vector<data::TokenBatch> parts = split.next_split(3);
    REQUIRE(parts.size() == 3);
    CHECK(parts[0].x.shape() == Shape{3, 3});
    CHECK(parts[2].x.shape() == Shape{2, 3});
    check_same_tokens(parts, all);
    CHECK(split.epoch() == whole.epoch());
  }
  CHECK(split.epoch() == 1);
  CHECK(split.next_split(8).size() == 1);
  CHECK(split.next_split(20).size() == 1);
  CHECK_THROWS_WITH_AS(split.next_split(0), doctest::Contains("must be >= 1 sequence, got 0"), Error);
}

TEST_CASE("TokenBatches::split_last: the window last read again, cut anew, and the stream not moved") {
  std::vector<uint16_t> tokens(100);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7) % 100);
  data::TokenBatches b(tokens, 8, 3, 1, 2), ref(tokens, 8, 3, 1, 2);
  CHECK_THROWS_WITH_AS(b.split_last(2), doctest::Contains("no window has been read yet"), Error);
  for (int w = 0; w < 3; ++w) {
    const data::TokenBatch all = ref.next();
    const std::vector<data::TokenBatch> first = b.next_split(3), again = b.split_last(5);
    REQUIRE(again.size() == 2);
    CHECK(again[0].x.shape() == Shape{5, 3});
    CHECK(again[1].x.shape() == Shape{3, 3});
    check_same_tokens(again, all);
    CHECK(b.epoch() == ref.epoch());
  }
  CHECK_THROWS_WITH_AS(b.split_last(0), doctest::Contains("must be >= 1 sequence, got 0"), Error);
}
