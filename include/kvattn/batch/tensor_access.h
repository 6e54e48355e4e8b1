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

}  // namespace kvattn
