// kvattn/batch/tensor_access.h — checked host access to the small integer tensors that batch
// metadata is made of.
//
// Batch helpers read query start locations, sequence lengths and block tables on the host.
// These accessors check dtype, device, rank and contiguity once and hand back a raw span or
// a (pointer, strides) row view, so the loops that follow index plain memory without a
// per-element check and without allocating.
#pragma once

#include <cstdint>
#include <span>

#include "kvattn/core/tensor.h"

namespace kvattn {

// A 1-D contiguous int32 host tensor as a span (`what` names it in errors).  An undefined
// tensor is an error.
std::span<int32_t> host_i32_span(const Tensor& t, const char* what);
std::span<int64_t> host_i64_span(const Tensor& t, const char* what);

// A read-only view of a 2-D int32 host block table with arbitrary strides.
struct BlockTableView {
  const int32_t* data = nullptr;
  int64_t num_rows = 0;
  int64_t width = 0;       // columns (max blocks per request)
  int64_t row_stride = 0;  // elements
  int64_t col_stride = 1;  // elements

  int32_t at(int64_t row, int64_t col) const noexcept {
    return data[row * row_stride + col * col_stride];
  }
  const int32_t* row_ptr(int64_t row) const noexcept { return data + row * row_stride; }
};

// Checks `t` is a defined 2-D int32 CPU tensor and returns its view.
BlockTableView host_block_table(const Tensor& t, const char* what = "block_table");

// The block-table row gather behind paged-KV indices: for r < num_rows,
//   dst[indptr[r] + i] = table[r * row_stride + col0 + i],  i < indptr[r + 1] - indptr[r]
// (columns contiguous, rows already checked against the table width).  Every id must be in
// [0, limit) (limit <= 2^31; ids are compared as uint32, so a negative id fails): one vector
// max per row and one compare, at memcpy speed (AVX2 when the CPU has it).  Returns the first
// row holding a bad id (its ids are copied), or -1.
int64_t gather_block_rows(int32_t* __restrict dst, const int32_t* __restrict table,
                          int64_t row_stride, int64_t col0, const int32_t* indptr,
                          int64_t num_rows, uint32_t limit) noexcept;
// Exchanges the first n ids of two distinct block-table rows (AVX2 when the CPU has it).
void swap_block_ids(int32_t* __restrict a, int32_t* __restrict b, int64_t n) noexcept;

// Whether this CPU runs the AVX2 forms of the batch loops (x86-64 with AVX2; false elsewhere).
bool host_has_avx2() noexcept;

// The pool bound as the gather's limit: num_blocks when in (0, 2^31), else 2^31 (any id >= 0).
uint32_t block_id_limit(int64_t num_blocks) noexcept;

}  // namespace kvattn
