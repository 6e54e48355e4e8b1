// src/ops/cuda/paged_attention.cu — paged attention (decode, multi-token decode, prefill) on
// tensor cores (mma.sync m16n8k16, f32 accumulation), one source for sm_80 and sm_90a.
//
// Work decomposition (all on the device, so the launch is CUDA-graph safe and needs no host
// copy of the lengths):
//   1. plan kernel (one CTA): per request q_len, kv_len, row tiles; picks the KV chunk size
//      from the total work and the number of resident CTAs; writes a work-item list
//      (request, row tile, split) and, when a request is split, a token -> request map.
//   2. attention kernel (persistent grid): work unit = (item, kv head).  A CTA processes the
//      rows {(token, head-in-group)} of one KV head (GQA packing: row = token * group + h), so
//      every KV byte is read once for all query heads of its group.  K/V tiles are streamed
//      with 16-byte cp.async into a swizzled multi-stage shared-memory ring, page ids of the
//      next tile are prefetched into registers one tile ahead.  fp8 pages are streamed as fp8
//      bytes and widened to f16 in registers (e4m3: a bit shift, the 2^-8 folded into the
//      scales; e5m2: the byte is the high half of an f16).
//        decode config  (16 rows / CTA, 4 warps split each 64-key tile, combined at the end)
//        prefill config (64 rows / CTA, 4 warps x 16 rows, each warp sees the whole tile)
//   3. merge kernel (only when some request was split): combines the partial (O, LSE) of
//      the splits, adds the sink term, writes out and LSE.
// Decode option bit 16 (KVATTN_DECODE_STREAMK=1) replaces 1-2 for the decode config by a
// stream-K schedule (plan_streamk_kernel, attn_kernel<..., SK>, merge_streamk_kernel).
// The device code is in attention_plan.cuh (1), attention_kernel.cuh (2, with the fp8
// conversions of fp8.cuh) and attention_merge.cuh (3); this file holds the host side: workspace
// layout, the launchers of each form and the plan shape.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/routing.h"
#include "ops/cuda/small_decode.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ops/cuda/attention_merge.cuh"

