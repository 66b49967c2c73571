// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11): a value is a pure function
// of (seed, counter), so any element of any random tensor can be regenerated later, on CPU or
// GPU, without storing it. This is what makes dropout masks replay exactly under checkpointing
// (Note [checkpoint replay] in minigrad/core/checkpoint.h).
//
//   mg::Generator gen(42);
//   uint64_t offset = gen.advance(n);          // reserve n draws, get their first counter
//   float u = mg::philox_uniform(gen.seed(), offset + i);   // the i-th draw, in [0, 1)
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MG_HOST_DEVICE inline
#endif

namespace mg {

struct Philox4 {
  uint32_t v[4];
};

// Philox4x32-10 of counter (lo, hi) under key `seed`.
MG_HOST_DEVICE Philox4 philox4x32(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = static_cast<uint32_t>(p1);
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// The i-th 32-bit draw of the stream: element i uses word i % 4 of block i / 4.
MG_HOST_DEVICE uint32_t philox_u32(uint64_t seed, uint64_t i) {
  return philox4x32(seed, i >> 2).v[i & 3];
}

// A 32-bit draw as a uniform in [0, 1) with 24 bits, the same float on every device.
MG_HOST_DEVICE float uniform_of(uint32_t word) { return static_cast<float>(word >> 8) * (1.0f / 16777216.0f); }

MG_HOST_DEVICE float philox_uniform(uint64_t seed, uint64_t i) { return uniform_of(philox_u32(seed, i)); }

// f(k, philox_uniform(seed, first + k)) for k = 0 .. n-1, in order, each Philox block computed once
// for the (up to) four draws it serves: a fill of n draws costs n / 4 blocks, not n.
template <class F> void philox_uniforms(uint64_t seed, uint64_t first, int64_t n, F&& f) {
  for (int64_t k = 0; k < n;) {
    const uint64_t i = first + static_cast<uint64_t>(k);
    const Philox4 r = philox4x32(seed, i >> 2);
    for (uint64_t w = i & 3; w < 4 && k < n; ++w, ++k) f(k, uniform_of(r.v[w]));
  }
}

// A seed plus a position in its stream. Each random op reserves the draws it needs with
// advance() and records (seed, offset), so it can be replayed.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t o) { offset_ = o; }
  void manual_seed(uint64_t s) { seed_ = s; offset_ = 0; }
  // Reserves n draws, rounded up to whole Philox blocks, and returns the first one's index.
  uint64_t advance(uint64_t n) {
    uint64_t first = offset_;
    offset_ += (n + 3) & ~uint64_t{3};
    return first;
  }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The process-wide generator used by initialisers and dropout when none is given.
Generator& default_generator();
void manual_seed(uint64_t seed);

// Note [dropout by sample]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Outside a sample window, each dropout call reserves numel draws of its generator, so the masks
// depend on how the batch was split: with two dropout layers, 4 micro-batches of 8 draw other
// masks than one batch of 32. Inside a window (a SampleWindowGuard, held while a micro-batch's
// forward runs; optim::Accumulator::sample_window() makes one), dropout call k of the forward
// draws the mask of sample s of the window (counted from the window's first sample, over all its
// micro-batches) from the key sample_window_seed(generator seed, window key, k) and the counters
// s * F .. s * F + F - 1 (F: elements per sample): the same mask whichever micro-batch the sample
// is in, and the generator does not advance. The window key is the optimizer step, so every step
// draws new masks, and a resumed run draws the ones it would have drawn. The mask is recorded in
// the op's attributes, so backward and checkpoint replay use it as before. Under data parallelism
// rank r of K holds every K-th sample of the window (Note [shards]): its micro-batch's sample j
// is sample (first_sample + j) * K + r of the window (sample_stride K, sample_lane r), and draws
// that sample's mask, the one a single process draws.
//
//   {
//     mg::SampleWindowGuard window(/*key=*/step, /*first_sample=*/samples_before_this_micro_batch);
//     loss = mg::cross_entropy(model.forward(x), y, mg::Reduction::sum);
//   }
struct SampleWindow {
  uint64_t key = 0;          // the window: an optimizer step
  int64_t first_sample = 0;  // this micro-batch's first sample within the window (of this rank)
  int64_t sample_stride = 1, sample_lane = 0;  // window sample of local sample s: s * stride + lane
  uint32_t calls = 0;        // dropout calls so far in this micro-batch's forward
};

// The calling thread's innermost window, or nullptr.
SampleWindow* current_sample_window();

// Makes a window current on this thread for its lifetime (the previous one comes back after).
class SampleWindowGuard {
 public:
  SampleWindowGuard(uint64_t key, int64_t first_sample, int64_t sample_stride = 1, int64_t sample_lane = 0);
  ~SampleWindowGuard();
  SampleWindowGuard(const SampleWindowGuard&) = delete;
  SampleWindowGuard& operator=(const SampleWindowGuard&) = delete;

 private:
  SampleWindow window_;
  SampleWindow* previous_;
};

// The Philox key of dropout call `call` in window `key` under a generator of seed `seed`.
inline uint64_t sample_window_seed(uint64_t seed, uint64_t key, uint32_t call) {
  const Philox4 r = philox4x32(seed ^ 0x5A4D504C45574E44ull, key);  // a key of its own per window
  const uint64_t window = (static_cast<uint64_t>(r.v[1]) << 32) | r.v[0];
  const Philox4 c = philox4x32(window, call);
  return (static_cast<uint64_t>(c.v[1]) << 32) | c.v[0];
}

}  // namespace mg
