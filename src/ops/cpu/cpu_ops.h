// src/ops/cpu/cpu_ops.h — the optimised CPU implementations (internal).  Arguments have been
// validated by the entry points in src/ops/ops.cpp.
#pragma once

#include "kvattn/ops/merge_attn_states.h"
#include "kvattn/ops/paged_attention.h"
#include "kvattn/ops/reshape_and_cache.h"
#include "ops/common.h"

namespace kvattn::ops::cpu {

void reshape_and_cache_flash(const ReshapeAndCacheArgs& a, const detail::CacheWriteDims& d);
void paged_attention(const PagedAttentionArgs& a, const detail::AttnDims& d);
void merge_attn_states(const MergeAttnStatesArgs& a, const detail::MergeDims& d);
void mask_empty_context_lse(const Tensor& lse, const Tensor& qsl, const Tensor& csl);
void zero_kv_blocks(const Tensor& seg_addrs, const Tensor& seg_block_strides, const Tensor& seg_page_sizes,
                    const Tensor& block_ids);
void copy_page_indices(const Tensor& paged_kv_indices, const Tensor& block_table, const Tensor& paged_kv_indptr);
void mamba_align_block_table(const Tensor& out, const Tensor& block_table, const Tensor& seq_lens,
                             int64_t block_size);
void kvfp8_dequant(const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables, const Tensor& k_scale,
                   const Tensor& v_scale, const Tensor& out_k_cache, const Tensor& out_v_cache);

// ---- the attention kernel, compiled once per instruction set ----------------------------------
struct AttnWorkItem {
  int32_t req;      // request
  int32_t kv_head;       // first KV head (all its query heads are done together)
  int32_t num_kv_heads;  // KV heads [kv_head, kv_head + num_kv_heads)
  int64_t t0, t1;   // query rows [t0, t1) of the request
  // Split-KV (decode kernel only): keys [k0, k1) of the request; when part >= 0 the item
  // writes its unnormalised state (acc, m, l) to partial slot `part` instead of the output,
  // and merge items (attention_merge_*) combine slots [part, part + num_parts).
  int64_t k0 = 0, k1 = INT64_MAX;
  int32_t part = -1, num_parts = 0;
};

struct AttnKernelParams {
  const PagedAttentionArgs* args;
  const detail::AttnDims* dims;
  const detail::ResolvedBatch* batch;
  const char* q;  int64_t q_st[3];   DType q_dtype;   // element strides
  const char* k;  int64_t k_st[4];                    // element strides (p, s, h, d)
  const char* v;  int64_t v_st[4];   DType kv_dtype;
  char* o;        int64_t o_st[3];   DType o_dtype;
  char* lse;      int64_t lse_st[2]; bool lse_base2;
  const char* sinks; int64_t sinks_st;
  float scale;   // sm_scale * q_scale * k_scale
  float cap;     // logits soft cap, 0 = off
  float v_scale;
  bool complex_mask;  // PrefixLM ranges or XQA mask: check every key
  int64_t key_tile;   // keys per tile
  bool decode;        // attention_decode_ok: items of <= kDecodeMaxRows rows per KV head use the decode kernel
  float* parts;       // split-KV partial slots
  int64_t part_stride;  // floats per slot (>= attention_part_floats of every split item)
};

// The decode kernel (K/V read straight from the cache rows, no f32 tile copy) handles items
// with few query rows per KV head; the tiled kernel handles the rest.
constexpr int64_t kDecodeMaxRows = 16;  // query rows per KV head (tokens x GQA group)
// Whether the layout and options allow the decode kernel: contiguous head dims, D % 8 == 0,
// no PrefixLM / XQA mask.
bool attention_decode_ok(const AttnKernelParams& p);
// Floats of one split-KV partial slot: [num_kv_heads][rows][D] acc, then [..][rows] m and l.
inline int64_t attention_part_floats(int64_t num_kv_heads, int64_t rows, int64_t D) {
  return num_kv_heads * rows * (D + 2);
}

// Per-thread scratch of one work item (valid until the next call on the same thread).
struct AttnScratch {
  float *q, *acc, *kf, *vf, *s, *m, *l;  // [rows, D] x2, [TK, D] x2, [rows, TK], [rows] x2
  int64_t *lo, *hi;                      // [nt]
  detail::RowMask* masks;                // [nt]
};
AttnScratch attention_scratch(int64_t rows, int64_t nt, int64_t D, int64_t TK);

// Runs work items [begin, end).  The AVX2 variant exists on x86-64 builds.
void attention_items_generic(const AttnKernelParams& p, const AttnWorkItem* items, int64_t n);
void attention_items_avx2(const AttnKernelParams& p, const AttnWorkItem* items, int64_t n);
// Combines the split-KV partial slots of merge items and writes their outputs.
void attention_merge_generic(const AttnKernelParams& p, const AttnWorkItem* items, int64_t n);
void attention_merge_avx2(const AttnKernelParams& p, const AttnWorkItem* items, int64_t n);
void attention_items_avx512bf16(const AttnKernelParams& p, const AttnWorkItem* items, int64_t n);
void attention_merge_avx512bf16(const AttnKernelParams& p, const AttnWorkItem* items, int64_t n);
bool cpu_has_avx2_fma();
bool cpu_has_avx512bf16();
// Tests: run the baseline-ISA kernel even on an AVX2 machine (process-wide switch).
void set_force_generic_kernel(bool on);
// Tests: never choose the AVX512-BF16 build (use AVX2 where available; process-wide switch).
void set_disable_avx512_kernel(bool on);

// float values of every fp8 code
const float* fp8_e4m3_table();
const float* fp8_e5m2_table();

}  // namespace kvattn::ops::cpu
