// bf16 and f16 tensors a block of rows (the first dimension: samples) at a time, for CPU kernels
// that run their float32 code on a chunk of samples (Note [half operands] in kernels/cpu/gemm.h).
// Each copy is a tensor, so the CPU allocator counts it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::cpu {

inline bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }

// n values of src (float32, bf16 or f16) into dst as float32; and back, rounded to dst's dtype.
void widen_span(float* dst, const void* src, DType from, int64_t n);
void narrow_span(void* dst, DType to, const float* src, int64_t n);
// Whether widen_span/narrow_span convert f16 with F16C (Note [f16 conversions with F16C]): the
// CPU has it and allow_f16c has not turned it off. allow_f16c returns the previous setting (tests
// compare both paths).
bool f16c_in_use();
bool allow_f16c(bool allowed);

// A float32 buffer for summing into g: g itself when it is float32, else a new one, which
// store_sum then rounds into g (a bf16 weight's own gradient is summed in float32).
Tensor float32_sum(const Tensor& g);
void store_sum(Tensor& g, const Tensor& sum);

// The whole tensor as float32: itself when it is float32.
Tensor widened(const Tensor& t);

// Rows [first, first + rows) of t (a float dtype) as a new float32 tensor of shape (rows, ...).
Tensor widen_rows(const Tensor& t, int64_t first, int64_t rows);

// Row r of a bf16/f16 matrix t (rows of `out.numel()` elements) widened into out; returns out's data.
const float* widen_row(const Tensor& out, const Tensor& t, int64_t r);

// dst's rows [first, first + src.size(0)) = src (float32), rounded to dst's dtype.
void store_rows(Tensor& dst, int64_t first, const Tensor& src);

// Rows of `n` values of a tensor of a float dtype, as float32, in one piece of a kernel that runs
// row by row (layer_norm, softmax, embedding): a float32 tensor's rows are its own memory; a bf16 or f16
// tensor's row is widened into a buffer of the piece's, or written there and rounded into the
// tensor. So a half kernel holds a row per piece in float32, and the row's float32 code (one call
// site for every dtype) runs on the same values either way. The buffers come from a FloatRowRoom
// made before the parallel part (Note [half scratch] in kernels/cpu/gemm.cpp): made by each piece
// as it ran, the bytes in use at the kernel's moment depended on which pieces overlapped in time.
class FloatRows {
 public:
  // Row r as float32; a buffer's row stays valid until the next read or write.
  const float* read(int64_t r) const {
    if (!buf_) return reinterpret_cast<const float*>(base_) + r * n_;
    widen_span(buf_, at(r), dtype_, n_);
    return buf_;
  }
  // Where row r's float32 values go; store(r) then rounds them into the tensor.
  float* write(int64_t r) const { return buf_ ? buf_ : reinterpret_cast<float*>(base_) + r * n_; }
  // Row r as float32, to change in place; store(r) then rounds it back.
  float* update(int64_t r) const { return const_cast<float*>(read(r)); }
  void store(int64_t r) const {
    if (buf_) narrow_span(at(r), dtype_, buf_, n_);
  }

 private:
  friend class FloatRowRoom;
  FloatRows(const Tensor& t, int64_t n, float* buf)
      : base_(static_cast<char*>(t.raw_data())), dtype_(t.dtype()), n_(n), buf_(buf) {}
  char* at(int64_t r) const { return base_ + static_cast<size_t>(r * n_) * dtype_size(dtype_); }
  char* base_;
  DType dtype_;
  int64_t n_;
  float* buf_;  // null for a float32 tensor
};

// Every slot's row buffers of a parallel part, allocated before it runs (a tensor, counted by the
// CPU allocator): for each slot, a row of n floats for each bf16 or f16 tensor of `rows` (an
// undefined tensor takes no room). rows(slot, k) gives the k-th tensor's FloatRows.
//   const cpu::FloatRowRoom room(cpu::parallel_for_slots(m, grain), {{&x, c}, {&y, c}});
//   cpu::parallel_for_slot(m, grain, [&](int64_t r0, int64_t r1, int slot) {
//     const cpu::FloatRows xs = room.rows(slot, 0), ys = room.rows(slot, 1); ... });
class FloatRowRoom {
 public:
  FloatRowRoom(int slots, std::initializer_list<std::pair<const Tensor*, int64_t>> rows);
  FloatRows rows(int slot, size_t k) const;

 private:
  struct Row {
    const Tensor* t;
    int64_t n, offset;  // offset: floats into a slot's room; -1 for a float32 (or undefined) tensor
  };
  std::vector<Row> rows_;
  int64_t per_slot_ = 0;
  Tensor room_;
};

// Samples per chunk for a kernel whose float32 copies take `bytes_per_row` a sample: about
// half_chunk_bytes() of them, at least one per thread, at most `rows`.
int64_t half_chunk_rows(int64_t rows, int64_t bytes_per_row);
int64_t half_chunk_bytes();
void set_half_chunk_bytes(int64_t bytes);  // tests: small chunks, to cut every batch

}  // namespace mg::cpu
