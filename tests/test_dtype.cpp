// bfloat16 and float16 as storage types (Note [half conversions] in src/kernels/convert.h): every
// half value widened exactly, every narrowing a nearest value with ties to even, NaN and infinity
// kept, f16's overflow and subnormals; Tensor::to(DType), copy_ between dtypes, fill_, str(), and
// safetensors files that keep BF16 and F16.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <unistd.h>

#include "helpers.h"
#include "kernels/convert.h"
#include "core/parallel.h"
#include "core/tape.h"  // rows_view
#include "kernels/cpu/half_rows.h"
#include "kernels/batch_norm.h"
#include "kernels/layer_norm.h"
#include "kernels/softmax.h"
#include <minigrad/nn/serialize.h>

using namespace mg;

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The value of half bits by the format's definition, in double: the reference for widening.
double f16_value(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v;
  if (e == 0x1f) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0) v = std::ldexp(static_cast<double>(m), -24);
  else v = std::ldexp(1.0 + m / 1024.0, e - 15);
  return sign ? -v : v;
}
double bf16_value(uint16_t h) {
  const int sign = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
  double v;
  if (e == 0xff) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0) v = std::ldexp(static_cast<double>(m), -133);
  else v = std::ldexp(1.0 + m / 128.0, e - 127);
  return sign ? -v : v;
}

// Checks that `h` is a correct rounding of finite f: no representable value of the format is
// nearer, and of two equally near the even one (mantissa's last bit 0) was taken. The format's
// values are those of `value` over all 65536 bit patterns (finite ones), sorted once.
struct Grid {
  std::vector<std::pair<double, uint16_t>> v;  // finite values, ascending (+0 and -0 both present)
  explicit Grid(double (*value)(uint16_t)) {
    for (uint32_t b = 0; b < 65536; ++b) {
      const double x = value(static_cast<uint16_t>(b));
      if (std::isfinite(x)) v.emplace_back(x, static_cast<uint16_t>(b));
    }
    std::sort(v.begin(), v.end());
  }
  // The correctly rounded bits of x (ties to even), or 0xffff meaning "overflows to infinity".
  std::pair<double, bool> nearest(double x, double overflow_at) const {
    if (std::abs(x) >= overflow_at) return {x > 0 ? INFINITY : -INFINITY, true};
    const auto pos = std::lower_bound(v.begin(), v.end(), std::make_pair(x, uint16_t{0})) - v.begin();
    double best = 0;
    double dist = INFINITY;
    bool tie_even = false;
    for (auto j = std::max<std::ptrdiff_t>(0, pos - 2); j < std::min<std::ptrdiff_t>(std::ssize(v), pos + 2); ++j) {
      const double d = std::abs(v[static_cast<size_t>(j)].first - x);
      const bool even = (v[static_cast<size_t>(j)].second & 1) == 0;
      if (d < dist || (d == dist && even && !tie_even)) {
        best = v[static_cast<size_t>(j)].first;
        dist = d;
        tie_even = even;
      }
    }
    return {best, false};
  }
};

}  // namespace

TEST_CASE("half conversions: every bf16 and f16 value widens to its exact float") {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const double want16 = f16_value(h), want_bf = bf16_value(h);
    const float got16 = half::float_from_f16(h), got_bf = half::float_from_bf16(h);
    if (std::isnan(want16)) {
      CHECK(std::isnan(got16));
      CHECK((half::bits_of(got16) & 0x00400000u) != 0);  // quiet, as F16C widens it
      CHECK(std::signbit(got16) == ((h >> 15) != 0));
    } else {
      REQUIRE_MESSAGE(static_cast<double>(got16) == want16, "f16 bits " << b);
      CHECK(std::signbit(got16) == ((h >> 15) != 0));  // -0 too
    }
    if (std::isnan(want_bf)) {
      CHECK(std::isnan(got_bf));
    } else {
      REQUIRE_MESSAGE(static_cast<double>(got_bf) == want_bf, "bf16 bits " << b);
    }
    // Narrowing a widened value gives its bits back (NaNs: a NaN).
    if (!std::isnan(want16)) CHECK(half::f16_from_float(got16) == h);
    if (!std::isnan(want_bf)) CHECK(half::bf16_from_float(got_bf) == h);
  }
}

