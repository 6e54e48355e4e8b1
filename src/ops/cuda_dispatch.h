// src/ops/cuda_dispatch.h — the CUDA side of every ops/ entry point (internal).
//
// The public entry points (include/kvattn/ops/*.h) validate their arguments once — shapes,
// dtypes, ranges, every page id / slot / block-table entry the CPU can see — and then call
// these for CUDA tensors.  Definitions live in src/ops/cuda/ (CUDA builds) or in
// cuda_dispatch_stub.cpp (builds without CUDA: each throws Unsupported).
//
// What the entry point has already guaranteed (so the kernels need not re-check):
//   * every tensor of the call is on the same CUDA device, with the documented shape/dtype;
//   * optional tensors are either !defined() or fully checked;
//   * index tensors (indptr, indices, block tables, slot mappings) are int32 or int64 and —
//     when they are CPU-readable — in range.  Device-resident index tensors cannot be read by
//     the host without a sync, so the CUDA kernels must clamp/skip out-of-range ids themselves
//     (skip slot < 0 and slot >= num_blocks * block_size; skip page ids outside [0, num_pages)).
//   * paged_attention: args.sm_scale has a value (the entry point fills the default); at most
//     one of (paged indices, block table) is set; head_dim % 8 == 0 and 8 <= head_dim <= 512.
#pragma once

#include "kvattn/ops/cascade.h"
#include "kvattn/ops/dcp_combine.h"
#include "kvattn/ops/merge_attn_states.h"
#include "kvattn/ops/paged_attention.h"
#include "kvattn/ops/reshape_and_cache.h"

namespace kvattn::ops::cuda_impl {

bool available() noexcept;  // true in CUDA builds

void reshape_and_cache_flash(const ReshapeAndCacheArgs& args);
void paged_attention(const PagedAttentionArgs& args);
void merge_attn_states(const MergeAttnStatesArgs& args);
void mask_empty_context_lse(const Tensor& lse, const Tensor& query_start_loc,
                            const Tensor& context_start_loc);
void zero_kv_blocks(const Tensor& seg_addrs, const Tensor& seg_block_strides,
                    const Tensor& seg_page_sizes, const Tensor& block_ids);
void copy_page_indices(const Tensor& paged_kv_indices, const Tensor& block_table,
                       const Tensor& paged_kv_indptr);
void mamba_align_block_table(const Tensor& out, const Tensor& block_table, const Tensor& seq_lens,
                             int64_t block_size);
void kvfp8_dequant(const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables,
                   const Tensor& k_scale, const Tensor& v_scale, const Tensor& out_k_cache,
                   const Tensor& out_v_cache);

// DCP pieces (kernels in src/ops/cuda/dcp_ops.cu).
void copy_(const Tensor& dst, const Tensor& src, float scale);
void dcp_lse_scale_pack(const Tensor& partial, const Tensor& all_lse, int64_t rank, bool lse_base_e,
                        const Tensor& packed, const Tensor& global_lse);
void dcp_lse_combine(const Tensor& partials, const Tensor& lses, bool lse_base_e, const Tensor& out,
                     const Tensor& global_lse);

// Which kernel path serves a paged_attention call, and why: src/ops/cuda/attention_path.h
// (select_attention_path).  The routing settings and the hooks through which test and benchmark
// binaries override them: src/ops/cuda/routing.h.

}  // namespace kvattn::ops::cuda_impl
