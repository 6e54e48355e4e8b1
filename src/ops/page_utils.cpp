// The page-table utilities: check once, then dispatch on the tensors' device.
#include "kvattn/ops/page_utils.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "ops/common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda_dispatch.h"

namespace kvattn::ops {
using namespace detail;

void copy_page_indices(const Tensor& paged_kv_indices, const Tensor& block_table, const Tensor& paged_kv_indptr) {
  static constexpr const char* op = "copy_page_indices";
  check_dim(paged_kv_indices, 1, op, "paged_kv_indices", "[nnz]");
  check_dim(block_table, 2, op, "block_table", "[num_reqs, max_blocks]");
  check_dim(paged_kv_indptr, 1, op, "paged_kv_indptr", "[num_reqs + 1]");
  check_index_dtype(paged_kv_indices, op, "paged_kv_indices");
  check_index_dtype(block_table, op, "block_table");
  check_index_dtype(paged_kv_indptr, op, "paged_kv_indptr");
  check_same_device(paged_kv_indices, block_table, op, "block_table");
  check_same_device(paged_kv_indices, paged_kv_indptr, op, "paged_kv_indptr");
  KVATTN_CHECK(paged_kv_indptr.size(0) == block_table.size(0) + 1,
               "{}: paged_kv_indptr has {} entries but block_table has {} rows; need num_reqs + 1", op,
               paged_kv_indptr.size(0), block_table.size(0));
  if (paged_kv_indices.device().is_cuda()) return cuda_impl::copy_page_indices(paged_kv_indices, block_table, paged_kv_indptr);
  const IndexView ip(paged_kv_indptr);
  KVATTN_CHECK(ip[0] == 0, "{}: paged_kv_indptr[0] = {} must be 0", op, ip[0]);
  for (int64_t r = 0; r < block_table.size(0); ++r) {
    const int64_t n = ip[r + 1] - ip[r];
    KVATTN_CHECK(n >= 0 && n <= block_table.size(1),
                 "{}: request {} has {} pages (paged_kv_indptr[{}] - [{}]); must be in [0, max_blocks = {}]", op, r, n,
                 r + 1, r, block_table.size(1));
  }
  KVATTN_CHECK(ip[block_table.size(0)] <= paged_kv_indices.size(0),
               "{}: paged_kv_indptr[-1] = {} exceeds paged_kv_indices' {} entries", op, ip[block_table.size(0)],
               paged_kv_indices.size(0));
  cpu::copy_page_indices(paged_kv_indices, block_table, paged_kv_indptr);
}

void mamba_align_block_table(const Tensor& out, const Tensor& block_table, const Tensor& seq_lens, int64_t block_size) {
  static constexpr const char* op = "mamba_align_block_table";
  check_dim(out, 2, op, "out", "[num_reqs, n_out]");
  check_dim(block_table, 2, op, "block_table", "[num_reqs, width]");
  check_dim(seq_lens, 1, op, "seq_lens", "[num_reqs]");
  check_index_dtype(block_table, op, "block_table");
  check_index_dtype(seq_lens, op, "seq_lens");
  KVATTN_CHECK(out.dtype() == block_table.dtype(), "{}: out dtype {} must equal block_table dtype {}", op,
               dtype_name(out.dtype()), dtype_name(block_table.dtype()));
  check_same_device(out, block_table, op, "block_table");
  check_same_device(out, seq_lens, op, "seq_lens");
  KVATTN_CHECK(seq_lens.size(0) == block_table.size(0) && out.size(0) == block_table.size(0),
               "{}: seq_lens has {} rows, block_table {} and out {}; they must agree", op, seq_lens.size(0),
               block_table.size(0), out.size(0));
  KVATTN_CHECK(block_size > 0, "{}: block_size = {} must be > 0", op, block_size);
  if (out.device().is_cuda()) return cuda_impl::mamba_align_block_table(out, block_table, seq_lens, block_size);
  const IndexView sl(seq_lens);
  for (int64_t r = 0; r < seq_lens.size(0); ++r) {
    const int64_t start = std::max<int64_t>((sl[r] - 1) / block_size, 0);
    KVATTN_CHECK(start + out.size(1) <= block_table.size(1),
                 "{}: request {} (seq_len {}) needs block-table columns [{}, {}) but the table has {}; widen the "
                 "table or lower n_out", op, r, sl[r], start, start + out.size(1), block_table.size(1));
  }
  cpu::mamba_align_block_table(out, block_table, seq_lens, block_size);
}

void kvfp8_dequant(const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables, const Tensor& k_scale,
                   const Tensor& v_scale, const Tensor& out_k_cache, const Tensor& out_v_cache) {
  static constexpr const char* op = "kvfp8_dequant";
  check_dim(k_cache, 4, op, "k_cache", "[num_pages, page_size, num_kv_heads, head_dim]");
  check_dim(v_cache, 4, op, "v_cache", "[num_pages, page_size, num_kv_heads, head_dim]");
  check_dim(block_tables, 2, op, "block_tables", "[num_reqs, pages_per_req]");
  check_dim(out_k_cache, 4, op, "out_k_cache", "[num_reqs * pages_per_req + 1, page_size, num_kv_heads, head_dim]");
  check_dim(out_v_cache, 4, op, "out_v_cache", "[num_reqs * pages_per_req + 1, page_size, num_kv_heads, head_dim]");
  check_index_dtype(block_tables, op, "block_tables");
  for (const Tensor* t : {&v_cache, &block_tables, &k_scale, &v_scale, &out_k_cache, &out_v_cache})
    check_same_device(k_cache, *t, op, "tensor");
  check_dtype_in(k_cache, {DType::fp8_e4m3, DType::fp8_e5m2}, op, "k_cache");
  KVATTN_CHECK(v_cache.dtype() == k_cache.dtype() && v_cache.shape() == k_cache.shape(),
               "{}: v_cache ({}, {}) must match k_cache ({}, {})", op, dtype_name(v_cache.dtype()),
               v_cache.shape().str(), dtype_name(k_cache.dtype()), k_cache.shape().str());
  check_dtype_in(out_k_cache, {DType::bf16, DType::f16}, op, "out_k_cache");
  KVATTN_CHECK(out_v_cache.dtype() == out_k_cache.dtype(), "{}: out_v_cache dtype differs from out_k_cache", op);
  const int64_t need = block_tables.size(0) * block_tables.size(1) + 1;
  for (const Tensor* t : {&out_k_cache, &out_v_cache})
    KVATTN_CHECK(t->size(0) >= need && t->size(1) == k_cache.size(1) && t->size(2) == k_cache.size(2) &&
                     t->size(3) == k_cache.size(3),
                 "{}: scratch cache shape {} must be [>= num_reqs * pages_per_req + 1 = {}, {}, {}, {}]", op,
                 t->shape().str(), need, k_cache.size(1), k_cache.size(2), k_cache.size(3));
  for (const auto& [t, name] : {std::pair{&k_scale, "k_scale"}, std::pair{&v_scale, "v_scale"}}) {
    check_defined(*t, op, name);
    check_dtype_in(*t, {DType::f32}, op, name);
    KVATTN_CHECK(t->numel() == 1, "{}: `{}` must hold 1 value (per-tensor scale), got shape {}", op, name,
                 t->shape().str());
  }
  if (k_cache.device().is_cuda())
    return cuda_impl::kvfp8_dequant(k_cache, v_cache, block_tables, k_scale, v_scale, out_k_cache, out_v_cache);
  const IndexView bt(block_tables);
  for (int64_t r = 0; r < block_tables.size(0); ++r)
    for (int64_t c = 0; c < block_tables.size(1); ++c)
      KVATTN_CHECK(bt.at(r, c) < k_cache.size(0), "{}: block_tables[{}, {}] = {} is outside the cache's {} pages", op,
                   r, c, bt.at(r, c), k_cache.size(0));
  cpu::kvfp8_dequant(k_cache, v_cache, block_tables, k_scale, v_scale, out_k_cache, out_v_cache);
}

Tensor make_mock_block_table(int64_t num_reqs, int64_t pages_per_req) {
  KVATTN_CHECK(num_reqs >= 0 && pages_per_req >= 0, "make_mock_block_table: sizes must be >= 0, got {} x {}",
               num_reqs, pages_per_req);
  std::vector<int32_t> v(static_cast<size_t>(num_reqs * pages_per_req));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i + 1);
  return Tensor::from_vector(v, Dims{num_reqs, pages_per_req});
}

}  // namespace kvattn::ops