// Note [f16 conversions with F16C]: the vector path against the scalar functions, on every f16
// value and every float32 bit pattern (NaNs included: the same quiet NaN bits).
TEST_CASE("half conversions: f16 through F16C gives the scalar functions' bits") {
  if (!cpu::f16c_in_use()) {
    MESSAGE("skipped: this CPU has no F16C, so only the scalar path runs");
    return;
  }
  std::vector<uint16_t> every(65536);
  for (uint32_t b = 0; b < 65536; ++b) every[b] = static_cast<uint16_t>(b);
  std::vector<float> wide(every.size());
  cpu::widen_span(wide.data(), every.data(), DType::f16, static_cast<int64_t>(every.size()));
  int64_t widen_diff = 0;
  for (uint32_t b = 0; b < 65536; ++b) widen_diff += half::bits_of(wide[b]) != half::bits_of(half::float_from_f16(every[b]));
  CHECK(widen_diff == 0);

  constexpr int64_t kChunk = int64_t{1} << 20;
  std::vector<float> xs(kChunk);
  std::vector<uint16_t> got(kChunk);
  int64_t narrow_diff = 0;
  uint32_t first_diff = 0;
  for (uint64_t base = 0; base < (uint64_t{1} << 32); base += kChunk) {
    for (int64_t i = 0; i < kChunk; ++i) xs[i] = from_bits(static_cast<uint32_t>(base + i));
    cpu::narrow_span(got.data(), DType::f16, xs.data(), kChunk);
    for (int64_t i = 0; i < kChunk; ++i) {
      if (got[i] != half::f16_from_float(xs[i]) && narrow_diff++ == 0) first_diff = static_cast<uint32_t>(base + i);
    }
  }
  CHECK_MESSAGE(narrow_diff == 0, narrow_diff << " float32 patterns narrow differently, the first 0x" << std::hex
                                              << first_diff);

  // Tensor::to goes through the same spans; with F16C off it gives the same bits.
  Tensor x = Tensor::empty({4099}, TensorOptions{DType::f32, Device::cpu()});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = from_bits(static_cast<uint32_t>(i * 1048573u));
  const Tensor with = x.to(DType::f16);
  const bool was = cpu::allow_f16c(false);
  const Tensor without = x.to(DType::f16);
  cpu::allow_f16c(was);
  CHECK(std::memcmp(with.raw_data(), without.raw_data(), static_cast<size_t>(x.numel()) * 2) == 0);
}

