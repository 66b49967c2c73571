// Tensors on the device: copies between host and device, tensors of every dtype, device
// strings, and what is not supported saying so.
#include <cstring>

#include "core/tape.h"     // rows_view
#include "cuda_helpers.h"  // exits with 77 (skipped) without the CUDA backend or a device

#ifdef MINIGRAD_WITH_CUDA
using namespace mg;
using namespace mg::test;

TEST_CASE("cuda: copies between host and device are exact, for float and int64") {
  Tensor x = rand_tensor({7, 131}, 1);
  Tensor g = x.to(kGpu);
  CHECK(g.is_cuda());
  Tensor g2 = g.clone();  // device to device
  CHECK(!g2.shares_storage(g));
  CHECK(test::bit_equal(g2.cpu(), x));
  Tensor idx = labels(1001, 1 << 30, 2);
  CHECK(idx.to(kGpu).to_vector<int64_t>() == idx.to_vector<int64_t>());
}

TEST_CASE("cuda: tensors of every dtype on the device; device strings; what is not supported says so") {
  CHECK(Device::parse("cuda") == Device::cuda(0));
  CHECK(Device::parse("cuda:0") == kGpu);
  CHECK(Device::parse("cuda:1") == Device::cuda(1));
  CHECK_THROWS_WITH_AS(Device::parse("gpu"), doctest::Contains("expected cpu, cuda or cuda:N"), Error);
  CHECK_THROWS_WITH_AS(Device::parse("cuda:-1"), doctest::Contains("expected cpu, cuda or cuda:N"), Error);
  const int n = cuda_device_count();
  CHECK_THROWS_WITH_AS(Tensor::empty({3}, TensorOptions{}.with_device(Device::cuda(n))),
                       doctest::Contains("does not exist"), Error);
  // int64 and float64 tensors live on the device (labels, pooling indices, step statistics), but
  // fill_ has a float32 kernel only: a clear error, not a kernel reading the wrong width.
  Tensor i = Tensor::empty({5}, TensorOptions{DType::i64, kGpu});
  CHECK_THROWS_WITH_AS(i.fill_(1.0f), doctest::Contains("int64"), Error);
  Tensor d = Tensor::empty({5}, TensorOptions{DType::f64, kGpu});
  CHECK_THROWS_WITH_AS(d.zero_(), doctest::Contains("float64"), Error);
  Tensor dh = Tensor::full({1}, 0.5f, TensorOptions{DType::f64});
  CHECK(dh.to(kGpu).item() == 0.5f);
  CHECK(Tensor::from_vector(std::vector<int64_t>{-3}, {1}).to(kGpu).item() == -3.0f);
  Tensor f = rand_tensor({1}, 5);
  CHECK(f.to(kGpu).item() == f.item());
  CHECK_THROWS_WITH_AS(rand_tensor({2}, 5).to(kGpu).item(), doctest::Contains("one element"), Error);
  // clone and copy_ on the device, and copy_ across devices in both directions.
  Tensor a = rand_tensor({3, 7}, 6).to(kGpu), b = poisoned({3, 7}, kGpu);
  b.copy_(a);
  CHECK(test::bit_equal(b.cpu(), a.cpu()));
  Tensor host = poisoned({3, 7}, Device::cpu());
  host.copy_(a);
  CHECK(test::bit_equal(host, a.cpu()));
  Tensor c = a.clone();
  CHECK(c.is_cuda());
  CHECK(!c.shares_storage(a));
}

TEST_CASE("cuda: conversions between float32, float64, bfloat16 and float16 give the CPU's bits") {
  // Note [half conversions]: the same element functions on both devices. Inputs over every
  // exponent (random bits: NaN, infinities, subnormals, f16's overflow), into poisoned outputs.
  std::vector<float> v(100003);
  uint32_t state = 12345;
  for (float& e : v) {
    state = state * 1664525u + 1013904223u;
    std::memcpy(&e, &state, sizeof e);
  }
  const Tensor x = Tensor::from_vector(v, {100003});
  const Tensor gx = x.to(kGpu);
  for (const DType t : {DType::bf16, DType::f16, DType::f64}) {
    CAPTURE(dtype_name(t));
    const Tensor want = x.to(t);
    Tensor got = Tensor::full(x.shape(), std::nanf(""), TensorOptions{t}).to(kGpu);  // poisoned
    got.copy_(gx);
    CHECK(test::bit_equal(got.cpu(), want));
    CHECK(test::bit_equal(x.to(kGpu, t).cpu(), want));  // host float32 to device t
    // Back to float32 on the device: the CPU's widening.
    CHECK(test::bit_equal(got.to(DType::f32).cpu(), want.to(DType::f32)));
  }
  CHECK(test::bit_equal(gx.to(DType::f16).to(DType::bf16).cpu(), x.to(DType::f16).to(DType::bf16)));
  CHECK(Tensor::full({4}, 0.1f, TensorOptions{DType::bf16, kGpu}).cpu().to_vector<float>() ==
        Tensor::full({4}, 0.1f, TensorOptions{DType::bf16}).to_vector<float>());
  // fill_ of 16-bit tensors runs on the device (it filled a host copy and copied it over): the
  // CPU's bits, on a view of rows (the rows beside it untouched), with no device memory taken.
  for (const DType t : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(t));
    Tensor want = Tensor::full({3, 70001}, -1.0f, TensorOptions{t});
    rows_view(want, 1, 1).fill_(0.1f);
    Tensor got = Tensor::full({3, 70001}, -1.0f, TensorOptions{t, kGpu});
    const size_t in_use = memory_stats(kGpu).in_use;
    reset_peak_memory_stats(kGpu);
    rows_view(got, 1, 1).fill_(0.1f);
    CHECK(memory_stats(kGpu).peak_in_use == in_use);
    CHECK(test::bit_equal(got.cpu(), want));
  }
}

#endif  // MINIGRAD_WITH_CUDA
