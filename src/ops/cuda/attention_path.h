// src/ops/cuda/attention_path.h — which CUDA kernel path serves a paged_attention call, and why.
//
// select_attention_path() is the planner's one routing decision: dispatch.cpp runs the path it
// returns, tests ask it for the path and its reason.  It reads the call's parameters, the
// device (multiprocessor count, compute capability, shared memory) and the routing settings
// (routing.h); it launches nothing and does not synchronise.  No CUDA header.
#pragma once

#include <cstdint>

#include "kvattn/ops/paged_attention.h"
#include "ops/cuda/kernels.h"

namespace kvattn::ops::cuda_impl {

enum class AttentionPath : int {
  unsupported = 0,  // no CUDA kernel implements the call (the reason says what to change)
  f32,              // float32 caches: the SIMT kernel (f32_attention.cu)
  prefill_wgmma,    // many query rows per request, sm_90a: TMA + wgmma (hopper_prefill.cu)
  prefill_mma,      // many query rows per request: mma.sync (prefill_kernel.cu)
  page_decode,      // decode reading whole pages, one CTA range per SM (page_decode.cu)
  small_cluster,    // small decode calls, one launch, thread-block clusters (small_decode.cu)
  small_decode,     // small decode calls, one launch, attn_kernel's small form (paged_attention.cu)
  attn_kernel,      // everything else: plan kernel, persistent attn_kernel grid, split merge
};
const char* attention_path_name(AttentionPath path);

// What the call promises beyond its parameters (PagedAttentionArgs::max_query_len, -1 unknown;
// KvLengthsHint::mixed) and the device's multiprocessor count.
struct AttentionPathQuery {
  int num_sms = 0;
  int64_t max_query_len = -1;
  bool mixed_kv_lens = false;
};

struct AttentionPathChoice {
  AttentionPath path = AttentionPath::unsupported;
  const char* reason = "";  // a static string: why this path (for unsupported: what to change)
  int error = 0;            // a CUDA error from the device queries (0: none; path is unsupported)
  k::AttnPlanShape shape;   // attn_kernel's plan shape (small_cluster, small_decode, attn_kernel)
};

AttentionPathChoice select_attention_path(const k::AttnParams& p, const AttentionPathQuery& q);

// The choice for a paged_attention call on CUDA tensors, as paged_attention makes it (the same
// validation and parameters; dispatch.cpp).  Throws what paged_attention throws for bad arguments.
AttentionPathChoice attention_path_for(const PagedAttentionArgs& args);

}  // namespace kvattn::ops::cuda_impl