TEST_CASE("half conversions: narrowing rounds to the nearest value, ties to even") {
  const Grid f16(f16_value), bf16(bf16_value);
  // f16 overflows from 65520 (the midpoint between its largest, 65504, and 2^16); bf16 from the
  // midpoint between its largest and 2^128.
  const double f16_over = 65520.0, bf16_over = std::ldexp(2.0 - std::ldexp(1.0, -8), 127);
  std::mt19937 rng(7);
  std::vector<float> xs;
  for (int i = 0; i < 200000; ++i) xs.push_back(from_bits(static_cast<uint32_t>(rng())));  // every exponent
  std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
  for (int i = 0; i < 100000; ++i) xs.push_back(u(rng));
  // Ties and their neighbours around every f16 value near 1, 65504, the subnormals and bf16's.
  for (const float base : {1.0f, 1.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 1.1754944e-38f, 3.3895314e38f}) {
    for (int k = -40; k <= 40; ++k) {
      xs.push_back(from_bits(to_bits(base) + static_cast<uint32_t>(k)));
      xs.push_back(-from_bits(to_bits(base) + static_cast<uint32_t>(k)));
    }
  }
  for (int k = 0; k < 1024; ++k) {  // f16 subnormal midpoints: (k + 0.5) * 2^-24, exactly ties
    xs.push_back(static_cast<float>(std::ldexp(k + 0.5, -24)));
  }
  xs.push_back(65520.0f);
  xs.push_back(std::nextafter(65520.0f, 0.0f));
  int checked = 0;
  for (const float x : xs) {
    if (!std::isfinite(x)) continue;
    const auto [want16, over16] = f16.nearest(x, f16_over);
    const float got16 = half::float_from_f16(half::f16_from_float(x));
    REQUIRE_MESSAGE(static_cast<double>(got16) == want16, "f16 of " << x << " (bits " << to_bits(x) << "): "
                                                                      << got16 << ", expected " << want16);
    (void)over16;
    const auto [want_bf, over_bf] = bf16.nearest(x, bf16_over);
    const float got_bf = half::float_from_bf16(half::bf16_from_float(x));
    REQUIRE_MESSAGE(static_cast<double>(got_bf) == want_bf, "bf16 of " << x << " (bits " << to_bits(x) << "): "
                                                                        << got_bf << ", expected " << want_bf);
    (void)over_bf;
    ++checked;
  }
  CHECK(checked > 290000);
  // Non-finite values: infinities stay, NaN stays a NaN of its sign, quiet.
  for (const float inf : {INFINITY, -INFINITY}) {
    CHECK(half::float_from_f16(half::f16_from_float(inf)) == inf);
    CHECK(half::float_from_bf16(half::bf16_from_float(inf)) == inf);
  }
  for (const uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const float x = from_bits(nan);
    const uint16_t h = half::f16_from_float(x), b = half::bf16_from_float(x);
    CHECK(std::isnan(half::float_from_f16(h)));
    CHECK(std::isnan(half::float_from_bf16(b)));
    CHECK((h & 0x0200u) != 0);  // quiet
    CHECK((b & 0x0040u) != 0);
    CHECK(((h >> 15) != 0) == ((nan >> 31) != 0));
    CHECK(((b >> 15) != 0) == ((nan >> 31) != 0));
  }
}

