// src/ops/cuda/attention_plan.cuh — attn_kernel's plan: the per-request plan tables (Plan), the split rules' cost
// models, the plan kernel of the counter schedule and the stream-K plan kernel
// (paged_attention.cu's step 1; see its header).  Device code for paged_attention.cu, in its
// anonymous namespace.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <utility>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/ptx.cuh"
#include "ops/cuda/routing.h"
#include "ops/cuda/softmax.cuh"
#include "ops/cuda/streamk_schedule.h"

namespace kvattn::ops::cuda_impl::k {
namespace {

constexpr int kPlanThreads = 1024;

// ---------------------------------------------------------------------------------------------
// Per-request plan written by the plan kernel.
struct ReqInfo {
  int32_t q_start, q_len, kv_len, splits;
};
struct Item {
  int32_t req, rtile, split, pad;
};
struct Plan {
  ReqInfo* req;          // [batch]
  int64_t* page_base;    // [batch] offset of the request's first page id (form A)
  Item* items;           // [max_items]
  int32_t* num_items;    // [1]
  int32_t* chunk;        // [1] keys per split (multiple of the tile)
  int32_t* counter;      // [1] dynamic work counter (0 at every launch: the plan kernel sets it, the launch's last draw puts it back)
  int32_t* tok_splits;   // [num_tokens] splits of the token's request, 0 = no request (split runs only)
  float* part_o;         // [S_max, num_tokens, hq, D]
  float* part_lse;       // [S_max, num_tokens, hq] base 2
  // small-call path only (attn_kernel<..., SMALL = true>): arrivals per (request, row tile,
  // KV head) unit; all 0 between launches (the last arrival puts its counter back), in a
  // buffer of their own so no other path's use of the workspace can dirty them
  // stream-K decode (kOptStreamK, never the small path): the same pointer holds its header
  // [C, G, SkUnit* units, int32* unit of each CTA's first position] (int64 words, sk_hdr() below),
  // written by plan_streamk_kernel.  Plan keeps its 112 bytes and layout: a larger kernel
  // parameter (and a union here) changed the default kernels' code.
  int32_t* small_ctr;
  int32_t small_units;   // unit counters available
  int32_t small_smax;    // split bound (<= kSmallMaxSplits)
  int32_t small_min_tiles;
  // the general path (decode and prefill configs of attn_kernel, not the small path):
  int32_t opts;          // kOpt* bits (routing.h KernelRouting::decode_options)
  uint64_t* tl;          // timeline stamps (a debugging aid), nullptr = off (the library always passes nullptr)
  int32_t tl_cap;        // unit records available in tl
};
// One stream-K unit: its tiles sit at positions [start, start + len) of the flattened cost space
// (streamk_schedule.h); CTAs first_cta .. first_cta + pieces - 1 hold its pieces (slot = CTA -
// first_cta).
struct SkUnit {
  int64_t start;
  int32_t len, first_cta, pieces, pad;
};

__host__ __device__ __forceinline__ int64_t* sk_hdr(const Plan& plan) {
  return reinterpret_cast<int64_t*>(plan.small_ctr);
}

// Plan::opts: the kOpt* bits of routing.h.  Why the defaults are what they are (H200, one process):
// kOptFp8Fast (fp8 pages, D <= 128, sm_90+: the KV types KVe4m3f / KVe5m2f below) fp8 256 x 8192
// 1257 vs 1592 us; kOptRemSplits (plan_kernel, uniform lengths with kOptWaveSplits: also chunk
// sizes that do not divide the request, the short last units handed out after all the long ones,
// so they fill the last wave) 64 x 4096 -2.2 %, 128 x 4096 -2.3 %, 256 x 8192 -1.6 %, fp8
// 256 x 8192 -2.1 %; kOptStreamKFp8 (stream-K for fp8 caches with at least one (request, KV head)
// pair per CTA) fp8 256 x 8192 1164.5 vs 1215.7 us, while the bf16 shapes it lost on (128 x 4096
// -1.8 %, 256 x 8192 -1.4 %, 32 x 4096 -15 % where fewer pairs than CTAs leave CTAs idle) keep
// the counter path; kOptStreamKMixed (KvLengthsHint::mixed, same bound) bf16 128 x U[256, 8192]
// 532.2-533.2 vs 544.3-545.0 us with plans kept.  kOptStreamK (stream-K for every call) is off.
// Plans that chose a non-dividing chunk (items long units first), for tests: rem_split_plans().
__device__ unsigned long long g_rem_split_plans;
// Timeline buffer layout (uint64 words): header, then per CTA (entry, exit), then per unit
// (start, first tile ready, tile loop done, end, meta, ns thread 0 spent waiting for tiles).
constexpr int kTlHeader = 8;      // plan start, plan end, merge first start, merge last end, plan phase stamps (2)
constexpr int kTlUnitWords = 6;
__device__ __forceinline__ uint64_t gtimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Small-call path (one launch: plan per CTA, attention, merge by the last-arriving piece).
constexpr int kSmallMaxBatch = 32;   // one lane of warp 0 per request in the per-CTA plan
constexpr int kSmallMaxSplits = 32;  // pieces per unit (LSE slots per row in the merge)

// Split-rule costs of a uniform-length call (plan_kernel): mt tiles per row tile, P = (row tile,
// KV head) pairs, G CTAs, c0 = a unit's fixed cost in tile-times.  Integer type I: uint32_t when
// every intermediate fits (plan_kernel checks; 32-bit divisions are several times cheaper and
// the search runs on the plan kernel's critical path), else int64_t.
// Whole waves of equal units, the request cut into n chunks of ceil(mt / n) tiles.
template <typename I>
__device__ __forceinline__ I wave_split_cost(I mt, I P, I G, I c0, I n) {
  const I ct = (mt + n - 1) / n;
  const I units = P * ((mt + ct - 1) / ct);
  return ((units + G - 1) / G) * (ct + c0);
}
// Chunks of ct tiles that need not divide the request: per pair n - 1 long units of l = ct + c0
// and one short unit of s = rem + c0, the items written long units first, so the counter hands
// out every long unit, then the short ones into the gaps of the last waves.  Exact makespan of
// that greedy schedule: k whole waves of long units, then m CTAs busy with the left-over long
// units and f = G - m free.  The short units start at i * s on the free CTAs and at l + j * s on
// the busy ones; with l = a * s + b, period a + q holds the free CTAs' start at (a + q) s, then
// the busy CTAs' at (a + q) s + b, so the last short unit starts at the first of those times at
// which the started count reaches the short units.  A dividing ct is the whole-wave cost.
// (Checked against a list-schedule simulation.)
template <typename I>
__device__ __forceinline__ I rem_split_cost(I mt, I P, I G, I c0, I ct) {
  const I n = (mt + ct - 1) / ct;
  const I rem = mt - (n - 1) * ct;
  const I l = ct + c0, s = rem + c0;
  const I n_long = rem == ct ? P * n : P * (n - 1);
  const I n_short = rem == ct ? I(0) : P;
  const I k = n_long / G, m = n_long - k * G, f = G - m;
  if (n_short == 0) return k * l + (m > 0 ? l : I(0));
  I T;  // start of the last short unit after the k whole waves
  if (m == 0) {
    T = ((n_short + G - 1) / G - 1) * s;
  } else {
    const I a = l / s, b = l - a * s;
    if (n_short <= f * a) {
      T = ((n_short + f - 1) / f - 1) * s;
    } else {
      const I left = n_short - f * a;
      const I qa = left > f ? (left - f + G - 1) / G : I(0);
      const I qb = (left + G - 1) / G - 1;
      T = min((a + qa) * s, (a + qb) * s + b);
    }
  }
  return k * l + max(m > 0 ? l : I(0), T + s);
}

constexpr int kWaveCands = 128;  // split counts the whole-wave rule tries (1..128)
constexpr int kRemCands = 256;   // chunk sizes the remainder rule tries
static_assert(kWaveCands <= kPlanThreads && kRemCands <= kPlanThreads, "one candidate per plan thread");

// The plan kernels' warp reduction of two sums and a maximum: every lane ends with the warp's totals.
__device__ __forceinline__ void warp_sum2_max(int64_t& a, int64_t& b, int32_t& m) {
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
    m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  }
}

template <int ROWS, int TILE>
__global__ void __launch_bounds__(kPlanThreads) plan_kernel(AttnParams p, Plan plan, int max_splits,
                                                            int64_t max_items, int target_ctas,
                                                            bool write_map, int force_splits, int force_chunk) {
  __shared__ int64_t s_red[32];
  __shared__ int64_t s_red2[32];
  __shared__ int32_t s_max[32];
  __shared__ int64_t s_total;
  __shared__ int64_t s_lpt;  // row tiles of the call when items go long units first, else -1
  __shared__ int64_t s_wcost[kWaveCands];  // whole-wave rule: cost of n = i + 1 splits
  __shared__ int64_t s_rcost[kRemCands];   // remainder rule: cost of chunk 1 + i * step tiles
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  if (plan.tl != nullptr && tid == 0) plan.tl[0] = gtimer();
  // tokens of no request (padding rows) read 0 in the merge; the first barrier below orders
  // these stores before the per-request ones
  if (write_map)
    for (int64_t t = tid; t < p.num_tokens; t += blockDim.x) plan.tok_splits[t] = 0;
  int64_t work = 0, rt_sum = 0;
  int32_t kv_max = 0;
  ReqInfo ri_mine = {0, 0, 0, 1};  // request tid (the items loop's first round reads it from here)
  for (int r = tid; r < p.batch; r += blockDim.x) {
    const RequestBounds rb = load_request_bounds(p, r);  // one round trip for the index words
    const int64_t kv = rb.kv_len;
    ReqInfo ri;
    ri.q_start = static_cast<int32_t>(rb.q_begin);
    ri.q_len = static_cast<int32_t>(rb.q_end - rb.q_begin);
    ri.kv_len = static_cast<int32_t>(kv);
    ri.splits = 1;
    if (r == tid) ri_mine = ri;
    plan.req[r] = ri;
    plan.page_base[r] = rb.page_base;
    const int64_t rows = int64_t(ri.q_len) * p.group;
    const int64_t rt = (rows + ROWS - 1) / ROWS;
    rt_sum += rt;
    work += rt * ((kv + TILE - 1) / TILE);
    kv_max = max(kv_max, ri.kv_len);
  }
  // block reductions
  warp_sum2_max(work, rt_sum, kv_max);
  if (lane == 0) { s_red[warp] = work; s_red2[warp] = rt_sum; s_max[warp] = kv_max; }
  __syncthreads();
  if (plan.tl != nullptr && tid == 0) plan.tl[4] = gtimer();  // index words loaded, reduced
  // every warp reduces the per-warp partials itself (lane w reads warp w's): W, R, M everywhere
  const int nwarps = static_cast<int>(blockDim.x >> 5);
  int64_t W = lane < nwarps ? s_red[lane] : 0, R = lane < nwarps ? s_red2[lane] : 0;
  int32_t M = lane < nwarps ? s_max[lane] : 0;
  warp_sum2_max(W, R, M);
  const int64_t max_tiles = (M + TILE - 1) / TILE;
  // Uniform lengths (every row tile has max_tiles tiles) in the decode config: the whole-wave
  // rule and the remainder rule below choose by model costs, one candidate per thread, written
  // to s_wcost / s_rcost (the search ran on warp 0's lanes before).
  // (decode config only: in the prefill config causal masking makes units of equal tile
  // counts unequal in work, and the model was fitted on decode timelines)
  const bool uniform_rule = ROWS == 16 && force_splits <= 0 && max_splits > 1 && max_tiles > 1 &&
                            (plan.opts & kOptWaveSplits) && R > 0 && W == R * max_tiles;
  const bool rem_rule = uniform_rule && (plan.opts & kOptRemSplits);
  // c0 = a unit's fixed cost in tiles.  Measured (decode timeline, H200): ~8 us per unit (6 us
  // from the unit's start to its first tile, 1.5 us epilogue, 0.4 us between units) vs 2.7 us
  // per 64-key bf16 tile and 4.3 us per 128-key fp8 tile -> c0 = 3 / 2.
  constexpr int64_t c0 = TILE <= 64 ? 3 : 2;
  const int64_t G = max(target_ctas, 1);
  const int64_t per_split = R * p.hkv;
  // 32-bit costs when every intermediate fits (bounded by P (mt + c0) (c0 + 2) + G (mt + c0))
  const bool narrow = per_split * (max_tiles + c0) * (c0 + 2) + G * (max_tiles + c0) < (int64_t(1) << 31);
  auto cost = [&](int64_t n) -> int64_t {
    if (narrow) return wave_split_cost<uint32_t>(max_tiles, per_split, G, c0, n);
    return wave_split_cost<int64_t>(max_tiles, per_split, G, c0, n);
  };
  auto rem_cost = [&](int64_t ct) -> int64_t {
    if (narrow) return rem_split_cost<uint32_t>(max_tiles, per_split, G, c0, ct);
    return rem_split_cost<int64_t>(max_tiles, per_split, G, c0, ct);
  };
  // ceil(a / b) of the split rules, 32-bit when `narrow` (a 64-bit division is a subroutine of
  // tens of dependent instructions; with these and the parallel candidates the plan kernel went
  // 8.4 -> 7.2-7.4 us at 64 x 4096, by the decode timeline)
  auto cdiv = [&](int64_t a, int64_t b) -> int64_t {
    if (narrow) return int64_t((uint32_t(a) + uint32_t(b) - 1u) / uint32_t(b));
    return (a + b - 1) / b;
  };
  constexpr int64_t kNoCost = int64_t(0x7fffffffffffffff);
  const int64_t n_max = min(min(int64_t(max_splits), max_tiles), int64_t(kWaveCands));
  const int64_t step = (max_tiles + kRemCands - 1) / kRemCands;  // every ct up to 256 tiles, a stride above
  if (uniform_rule) {
    if (tid < kWaveCands) s_wcost[tid] = tid < n_max ? cost(tid + 1) : kNoCost;
    if (rem_rule && tid < kRemCands) {
      const int64_t ct = 1 + tid * step;
      // (more splits than partial-state slots: not a candidate)
      s_rcost[tid] = ct <= max_tiles && ct * max_splits >= max_tiles ? rem_cost(ct) : kNoCost;
    }
  }
  __syncthreads();  // candidate costs written; every warp has read s_red / s_red2 / s_max
  if (warp == 0) {
    bool lpt = false;
    int64_t chunk_tiles = max_tiles > 0 ? max_tiles : 1;  // default: no split
    if (force_splits > 0 && max_tiles > 1) {
      // measurement setting (KernelRouting::decode_splits): every request cut into this many chunks
      const int64_t nsplit = min(min(int64_t(force_splits), int64_t(max_splits)), max_tiles);
      chunk_tiles = (max_tiles + nsplit - 1) / nsplit;
    } else if (max_splits > 1 && max_tiles > 1) {
      // Units of about 1/8 of a CTA's fair share (at least 8 tiles) balance mixed lengths
      // under the dynamic scheduler; small batches split down to one tile per unit.
      // (v3 tried a waves x unit-length cost model: +2% at 64x4096, -7% on mixed lengths.)
      const int64_t per_cta = cdiv(W * p.hkv, target_ctas);
      int64_t want = per_cta <= 8 ? per_cta : max(int64_t(8), (per_cta + 7) / 8);
      want = max(want, cdiv(max_tiles, max_splits));
      want = max(want, int64_t(1));
      int64_t nsplit = cdiv(max_tiles, want);
      chunk_tiles = cdiv(max_tiles, nsplit);
      if (uniform_rule) {
        // All units equally long: the work counter hands them out in waves of G = target_ctas,
        // so the call takes about ceil(units / G) x (tiles per unit + c0) (wave_split_cost).
        // 64 x 4096: 3 splits (3.9 waves of 22 tiles) instead of 6 (7.8 waves of 11) measured
        // 6 % faster.  Mixed lengths keep the rule above (units of different lengths fill the
        // tail; v4's wave model lost 7 % there).
        int64_t best = kNoCost, best_n = 1;
        for (int i = lane; i < kWaveCands; i += 32)
          if (s_wcost[i] < best) { best = s_wcost[i]; best_n = i + 1; }
        for (int o = 16; o > 0; o >>= 1) {
          const int64_t ob = __shfl_xor_sync(0xffffffffu, best, o);
          const int64_t on = __shfl_xor_sync(0xffffffffu, best_n, o);
          if (ob < best || (ob == best && on < best_n)) { best = ob; best_n = on; }
        }
        // keep the rule above unless whole waves are >= 2 % cheaper by the model
        const int64_t c_rule = nsplit <= n_max ? s_wcost[nsplit - 1] : cost(nsplit);
        if (best != kNoCost && best * 50 < c_rule * 49) {
          nsplit = best_n;
          chunk_tiles = cdiv(max_tiles, nsplit);
        }
        if (rem_rule) {
          // chunks that need not divide the request (rem_split_cost above), taken when >= 2 %
          // cheaper by that model than the chunk chosen so far; ties go to the longer chunk
          int64_t rbest = kNoCost, rbest_ct = chunk_tiles;
          for (int i = lane; i < kRemCands; i += 32)
            if (s_rcost[i] < rbest) { rbest = s_rcost[i]; rbest_ct = 1 + i * step; }
          for (int o = 16; o > 0; o >>= 1) {
            const int64_t ob = __shfl_xor_sync(0xffffffffu, rbest, o);
            const int64_t oc = __shfl_xor_sync(0xffffffffu, rbest_ct, o);
            if (ob < rbest || (ob == rbest && oc > rbest_ct)) { rbest = ob; rbest_ct = oc; }
          }
          const int64_t c_now = step == 1 ? s_rcost[chunk_tiles - 1] : rem_cost(chunk_tiles);
          if (rbest != kNoCost && (c_now == kNoCost || rbest * 50 < c_now * 49)) chunk_tiles = rbest_ct;
          // measurement setting (KernelRouting::decode_chunk): this chunk instead of the model's,
          // within the partial-state slots
          if (force_chunk > 0) chunk_tiles = max(min(int64_t(force_chunk), max_tiles), cdiv(max_tiles, max_splits));
          lpt = cdiv(max_tiles, chunk_tiles) * chunk_tiles != max_tiles;
        }
      }
    }
    // (every warp read s_red[] before the barrier above, so lane 0 may overwrite s_red[0])
    if (lane == 0) {
      plan.counter[0] = 0;
      s_lpt = lpt ? R : -1;
      if (lpt) atomicAdd(&g_rem_split_plans, 1ull);
      s_red[0] = chunk_tiles * TILE;
      plan.chunk[0] = static_cast<int32_t>(chunk_tiles * TILE);
    }
  }
  __syncthreads();
  const int64_t chunk = s_red[0];
  const int64_t lpt_rtiles = s_lpt;
  if (plan.tl != nullptr && tid == 0) plan.tl[5] = gtimer();  // chunk chosen
  __syncthreads();
  // items: exclusive scan over requests, in rounds of blockDim requests
  int64_t base = 0;
  for (int r0 = 0; r0 < p.batch; r0 += blockDim.x) {
    const int r = r0 + tid;
    int64_t n_items = 0, rt = 0, sp = 1;
    bool long_q = false;
    if (r < p.batch) {
      ReqInfo ri = r0 == 0 ? ri_mine : plan.req[r];
      // (32-bit division: kv_len < 2^31, chunk < 2^31)
      sp = ri.kv_len > 0 ? (uint32_t(ri.kv_len) + uint32_t(chunk) - 1u) / uint32_t(chunk) : 1;
      rt = (int64_t(ri.q_len) * p.group + ROWS - 1) / ROWS;
      n_items = rt * sp;
      ri.splits = static_cast<int32_t>(sp);
      plan.req[r] = ri;
      // token -> splits map: a request's own thread writes short query ranges (decode); long
      // ones are written by the whole block below (a serial loop over every request here cost
      // ~0.13 us per request: 21 us of plan kernel at batch 128)
      if (write_map) {
        long_q = ri.q_len > 64;
        if (!long_q)
          for (int t = 0; t < ri.q_len; ++t) plan.tok_splits[ri.q_start + t] = ri.splits;
      }
    }
    if (write_map && __syncthreads_or(long_q)) {
      for (int rr = r0; rr < min(p.batch, r0 + (int)blockDim.x); ++rr) {
        const ReqInfo ri = plan.req[rr];
        if (ri.q_len > 64)
          for (int t = tid; t < ri.q_len; t += blockDim.x) plan.tok_splits[ri.q_start + t] = ri.splits;
      }
    }
    // inclusive warp scan
    int64_t x = n_items;
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    if (lane == 31) s_red[warp] = x;
    __syncthreads();
    if (warp == 0) {  // exclusive scan of the warp totals, lane w for warp w
      const int64_t v = lane < nwarps ? s_red[lane] : 0;
      int64_t incl = v;
      for (int o = 1; o < 32; o <<= 1) {
        const int64_t y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      if (lane < nwarps) s_red2[lane] = incl - v;
      if (lane == 31) s_total = incl;
    }
    __syncthreads();
    const int64_t off = base + s_red2[warp] + x - n_items;
    if (r < p.batch) {
      // long units first (lpt_rtiles >= 0): every request has sp splits then (uniform lengths),
      // so the request's first row tile is off / sp; the short last splits follow all long ones
      const int64_t rt_first = lpt_rtiles < 0 ? 0 : off < (int64_t(1) << 31) ? int64_t(uint32_t(off) / uint32_t(sp)) : off / sp;
      for (int64_t rtile = 0; rtile < rt; ++rtile) {
        for (int64_t split = 0; split < sp; ++split) {
          int64_t idx = off + rtile * sp + split;
          if (lpt_rtiles >= 0) {
            const int64_t rt_index = rt_first + rtile;
            idx = split < sp - 1 ? rt_index * (sp - 1) + split : lpt_rtiles * (sp - 1) + rt_index;
          }
          if (idx < max_items) {
            Item it;
            it.req = r;
            it.rtile = static_cast<int32_t>(rtile);
            it.split = static_cast<int32_t>(split);
            it.pad = 0;
            plan.items[idx] = it;
          }
        }
      }
    }
    base += s_total;
    __syncthreads();
  }
  if (tid == 0) plan.num_items[0] = static_cast<int32_t>(min(base, max_items));
  if (plan.tl != nullptr) {
    __syncthreads();
    if (tid == 0) plan.tl[1] = gtimer();
  }
}

// ---------------------------------------------------------------------------------------------
// Stream-K plan of the decode config (kOptStreamK; one CTA).  Units are (request, row tile, KV
// head) as in plan_kernel (w = item * hkv + hk), unit w has L_w >= 1 key tiles (the range
// attn_kernel derives from kv_len, the causal bound and the window; an empty unit counts 1 so it
// still writes its zero output / -inf LSE).  Units are laid out in unit order in a cost space,
// `lead` positions (a piece start's cost) then their tiles, C positions in all; G CTAs take the
// contiguous ranges [floor(c C / G), floor((c + 1) C / G)) — the arithmetic and its bounds are in
// streamk_schedule.h.  Written every call (CUDA-graph safe): req / page_base / items / num_items
// as plan_kernel (items carry L in `split`, the tile prefix over items in `pad`), sk_hdr(plan)
// (C, G, table addresses), the unit table, each CTA's first unit and the map (pieces of the row's
// unit per (token, qo head), 0 = padding).
template <int ROWS, int TILE>
__device__ __forceinline__ int sk_item_tiles(const AttnParams& p, const ReqInfo& ri, int rtile) {
  // the same arithmetic as attn_kernel's key range (split 0, one chunk)
  const int rows_r = ri.q_len * p.group;
  const int row0 = rtile * ROWS;
  const int last_row = min(rows_r, row0 + ROWS) - 1;
  const int qpos_first = ri.kv_len - ri.q_len + row0 / p.group;
  const int qpos_last = ri.kv_len - ri.q_len + last_row / p.group;
  int hi = ri.kv_len;
  if (p.causal && p.xqa == nullptr && p.mm == nullptr) hi = min(hi, qpos_last + 1);
  int lo = 0;
  if (p.window_left >= 0) lo = max(0, qpos_first - static_cast<int>(p.window_left));
  const int tile0 = (lo / TILE) * TILE;
  const int n = hi > lo ? (hi - tile0 + TILE - 1) / TILE : 0;
  return max(n, 1);
}
// Tables of the stream-K decode (the kernels find units / cta through sk_hdr(plan), the map
// through plan.tok_splits).
struct SkTables {
  SkUnit* units;  // [max units] per unit w = item * hkv + hk
  int32_t* cta;   // [grid] unit holding the CTA's first tile
  int32_t* map;   // [num_tokens * hq] pieces of the row's unit, 0 = no request
};
template <int ROWS, int TILE>
__global__ void __launch_bounds__(kPlanThreads) plan_streamk_kernel(AttnParams p, Plan plan, SkTables skt,
                                                                    int max_splits, int64_t item_cap, int grid) {
  __shared__ int64_t s_a[32], s_b[32], s_c[32];
  __shared__ int32_t s_m[32];
  __shared__ int64_t s_tot[4];  // items, C, G, lead (pass 1); per-round totals (pass 2)
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5, nw = static_cast<int>(blockDim.x >> 5);
  const int64_t nmap = p.num_tokens * p.hq;
  for (int64_t i = tid; i < nmap; i += blockDim.x) skt.map[i] = 0;  // ordered by the barriers below
  // pass 1: per request info; totals of row tiles, tiles, longest unit; thread 0: C, G, lead
  int64_t nit = 0, nl = 0;
  int32_t lmax = 0;
  for (int r = tid; r < p.batch; r += blockDim.x) {
    const RequestBounds rb = load_request_bounds(p, r);
    ReqInfo ri;
    ri.q_start = static_cast<int32_t>(rb.q_begin);
    ri.q_len = static_cast<int32_t>(rb.q_end - rb.q_begin);
    ri.kv_len = static_cast<int32_t>(rb.kv_len);
    ri.splits = 1;
    plan.req[r] = ri;
    plan.page_base[r] = rb.page_base;
    const int rt = (ri.q_len * p.group + ROWS - 1) / ROWS;
    nit += rt;
    for (int k = 0; k < rt; ++k) {
      const int L = sk_item_tiles<ROWS, TILE>(p, ri, k);
      nl += L;
      lmax = max(lmax, L);
    }
  }
  warp_sum2_max(nit, nl, lmax);
  if (lane == 0) { s_a[warp] = nit; s_b[warp] = nl; s_m[warp] = lmax; }
  __syncthreads();
  if (tid == 0) {
    int64_t R = 0, Lt = 0;
    int32_t M = 0;
    for (int w = 0; w < nw; ++w) { R += s_a[w]; Lt += s_b[w]; M = max(M, s_m[w]); }
    // more row tiles than the workspace holds (only with a malformed qo_indptr): nothing runs
    if (R > item_cap) R = 0;
    const sk::Schedule sc = sk::schedule(R > 0 ? Lt * p.hkv : 0, R * p.hkv, M, max_splits, grid,
                                         sk::lead_for_tile(TILE));
    s_tot[0] = R; s_tot[1] = sc.C; s_tot[2] = sc.G; s_tot[3] = sc.lead;
    sk_hdr(plan)[0] = sc.C;
    sk_hdr(plan)[1] = sc.G;
    sk_hdr(plan)[2] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(skt.units));
    sk_hdr(plan)[3] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(skt.cta));
    plan.num_items[0] = static_cast<int32_t>(R);
    plan.chunk[0] = 0;
    plan.counter[0] = 0;
  }
  __syncthreads();
  const int64_t R = s_tot[0], C = s_tot[1], G = s_tot[2];
  const int32_t lead = static_cast<int32_t>(s_tot[3]);
  __syncthreads();
  // pass 2: items (request, row tile, L, tile prefix), exclusive scans over requests in rounds
  int64_t ibase = 0, lbase = 0;
  for (int r0 = 0; r0 < p.batch && R > 0; r0 += blockDim.x) {
    const int r = r0 + tid;
    int64_t n_items = 0, n_l = 0;
    ReqInfo ri{};
    if (r < p.batch) {
      ri = plan.req[r];
      n_items = (ri.q_len * p.group + ROWS - 1) / ROWS;
      for (int k = 0; k < n_items; ++k) n_l += sk_item_tiles<ROWS, TILE>(p, ri, k);
    }
    int64_t x = n_items, y = n_l;
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t a = __shfl_up_sync(0xffffffffu, x, o), b = __shfl_up_sync(0xffffffffu, y, o);
      if (lane >= o) { x += a; y += b; }
    }
    if (lane == 31) { s_a[warp] = x; s_b[warp] = y; }
    __syncthreads();
    if (tid == 0) {
      int64_t ai = 0, al = 0;
      for (int w = 0; w < nw; ++w) {
        const int64_t ti = s_a[w], tl = s_b[w];
        s_c[w] = ai; s_a[w] = al;  // exclusive items (s_c), exclusive tiles (s_a)
        ai += ti; al += tl;
      }
      s_tot[0] = ai; s_tot[1] = al;
    }
    __syncthreads();
    if (r < p.batch) {
      int64_t idx = ibase + s_c[warp] + x - n_items;
      int64_t lp = lbase + s_a[warp] + y - n_l;
      for (int k = 0; k < n_items; ++k, ++idx) {
        const int L = sk_item_tiles<ROWS, TILE>(p, ri, k);
        Item it;
        it.req = r;
        it.rtile = k;
        it.split = L;
        it.pad = static_cast<int32_t>(lp);
        plan.items[idx] = it;
        lp += L;
      }
    }
    ibase += s_tot[0];
    lbase += s_tot[1];
    __syncthreads();
  }
  // pass 3: units and the (token, qo head) -> pieces map
  const int64_t U = R * p.hkv;
  for (int64_t w = tid; w < U; w += blockDim.x) {
    const Item it = plan.items[w / p.hkv];
    const int hk = static_cast<int>(w % p.hkv);
    SkUnit u;
    u.start = sk::unit_start(int64_t(it.pad) * p.hkv + int64_t(hk) * it.split, w, lead);
    u.len = it.split;
    u.first_cta = static_cast<int32_t>(sk::cta_of(u.start, C, G));
    u.pieces = static_cast<int32_t>(sk::cta_of(u.start + u.len - 1, C, G)) - u.first_cta + 1;
    u.pad = 0;
    skt.units[w] = u;
    const ReqInfo ri = plan.req[it.req];
    const int rows_r = ri.q_len * p.group;
    const int row0 = it.rtile * ROWS;
    for (int rr = row0; rr < min(rows_r, row0 + ROWS); ++rr) {
      const int64_t tok = ri.q_start + rr / p.group;
      skt.map[tok * p.hq + int64_t(hk) * p.group + rr % p.group] = u.pieces;
    }
  }
  __syncthreads();
  // pass 4: unit of each range's first position (binary search over the unit starts; unit w's
  // positions begin `lead` before its first tile)
  for (int64_t c = tid; c < G; c += blockDim.x) {
    const int64_t a = sk::range_begin(c, C, G);
    int64_t lo = 0, hi = U - 1;  // largest w with start(w) - lead <= a
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) >> 1;
      if (skt.units[mid].start - lead <= a) lo = mid;
      else hi = mid - 1;
    }
    skt.cta[c] = static_cast<int32_t>(lo);
  }
}

}  // namespace
}  // namespace kvattn::ops::cuda_impl::k
