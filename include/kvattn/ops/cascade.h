// kvattn/ops/cascade.h — attention built from paged_attention + merge_attn_states.
//
// Two compositions used by vLLM's FlashInfer backend, device-neutral (they allocate their
// temporaries on the query's device and call the entry points, so they run wherever those do):
//   * cascade_attention: FlashInfer MultiLevelCascadeAttentionWrapper(2): a shared-prefix pass
//     (every query row, non-causal, over the common pages), a per-request suffix pass (causal,
//     over each request's remaining pages), then a merge by LSE.
//   * dcp_prefill_attention: the single-rank shape of BatchDCPPrefillWrapper: a context pass
//     (non-causal, over the paged cache holding the context only), a causal pass over the new
//     tokens' K/V (ragged, not yet read back from the cache), then a merge.  The cross-rank
//     combine of DCP is attention/'s job.
#pragma once

#include <optional>

#include "kvattn/core/tensor.h"

namespace kvattn::ops {

struct CascadeAttentionArgs {
  Tensor query;    // [num_tokens, num_qo_heads, head_dim] f32/f16/bf16
  Tensor k_cache;  // [num_pages, page_size, num_kv_heads, head_dim] strided view
  Tensor v_cache;  // same as k_cache
  Tensor qo_indptr;               // [batch + 1] int32/int64
  Tensor shared_kv_page_indices;  // [num_shared_pages] int32/int64: the common prefix, full
                                  //   pages (prefix length = num_shared_pages * page_size)
  Tensor paged_kv_indptr;         // [batch + 1] per-request suffix pages (shared ones removed)
  Tensor paged_kv_indices;        // [nnz] int32/int64
  Tensor paged_kv_last_page_len;  // [batch] int32/int64
  Tensor out;                     // [num_tokens, num_qo_heads, head_dim] f32/f16/bf16
  double logits_soft_cap = 0.0;
  std::optional<double> sm_scale;
  double q_scale = 1.0, k_scale = 1.0, v_scale = 1.0;
  // No sliding window and no sinks: cascade is never chosen with them (vLLM), and a sink
  // would be counted twice by the merge.
};
void cascade_attention(const CascadeAttentionArgs& args);

struct DcpPrefillArgs {
  Tensor query;    // [num_tokens, num_qo_heads, head_dim] f32/f16/bf16
  Tensor k_cache;  // [num_pages, page_size, num_kv_heads, head_dim]: the context
  Tensor v_cache;
  Tensor qo_indptr;               // [batch + 1] int32/int64 (also the new tokens' kv indptr)
  Tensor paged_kv_indptr;         // [batch + 1] context pages per request
  Tensor paged_kv_indices;        // [nnz]
  Tensor paged_kv_last_page_len;  // [batch]
  Tensor key;    // [num_tokens, num_kv_heads, head_dim] new tokens, same dtype as query
  Tensor value;  // [num_tokens, num_kv_heads, head_dim]
  Tensor out;    // [num_tokens, num_qo_heads, head_dim]
  int64_t window_left = -1;
  double logits_soft_cap = 0.0;
  std::optional<double> sm_scale;
  double k_scale = 1.0, v_scale = 1.0;  // the cache's scales (context pass only)
};
void dcp_prefill_attention(const DcpPrefillArgs& args);

}  // namespace kvattn::ops
