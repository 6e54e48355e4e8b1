// src/ops/cuda/page_decode.h — the whole-page decode path (page_decode.cu), internal to
// src/ops/cuda/: dispatch.cpp asks whether it takes a call, sizes its workspace and launches it.
//
// The path reads every 16-slot chunk of a page once for all 8 KV heads (one 64 KB K+V copy per
// chunk into a 3-stage shared-memory ring) and gives each CTA of a resident grid (one per SM) an
// equal contiguous range of the call's chunks; warp w computes KV head w.  See DESIGN.md
// "Whole-page decode".
#pragma once

#include <cstdint>

#include "ops/cuda/kernels.h"

namespace kvattn::ops::cuda_impl::k {

// Routing (KernelRouting::page_decode, routing.h): automatic = decode calls it covers that the
// small-call path does not take, with more than one request per 4 CTAs; off: never; force: every
// call it covers (tests).

// Why the path cannot run the call (nullptr: it can).  max_q_len: the caller's bound on query
// rows per request (PagedAttentionArgs::max_query_len; -1 unknown).  It covers bf16 / f16
// caches with a query and output of the cache's type in 16-byte-aligned rows, head_dim 128,
// 8 KV heads, max_q_len x GQA group <= 16, page sizes that are multiples of 16, K and V views
// with the same slot and head strides, no soft cap / window / sinks / PrefixLM / XQA mask, on a
// device of sm_90 or later (two CTAs of 97 KB shared memory per SM).
const char* page_decode_unsupported(const AttnParams& p, int64_t max_q_len);

// Automatic routing's size rule: more than one request per 4 CTAs (batch x 4 > SMs).  With fewer,
// every request is cut into 4 or more pieces whose merge lands on the kernel's tail: measured on
// an H200, 32 x 4096 ran 0.8 % slower than attn_kernel's
// decode and 64 x 4096 1.8 % faster.
bool page_decode_batch_ok(const AttnParams& p, int num_sms);

struct PageDecodeShape {
  int grid = 0;      // chunk ranges (one per SM), each taken by two CTAs (one per half of the KV heads)
  int rows = 0;      // query rows per (request, KV head) the partial slots hold: max_q_len x group
  int64_t plan_bytes = 0, scratch_bytes = 0;
};
PageDecodeShape page_decode_shape(const AttnParams& p, int num_sms, int64_t max_q_len);
// run_plan false: plan_ws already holds this call's plan (same plan inputs; the caller's
// PagedAttentionPlan decides) and the plan kernel is skipped.  The split counters the plan
// kernel zeroes are put back to 0 by every launch, so a kept plan stays ready to run.
int launch_page_decode(const AttnParams& p, const PageDecodeShape& s, void* plan_ws, void* scratch_ws,
                       bool run_plan);

}  // namespace kvattn::ops::cuda_impl::k
