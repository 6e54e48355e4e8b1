// src/ops/cuda/attention_path.cpp — select_attention_path (attention_path.h).
#include "ops/cuda/attention_path.h"

#include "ops/cuda/hopper_prefill.h"
#include "ops/cuda/page_decode.h"
#include "ops/cuda/routing.h"

namespace kvattn::ops::cuda_impl {

const char* attention_path_name(AttentionPath path) {
  switch (path) {
    case AttentionPath::unsupported: return "unsupported";
    case AttentionPath::f32: return "f32";
    case AttentionPath::prefill_wgmma: return "prefill_wgmma";
    case AttentionPath::prefill_mma: return "prefill_mma";
    case AttentionPath::page_decode: return "page_decode";
    case AttentionPath::small_cluster: return "small_cluster";
    case AttentionPath::small_decode: return "small_decode";
    case AttentionPath::attn_kernel: return "attn_kernel";
  }
  return "unknown";
}

AttentionPathChoice select_attention_path(const k::AttnParams& p, const AttentionPathQuery& q) {
  AttentionPathChoice c;
  // 1. float32 caches: only the SIMT kernel reads them
  if (p.kv_t == k::Elt::f32) {
    c.path = AttentionPath::f32;
    c.reason = "float32 K/V cache: the SIMT float32 kernel (one launch, no plan)";
    return c;
  }
  // 2. many query rows per request (or KVATTN_PREFILL=force): the prefill kernels; the wgmma
  //    form where it covers the call (its reason says why it does or does not)
  if (k::prefill_eligible(p, q.num_sms)) {
    const k::PrefillChoice h = p.head_dim == 128 ? k::hopper_prefill_choice(p)
                                                 : k::PrefillChoice{k::PrefillPath::mma_sync, "head_dim is not 128"};
    c.path = h.path == k::PrefillPath::wgmma ? AttentionPath::prefill_wgmma : AttentionPath::prefill_mma;
    c.reason = h.reason;
    return c;
  }
  // 3. attn_kernel's plan shape: which kernels exist for the call, and whether it is small
  const char* why = nullptr;
  c.error = k::plan_paged_attention(p, q.num_sms, &c.shape, &why);
  if (c.error != 0) {
    c.reason = "a device query failed while planning the call";
    return c;
  }
  if (why != nullptr) {
    c.reason = why;
    return c;
  }
  c.shape.mixed_kv_lens = q.mixed_kv_lens;
  // 4. the whole-page decode for the calls it covers, except those the small path takes and
  //    those with few requests per CTA (unless forced)
  const k::KernelRouting& r = k::kernel_routing();
  if (r.page_decode != k::Route::off &&
      (r.page_decode == k::Route::force || (!c.shape.small && k::page_decode_batch_ok(p, q.num_sms))) &&
      k::page_decode_unsupported(p, q.max_query_len) == nullptr) {
    c.path = AttentionPath::page_decode;
    c.reason = r.page_decode == k::Route::force
                   ? "whole-page decode forced (KVATTN_PAGE_DECODE=force) and the call is one it covers"
                   : "decode with more than one request per 4 CTAs that the whole-page decode covers";
    return c;
  }
  // 5. small calls: one launch
  if (c.shape.small) {
    c.path = c.shape.cluster > 0 ? AttentionPath::small_cluster : AttentionPath::small_decode;
    c.reason = c.shape.cluster > 0
                   ? "small decode call (every unit has a CTA of its own): one launch, clusters merge the pieces"
                   : "small decode call (every unit has a CTA of its own): one launch on attn_kernel's small form";
    return c;
  }
  c.path = AttentionPath::attn_kernel;
  c.reason = c.shape.config == 0 ? "decode rows (<= 16 per KV head on average): attn_kernel's decode configuration"
                                 : "query rows the prefill kernels do not take: attn_kernel's prefill configuration";
  return c;
}

}  // namespace kvattn::ops::cuda_impl
