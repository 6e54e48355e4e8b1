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

// Routing of paged_attention between the prefill kernel (prefill_kernel.cu) and attn_kernel,
// for tests and benchmarks: 0 automatic (default, or KVATTN_PREFILL=off|force), 1 off,
// 2 force (every call the prefill kernel supports); see kernels.h PrefillMode.
// prefill_kernel_launches() counts calls routed to the prefill kernel (0 without CUDA).
void set_prefill_kernel_mode(int mode);
int prefill_kernel_mode() noexcept;
// The prefill kernel's V6 K/V loader (on by default where rows are aligned; kernels.h set_prefill_v6).
void set_prefill_kernel_v6(bool on);
bool prefill_kernel_v6() noexcept;
int64_t prefill_kernel_launches() noexcept;
// The prefill kernel's Hopper form (hopper_prefill.cu: TMA + wgmma, sm_90a): 0 automatic (default,
// or KVATTN_PREFILL_HOPPER=off|force; not selected by default yet), 1 off, 2 force (every call it
// covers on an sm_90 device).
// last_prefill_kernel_path() says which kernel served the last prefill-routed call (1 wgmma, 0
// mma.sync; -1 none yet or no CUDA) and last_prefill_kernel_reason() why (a static string).
void set_prefill_hopper_mode(int mode);
int prefill_hopper_mode() noexcept;
int64_t prefill_hopper_launches() noexcept;
int last_prefill_kernel_path() noexcept;
const char* last_prefill_kernel_reason() noexcept;
// Routing of decode calls to attn_kernel's small-call path (one launch: per-CTA plan,
// attention, merge by the last piece; see kernels.h SmallDecodeMode): 0 automatic (default, or
// KVATTN_SMALL_DECODE=off|force), 1 off, 2 force.  small_decode_launches() counts its launches.
void set_small_decode_mode(int mode);
int small_decode_mode() noexcept;
int64_t small_decode_launches() noexcept;
// Routing of decode calls to the whole-page decode path (page_decode.cu; PagedAttentionArgs::
// max_query_len x group <= 16 and the cases page_decode.h lists): 0 automatic (default, or
// KVATTN_PAGE_DECODE=off|force; the small-call path keeps the calls it takes), 1 off, 2 force.
// page_decode_launches() counts its launches (0 without CUDA).
void set_page_decode_mode(int mode);
int page_decode_mode() noexcept;
int64_t page_decode_launches() noexcept;
// Which kernel runs the small-call path (kernels.h SmallKernel): 0 automatic (default, or
// KVATTN_SMALL_KERNEL=v8|cluster) = the cluster kernel of small_decode.cu for the calls it covers,
// 1 = attn_kernel<..., SMALL> (v8) always.  small_cluster_launches() counts the cluster kernel's
// launches; set_small_cluster_max caps its pieces per unit (1..16, KVATTN_SMALL_CLUSTER_MAX).
void set_small_decode_kernel(int kernel);
int64_t small_cluster_launches() noexcept;
void set_small_cluster_max(int pieces);
int small_cluster_max() noexcept;
// The cluster kernel's page-id window (small_decode.h; default on, KVATTN_SMALL_PAGE_WINDOW=0 off).
void set_small_page_window(bool on);
bool small_page_window() noexcept;
// Its warps per CTA (small_decode.h): 0 automatic (8 where they fit), 4 always (KVATTN_SMALL_WARPS=4).
void set_small_warps(int warps);
int small_warps() noexcept;
int64_t small_cluster_launches_8warps() noexcept;  // of small_cluster_launches()
// Automatic routing of calls only the 8-warp cluster kernel covers well (small_decode.h; default
// on, KVATTN_SMALL_ROUTE8=0 off).
void set_small_route8(bool on);
// Knobs of attn_kernel's v6 decode path (plan kernel, persistent grid, merge; kernels.h
// set_decode_options): option bits (1 = whole-wave split rule for uniform lengths, default;
// KVATTN_DECODE_SPLIT_RULE=waves|v6) and a forced split count per request
// (KVATTN_DECODE_SPLITS, 0 = the plan's rule).  No-ops without CUDA.
void set_decode_options(int opts);
int decode_options() noexcept;
// bit 4 = fp8 fast variant of the decode config (default on; KVATTN_FP8_FAST=0 off); its launches:
int64_t fp8_fast_launches() noexcept;
int64_t rem_split_plans() noexcept;  // decode plans with a non-dividing chunk (kernels.h)
// bit 16 = stream-K decode schedule for every call (default off; KVATTN_DECODE_STREAMK=1), bit 32 =
// stream-K for fp8 caches with a (request, KV head) pair per CTA (default on); its calls:
int64_t streamk_launches() noexcept;
void set_decode_splits(int n);
// forced chunk (tiles) of the remainder rule, 0 = the plan kernel's model (kernels.h set_decode_chunk)
void set_decode_chunk(int tiles);
// the vectorised KV write's kernel (kernels.h set_cache_write_variant: 1 default, 0 previous)
void set_cache_write_variant(int v);
int cache_write_variant() noexcept;

}  // namespace kvattn::ops::cuda_impl
