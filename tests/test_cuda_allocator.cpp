// The caching allocator on a real device: reuse without a new cudaMalloc, small tensors sharing
// a segment, the statistics, empty_cache, and out of memory (the message, the release of the
// cache and the retry). Its block logic runs without a GPU in test_cuda_allocator_logic.
#include "cuda_helpers.h"  // exits with 77 (skipped) without the CUDA backend or a device

#ifdef MINIGRAD_WITH_CUDA
using namespace mg;
using namespace mg::test;

TEST_CASE("cuda allocator: a freed block is reused without a new cudaMalloc") {
  empty_cache(kGpu);
  void* first = nullptr;
  {
    Tensor a = Tensor::empty({1000}, TensorOptions{}.with_device(kGpu));
    first = a.raw_data();
  }
  const MemoryStats s0 = memory_stats(kGpu);
  Tensor b = Tensor::empty({1000}, TensorOptions{}.with_device(kGpu));
  CHECK(b.raw_data() == first);
  CHECK(memory_stats(kGpu).system_alloc_count == s0.system_alloc_count);
  CHECK(memory_stats(kGpu).in_use == s0.in_use + 4000);
}

TEST_CASE("cuda allocator: small tensors split one segment; stats and empty_cache") {
  empty_cache(kGpu);
  const MemoryStats s0 = memory_stats(kGpu);
  reset_peak_memory_stats(kGpu);
  {
    std::vector<Tensor> ts;
    for (int i = 0; i < 5; ++i) ts.push_back(Tensor::empty({1000 + 7 * i}, TensorOptions{}.with_device(kGpu)));
    const MemoryStats s1 = memory_stats(kGpu);
    CHECK(s1.system_alloc_count <= s0.system_alloc_count + 1);
    CHECK(s1.reserved <= s0.reserved + (size_t{2} << 20));
    CHECK(s1.in_use == s0.in_use + 4 * (5 * 1000 + 7 * 10));
    Tensor large = Tensor::empty({3 << 18}, TensorOptions{}.with_device(kGpu));  // 3 MiB: a large segment
    CHECK(memory_stats(kGpu).peak_in_use == s1.in_use + (size_t{3} << 20));
  }
  CHECK(memory_stats(kGpu).in_use == s0.in_use);
  CHECK(memory_stats(kGpu).reserved > s0.reserved);  // cached
  empty_cache(kGpu);
  CHECK(memory_stats(kGpu).reserved <= s0.reserved);
}

TEST_CASE("cuda allocator: out of memory names the stats and the remedies, and recovers") {
  const MemoryStats s0 = memory_stats(kGpu);
  std::string msg;
  try {
    Tensor huge = Tensor::empty({int64_t{1} << 40}, TensorOptions{}.with_device(kGpu));  // 4 TiB
  } catch (const Error& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.find("cuda:0 out of memory: tried to allocate 4096.00 GiB (4398046511104 bytes)") != std::string::npos);
  CHECK(msg.find("in use by tensors") != std::string::npos);
  CHECK(msg.find("reserved") != std::string::npos);
  CHECK(msg.find("free of") != std::string::npos);
  CHECK(msg.find("gradient accumulation") != std::string::npos);
  CHECK(msg.find("mg::checkpoint") != std::string::npos);
  CHECK(memory_stats(kGpu).in_use == s0.in_use);
  Tensor after = rand_tensor({257}, 9).to(kGpu);  // the allocator and the device still work
  CHECK(test::bit_equal(after.cpu(), rand_tensor({257}, 9)));
}

TEST_CASE("cuda allocator: on a full device the cache is released and the request retried once") {
  empty_cache(kGpu);
  constexpr int64_t kGiBFloats = int64_t{1} << 28;  // 1 GiB: a segment of its own
  std::vector<Tensor> hold;
  std::string msg;
  try {
    for (int i = 0; i < 4096; ++i) hold.push_back(Tensor::empty({kGiBFloats}, TensorOptions{}.with_device(kGpu)));
  } catch (const Error& e) {
    msg = e.what();
  }
  INFO(msg);
  REQUIRE(msg.find("out of memory") != std::string::npos);
  REQUIRE(hold.size() >= 2);
  const size_t held = hold.size();
  hold.clear();  // every 1 GiB segment is now cached, none returned
  const MemoryStats s0 = memory_stats(kGpu);
  CHECK(s0.reserved >= held * (size_t{1} << 30));
  // 1.5 GiB: no cached block is large enough and the device has less than 1 GiB free, so the
  // first cudaMalloc fails; the free segments go back and the retry succeeds.
  Tensor big = Tensor::empty({kGiBFloats * 3 / 2}, TensorOptions{}.with_device(kGpu));
  const MemoryStats s1 = memory_stats(kGpu);
  CHECK(s1.system_alloc_count == s0.system_alloc_count + 1);
  CHECK(s1.reserved < s0.reserved);
  CHECK(s1.in_use == s0.in_use + (size_t{3} << 29));
  big = Tensor();
  empty_cache(kGpu);
}

#endif  // MINIGRAD_WITH_CUDA
