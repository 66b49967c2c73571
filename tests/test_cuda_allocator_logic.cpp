// The CUDA caching allocator's block logic (src/kernels/cuda/block_pool.h, Note [caching allocator])
// driven by a fake "system allocator": runs on every machine, GPU or not. The same pool over
// cudaMalloc is tested on a device in test_cuda_allocator.cpp.
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "helpers.h"
#include "kernels/cuda/block_pool.h"

using namespace mg;
using cuda::BlockPool;
using cuda::SystemMemInfo;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Hands out address ranges (never dereferenced) up to a capacity, and records every call.
struct FakeState {
  size_t capacity = 0;
  size_t used = 0;
  uintptr_t next_address = 0x100000000ull;
  std::map<uintptr_t, size_t> segments;  // live: base -> bytes
  int mallocs = 0, frees = 0, refusals = 0;
};

struct FakeSystem {
  std::shared_ptr<FakeState> st;
  void* malloc(size_t bytes) {
    if (st->used + bytes > st->capacity) {
      st->refusals++;
      return nullptr;
    }
    const uintptr_t base = st->next_address;
    st->next_address += bytes + 4096;  // a gap: segments are never contiguous
    st->segments[base] = bytes;
    st->used += bytes;
    st->mallocs++;
    return reinterpret_cast<void*>(base);
  }
  void free(void* p) {
    auto it = st->segments.find(reinterpret_cast<uintptr_t>(p));
    REQUIRE(it != st->segments.end());  // only whole segments go back
    st->used -= it->second;
    st->segments.erase(it);
    st->frees++;
  }
  SystemMemInfo mem_info() { return {st->capacity - st->used, st->capacity}; }
  std::string name() const { return "fake:0"; }
};

struct Fixture {
  std::shared_ptr<FakeState> st = std::make_shared<FakeState>();
  std::unique_ptr<BlockPool<FakeSystem>> pool;
  explicit Fixture(size_t capacity) {
    st->capacity = capacity;
    pool = std::make_unique<BlockPool<FakeSystem>>(FakeSystem{st});
  }
};

char* as_bytes(void* p) { return static_cast<char*>(p); }

}  // namespace

TEST_CASE("block pool: rounding, reuse of a freed block, counted stats") {
  Fixture f(64 * kMiB);
  void* a = f.pool->allocate(1000);
  MemoryStats s = f.pool->stats();
  CHECK(s.in_use == 1000);  // as requested
  CHECK(s.reserved == cuda::kSmallSegment);
  CHECK(s.system_alloc_count == 1);
  f.pool->deallocate(a, 1000);
  CHECK(f.pool->stats().in_use == 0);
  CHECK(f.pool->stats().reserved == cuda::kSmallSegment);  // cached, not returned
  void* b = f.pool->allocate(777);
  CHECK(b == a);
  CHECK(f.st->mallocs == 1);
  CHECK(f.pool->stats().peak_in_use == 1000);
  f.pool->reset_peak();
  CHECK(f.pool->stats().peak_in_use == 777);
  CHECK(f.pool->allocate(0) == nullptr);
  f.pool->deallocate(b, 777);
}

TEST_CASE("block pool: a segment is split, and the pieces merge back") {
  Fixture f(64 * kMiB);
  void* a = f.pool->allocate(1000);  // 1024 bytes
  void* b = f.pool->allocate(3000);  // 3072
  void* c = f.pool->allocate(513);   // 1024
  CHECK(as_bytes(b) == as_bytes(a) + 1024);
  CHECK(as_bytes(c) == as_bytes(b) + 3072);
  CHECK(f.st->mallocs == 1);
  CHECK(f.pool->cached_bytes() == cuda::kSmallSegment - 1024 - 3072 - 1024);
  f.pool->deallocate(b, 3000);
  f.pool->deallocate(a, 1000);
  f.pool->deallocate(c, 513);
  // Everything merged into one free segment: empty_cache gives it back whole.
  CHECK(f.pool->segment_count() == 1);
  f.pool->empty_cache();
  CHECK(f.st->frees == 1);
  CHECK(f.st->segments.empty());
  CHECK(f.pool->stats().reserved == 0);
  CHECK(f.pool->segment_count() == 0);
}

TEST_CASE("block pool: best fit among cached blocks") {
  Fixture f(64 * kMiB);
  void* x1 = f.pool->allocate(4096);
  void* s1 = f.pool->allocate(512);  // separators keep the freed blocks from merging
  void* x2 = f.pool->allocate(1536);
  void* s2 = f.pool->allocate(512);
  void* x3 = f.pool->allocate(8192);
  void* s3 = f.pool->allocate(512);
  f.pool->deallocate(x1, 4096);
  f.pool->deallocate(x2, 1536);
  f.pool->deallocate(x3, 8192);
  CHECK(f.pool->allocate(1500) == x2);  // 1536 fits best, not 4096 nor the segment's tail
  CHECK(f.pool->allocate(4000) == x1);
  void* y = f.pool->allocate(5000);     // 5120 of the 8192 block, the rest split off
  CHECK(y == x3);
  CHECK(f.pool->allocate(3000) == as_bytes(x3) + 5120);
  CHECK(f.st->mallocs == 1);
  (void)s1, (void)s2, (void)s3;
}

