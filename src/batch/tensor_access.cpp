#include "kvattn/batch/tensor_access.h"

#include <fmt/format.h>

namespace kvattn {
namespace {

template <typename T>
std::span<T> host_span(const Tensor& t, const char* what) {
  KVATTN_CHECK(t.defined(), "{} is undefined; pass a 1-D {} CPU tensor", what,
               dtype_name(dtype_of_v<T>));
  KVATTN_CHECK(t.dtype() == dtype_of_v<T>, "{} has dtype {}, expected {}; convert it with .to()",
               what, dtype_name(t.dtype()), dtype_name(dtype_of_v<T>));
  KVATTN_CHECK(t.device().is_cpu(), "{} lives on {}; host batch helpers read CPU tensors (pass the "
               "_cpu copy)", what, t.device().str());
  KVATTN_CHECK(t.dim() == 1, "{} must be 1-D, got shape {}", what, t.shape().str());
  KVATTN_CHECK(t.numel() <= 1 || t.stride(0) == 1,
               "{} must be contiguous (stride 1), got stride {}; call .contiguous()", what,
               t.stride(0));
  return {t.data_ptr<T>(), static_cast<size_t>(t.numel())};
}

}  // namespace

std::span<int32_t> host_i32_span(const Tensor& t, const char* what) {
  return host_span<int32_t>(t, what);
}
std::span<int64_t> host_i64_span(const Tensor& t, const char* what) {
  return host_span<int64_t>(t, what);
}

BlockTableView host_block_table(const Tensor& t, const char* what) {
  KVATTN_CHECK(t.defined(), "{} is undefined; pass a [num_reqs, max_blocks] int32 CPU tensor", what);
  KVATTN_CHECK(t.dtype() == DType::i32, "{} has dtype {}, expected int32", what,
               dtype_name(t.dtype()));
  KVATTN_CHECK(t.device().is_cpu(), "{} lives on {}; host batch helpers read CPU tensors", what,
               t.device().str());
  KVATTN_CHECK(t.dim() == 2, "{} must be 2-D [num_reqs, max_blocks], got shape {}", what,
               t.shape().str());
  BlockTableView v;
  v.data = t.data_ptr<int32_t>();
  v.num_rows = t.size(0);
  v.width = t.size(1);
  v.row_stride = t.stride(0);
  v.col_stride = t.stride(1);
  return v;
}

}  // namespace kvattn