TEST_CASE("Tensor::to(DType), copy_ between dtypes, fill_, to_vector and str") {
  const std::vector<float> v{0.1f, -2.5f, 65504.0f, 70000.0f, 1e-7f, -0.0f, 3.0f};
  const Tensor x = Tensor::from_vector(v, {7});
  const Tensor b = x.to(DType::bf16), h = x.to(DType::f16);
  CHECK(b.dtype() == DType::bf16);
  CHECK(h.dtype() == DType::f16);
  CHECK(b.nbytes() == 14);
  const std::vector<float> bv = b.to_vector<float>(), hv = h.to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i) {
    CHECK(bv[i] == half::float_from_bf16(half::bf16_from_float(v[i])));
    CHECK(hv[i] == half::float_from_f16(half::f16_from_float(v[i])));
  }
  CHECK(hv[3] == INFINITY);                                // 70000 overflows f16
  CHECK(hv[4] == static_cast<float>(std::ldexp(2.0, -24)));  // 1e-7: the subnormal 2 * 2^-24
  CHECK(std::signbit(hv[5]));
  // Between the half types and f64, through float; back to float32 exactly.
  const Tensor d = h.to(DType::f64);
  CHECK(d.dtype() == DType::f64);
  const std::vector<double> dv = d.to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) CHECK(dv[i] == static_cast<double>(hv[i]));
  CHECK(d.to(DType::bf16).to_vector<float>() == h.to(DType::f32).to(DType::bf16).to_vector<float>());
  // NaNs to and from f64 become the quiet NaN of their sign, whatever their payload or whether
  // they signal, written as bits (Note [half conversions]): x86's conversions keep payloads, a
  // GPU's give its own canonical NaN, and both devices must give these bits.
  const Tensor nans = Tensor::from_vector(std::vector<float>{half::float_of(0x7f800001u), half::float_of(0xffa12345u),
                                                             half::float_of(0x7fc00000u), 1.5f}, {4});
  const Tensor nd = nans.to(DType::f64);
  const double* pd = nd.data<double>();
  CHECK(half::bits_of(pd[0]) == 0x7ff8000000000000ull);
  CHECK(half::bits_of(pd[1]) == 0xfff8000000000000ull);
  CHECK(half::bits_of(pd[2]) == 0x7ff8000000000000ull);
  CHECK(pd[3] == 1.5);
  Tensor dn = Tensor::empty({3}, TensorOptions{DType::f64});
  double* pdn = dn.data<double>();
  pdn[0] = half::double_of(0x7ff0000000000001ull);  // signalling, payload 1
  pdn[1] = half::double_of(0xfff8dead00000000ull);  // quiet, negative, a payload in the high bits
  pdn[2] = -0.25;
  const Tensor fn = dn.to(DType::f32);
  const float* pf = fn.data<float>();
  CHECK(half::bits_of(pf[0]) == 0x7fc00000u);
  CHECK(half::bits_of(pf[1]) == 0xffc00000u);
  CHECK(pf[2] == -0.25f);
  // copy_ converts; int64 does not.
  Tensor into = Tensor::zeros({7}, TensorOptions{DType::f16});
  into.copy_(x);
  CHECK(into.to_vector<float>() == hv);
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}, {7});
  CHECK_THROWS_WITH_AS(labels.copy_(x), doctest::Contains("copy_: source [7] float32 into destination [7] int64"),
                       Error);
  CHECK_THROWS_WITH_AS(x.to(DType::i64), doctest::Contains("int64"), Error);
  // fill_ and the factories.
  const Tensor ones = Tensor::full({3}, 0.1f, TensorOptions{DType::bf16});
  for (float e : ones.to_vector<float>()) CHECK(e == half::float_from_bf16(half::bf16_from_float(0.1f)));
  CHECK(Tensor::zeros({2}, TensorOptions{DType::f16}).to_vector<float>() == std::vector<float>{0.0f, 0.0f});
  CHECK(Tensor::full({1}, 2.5f, TensorOptions{DType::f16}).item() == 2.5f);
  // fill_ in place: each element the value's bits, rounded once, over more elements than one
  // thread's piece, on a view of rows (its offset honoured, the rows beside it untouched), with no
  // memory taken (it used to fill a host copy and copy it over).
  for (DType t : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(t));
    Tensor big = Tensor::full({3, 40000}, -1.0f, TensorOptions{t});
    const size_t in_use = memory_stats(Device::cpu()).in_use;
    reset_peak_memory_stats(Device::cpu());
    rows_view(big, 1, 1).fill_(0.1f);
    CHECK(memory_stats(Device::cpu()).peak_in_use == in_use);
    const uint16_t want = t == DType::bf16 ? half::bf16_from_float(0.1f) : half::f16_from_float(0.1f);
    const uint16_t minus = t == DType::bf16 ? half::bf16_from_float(-1.0f) : half::f16_from_float(-1.0f);
    const uint16_t* p = static_cast<const uint16_t*>(big.raw_data());
    CHECK(std::count(p, p + 40000, minus) == 40000);
    CHECK(std::count(p + 40000, p + 80000, want) == 40000);
    CHECK(std::count(p + 80000, p + 120000, minus) == 40000);
  }
  // str(): the values as float, the dtype and the device.
  CHECK(b.str(2) == "tensor([0.100098, -2.5, ..., -0, 3], shape [7], bfloat16, cpu)");
  CHECK(Tensor::from_vector(std::vector<int64_t>{4, 5}, {2}).str() == "tensor([4, 5], shape [2], int64, cpu)");
}