TEST_CASE("block pool: large requests use large segments, split only past 1 MiB") {
  Fixture f(256 * kMiB);
  void* a = f.pool->allocate(3 * kMiB);  // < 10 MiB: a 20 MiB segment
  CHECK(f.pool->stats().reserved == 20 * kMiB);
  void* b = f.pool->allocate(5 * kMiB);
  CHECK(as_bytes(b) == as_bytes(a) + 3 * kMiB);
  void* c = f.pool->allocate(12 * kMiB + 1);  // >= 10 MiB: rounded to 2 MiB, 14 MiB
  CHECK(f.pool->stats().reserved == 34 * kMiB);
  CHECK(f.st->mallocs == 2);
  f.pool->deallocate(c, 12 * kMiB + 1);
  // 13 MiB from the cached 14 MiB block: the 1 MiB rest is not worth a block of its own.
  void* d = f.pool->allocate(13 * kMiB);
  CHECK(d == c);
  CHECK(f.pool->cached_bytes() == 20 * kMiB - 8 * kMiB);
  // Small requests never take large blocks: a new small segment.
  void* e = f.pool->allocate(100);
  CHECK(f.pool->stats().reserved == 36 * kMiB);
  f.pool->deallocate(a, 3 * kMiB);
  f.pool->deallocate(b, 5 * kMiB);
  f.pool->deallocate(d, 13 * kMiB);
  f.pool->deallocate(e, 100);
  f.pool->empty_cache();
  CHECK(f.pool->stats().reserved == 0);
  CHECK(f.st->segments.empty());
}

TEST_CASE("block pool: on refusal the cache is released and the request retried once") {
  Fixture f(27 * kMiB);
  void* a = f.pool->allocate(1000);  // 2 MiB small segment, then cached
  f.pool->deallocate(a, 1000);
  void* big = f.pool->allocate(26 * kMiB);  // 2 + 26 > 27: refused, cache released, retried
  CHECK(big != nullptr);
  CHECK(f.st->refusals == 1);
  CHECK(f.st->frees == 1);
  CHECK(f.pool->stats().reserved == 26 * kMiB);
  CHECK(f.pool->stats().in_use == 26 * kMiB);
  f.pool->deallocate(big, 26 * kMiB);
}

TEST_CASE("block pool: out of memory names the request, the statistics and the remedies") {
  Fixture f(27 * kMiB);
  void* big = f.pool->allocate(26 * kMiB);
  const MemoryStats before = f.pool->stats();
  std::string msg;
  try {
    f.pool->allocate(4 * kMiB);
  } catch (const Error& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.find("fake:0 out of memory") != std::string::npos);
  CHECK(msg.find("tried to allocate 4.00 MiB (4194304 bytes)") != std::string::npos);
  CHECK(msg.find("new segment of 20.00 MiB") != std::string::npos);
  CHECK(msg.find("26.00 MiB (27262976 bytes) in use") != std::string::npos);
  CHECK(msg.find("reserved") != std::string::npos);
  CHECK(msg.find("1.00 MiB (1048576 bytes) free of 27.00 MiB") != std::string::npos);
  CHECK(msg.find("gradient accumulation") != std::string::npos);
  CHECK(msg.find("mg::checkpoint") != std::string::npos);
  CHECK(msg.find("memory budget") != std::string::npos);
  CHECK(msg.find("nn/checkpoint_plan.h") != std::string::npos);
  CHECK(f.st->refusals == 2);  // tried, released nothing useful, retried once, gave up
  // A failed request leaves the pool as it was.
  CHECK(f.pool->stats().in_use == before.in_use);
  CHECK(f.pool->stats().reserved == before.reserved);
  CHECK_THROWS_AS(f.pool->allocate(512 * 1024), Error);  // a 2 MiB small segment: no room
  f.pool->deallocate(big, 26 * kMiB);
  void* again = f.pool->allocate(4 * kMiB);  // the cached 26 MiB block serves it now
  CHECK(again == big);
  f.pool->deallocate(again, 4 * kMiB);
}

