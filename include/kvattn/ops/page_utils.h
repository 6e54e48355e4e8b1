// kvattn/ops/page_utils.h — small page-table kernels of the metadata path.
#pragma once

#include "kvattn/core/tensor.h"

namespace kvattn::ops {

// FlashInfer backend `_copy_page_indices_kernel`: for each request r,
//   paged_kv_indices[indptr[r] + i] = block_table[r, i]   for i < indptr[r+1] - indptr[r].
//   paged_kv_indices [>= indptr[R]] int32/int64 (written)
//   block_table      [R, max_blocks] int32/int64, any strides
//   paged_kv_indptr  [R + 1] int32/int64, non-decreasing, [0] == 0, each row count <= max_blocks
void copy_page_indices(const Tensor& paged_kv_indices, const Tensor& block_table,
                       const Tensor& paged_kv_indptr);

// vLLM `_mamba_align_block_table_kernel` ("align" Mamba cache mode): the last n_out block-table
// entries of each request,
//   out[r, j] = block_table[r, max((seq_lens[r] - 1) / block_size, 0) + j],  j < n_out.
//   out         [R, n_out] int32/int64 (same dtype as block_table), any strides (written)
//   block_table [R, width] int32/int64, any strides
//   seq_lens    [R] int32/int64, any stride
// An index past the row (start + n_out > width) is an InvalidArgument (torch.gather raised).
void mamba_align_block_table(const Tensor& out, const Tensor& block_table, const Tensor& seq_lens,
                             int64_t block_size);

// fp8 pages -> a bf16/f16 scratch cache (vLLM `trtllm_prefill_attn_kvfp8_dequant`): for request
// r and column c with page = block_tables[r, c] > 0, mock page m = r * P + 1 + c receives
//   out_k_cache[m] = k_cache[page] * k_scale,   out_v_cache[m] = v_cache[page] * v_scale.
// Entries <= 0 (padding / the null block) leave their mock page unwritten; mock page 0 is never
// written.  The mock block table is  r * P + 1 + c  (make_mock_block_table).
//   k_cache, v_cache         [num_pages, page_size, num_kv_heads, head_dim] fp8_e4m3/e5m2 views
//   block_tables             [R, P] int32/int64
//   k_scale, v_scale         [1] f32
//   out_k_cache, out_v_cache [R * P + 1, page_size, num_kv_heads, head_dim] bf16 or f16 views
void kvfp8_dequant(const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables,
                   const Tensor& k_scale, const Tensor& v_scale, const Tensor& out_k_cache,
                   const Tensor& out_v_cache);
// [R, P] int32 CPU tensor with entries r * P + 1 + c.
Tensor make_mock_block_table(int64_t num_reqs, int64_t pages_per_req);

}  // namespace kvattn::ops