namespace kvattn::ops::cuda_impl::k {
namespace {

// ---------------------------------------------------------------------------------------------
// Host side.
// Two regions: the plan (offsets from the plan base; written by the plan kernels, kept across
// calls when the caller reuses a plan) and the scratch (offsets from the scratch base: split
// partials, rewritten by every call).
struct WsLayout {
  int64_t req, page_base, items, num_items, chunk, counter, tok_splits;  // plan region
  int64_t sk_hdr, sk_units, sk_cta, sk_map;  // stream-K decode tables (decode config, not the small path)
  int64_t plan_total;
  int64_t part_o, part_lse;  // scratch region
  int64_t scratch_total;
};
WsLayout ws_layout(const AttnParams& p, const AttnPlanShape& s) {
  auto al = [](int64_t x) { return (x + 255) / 256 * 256; };
  WsLayout w{};
  int64_t off = 0;
  w.req = off; off += al(int64_t(p.batch) * sizeof(ReqInfo) + 16);
  w.page_base = off; off += al(int64_t(p.batch) * 8 + 16);
  w.items = off; off += al(s.max_items * int64_t(sizeof(Item)) + 16);
  w.num_items = off; off += 256;
  w.chunk = off; off += 256;
  w.counter = off; off += 256;
  w.tok_splits = off; off += al(p.num_tokens * 4 + 16);
  // stream-K tables, reserved for every decode-config call of the general path so the setting can change between
  // plan and launch (a few bytes per unit / token)
  const bool sk = s.config == 0 && !s.small && s.max_splits > 1;
  const int64_t units = sk ? s.max_items / s.max_splits * p.hkv : 0;
  w.sk_hdr = off; off += sk ? 256 : 0;
  w.sk_units = off; off += sk ? al(units * int64_t(sizeof(SkUnit)) + 16) : 0;
  w.sk_cta = off; off += sk ? al(int64_t(s.grid) * 4 + 16) : 0;
  w.sk_map = off; off += sk ? al(p.num_tokens * p.hq * 4 + 16) : 0;
  w.plan_total = off;
  off = 0;
  w.part_o = off;
  off += s.max_splits > 1 ? al(int64_t(s.max_splits) * p.num_tokens * p.hq * p.head_dim * 4) : 0;
  w.part_lse = off;
  off += s.max_splits > 1 ? al(int64_t(s.max_splits) * p.num_tokens * p.hq * 4) : 0;
  w.scratch_total = off;
  return w;
}

// Plan::opts of a call: KernelRouting::decode_options (routing.h), its forced splits and chunk
// (measurement settings, 0 = the plan kernel's rule).
int decode_opts_now() { return kernel_routing().decode_options & kDecodeOptsMask; }

// Stream-K decode (kOptStreamK): plan_streamk_kernel, attn_kernel<..., SK>, merge_streamk_kernel.
template <typename KV, int D>
int run_streamk(const AttnParams& p, const AttnPlanShape& s, Plan plan, float lf, float of) {
  const WsLayout w = ws_layout(p, s);
  char* const base = reinterpret_cast<char*>(plan.req) - w.req;  // the workspace
  SkTables skt;
  skt.units = reinterpret_cast<SkUnit*>(base + w.sk_units);
  skt.cta = reinterpret_cast<int32_t*>(base + w.sk_cta);
  skt.map = reinterpret_cast<int32_t*>(base + w.sk_map);
  plan.small_ctr = reinterpret_cast<int32_t*>(base + w.sk_hdr);  // sk_hdr(plan)
  plan.tok_splits = skt.map;  // the merge reads pieces per (token, qo head)
  using C = Cfg<KV, D, 1, 4>;
  auto kern = attn_kernel<KV, D, 1, 4, false, true>;
  if (int e = opt_in_dynamic_smem<attn_kernel<KV, D, 1, 4, false, true>>(C::kSmem)) return e;
  plan.opts = decode_opts_now();
  plan.tl = nullptr;
  plan.tl_cap = 0;
  cudaError_t e = cudaSuccess;
  if (!s.reuse_plan) {  // a kept plan (PagedAttentionPlan) holds the tables already
    plan_streamk_kernel<C::kRows, C::kTile><<<1, kPlanThreads>>>(p, plan, skt, s.max_splits,
                                                                s.max_items / s.max_splits, s.grid);
    e = cudaGetLastError();
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  kern<<<s.grid, C::kThreads, C::kSmem>>>(p, plan, lf, of);
  e = cudaGetLastError();
  if (e != cudaSuccess) return static_cast<int>(e);
  const int64_t rows = p.num_tokens * p.hq;
  const int threads = 256;
  const int64_t blocks = (rows * 32 + threads - 1) / threads;
  if (blocks > 0) merge_streamk_kernel<<<static_cast<unsigned>(blocks), threads>>>(p, plan, of);
  e = cudaGetLastError();
  if (e == cudaSuccess) {
    note_launch(KernelLaunch::decode);
    note_launch(KernelLaunch::streamk);
  }
  return static_cast<int>(e);
}
// Stream-K runs for the decode config of the general path with room for >= 4 partial slots per row
// (the plan bounds pieces per unit by max_splits - 1) when the bit is set, or when the call has at
// least one (request, KV head) pair per CTA and either its cache is fp8 (kOptStreamKFp8) or its
// caller said the KV lengths are mixed (kOptStreamKMixed).
bool streamk_on(const AttnParams& p, const AttnPlanShape& s, bool fp8) {
  if (s.config != 0 || s.small || s.max_splits < 4) return false;
  const int opts = decode_opts_now();
  if ((opts & kOptStreamK) != 0) return true;
  const bool by_dtype = fp8 && (opts & kOptStreamKFp8) != 0;
  const bool by_lengths = s.mixed_kv_lens && (opts & kOptStreamKMixed) != 0;
  return (by_dtype || by_lengths) && int64_t(p.batch) * p.hkv >= s.grid;
}

template <typename KV, int D, int WM, int WN>
int run_kernel(const AttnParams& p, const AttnPlanShape& s, Plan plan, float lf, float of) {
  using C = Cfg<KV, D, WM, WN>;
  auto kern = attn_kernel<KV, D, WM, WN>;
  if (int e = opt_in_dynamic_smem<attn_kernel<KV, D, WM, WN>>(C::kSmem)) return e;
  plan.opts = decode_opts_now();
  plan.tl = nullptr;
  plan.tl_cap = 0;
  const KernelRouting& r = kernel_routing();
  cudaError_t e = cudaSuccess;
  if (!s.reuse_plan) {  // a kept plan (PagedAttentionPlan) holds the tables already
    plan_kernel<C::kRows, C::kTile><<<1, kPlanThreads>>>(p, plan, s.max_splits, s.max_items, s.target_ctas,
                                                        s.max_splits > 1, r.decode_splits, r.decode_chunk);
    e = cudaGetLastError();
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  kern<<<s.grid, C::kThreads, C::kSmem>>>(p, plan, lf, of);
  e = cudaGetLastError();
  if (e != cudaSuccess) return static_cast<int>(e);
  if (s.max_splits > 1) {
    const int64_t rows = p.num_tokens * p.hq;
    const int threads = 256;
    const int64_t blocks = (rows * 32 + threads - 1) / threads;
    if (blocks > 0) merge_splits_kernel<<<static_cast<unsigned>(blocks), threads>>>(p, plan, of);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) note_launch(KernelLaunch::decode);
  return static_cast<int>(e);
}

// Unit counters of the small-call path, per device: zeroed once when (re)allocated; every
// launch leaves them at 0.  Like the workspace, the first call of a shape must come before
// CUDA-graph capture (allocation and memset are not capturable).
int32_t* small_counters(int dev, int64_t n, int* err) {
  static std::mutex mu;
  static int32_t* ptr[64] = {};
  static int64_t cap[64] = {};
  std::lock_guard<std::mutex> lock(mu);
  const int d = dev & 63;
  if (cap[d] < n) {
    if (ptr[d] != nullptr) cudaFree(ptr[d]);  // synchronises: earlier launches are done with it
    ptr[d] = nullptr;
    cap[d] = 0;
    const int64_t want = std::max<int64_t>(n, 4096);
    void* q = nullptr;
    cudaError_t e = cudaMalloc(&q, static_cast<size_t>(want) * sizeof(int32_t));
    if (e == cudaSuccess) e = cudaMemset(q, 0, static_cast<size_t>(want) * sizeof(int32_t));
    if (e != cudaSuccess) {
      if (q != nullptr) cudaFree(q);
      *err = static_cast<int>(e);
      return nullptr;
    }
    ptr[d] = static_cast<int32_t*>(q);
    cap[d] = want;
  }
  return ptr[d];
}

template <typename KV, int D, int WM, int WN>
int run_small(const AttnParams& p, const AttnPlanShape& s, Plan plan, float lf, float of) {
  if (s.cluster > 0) {  // the cluster kernel (small_decode.cu) covers this call
    const int e = launch_cluster_decode(p, s.cluster);
    if (e == 0) note_launch(KernelLaunch::small_decode);
    return e;
  }
  using C = Cfg<KV, D, WM, WN>;
  auto kern = attn_kernel<KV, D, WM, WN, true>;
  if (int e = opt_in_dynamic_smem<attn_kernel<KV, D, WM, WN, true>>(C::kSmem)) return e;
  int dev = 0;
  cudaGetDevice(&dev);
  int err = 0;
  plan.small_ctr = small_counters(dev, s.small_units, &err);
  if (plan.small_ctr == nullptr) return err;
  plan.small_units = s.small_units;
  plan.small_smax = s.max_splits;
  plan.small_min_tiles = std::max(1, kernel_routing().small_min_tiles);
  kern<<<s.grid, C::kThreads, C::kSmem>>>(p, plan, lf, of);
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) note_launch(KernelLaunch::small_decode);
  return static_cast<int>(e);
}

template <typename KV, int D, int WM, int WN, bool SMALL = false>
int occupancy() {
  using C = Cfg<KV, D, WM, WN>;
  static int cache[64] = {};  // per device
  int dev = 0;
  cudaGetDevice(&dev);
  int& cached = cache[dev & 63];
  if (cached > 0) return cached;
  auto kern = attn_kernel<KV, D, WM, WN, SMALL>;
  cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, C::kThreads, C::kSmem) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  cached = n > 0 ? n : 1;
  return cached;
}

template <typename KV, int D>
int dispatch_cfg(const AttnParams& p, const AttnPlanShape* s, Plan* plan, bool query_occ, int* occ) {
  const float lf = KVTraits<KV>::kE4m3 ? 256.f : 1.f;
  if (s != nullptr && s->config == 0 && s->small) {
    if (query_occ) { *occ = occupancy<KV, D, 1, 4, true>(); return 0; }
    return run_small<KV, D, 1, 4>(p, *s, *plan, lf, lf);
  }
  if (s == nullptr || s->config == 0) {
    if (query_occ) { *occ = occupancy<KV, D, 1, 4>(); return 0; }
    if constexpr (KVTraits<KV>::kFp8 && D <= 128) {
      // fp8 fast variant (kOptFp8Fast): sm_90+, and only where it keeps the default's CTAs per SM
      // (the grid was sized by the default's occupancy)
      using KF = typename FastOf<KV>::type;
      if ((decode_opts_now() & kOptFp8Fast) != 0 && device_cc_major() >= 9 &&
          occupancy<KF, D, 1, 4>() >= occupancy<KV, D, 1, 4>())
      {
        const int e = streamk_on(p, *s, true) ? run_streamk<KF, D>(p, *s, *plan, lf, lf)
                                              : run_kernel<KF, D, 1, 4>(p, *s, *plan, lf, lf);
        if (e == 0) note_launch(KernelLaunch::fp8_fast);
        return e;
      }
    }
    if (streamk_on(p, *s, KVTraits<KV>::kFp8)) return run_streamk<KV, D>(p, *s, *plan, lf, lf);
    return run_kernel<KV, D, 1, 4>(p, *s, *plan, lf, lf);
  }
  if (query_occ) { *occ = occupancy<KV, D, 4, 1>(); return 0; }
  return run_kernel<KV, D, 4, 1>(p, *s, *plan, lf, lf);
}

template <typename KV>
int dispatch_d(const AttnParams& p, const AttnPlanShape* s, Plan* plan, bool query_occ, int* occ) {
  switch (p.head_dim) {
    case 64: return dispatch_cfg<KV, 64>(p, s, plan, query_occ, occ);
    case 128: return dispatch_cfg<KV, 128>(p, s, plan, query_occ, occ);
    case 256: return dispatch_cfg<KV, 256>(p, s, plan, query_occ, occ);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

int dispatch(const AttnParams& p, const AttnPlanShape* s, Plan* plan, bool query_occ, int* occ) {
  switch (p.kv_t) {
    case Elt::bf16: return dispatch_d<KVbf16>(p, s, plan, query_occ, occ);
    case Elt::f16: return dispatch_d<KVf16>(p, s, plan, query_occ, occ);
    case Elt::e4m3: return dispatch_d<KVe4m3>(p, s, plan, query_occ, occ);
    case Elt::e5m2: return dispatch_d<KVe5m2>(p, s, plan, query_occ, occ);
    default: break;
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace

int plan_paged_attention(const AttnParams& p, int num_sms, AttnPlanShape* s, const char** why) {
  *why = nullptr;
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) {
    *why = "the CUDA paged_attention kernels exist for head_dim 64, 128 and 256";
    return 0;
  }
  if (p.kv_t == Elt::f32) {
    *why = "the CUDA paged_attention kernels read f16/bf16/fp8 caches, not float32";
    return 0;
  }
  if (p.kv_t == Elt::bf16 && p.q_t == Elt::f16) {
    *why = "a float16 query with a bfloat16 cache is not supported on CUDA (cast the query)";
    return 0;
  }
  // decode config when the average request has few query rows per KV head
  const int64_t rows_avg = p.batch > 0 ? (p.num_tokens * p.group + p.batch - 1) / p.batch : 0;
  s->config = rows_avg <= 16 ? 0 : 1;
  s->small = 0;
  s->cluster = 0;
  int occ = 1;
  int e = dispatch(p, s, nullptr, true, &occ);
  if (e != 0) return e;
  s->grid = std::max(1, num_sms * occ);
  s->target_ctas = s->grid;
  // split bound: keep the partial-state workspace under ~256 MB
  const int64_t per_split = std::max<int64_t>(1, p.num_tokens * p.hq * (p.head_dim + 1) * 4);
  int64_t smax = (int64_t(256) << 20) / per_split;
  smax = std::min<int64_t>(std::max<int64_t>(smax, 1), 128);
  s->max_splits = static_cast<int>(smax);
  const int rows = s->config == 0 ? 16 : 64;
  const int64_t rtiles = (p.num_tokens * p.group + rows - 1) / rows + p.batch;
  s->max_items = rtiles * s->max_splits;
  // Small calls: one launch (per-CTA plan, attention, merge by the last piece of each unit)
  // when every (request, row tile, KV head) unit can have a CTA of its own.
  s->small = 0;
  const Route mode = kernel_routing().small_decode;
  if (s->config == 0 && mode != Route::off && p.batch <= kSmallMaxBatch) {
    const int64_t units = rtiles * p.hkv;
    AttnPlanShape t = *s;
    t.small = 1;
    int occ_s = 1;
    e = dispatch(p, &t, nullptr, true, &occ_s);
    if (e != 0) return e;
    const int64_t grid_s = std::max(1, num_sms * occ_s);
    // one piece per CTA: the per-CTA plan needs units < grid (force) and is given room for
    // >= 2 pieces per unit on average (automatic)
    if (units < grid_s && (mode == Route::force || 2 * units <= grid_s)) {
      s->small = 1;
      s->grid = static_cast<int>(grid_s);
      s->target_ctas = s->grid;
      s->max_splits = static_cast<int>(std::min<int64_t>(smax, kSmallMaxSplits));
      s->small_units = static_cast<int>(units);
      s->max_items = rtiles;
      s->cluster = cluster_decode_pieces(p, num_sms, mode == Route::force);  // 0: attn_kernel<..., SMALL> runs it
    }
  }
  const WsLayout w = ws_layout(p, *s);
  s->plan_bytes = w.plan_total;
  s->scratch_bytes = w.scratch_total;
  s->workspace_bytes = w.plan_total + w.scratch_total;
  return 0;
}

int64_t rem_split_plans() {
  unsigned long long n = 0;
  if (cudaMemcpyFromSymbol(&n, g_rem_split_plans, sizeof(n)) != cudaSuccess) return -1;
  return static_cast<int64_t>(n);
}

int launch_paged_attention(const AttnParams& p, const AttnPlanShape& s, void* plan_ws, void* scratch_ws,
                           bool run_plan) {
  if (p.batch == 0 || p.num_tokens == 0) return 0;
  const WsLayout w = ws_layout(p, s);
  char* base = static_cast<char*>(plan_ws);
  char* scratch = static_cast<char*>(scratch_ws);
  Plan plan;
  plan.req = reinterpret_cast<ReqInfo*>(base + w.req);
  plan.page_base = reinterpret_cast<int64_t*>(base + w.page_base);
  plan.items = reinterpret_cast<Item*>(base + w.items);
  plan.num_items = reinterpret_cast<int32_t*>(base + w.num_items);
  plan.chunk = reinterpret_cast<int32_t*>(base + w.chunk);
  plan.counter = reinterpret_cast<int32_t*>(base + w.counter);
  plan.tok_splits = reinterpret_cast<int32_t*>(base + w.tok_splits);
  plan.part_o = reinterpret_cast<float*>(scratch + w.part_o);
  plan.part_lse = reinterpret_cast<float*>(scratch + w.part_lse);
  plan.small_ctr = nullptr;
  plan.small_units = 0;
  plan.small_smax = 1;
  plan.small_min_tiles = 1;
  plan.opts = 0;
  plan.tl = nullptr;
  plan.tl_cap = 0;
  AttnPlanShape shape = s;
  shape.reuse_plan = !run_plan;
  int dummy = 0;
  return dispatch(p, &shape, &plan, false, &dummy);
}

}  // namespace kvattn::ops::cuda_impl::k