TEST_CASE("block pool: a memory limit caps in_use and reserved, releasing cached segments first") {
  Fixture f(64 * kMiB);  // the device has more than the cap
  f.pool->set_limit(24 * kMiB);
  CHECK(f.pool->limit() == 24 * kMiB);
  void* a = f.pool->allocate(10 * kMiB);  // a 10 MiB segment (large requests get their own size)
  void* b = f.pool->allocate(10 * kMiB);
  CHECK(f.pool->stats().reserved == 20 * kMiB);
  // 20 + 6 MiB in use would pass the cap: refused before the system is asked.
  const int mallocs = f.st->mallocs;
  std::string msg;
  try {
    f.pool->allocate(6 * kMiB);
  } catch (const OutOfMemoryError& e) {
    msg = e.what();
    CHECK(e.requested() == 6 * kMiB);
  }
  INFO(msg);
  CHECK(msg.find("fake:0 out of memory: tried to allocate 6.00 MiB") != std::string::npos);
  CHECK(msg.find("the memory limit is 24.00 MiB") != std::string::npos);
  CHECK(msg.find("gradient accumulation") != std::string::npos);
  CHECK(f.st->mallocs == mallocs);
  CHECK(f.pool->stats().in_use == 20 * kMiB);
  // 4 MiB fits in use (24), but a new 20 MiB segment would take reserved to 40: the cached free
  // segment goes first, and then the new one fits.
  f.pool->deallocate(b, 10 * kMiB);
  void* c = f.pool->allocate(12 * kMiB);  // no cached block is big enough: a new segment
  CHECK(c != nullptr);
  CHECK(f.st->frees == 1);  // b's segment was released to make room under the cap
  CHECK(f.pool->stats().reserved == 22 * kMiB);
  CHECK(f.pool->stats().reserved <= f.pool->limit());
  // 1.5 MiB fits in use (23.5), but its new 20 MiB segment would take reserved to 42 and nothing
  // cached is left to release: refused.
  CHECK_THROWS_AS(f.pool->allocate(kMiB + kMiB / 2), OutOfMemoryError);
  CHECK(f.pool->stats().reserved == 22 * kMiB);
  f.pool->set_limit(0);
  void* d = f.pool->allocate(3 * kMiB);  // no cap: the device's 64 MiB
  f.pool->deallocate(a, 10 * kMiB);
  f.pool->deallocate(c, 12 * kMiB);
  f.pool->deallocate(d, 3 * kMiB);
}

TEST_CASE("block pool: freeing a foreign pointer or the wrong size throws") {
  Fixture f(64 * kMiB);
  void* a = f.pool->allocate(2048);
  int on_stack = 0;
  CHECK_THROWS_WITH_AS(f.pool->deallocate(&on_stack, 4), doctest::Contains("did not allocate"), Error);
  CHECK_THROWS_WITH_AS(f.pool->deallocate(a, 1024), doctest::Contains("2048 were allocated"), Error);
  f.pool->deallocate(a, 2048);
  CHECK_THROWS_AS(f.pool->deallocate(a, 2048), Error);  // twice
}

TEST_CASE("block pool: random traffic keeps blocks disjoint, inside segments, and counted") {
  Fixture f(4096 * kMiB);
  std::mt19937_64 rng(12345);
  std::map<uintptr_t, size_t> live;  // address -> requested bytes
  size_t requested_total = 0;
  auto check_invariants = [&] {
    uintptr_t prev_end = 0;
    for (auto [addr, n] : live) {
      CHECK(addr % cuda::kMinBlockSize == 0);
      CHECK(addr >= prev_end);  // disjoint (rounded extents)
      prev_end = addr + cuda::round_up(n, cuda::kMinBlockSize);
      auto seg = f.st->segments.upper_bound(addr);
      REQUIRE(seg != f.st->segments.begin());
      --seg;
      CHECK(prev_end <= seg->first + seg->second);  // inside a live segment
    }
    CHECK(f.pool->stats().in_use == requested_total);
    size_t seg_total = 0;
    for (auto [b, n] : f.st->segments) seg_total += n;
    CHECK(f.pool->stats().reserved == seg_total);
  };
  for (int step = 0; step < 4000; ++step) {
    const bool do_alloc = live.empty() || (live.size() < 80 && rng() % 100 < 55);
    if (do_alloc) {
      // Mostly small, sometimes large, sizes of every residue.
      const size_t n = rng() % 10 < 8 ? 1 + rng() % (3 * cuda::kSmallSize / 2) : 1 + rng() % (24 * kMiB);
      void* p = f.pool->allocate(n);
      REQUIRE(live.count(reinterpret_cast<uintptr_t>(p)) == 0);
      live[reinterpret_cast<uintptr_t>(p)] = n;
      requested_total += n;
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      f.pool->deallocate(reinterpret_cast<void*>(it->first), it->second);
      requested_total -= it->second;
      live.erase(it);
    }
    if (step % 97 == 0) check_invariants();
    if (step % 1000 == 999) f.pool->empty_cache();
  }
  check_invariants();
  for (auto [addr, n] : live) f.pool->deallocate(reinterpret_cast<void*>(addr), n);
  f.pool->empty_cache();
  CHECK(f.st->segments.empty());
  CHECK(f.pool->stats().reserved == 0);
}