TEST_CASE("safetensors: BF16 and F16 tensors are written and read back as they are") {
  const auto path = std::filesystem::temp_directory_path() / ("mg_dtype_" + std::to_string(::getpid()) + ".safetensors");
  const Tensor x = test::rand_tensor({3, 5}, 4);
  const Tensor b = x.to(DType::bf16), h = x.to(DType::f16);
  nn::save_safetensors(path.string(), {{"b", b}, {"h", h}, {"x", x}});
  const nn::SafetensorsFile f = nn::load_safetensors(path.string());
  std::filesystem::remove(path);
  REQUIRE(f.find("b") != nullptr);
  REQUIRE(f.find("h") != nullptr);
  CHECK(f.find("b")->dtype() == DType::bf16);
  CHECK(f.find("h")->dtype() == DType::f16);
  CHECK(test::bit_equal(*f.find("b"), b));
  CHECK(test::bit_equal(*f.find("h"), h));
  CHECK(test::bit_equal(*f.find("x"), x));
}

// A bf16 kernel that runs row by row holds each slot's float32 rows from a room made before its
// pieces (cpu::FloatRowRoom, Note [half scratch] in kernels/cpu/gemm.cpp): its scratch is the same
// every call, not whatever number of pieces happened to overlap.
TEST_CASE("bf16 row kernels: their float32 rows, one per tensor and slot, allocated before the pieces") {
  const int saved = num_threads();
  set_num_threads(2);
  const Device cpu = Device::cpu();
  const int64_t m = 512, c = 256;  // rows of 1 KiB in float32; many pieces
  const Tensor x = mg::test::rand_tensor({m, c}, 91).to(DType::bf16);
  const int64_t grain = (int64_t{1} << 15) / c;  // cpu::items_per_piece(c): 128 rows, 4 pieces
  const size_t slots = static_cast<size_t>(cpu::parallel_for_slots(m, grain));
  CHECK(slots == 2);
  std::vector<size_t> ln, sm;
  for (int rep = 0; rep < 20; ++rep) {
    Tensor y = Tensor::empty({m, c}, TensorOptions{DType::bf16}), mean = Tensor::empty({m}), rstd = Tensor::empty({m});
    size_t before = memory_stats(cpu).in_use;
    reset_peak_memory_stats(cpu);
    layer_norm_forward<Cpu>(y, mean, rstd, x, Tensor(), Tensor(), 1e-5f);
    ln.push_back(memory_stats(cpu).peak_in_use - before);
    CHECK(memory_stats(cpu).in_use == before);
    before = memory_stats(cpu).in_use;
    reset_peak_memory_stats(cpu);
    softmax_forward<Cpu>(y, x, m, c);
    sm.push_back(memory_stats(cpu).peak_in_use - before);
  }
  set_num_threads(saved);
  const size_t two_rows = slots * 2 * static_cast<size_t>(c) * sizeof(float);  // x's and y's row per slot
  for (int rep = 0; rep < 20; ++rep) {
    CAPTURE(rep);
    CHECK(ln[static_cast<size_t>(rep)] == two_rows);
    CHECK(sm[static_cast<size_t>(rep)] == two_rows);
  }
}

// Rows of 0 values (a batch norm over empty planes) need no room: the kernels run, as they did
// when each piece made an empty buffer of its own.
TEST_CASE("bf16 row kernels over rows of 0 values: no room, no error") {
  const Tensor x = Tensor::empty({2, 3, 0}, TensorOptions{DType::bf16});
  Tensor mean = Tensor::full({3}, 7.0f), var = Tensor::full({3}, 7.0f);
  batch_norm_stats<Cpu>(mean, var, x, false);
  CHECK(mean.to_vector<float>() == std::vector<float>{0, 0, 0});
  CHECK(var.to_vector<float>() == std::vector<float>{0, 0, 0});
  const cpu::FloatRowRoom room(2, {{&x, 0}});
  const cpu::FloatRows rows = room.rows(1, 0);
  rows.store(0);  // nothing to round
  CHECK_THROWS_WITH_AS(cpu::FloatRowRoom(1, {{&mean, 3}, {&x, 4}}).rows(2, 0), doctest::Contains("slot 2"), Error);
}
