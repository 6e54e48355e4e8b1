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

#include "kvattn/core/tensor.h"
#include "kvattn/ops/paged_attention.h"

namespace kvattn::ops {

// The pages (PagedKVCache) hold each request's own pages, shared prefix removed, in either page
// form; the options (AttentionOptions) apply to both levels, `causal` to the per-request level
// only (the shared prefix precedes every row).  No sliding window and no sinks: cascade is never
// chosen with them (vLLM), and a sink would be counted twice by the merge (InvalidArgument).
struct CascadeAttentionArgs : PagedKVCache, AttentionOptions {
  Tensor query;                   // [num_tokens, num_qo_heads, head_dim] f32/f16/bf16
  Tensor qo_indptr;               // [batch + 1] int32/int64
  Tensor shared_kv_page_indices;  // [num_shared_pages] int32/int64: the common prefix, full
                                  //   pages (prefix length = num_shared_pages * page_size)
  Tensor out;                     // [num_tokens, num_qo_heads, head_dim] f32/f16/bf16
};
void cascade_attention(const CascadeAttentionArgs& args);

// The pages (PagedKVCache) hold the cached context only; the options (AttentionOptions) apply to
// both passes, `causal` to the new tokens' pass (the context precedes them), k_scale / v_scale to
// the context pass only (the new tokens are not quantised).  No sinks (InvalidArgument: the merge
// would count them twice).
struct DcpPrefillArgs : PagedKVCache, AttentionOptions {
  Tensor query;      // [num_tokens, num_qo_heads, head_dim] f32/f16/bf16
  Tensor qo_indptr;  // [batch + 1] int32/int64 (also the new tokens' kv indptr)
  Tensor key;        // [num_tokens, num_kv_heads, head_dim] new tokens, same dtype as query
  Tensor value;      // [num_tokens, num_kv_heads, head_dim]
  Tensor out;        // [num_tokens, num_qo_heads, head_dim]
};
void dcp_prefill_attention(const DcpPrefillArgs& args);

}  // namespace kvattn::ops
