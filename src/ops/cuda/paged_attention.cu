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
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/knobs.h"
#include "ops/cuda/ptx.cuh"
#include "ops/cuda/small_decode.h"
#include "ops/cuda/streamk_schedule.h"

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

namespace kvattn::ops::cuda_impl::k {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kPlanThreads = 1024;

// ---------------------------------------------------------------------------------------------
// PTX wrappers (shared ones in ptx.cuh).
// Two fp8 bytes of x (chosen by `sel`, a __byte_perm selector that puts them in the high
// bytes of the two halves) -> f16x2.  e5m2 is exactly the high byte of an f16; e4m3 becomes
// value * 2^-8 (exact), which the caller folds into its scales.
// On sm_89+ e4m3 uses the hardware cvt (exact, no 2^-8 factor): kE4m3Factor says which.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define KVATTN_HW_E4M3 1
#endif
#ifdef KVATTN_HW_E4M3
constexpr float kE4m3Factor = 1.f;
#else
constexpr float kE4m3Factor = 256.f;
#endif
template <bool E4M3>
__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint32_t x, uint32_t sel) {
#ifdef KVATTN_HW_E4M3
  if constexpr (E4M3) {
    // gather the two bytes into the low 16 bits (byte order lo, hi), then cvt
    const uint32_t pair = __byte_perm(x, 0u, ((sel >> 4) & 0xf) | (((sel >> 12) & 0xf) << 4) | 0x4400u);
    uint32_t h;
    asm("{\n .reg .b16 lo;\n cvt.u16.u32 lo, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(h) : "r"(pair));
    return h;
  }
#endif
  uint32_t h = __byte_perm(x, 0u, sel);
  if constexpr (E4M3) h = ((h >> 1) & 0x3f803f80u) | (h & 0x80008000u);
  return h;
}
// fp8 fast variant (KVTraits::kFast, KVATTN_FP8_FAST=1): the four bytes of x -> lo = f16x2(byte 0,
// byte 1), hi = f16x2(byte 2, byte 3), the same values as fp8x2_to_f16x2(x, 0x1404 / 0x3424).
// e4m3 on sm_89+: one cvt per half straight from the register's 16-bit halves (ptxas reads the
// high half in place: 2 instructions per word instead of byte_perm + cvt twice).
template <bool E4M3>
__device__ __forceinline__ void fp8x4_to_f16x2x2(uint32_t x, uint32_t& lo, uint32_t& hi) {
#ifdef KVATTN_HW_E4M3
  if constexpr (E4M3) {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(x));
    return;
  }
#endif
  lo = fp8x2_to_f16x2<E4M3>(x, 0x1404u);
  hi = fp8x2_to_f16x2<E4M3>(x, 0x3424u);
}
// fp8 fast variant, V fragments: even = f16x2(byte 0, byte 2), odd = f16x2(byte 1, byte 3) (the
// values of fp8x2_to_f16x2(x, 0x2404 / 0x3414)); e4m3 on sm_89+: one byte_perm to (0, 2, 1, 3),
// then a cvt per half (3 instructions per word instead of 4).
template <bool E4M3>
__device__ __forceinline__ void fp8x4_to_f16x2x2_eo(uint32_t x, uint32_t& even, uint32_t& odd) {
#ifdef KVATTN_HW_E4M3
  if constexpr (E4M3) {
    fp8x4_to_f16x2x2<true>(__byte_perm(x, 0u, 0x3120u), even, odd);
    return;
  }
#endif
  even = fp8x2_to_f16x2<E4M3>(x, 0x2404u);
  odd = fp8x2_to_f16x2<E4M3>(x, 0x3414u);
}
// 2^x flushing subnormal inputs / results to 0: one MUFU.EX2 (exp2f is four instructions: the
// range check and two scalings that keep subnormal results).  Used by the fp8 fast variant's
// softmax, where every result is P (packed to f16, whose smallest subnormal is 2^-24) or a
// rescale factor: a flushed 2^-126 changes nothing that is stored.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

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
  // v6 path (decode and prefill configs of attn_kernel, not the small path):
  int32_t opts;          // kOpt* bits (KVATTN_DECODE_OPTS)
  uint64_t* tl;          // timeline stamps (KVATTN_DECODE_TIMELINE), nullptr = off
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

// v6-path options (Plan::opts)
constexpr int kOptWaveSplits = 1;  // plan_kernel: split count of uniform-length calls by whole waves
// decode config with fp8 pages, D <= 128, sm_90+: the fp8 fast variant of attn_kernel (KV types
// KVe4m3f / KVe5m2f below; KVATTN_FP8_FAST=1)
constexpr int kOptFp8Fast = 4;
// plan_kernel, uniform-length decode calls (with kOptWaveSplits): also try chunk sizes that do not
// divide the request (units of ct, ..., ct, rem tiles) and hand out the short last units after all
// the long ones, so they fill the last wave (default on: 64 x 4096 -2.2 %,
// 128 x 4096 -2.3 %, 256 x 8192 -1.6 %, fp8 256 x 8192 -2.1 % in one process on an H200;
// KVATTN_DECODE_REM_SPLITS=0 turns it off)
constexpr int kOptRemSplits = 8;
// plans that chose such a chunk (items long units first), for tests: rem_split_plans()
__device__ unsigned long long g_rem_split_plans;
// decode config: stream-K schedule (plan_streamk_kernel; KVATTN_DECODE_STREAMK=1), see DESIGN.md
constexpr int kOptStreamK = 16;
// stream-K for fp8 caches when the call has at least one (request, KV head) pair per CTA (default
// on; KVATTN_DECODE_STREAMK_FP8=0 off).  Measured in one process on an H200: fp8 256 x 8192
// 1164.5 vs 1215.7 us with it; the bf16 shapes it lost on (128 x 4096 -1.8 %, 256 x 8192 -1.4 %,
// 32 x 4096 -15 % where fewer pairs than CTAs leave CTAs idle) keep the counter path.
constexpr int kOptStreamKFp8 = 32;
// stream-K for calls whose caller says the KV lengths are mixed (KvLengthsHint::mixed, any cache
// dtype) with a (request, KV head) pair per CTA (default on; KVATTN_DECODE_STREAMK_MIXED=0 off).
// Measured with plans kept on an H200: bf16 128 x U[256, 8192] 532.2-533.2 vs 544.3-545.0 us.
constexpr int kOptStreamKMixed = 64;
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
      // measurement knob (KVATTN_DECODE_SPLITS): every request cut into this many chunks
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
          // measurement knob (KVATTN_DECODE_CHUNK_TILES): this chunk instead of the model's,
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

// ---------------------------------------------------------------------------------------------
// The attention kernel.
template <typename KV>
struct KVTraits;
struct KVbf16 {};
struct KVf16 {};
struct KVe4m3 {};
struct KVe5m2 {};
template <> struct KVTraits<KVbf16> { static constexpr int kBytes = 2; static constexpr bool kFp8 = false, kBf16 = true, kE4m3 = false; };
template <> struct KVTraits<KVf16> { static constexpr int kBytes = 2; static constexpr bool kFp8 = false, kBf16 = false, kE4m3 = false; };
template <> struct KVTraits<KVe4m3> { static constexpr int kBytes = 1; static constexpr bool kFp8 = true, kBf16 = false, kE4m3 = true; };
template <> struct KVTraits<KVe5m2> { static constexpr int kBytes = 1; static constexpr bool kFp8 = true, kBf16 = false, kE4m3 = false; };
// fp8 fast variant of the decode config (D <= 128; the default, KVATTN_FP8_FAST=0 turns it off;
// Plan opts kOptFp8Fast):
// same tiles and results as KVe4m3 / KVe5m2, fewer instructions per tile (conversions without
// the extra byte_perm, MUFU-only exp2 in the softmax, the cp.async loop with constant shared
// memory offsets, one page id per key row for K and V).  kFastKV says which types are fast.
struct KVe4m3f {};
struct KVe5m2f {};
template <typename KV> struct FastOf { using type = KV; };
template <> struct FastOf<KVe4m3> { using type = KVe4m3f; };
template <> struct FastOf<KVe5m2> { using type = KVe5m2f; };
template <> struct KVTraits<KVe4m3f> : KVTraits<KVe4m3> {};
template <> struct KVTraits<KVe5m2f> : KVTraits<KVe5m2> {};
template <typename KV> constexpr bool kFastKV = false;
template <> constexpr bool kFastKV<KVe4m3f> = true;
template <> constexpr bool kFastKV<KVe5m2f> = true;

template <typename KV, int D, int WM, int WN>
struct Cfg {
  using T = KVTraits<KV>;
  static constexpr int kWarps = WM * WN;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 16 * WM;
  // decode with fp8 pages: 128-key tiles (32 keys per warp) so each pipeline step moves as
  // many bytes as a 16-bit tile
  static constexpr int kTile = (WN > 1) ? ((T::kFp8 && D <= 128) ? 128 : 64) : (D <= 128 ? 64 : 32);
  static constexpr int kNT = kTile / WN;  // keys per warp per tile (multiple of 16)
  static constexpr int kRowBytes = D * T::kBytes;
  static constexpr int kCPR = kRowBytes / 16;  // 16-byte chunks per key row
  static constexpr int kStageBytes = kTile * kRowBytes;  // one of K or V
  // decode: 3 CTAs / SM (2 stages for 16-bit pages, 3 for fp8); prefill: 2 CTAs / SM, 3 stages
  static constexpr int kStages = (WN > 1) ? ((kStageBytes * 2 * 3 <= 72 * 1024) ? 3 : 2) : 3;
  static constexpr int kMinBlocks = (WN > 1) ? 3 : 2;
  static constexpr int kChunksPerThread = kTile * kCPR / kThreads;
  static constexpr int kRowStepPerChunk = kThreads / kCPR;  // key rows between a thread's chunks
  static constexpr int kEpiPitch = D + 4;
  static constexpr int kEpiBytes = WN * kRows * kEpiPitch * 4 + 3 * WN * kRows * 4;
  static constexpr int kPipeBytes = kStages * kStageBytes * 2;
  static constexpr int kQBytes = kRows * (D + 4) * 4;
  static constexpr int kSmemMain0 = kPipeBytes > kEpiBytes ? kPipeBytes : kEpiBytes;
  static constexpr int kSmemMain = ((kSmemMain0 > kQBytes ? kSmemMain0 : kQBytes) + 127) / 128 * 128;
  // page-id ring of the tile loop: three tiles' index words (8 bytes) per offset slot and thread
  static constexpr int kPgRingBytes = 3 * ((2 * kTile + kThreads - 1) / kThreads) * kThreads * 8;  // kOffPer below
  static constexpr int kSmem = kSmemMain + kStages * 2 * kTile * 8 + kPgRingBytes;
  static_assert(kNT % 16 == 0, "keys per warp must be a multiple of 16");
  static_assert((kTile * kCPR) % kThreads == 0, "tile chunks must divide evenly");
  static_assert(kThreads % kCPR == 0, "threads must cover whole rows");
  static constexpr int kOffPer = (2 * kTile + kThreads - 1) / kThreads;  // offset slots / thread
};

// Swizzled byte offset of (key row, 16-byte chunk) inside one K or V stage.
template <int CPR>
__device__ __forceinline__ int swz(int row, int chunk) {
  int x;
  if constexpr (CPR >= 8) x = row & 7;
  else if constexpr (CPR == 4) x = (row >> 1) & 3;
  else if constexpr (CPR == 2) x = (row >> 2) & 1;
  else x = 0;
  return row * (CPR * 16) + ((chunk ^ x) * 16);
}

__device__ __forceinline__ float load_q(const AttnParams& p, int64_t tok, int head, int d) {
  return load_elt(p.q, tok * p.q_st + int64_t(head) * p.q_sh + int64_t(d) * p.q_sd, p.q_t);
}

struct RowInfo {
  bool valid;
  int64_t tok;    // global token index
  int head;       // qo head
  int qpos;
  int mm_s, mm_e;
};

// Merge of one (request, row tile, KV head) unit of the small-call path, run by the CTA whose
// piece arrived last: rows [0, nrows) of the tile, `ns` partial (O, LSE) pairs each.  The
// partial O rows are copied into shared memory with cp.async (as many pieces as fit at once;
// all of a 1 x 1024 call's in one go), so every load is in flight together without holding
// registers (v7's merge walked the pieces serially; a register-batched version spilled), the
// LSEs go out in the same round trip.  smem: [ROWS][kSmallMaxSplits] weights, [ROWS] scales,
// then the staged partials.
template <int D, int ROWS, int NT>
__device__ __forceinline__ void small_merge(const AttnParams& p, const Plan& plan, int ns, int nrows,
                                            const int* s_rtok, const int* s_rhead, float out_factor,
                                            unsigned char* smem, int smem_bytes) {
  constexpr int kC4 = D / 4;                    // float4 columns per row
  constexpr int kItems = ROWS * kC4 / NT;       // (row, column) items per thread
  constexpr int kLPer = ROWS * kSmallMaxSplits / NT;
  static_assert((ROWS * kC4) % NT == 0 && (ROWS * kSmallMaxSplits) % NT == 0, "items must divide evenly");
  float* sw = reinterpret_cast<float*>(smem);
  float* s_scale = sw + ROWS * kSmallMaxSplits;
  constexpr int kHead = (ROWS * kSmallMaxSplits + ROWS) * 4;
  float4* sdat = reinterpret_cast<float4*>(smem + (kHead + 15) / 16 * 16);
  const int per_split = nrows * kC4;  // float4 per piece
  const int cap = (smem_bytes - (kHead + 15) / 16 * 16) / (per_split * 16);
  const int sb = max(1, min(ns, cap));  // pieces staged at once
  const int tid = threadIdx.x;
  auto issue = [&](int s0) {
    const int n = min(sb, ns - s0) * per_split;
    for (int i = tid; i < n; i += NT) {
      const int s = i / per_split, j = i - s * per_split;
      const int row = j / kC4, c4 = j % kC4;
      const float* src =
          plan.part_o + ((int64_t(s0 + s) * p.num_tokens + s_rtok[row]) * p.hq + s_rhead[row]) * D + c4 * 4;
      cp_async16(smem_u32(sdat + i), src, 16);
    }
    cp_async_commit();
  };
  issue(0);
  float l[kLPer];
#pragma unroll
  for (int k = 0; k < kLPer; ++k) {
    const int i = tid + k * NT;
    const int row = i / kSmallMaxSplits, s = i % kSmallMaxSplits;
    l[k] = (row < nrows && s < ns)
               ? __ldcg(plan.part_lse + (int64_t(s) * p.num_tokens + s_rtok[row]) * p.hq + s_rhead[row])
               : -INFINITY;
  }
#pragma unroll
  for (int k = 0; k < kLPer; ++k) sw[tid + k * NT] = l[k];
  __syncthreads();
  if (tid < nrows) {  // weights, sink, LSE of row `tid`
    float* w = sw + tid * kSmallMaxSplits;
    const int head = s_rhead[tid];
    const int64_t tok = s_rtok[tid];
    float M = -INFINITY;
    for (int s = 0; s < ns; ++s) M = fmaxf(M, w[s]);
    float s2 = -INFINITY;
    if (p.sinks != nullptr) s2 = p.sinks[int64_t(head) * p.sinks_s] * kLog2e;
    const float Mf = fmaxf(M, s2);
    const float Mu = (Mf == -INFINITY) ? 0.f : Mf;
    float denom = 0.f;
    for (int s = 0; s < ns; ++s) {
      const float e = exp2f(w[s] - Mu);
      w[s] = e;
      denom += e;
    }
    if (p.sinks != nullptr) denom += exp2f(s2 - Mu);
    const float lse2 = denom > 0.f ? Mu + log2f(denom) : -INFINITY;
    s_scale[tid] = (denom > 0.f && M != -INFINITY) ? p.v_scale * out_factor / denom : 0.f;
    if (p.lse != nullptr) p.lse[tok * p.lse_st + int64_t(head) * p.lse_sh] = p.lse_natural ? lse2 * kLn2 : lse2;
  }
  float4 acc[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0; s0 < ns; s0 += sb) {
    if (s0 > 0) issue(s0);
    cp_async_wait<0>();
    __syncthreads();  // staged pieces (and, the first time, the weights) visible
    const int n = min(sb, ns - s0);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int item = tid + k * NT;
      if (item < per_split) {
        const float* w = sw + (item / kC4) * kSmallMaxSplits + s0;
        for (int s = 0; s < n; ++s) {
          const float f = w[s];
          const float4 x = sdat[s * per_split + item];
          acc[k].x += f * x.x;
          acc[k].y += f * x.y;
          acc[k].z += f * x.z;
          acc[k].w += f * x.w;
        }
      }
    }
    __syncthreads();  // before the next batch overwrites the staging area
  }
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int item = tid + k * NT;
    if (item >= per_split) continue;
    const int row = item / kC4, d = (item % kC4) * 4;
    const float sc = s_scale[row];
    const float a0 = acc[k].x * sc, a1 = acc[k].y * sc, a2 = acc[k].z * sc, a3 = acc[k].w * sc;
    const int64_t tok = s_rtok[row];
    const int head = s_rhead[row];
    store_out4(p, tok, head, d, a0, a1, a2, a3);
  }
}

// Per-CTA plan of the small-call path (shared memory).
template <bool SMALL>
struct SmallShared {};
template <>
struct SmallShared<true> {
  ReqInfo req[kSmallMaxBatch];   // splits = pieces per unit of the request
  int64_t pbase[kSmallMaxBatch];
  int32_t chunk[kSmallMaxBatch];  // keys per piece
  int32_t pinc[kSmallMaxBatch];   // inclusive scan of pieces
  int32_t uex[kSmallMaxBatch];    // exclusive scan of units
  int32_t npieces;
};
// Walk state of the stream-K decode (attn_kernel<..., SK = true>): written by thread 0 only,
// read by all threads after the barrier of each unit start (no registers held across the loop).
template <bool SK>
struct SkShared {};
template <>
struct SkShared<true> {
  const SkUnit* units;   // the plan's unit table
  int64_t t, end;        // next position of the CTA's range, range end (streamk_schedule.h)
  int32_t u;             // unit holding position t
  int32_t tb, te;        // current piece: tiles [tb, te) of its unit
  int32_t slot, pieces;  // current piece's partial slot and its unit's piece count
};

template <typename KV, int D, int WM, int WN, bool SMALL = false, bool SK = false>
__global__ void __launch_bounds__(Cfg<KV, D, WM, WN>::kThreads, Cfg<KV, D, WM, WN>::kMinBlocks)
    attn_kernel(AttnParams p, Plan plan, float kv_logit_factor, float kv_out_factor) {
  static_assert(!SK || (!SMALL && WN > 1), "stream-K is built for the v6 decode config");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  // the fp8 fast variant is built for sm_90 (the host never launches it below compute capability 9)
  if constexpr (kFastKV<KV>) return;
#endif
  using C = Cfg<KV, D, WM, WN>;
  using TR = KVTraits<KV>;
  constexpr bool kFast = kFastKV<KV>;
  static_assert(!kFast || (WN > 1 && D <= 128 && !SMALL && C::kThreads == C::kTile),
                "the fp8 fast variant is built for the decode config (one key row per thread)");
  constexpr bool kBf16 = TR::kBf16;
  constexpr int kTile = C::kTile, kNT = C::kNT, kCPR = C::kCPR, kStages = C::kStages;
  constexpr int kKSteps = D / 16;
  constexpr int kNTilesS = kNT / 8;   // S n-tiles per warp
  constexpr int kNTilesO = D / 8;     // O n-tiles
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* sK = smem;
  unsigned char* sV = smem + kStages * C::kStageBytes;
  int64_t* sOff = reinterpret_cast<int64_t*>(smem + C::kSmemMain);  // [kStages][2][kTile]
  // [3][kOffPer][kThreads] index words of the page ids of tiles t + kStages .. t + kStages + 2
  uint64_t* const sPg = reinterpret_cast<uint64_t*>(smem + C::kSmemMain + kStages * 2 * C::kTile * 8);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WN, wn = warp % WN;
  const int g = lane >> 2, t4 = lane & 3;

  const int total = SMALL ? 0 : plan.num_items[0] * p.hkv;
  const int chunk0 = SMALL ? 0 : plan.chunk[0];
  if constexpr (TR::kE4m3) { kv_logit_factor = kE4m3Factor; kv_out_factor = kE4m3Factor; }
  const float scale_log2 = p.sm_scale * kv_logit_factor * kLog2e;
  const float scale_lin = p.sm_scale * kv_logit_factor;
  const bool softcap = p.soft_cap > 0.f;

  __shared__ int s_work;
  __shared__ int s_rtok[C::kRows], s_rhead[C::kRows];
  __shared__ SmallShared<SMALL> s_sm;
  __shared__ SkShared<SK> s_sk;
  if constexpr (SMALL) {
    // The plan of the whole call, computed by every CTA (no plan kernel): warp 0, one lane per
    // request (batch <= kSmallMaxBatch, checked by the host).  Same split rule as plan_kernel
    // (units of ~1/8 of a CTA's share, at least 8 tiles, one-tile units for tiny calls), with
    // the split bound and the fewest tiles per piece applied per request.
    if (warp == 0) {
      const int r = lane;
      int64_t qs = 0, qe = 0, kv = 0, pb = 0;
      if (r < p.batch) {
        const RequestBounds rb = load_request_bounds(p, r);
        qs = rb.q_begin; qe = rb.q_end; kv = rb.kv_len; pb = rb.page_base;
      }
      const int ql = static_cast<int>(qe - qs);
      const int rt = (ql * p.group + C::kRows - 1) / C::kRows;
      const int kvt = static_cast<int>((kv + kTile - 1) / kTile);
      int64_t wk = int64_t(rt) * kvt;
      int kvt_max = rt > 0 ? kvt : 0;
      for (int o = 16; o > 0; o >>= 1) {
        wk += __shfl_xor_sync(0xffffffffu, wk, o);
        kvt_max = max(kvt_max, __shfl_xor_sync(0xffffffffu, kvt_max, o));
      }
      // tiles per piece: sum over units of ceil(kvt / want) <= W / want + U <= G, so every
      // piece has a CTA of its own (one wave, no work counter); the host sends only calls
      // with U <= G / 2 here
      int units_all = rt * p.hkv;
      for (int o = 16; o > 0; o >>= 1) units_all += __shfl_xor_sync(0xffffffffu, units_all, o);
      const int64_t room = max(int64_t(gridDim.x) - units_all, int64_t(1));
      int64_t want = (wk * p.hkv + room - 1) / room;
      want = max(want, int64_t(kvt_max + plan.small_smax - 1) / plan.small_smax);
      want = max(want, int64_t(max(plan.small_min_tiles, 1)));
      int sp = 1, chunk_tiles = 1;
      if (kvt > 0) {
        sp = static_cast<int>((kvt + want - 1) / want);
        chunk_tiles = (kvt + sp - 1) / sp;
        sp = (kvt + chunk_tiles - 1) / chunk_tiles;
      }
      const int units = rt * p.hkv;
      int ui = units;
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, ui, o);
        if (lane >= o) ui += y;
      }
      const int uex = ui - units;
      // units past the counter array (only with a malformed qo_indptr) are dropped, as
      // plan_kernel drops items past max_items
      const int pieces = uex + units <= plan.small_units ? units * sp : 0;
      int pi = pieces;
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, pi, o);
        if (lane >= o) pi += y;
      }
      ReqInfo ri;
      ri.q_start = static_cast<int32_t>(qs);
      ri.q_len = ql;
      ri.kv_len = static_cast<int32_t>(kv);
      ri.splits = sp;
      s_sm.req[r] = ri;
      s_sm.pbase[r] = pb;
      s_sm.chunk[r] = chunk_tiles * kTile;
      s_sm.pinc[r] = pi;
      s_sm.uex[r] = uex;
      if (lane == 31) s_sm.npieces = pi;
    }
    __syncthreads();
  }
  const int piece = blockIdx.x;  // small path: one piece per CTA
  // timeline record of the current unit (thread 0; s_work holds the unit's work id until the
  // next unit starts, so the address is recomputed instead of kept in registers)
  uint64_t* const tl = (SMALL || SK) ? nullptr : plan.tl;  // stream-K: no timeline (the host says so)
  auto tl_unit = [&]() -> uint64_t* {
    if (tl == nullptr || tid != 0 || s_work >= plan.tl_cap) return nullptr;
    return tl + kTlHeader + 2 * gridDim.x + int64_t(s_work) * kTlUnitWords;
  };
  if constexpr (!SMALL) {
    if (tid == 0 && tl != nullptr) tl[kTlHeader + 2 * blockIdx.x] = gtimer();
  }
  if constexpr (SK) {
    if (tid == 0) {  // the CTA's range and the unit of its first position (read after the first barrier)
      const int64_t C = sk_hdr(plan)[0], G = sk_hdr(plan)[1];
      const int64_t c = blockIdx.x;
      s_sk.t = c < G ? sk::range_begin(c, C, G) : 0;
      s_sk.end = c < G ? sk::range_begin(c + 1, C, G) : 0;
      s_sk.u = c < G ? reinterpret_cast<const int32_t*>(sk_hdr(plan)[3])[c] : 0;
      s_sk.units = reinterpret_cast<const SkUnit*>(sk_hdr(plan)[2]);
    }
  }
  for (;;) {
    Item it;
    int hk, chunk;
    ReqInfo ri;
    if constexpr (!SMALL) {
      if constexpr (SK) {
        if (tid == 0) {  // next piece of the range: (unit, [tb, te)), then advance
          if (s_sk.t >= s_sk.end) {
            s_work = 0x7fffffff;
          } else {
            const int u = s_sk.u;
            const SkUnit su = s_sk.units[u];
            const sk::Piece pc = sk::piece_at(s_sk.t, s_sk.end, su.start, su.len);
            if (pc.te <= pc.tb) {  // the range ends in this unit's lead: done
              s_work = 0x7fffffff;
              s_sk.t = s_sk.end;
            } else {
              s_work = u;
              s_sk.tb = pc.tb;
              s_sk.te = pc.te;
              s_sk.slot = static_cast<int>(blockIdx.x) - su.first_cta;
              s_sk.pieces = su.pieces;
              s_sk.t = su.start + pc.te;
              if (pc.te == su.len) s_sk.u = u + 1;
            }
          }
        }
      } else {
        if (tid == 0) s_work = atomicAdd(plan.counter, 1);
      }
      __syncthreads();
      const int w = s_work;
      if (w >= total) {
        if (tl != nullptr && tid == 0) tl[kTlHeader + 2 * blockIdx.x + 1] = gtimer();
        // Every CTA draws exactly one number >= total, so the draws are 0 .. total + grid - 1 and
        // the CTA holding the largest made the launch's last draw: it puts the counter back to 0,
        // ready for the next launch on a kept plan (PagedAttentionPlan: no plan kernel to reset it).
        if constexpr (!SK) {
          if (tid == 0 && w == total + static_cast<int>(gridDim.x) - 1) *plan.counter = 0;
        }
        break;
      }
      if (tl != nullptr) {
        if (uint64_t* r = tl_unit()) r[0] = gtimer();
      }
      it = plan.items[w / p.hkv];
      hk = w % p.hkv;
      ri = plan.req[it.req];
      chunk = chunk0;
      // SK: the piece's slot and its unit's piece count stay in shared memory (s_sk.slot /
      // s_sk.pieces, read in the epilogue: not held in registers across the tile loop)
    } else {
      if (piece >= s_sm.npieces) break;
      const int r = __popc(__ballot_sync(0xffffffffu, s_sm.pinc[lane] <= piece));
      const int local = piece - (r > 0 ? s_sm.pinc[r - 1] : 0);
      ri = s_sm.req[r];
      const int rest = local / ri.splits;  // rtile * hkv + hk
      it.req = r;
      it.split = local - rest * ri.splits;
      it.rtile = rest / p.hkv;
      it.pad = 0;
      hk = rest - it.rtile * p.hkv;
      chunk = s_sm.chunk[r];
    }
    const int rows_r = ri.q_len * p.group;
    const int row0 = it.rtile * C::kRows;
    // key range of this work unit
    const int last_row = min(rows_r, row0 + C::kRows) - 1;
    const int qpos_first = ri.kv_len - ri.q_len + row0 / p.group;
    const int qpos_last = ri.kv_len - ri.q_len + last_row / p.group;
    int hi = ri.kv_len;
    if (p.causal && p.xqa == nullptr && p.mm == nullptr) hi = min(hi, qpos_last + 1);
    int lo = 0;
    if (p.window_left >= 0) lo = max(0, qpos_first - static_cast<int>(p.window_left));
    int kstart, kend;
    if constexpr (SK) {  // tiles [tb, te) of the unit, counted from the tile holding lo
      const int ubase = (lo / kTile) * kTile;
      kstart = max(lo, ubase + s_sk.tb * kTile);
      kend = min(hi, ubase + s_sk.te * kTile);
    } else {
      kstart = max(lo, it.split * chunk);
      kend = min(hi, (it.split + 1) * chunk);
    }
    const int tile0 = (kstart / kTile) * kTile;
    const int n_tiles = kend > kstart ? (kend - tile0 + kTile - 1) / kTile : 0;

    // page table of this request
    int64_t pbase;
    if constexpr (SMALL) pbase = s_sm.pbase[it.req];
    else pbase = plan.page_base[it.req];

    // ---- loader ----
    // Row offsets (bytes from p.k / p.v) of each key row of a tile are computed once per
    // tile by 2*kTile threads (K rows, then V rows) into a ring of kStages smem slots, from a
    // page id fetched one tile earlier (so its latency hides behind a tile of compute).  The
    // copy threads then only read the offset: thread chunks are (row = tid / CPR + i * step,
    // chunk = tid % CPR), a warp covering whole 16-byte-chunk rows (coalesced).
    const int my_chunk = tid % kCPR;
    const int my_row0 = tid / kCPR;
    [[maybe_unused]] constexpr uint64_t kZeroFill = uint64_t(1) << 63;  // fp8 fast / kAbsLoader: row not loaded
    // Offset slot k of this thread: index tid + k * kThreads over [K rows | V rows].
    constexpr int kOffPer = C::kOffPer;
    // page ids per thread: the fast variant loads one per key row (thread = row) and derives both
    // the K and the V offset from it; the others one per offset slot (K rows, then V rows)
    constexpr int kPgPer = kFast ? 1 : kOffPer;
    // The page-id word of tile `tile`'s offset slot k, loaded ahead (load_idx_word: nothing waits
    // for it here) and turned into a checked page id by page_id() where it is used (-1: the row
    // is zero-filled: a key outside the unit, or a page id outside [0, num_pages)).
    // Element offset (in page_index(p)) of the page-id word of tile `tile`'s offset slot k; false
    // when the slot holds no key of the unit.
    auto slot_page_elem = [&](int tile, int k, int64_t& elem) -> bool {
      const int idx = tid + k * C::kThreads;
      const int which = kFast ? 0 : idx / kTile, row = kFast ? tid : idx % kTile;
      const int j = tile0 + tile * kTile + row;
      const int blk = p.page_shift >= 0 ? (j >> p.page_shift) : (j / p.page_size);
      elem = page_elem(p, pbase, it.req, blk);
      return which <= 1 && tile < n_tiles && j >= kstart && j < kend;
    };
    auto load_page = [&](int tile, int k) -> IdxWord {
      int64_t elem;
      const bool valid = slot_page_elem(tile, k, elem);
      return load_idx_word(page_index(p), elem, valid);
    };
    auto page_id = [&](IdxWord w) -> int64_t {
      const int64_t pg = idx_word_value(page_index(p), w);
      return (pg < 0 || pg >= p.num_pages) ? int64_t(-1) : pg;
    };
    // In the tile loop the page ids come two iterations ahead through shared memory: a cp.async of
    // the index word into this thread's slot of the ring sPg (kept in flight across the barriers,
    // which would wait for a load into a register: ncu put 10 % of the stall samples there), read
    // back by the same thread once its copy group has been waited for.  Slot of tile t: t % 3.
    auto pg_slot = [&](int tile, int k) -> uint64_t* {
      return sPg + ((tile % 3) * C::kOffPer + k) * C::kThreads + tid;
    };
    auto copy_page = [&](int tile, int k) {
      uint64_t* dst = pg_slot(tile, k);
      int64_t elem;
      if (!slot_page_elem(tile, k, elem)) {
        *dst = ~uint64_t(0);  // reads as page -1 (its earlier copy, 3 tiles back, is complete)
        return;
      }
      const Idx& x = page_index(p);
      cp_async_idx(smem_u32(dst), static_cast<const char*>(x.ptr) + elem * (x.is64 ? 8 : 4), x.is64);
    };
    auto ring_page = [&](int tile, int k) -> int64_t {
      const uint64_t v = *pg_slot(tile, k);
      return page_id(IdxWord{static_cast<uint32_t>(v), static_cast<uint32_t>(v >> 32)});
    };
    // The copy of tile t + kStages + 2's page ids, made at iteration t, must be complete at the top
    // of iteration t + 2, where the wait leaves the last kStages - 2 groups pending: with 2 stages
    // it joins the group committed at iteration t + 1, with 3 the one committed at iteration t.
    static_assert(kStages == 2 || kStages == 3, "page-id ring: 2 or 3 stages");
    constexpr bool kPgCopyAfterCommit = kStages == 2;
    // Decode config without the fp8 fast variant (16-bit pages, and the previous fp8 kernel) when a
    // thread's rows share a swizzle (D <= 128): the offset ring holds each row's K and V addresses
    // side by side as in the fp8 fast variant (absolute, bit 63 = zero-fill), written by the row's
    // K and V threads, so issue() reads both with one 16-byte load and needs no per-chunk select
    constexpr bool kAbsLoader = !kFast && WN > 1 && C::kRowStepPerChunk % 8 == 0;
    auto store_off = [&](int tile, int k, int64_t pg) {
      if constexpr (kFast) {
        // row tid: the addresses of its K and V rows side by side (one 16-byte store, one load
        // per chunk pair in issue()); a row to zero-fill holds the cache base with bit 63 set
        const int j = tile0 + tile * kTile + tid;
        const int slot = p.page_shift >= 0 ? (j & (p.page_size - 1)) : (j % p.page_size);
        const int64_t ok = pg * p.k_sb + int64_t(slot) * p.k_so + int64_t(hk) * p.k_sh;
        const int64_t ov = pg * p.v_sb + int64_t(slot) * p.v_so + int64_t(hk) * p.v_sh;
        const uint64_t kb = reinterpret_cast<uint64_t>(p.k), vb = reinterpret_cast<uint64_t>(p.v);
        ulonglong2 w;
        w.x = pg < 0 ? (kb | kZeroFill) : kb + static_cast<uint64_t>(ok);
        w.y = pg < 0 ? (vb | kZeroFill) : vb + static_cast<uint64_t>(ov);
        *reinterpret_cast<ulonglong2*>(sOff + ((tile % kStages) * kTile + tid) * 2) = w;
        return;
      }
      const int idx = tid + k * C::kThreads;
      const int which = idx / kTile, row = idx % kTile;
      if (which > 1) return;
      const int j = tile0 + tile * kTile + row;
      const int slot = p.page_shift >= 0 ? (j & (p.page_size - 1)) : (j % p.page_size);
      const int64_t off = which == 0 ? pg * p.k_sb + int64_t(slot) * p.k_so + int64_t(hk) * p.k_sh
                                     : pg * p.v_sb + int64_t(slot) * p.v_so + int64_t(hk) * p.v_sh;
      if constexpr (kAbsLoader) {
        const uint64_t base = reinterpret_cast<uint64_t>(which == 0 ? p.k : p.v);
        reinterpret_cast<uint64_t*>(sOff)[((tile % kStages) * kTile + row) * 2 + which] =
            pg < 0 ? (base | kZeroFill) : base + static_cast<uint64_t>(off);
        return;
      }
      sOff[((tile % kStages) * 2 + which) * kTile + row] = pg < 0 ? int64_t(-1) : off;
    };
    auto issue = [&](int tile) {
      const int st = tile % kStages;
      const uint64_t ef = l2_evict_first_policy();
      const bool ef_on = kv_read_once(p);  // K/V evict-first only then
      if constexpr (kFast || kAbsLoader) {
        // a thread's rows are kRowStepPerChunk (a multiple of 8) apart, so every row has the same
        // swizzle: constant shared-memory offsets from the first chunk's address; both offsets
        // of a row in one 16-byte load
        static_assert(C::kRowStepPerChunk % 8 == 0, "rows of a thread must share the swizzle");
        const int off0 = swz<kCPR>(my_row0, my_chunk);
        const uint32_t sk = smem_u32(sK + st * C::kStageBytes) + off0;
        const uint32_t sv = smem_u32(sV + st * C::kStageBytes) + off0;
        const ulonglong2* offs = reinterpret_cast<const ulonglong2*>(sOff) + st * kTile + my_row0;
#pragma unroll
        for (int i = 0; i < C::kChunksPerThread; ++i) {
          const ulonglong2 o = offs[i * C::kRowStepPerChunk];
          constexpr int kStep = C::kRowStepPerChunk * kCPR * 16;  // bytes between a thread's rows
          // zero-fill rows: 0 bytes read from (cache base + chunk), inside the first row
          const int nk = 16 - (static_cast<int>(o.x >> 59) & 16), nv = 16 - (static_cast<int>(o.y >> 59) & 16);
          cp_async16_policy_if(sk + i * kStep, reinterpret_cast<const void*>((o.x & ~kZeroFill) + my_chunk * 16), nk, ef, ef_on);
          cp_async16_policy_if(sv + i * kStep, reinterpret_cast<const void*>((o.y & ~kZeroFill) + my_chunk * 16), nv, ef, ef_on);
        }
        return;
      }
      const uint32_t sk = smem_u32(sK + st * C::kStageBytes);
      const uint32_t sv = smem_u32(sV + st * C::kStageBytes);
      const int64_t* offk = sOff + (st * 2) * kTile;
      const int64_t* offv = offk + kTile;
      const unsigned char* kb = static_cast<const unsigned char*>(p.k);
      const unsigned char* vb = static_cast<const unsigned char*>(p.v);
#pragma unroll
      for (int i = 0; i < C::kChunksPerThread; ++i) {
        const int row = my_row0 + i * C::kRowStepPerChunk;
        const int off = swz<kCPR>(row, my_chunk);
        const int64_t ok = offk[row], ov = offv[row];
        cp_async16_policy_if(sk + off, ok >= 0 ? kb + ok + my_chunk * 16 : kb, ok >= 0 ? 16 : 0, ef, ef_on);
        cp_async16_policy_if(sv + off, ov >= 0 ? vb + ov + my_chunk * 16 : vb, ov >= 0 ? 16 : 0, ef, ef_on);
      }
    };

    // SMALL: the prologue's page ids are requested before Q (one round trip less per piece)
    IdxWord pgs[kStages][kOffPer];
    if constexpr (SMALL) {
      if (n_tiles > 0) {
#pragma unroll
        for (int t = 0; t < kStages; ++t)
#pragma unroll
          for (int k = 0; k < kOffPer; ++k) pgs[t][k] = load_page(t, k);
      }
    }

    // ---- rows of this thread (g and g + 8 of the warp's 16) ----
    RowInfo rinfo[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = row0 + wm * 16 + g + 8 * h;
      RowInfo& R = rinfo[h];
      R.valid = rr < rows_r;
      const int tq = R.valid ? rr / p.group : 0;
      R.tok = ri.q_start + tq;
      R.head = hk * p.group + (R.valid ? rr % p.group : 0);
      R.qpos = ri.kv_len - ri.q_len + tq;
      R.mm_s = -1;
      R.mm_e = -1;
      if (p.mm != nullptr && R.valid) {
        R.mm_s = p.mm[R.tok * p.mm_s0];
        R.mm_e = p.mm[R.tok * p.mm_s0 + p.mm_s1];
      }
    }
    // ---- per-row (token, head) table: no divisions in the Q / output loops ----
    if (tid < C::kRows) {
      const int rr = row0 + tid;
      s_rtok[tid] = rr < rows_r ? ri.q_start + rr / p.group : -1;
      s_rhead[tid] = hk * p.group + (rr < rows_r ? rr % p.group : 0);
    }
    __syncthreads();
    // ---- Q: rows staged in smem as float (independent coalesced loads), then fragments ----
    {
      float* sQ = reinterpret_cast<float*>(smem);
      constexpr int kQP = D + 4;
      if (p.q_vec) {  // 16-bit query, 16-byte rows: one uint4 (8 dims) per step
#pragma unroll 2
        for (int idx = tid; idx < C::kRows * (D / 8); idx += C::kThreads) {
          const int row = idx / (D / 8), c = idx % (D / 8);
          const int tok = s_rtok[row];
          float x[8];
          if (tok >= 0) {
            const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.q) + int64_t(tok) * p.q_st +
                                                            int64_t(s_rhead[row]) * p.q_sh + c * 8);
            const uint16_t* e = reinterpret_cast<const uint16_t*>(&v);
#pragma unroll
            for (int k = 0; k < 8; ++k) x[k] = p.q_t == Elt::bf16 ? bf16_bits_to_f32(e[k]) : f16_bits_to_f32(e[k]);
          } else {
#pragma unroll
            for (int k = 0; k < 8; ++k) x[k] = 0.f;
          }
          float4* dst = reinterpret_cast<float4*>(sQ + row * kQP + c * 8);
          dst[0] = make_float4(x[0], x[1], x[2], x[3]);
          dst[1] = make_float4(x[4], x[5], x[6], x[7]);
        }
      } else {
#pragma unroll 4
        for (int idx = tid; idx < C::kRows * D; idx += C::kThreads) {
          const int row = idx / D, d = idx % D;
          const int tok = s_rtok[row];
          sQ[row * kQP + d] = tok >= 0 ? load_q(p, tok, s_rhead[row], d) : 0.f;
        }
      }
      __syncthreads();
    }
    uint32_t qf[kKSteps][4];
    {
      const float* sQ = reinterpret_cast<const float*>(smem);
      constexpr int kQP = D + 4;
#pragma unroll
      for (int s = 0; s < kKSteps; ++s) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = wm * 16 + g + 8 * (r & 1);  // a0,a2: row g; a1,a3: row g+8
          int d0;
          if constexpr (TR::kFp8) d0 = 16 * s + 4 * t4 + ((r >> 1) ? 2 : 0);
          else d0 = 16 * s + 2 * t4 + ((r >> 1) ? 8 : 0);
          const float2 x = *reinterpret_cast<const float2*>(sQ + row * kQP + d0);
          qf[s][r] = pack2<kBf16>(x.x, x.y);
        }
      }
      __syncthreads();  // sQ aliases the pipeline buffers
    }

    float o[kNTilesO][4];
#pragma unroll
    for (int n = 0; n < kNTilesO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};

    if (n_tiles > 0) {
      // prologue: offsets of tiles 0..S-1, issue tiles 0..S-2
      if constexpr (!SMALL) {
#pragma unroll
        for (int t = 0; t < kStages; ++t)
#pragma unroll
          for (int k = 0; k < kPgPer; ++k) pgs[t][k] = load_page(t, k);
      }
#pragma unroll
      for (int t = 0; t < kStages; ++t)
#pragma unroll
        for (int k = 0; k < kPgPer; ++k) store_off(t, k, page_id(pgs[t][k]));
#pragma unroll
      for (int k = 0; k < kPgPer; ++k) {  // tiles kStages and kStages + 1: in the first group
        copy_page(kStages, k);
        copy_page(kStages + 1, k);
      }
      __syncthreads();
#pragma unroll
      for (int t = 0; t < kStages - 1; ++t) {
        if (t < n_tiles) issue(t);
        cp_async_commit();
      }
    }

    uint64_t wait_ns = 0;  // timeline only
    for (int tile = 0; tile < n_tiles; ++tile) {
      // timeline: thread 0's time in the wait and barrier below, summed over the unit's tiles
      const uint64_t t_wait = (!SMALL && tl != nullptr && tid == 0) ? gtimer() : 0;
      cp_async_wait<kStages - 2>();
      __syncthreads();
      if (t_wait != 0) wait_ns += gtimer() - t_wait;
      if (!SMALL && tl != nullptr && tile == 0) {
        if (uint64_t* r = tl_unit()) r[1] = gtimer();
      }
      {
        if constexpr (!kPgCopyAfterCommit) {
#pragma unroll
          for (int k = 0; k < kPgPer; ++k) copy_page(tile + kStages + 2, k);
        }
        const int nt = tile + kStages - 1;
        if (nt < n_tiles) issue(nt);
        cp_async_commit();
#pragma unroll
        for (int k = 0; k < kPgPer; ++k) {
          store_off(tile + kStages, k, ring_page(tile + kStages, k));  // offset slot of `tile`, issued long ago
          if constexpr (kPgCopyAfterCommit) copy_page(tile + kStages + 2, k);
        }
      }
      const int st = tile % kStages;
      const unsigned char* tK = sK + st * C::kStageBytes;
      const unsigned char* tV = sV + st * C::kStageBytes;
      const int key0 = tile0 + tile * kTile + wn * kNT;  // first key of this warp's slice

      // ---- S = Q K^T ----
      float s[kNTilesS][4];
#pragma unroll
      for (int j = 0; j < kNTilesS; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
      for (int j = 0; j < kNTilesS; ++j) {
        const int krow = wn * kNT + 8 * j + (lane & 7);
        if constexpr (!TR::kFp8) {
#pragma unroll
          for (int ks = 0; ks < kKSteps; ks += 2) {
            uint32_t b0, b1, b2, b3;
            ldsm_x4(smem_u32(tK + swz<kCPR>(krow, 2 * ks + (lane >> 3))), b0, b1, b2, b3);
            mma16816<kBf16>(s[j], qf[ks], b0, b1);
            mma16816<kBf16>(s[j], qf[ks + 1], b2, b3);
          }
        } else {
          if constexpr (kKSteps >= 4) {
#pragma unroll
            for (int ks = 0; ks < kKSteps; ks += 4) {
              uint32_t r[4];
              ldsm_x4(smem_u32(tK + swz<kCPR>(krow, ks + (lane >> 3))), r[0], r[1], r[2], r[3]);
#pragma unroll
              for (int u = 0; u < 4; ++u) {
                uint32_t b0, b1;
                if constexpr (kFast) {
                  fp8x4_to_f16x2x2<TR::kE4m3>(r[u], b0, b1);
                } else {
                  b0 = fp8x2_to_f16x2<TR::kE4m3>(r[u], 0x1404u);
                  b1 = fp8x2_to_f16x2<TR::kE4m3>(r[u], 0x3424u);
                }
                mma16816<false>(s[j], qf[ks + u], b0, b1);
              }
            }
          }
        }
      }
      // ---- scale, soft cap, mask ----
      const int tile_lo = tile0 + tile * kTile, tile_hi = tile_lo + kTile;
      bool full = tile_lo >= kstart && tile_hi <= kend;
      if (p.causal && p.xqa == nullptr) full = full && (tile_hi - 1 <= qpos_first);
      if (p.xqa != nullptr) full = full && (tile_hi <= ri.kv_len - ri.q_len);
      if (p.window_left >= 0) full = full && (int64_t(tile_lo) >= int64_t(qpos_last) - p.window_left);
#pragma unroll
      for (int j = 0; j < kNTilesS; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[j][e];
          if (softcap) x = p.soft_cap * tanhf(x * scale_lin / p.soft_cap) * kLog2e;
          else x *= scale_log2;
          if (!full) {
            const RowInfo& R = rinfo[e >> 1];
            const int key = key0 + 8 * j + 2 * t4 + (e & 1);
            bool vis = R.valid && key >= kstart && key < kend;
            if (vis && p.window_left >= 0 && int64_t(key) < int64_t(R.qpos) - p.window_left) vis = false;
            if (vis) {
              const int dstart = ri.kv_len - ri.q_len;
              if (p.xqa != nullptr && key >= dstart) {
                const int kk = key - dstart;
                const uint32_t word = static_cast<uint32_t>(p.xqa[R.tok * p.xqa_s0 + int64_t(kk >> 5) * p.xqa_s1]);
                vis = ((word >> (kk & 31)) & 1u) != 0;
              } else if (p.xqa == nullptr && p.causal && key > R.qpos) {
                vis = R.mm_s >= 0 && key >= R.mm_s && key <= R.mm_e;
              }
            }
            if (!vis) x = -INFINITY;
          }
          s[j][e] = x;
        }
      }
      // ---- online softmax (rows g and g+8) ----
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < kNTilesS; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_r[h], mx);
        const float m_use = (m_new == -INFINITY) ? 0.f : m_new;
        alpha[h] = kFast ? ex2_ftz(m_r[h] - m_use) : exp2f(m_r[h] - m_use);
        m_r[h] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kNTilesS; ++j) {
          if constexpr (kFast) {
            s[j][2 * h] = ex2_ftz(s[j][2 * h] - m_use);
            s[j][2 * h + 1] = ex2_ftz(s[j][2 * h + 1] - m_use);
          } else {
            s[j][2 * h] = exp2f(s[j][2 * h] - m_use);
            s[j][2 * h + 1] = exp2f(s[j][2 * h + 1] - m_use);
          }
          sum += s[j][2 * h] + s[j][2 * h + 1];
        }
        l_r[h] = l_r[h] * alpha[h] + sum;
      }
      // rescale O only when some row's running max moved (rare after the first tiles)
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int n = 0; n < kNTilesO; ++n) {
          o[n][0] *= alpha[0];
          o[n][1] *= alpha[0];
          o[n][2] *= alpha[1];
          o[n][3] *= alpha[1];
        }
      }
      // ---- O += P V ----
#pragma unroll
      for (int kk = 0; kk < kNT / 16; ++kk) {
        uint32_t a[4];
        a[0] = pack2<kBf16>(s[2 * kk][0], s[2 * kk][1]);
        a[1] = pack2<kBf16>(s[2 * kk][2], s[2 * kk][3]);
        a[2] = pack2<kBf16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[3] = pack2<kBf16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        const int vrow = wn * kNT + 16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8;
        if constexpr (!TR::kFp8) {
#pragma unroll
          for (int n = 0; n < kNTilesO; n += 2) {
            uint32_t b0, b1, b2, b3;
            ldsm_x4_t(smem_u32(tV + swz<kCPR>(vrow, n + (lane >> 4))), b0, b1, b2, b3);
            mma16816<kBf16>(o[n], a, b0, b1);
            mma16816<kBf16>(o[n + 1], a, b2, b3);
          }
        } else {
#pragma unroll
          for (int c = 0; c < kCPR; c += 2) {
            uint32_t r0, r1, r2, r3;
            ldsm_x4_t(smem_u32(tV + swz<kCPR>(vrow, c + (lane >> 4))), r0, r1, r2, r3);
            // chunk c -> o tiles 2c (even dims), 2c+1 (odd dims); chunk c+1 -> 2c+2, 2c+3
            if constexpr (kFast) {
              uint32_t e0, o0, e1, o1, e2, o2, e3, o3;
              fp8x4_to_f16x2x2_eo<TR::kE4m3>(r0, e0, o0);
              fp8x4_to_f16x2x2_eo<TR::kE4m3>(r1, e1, o1);
              fp8x4_to_f16x2x2_eo<TR::kE4m3>(r2, e2, o2);
              fp8x4_to_f16x2x2_eo<TR::kE4m3>(r3, e3, o3);
              mma16816<false>(o[2 * c], a, e0, e1);
              mma16816<false>(o[2 * c + 1], a, o0, o1);
              mma16816<false>(o[2 * c + 2], a, e2, e3);
              mma16816<false>(o[2 * c + 3], a, o2, o3);
              continue;
            }
            mma16816<false>(o[2 * c], a, fp8x2_to_f16x2<TR::kE4m3>(r0, 0x2404u),
                            fp8x2_to_f16x2<TR::kE4m3>(r1, 0x2404u));
            mma16816<false>(o[2 * c + 1], a, fp8x2_to_f16x2<TR::kE4m3>(r0, 0x3414u),
                            fp8x2_to_f16x2<TR::kE4m3>(r1, 0x3414u));
            mma16816<false>(o[2 * c + 2], a, fp8x2_to_f16x2<TR::kE4m3>(r2, 0x2404u),
                            fp8x2_to_f16x2<TR::kE4m3>(r3, 0x2404u));
            mma16816<false>(o[2 * c + 3], a, fp8x2_to_f16x2<TR::kE4m3>(r2, 0x3414u),
                            fp8x2_to_f16x2<TR::kE4m3>(r3, 0x3414u));
          }
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // pipeline smem is free
    if (!SMALL && tl != nullptr) {
      if (uint64_t* r = tl_unit()) r[2] = gtimer();
    }

    // ---- epilogue: combine the WN warps of each row, normalise, write ----
    float* sO = reinterpret_cast<float*>(smem);
    float* sM = sO + WN * C::kRows * C::kEpiPitch;
    float* sL = sM + WN * C::kRows;
    float* sF = sL + WN * C::kRows;  // per (warp, row) factor
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_r[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      l_r[h] = l;
    }
    {
      float* myO = sO + (wn * C::kRows + wm * 16) * C::kEpiPitch;
#pragma unroll
      for (int n = 0; n < kNTilesO; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = g + 8 * (e >> 1);
          int dim;
          if constexpr (TR::kFp8) {
            const int c = n >> 1, par = n & 1;
            dim = 16 * c + 4 * t4 + 2 * (e & 1) + par;
          } else {
            dim = 8 * n + 2 * t4 + (e & 1);
          }
          myO[row * C::kEpiPitch + dim] = o[n][e];
        }
      }
      if (t4 == 0) {
        sM[wn * C::kRows + wm * 16 + g] = m_r[0];
        sM[wn * C::kRows + wm * 16 + g + 8] = m_r[1];
        sL[wn * C::kRows + wm * 16 + g] = l_r[0];
        sL[wn * C::kRows + wm * 16 + g + 8] = l_r[1];
      }
    }
    __syncthreads();
    // partial slot of this piece / whether its unit has several pieces (SK: from shared memory)
    auto slot_of = [&]() -> int {
      if constexpr (SK) return s_sk.slot;
      else return it.split;
    };
    bool split_run;
    if constexpr (SK) split_run = s_sk.pieces > 1;
    else split_run = ri.splits > 1;
    for (int row = tid; row < C::kRows; row += C::kThreads) {
      float M = -INFINITY;
      for (int x = 0; x < WN; ++x) M = fmaxf(M, sM[x * C::kRows + row]);
      const float Mu = (M == -INFINITY) ? 0.f : M;
      float L = 0.f;
      for (int x = 0; x < WN; ++x) {
        const float f = exp2f(sM[x * C::kRows + row] - Mu);
        sF[x * C::kRows + row] = f;
        L += sL[x * C::kRows + row] * f;
      }
      // final scale of O and the row's LSE
      const int rr = row0 + row;
      float scale_o = 0.f, lse2 = -INFINITY;
      if (rr < rows_r) {
        const int head = hk * p.group + rr % p.group;
        if (!split_run) {
          float Mf = M, Lf = L;
          if (p.sinks != nullptr) {
            const float s2 = p.sinks[int64_t(head) * p.sinks_s] * kLog2e;
            Mf = fmaxf(M, s2);
            Lf = L * exp2f(M - Mf) + exp2f(s2 - Mf);
            scale_o = Lf > 0.f ? exp2f(Mu - Mf) / Lf : 0.f;
            if (M == -INFINITY) scale_o = 0.f;
          } else {
            scale_o = L > 0.f ? 1.f / L : 0.f;
          }
          lse2 = Lf > 0.f ? Mf + log2f(Lf) : -INFINITY;
          scale_o *= p.v_scale * kv_out_factor;
          if (p.lse != nullptr) {
            const int64_t tok = ri.q_start + rr / p.group;
            p.lse[tok * p.lse_st + int64_t(head) * p.lse_sh] = p.lse_natural ? lse2 * kLn2 : lse2;
          }
        } else {
          scale_o = L > 0.f ? 1.f / L : 0.f;
          lse2 = L > 0.f ? M + log2f(L) : -INFINITY;
          const int64_t tok = ri.q_start + rr / p.group;
          plan.part_lse[(int64_t(slot_of()) * p.num_tokens + tok) * p.hq + head] = lse2;
        }
      }
      sM[row] = scale_o;  // reuse: row 0..kRows of warp slot 0 (already consumed)
    }
    __syncthreads();
    // thread per (row, 8 dims): sum the WN warps' partial O, scale, store
    for (int idx = tid; idx < C::kRows * (D / 8); idx += C::kThreads) {
      const int row = idx / (D / 8), c = idx % (D / 8);
      const int tok = s_rtok[row];
      if (tok < 0) continue;
      const int head = s_rhead[row];
      float acc[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] = 0.f;
#pragma unroll
      for (int x = 0; x < WN; ++x) {
        const float f = sF[x * C::kRows + row];
        const float* src = sO + (x * C::kRows + row) * C::kEpiPitch + c * 8;
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[k] += src[k] * f;
      }
      const float sc = sM[row];
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] *= sc;
      if (split_run) {
        float4* dst = reinterpret_cast<float4*>(plan.part_o + ((int64_t(slot_of()) * p.num_tokens + tok) * p.hq + head) * D + c * 8);
        dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
      } else if (p.o_vec) {
        uint4 v;
        uint32_t* w = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (p.out_t == Elt::bf16) {
            __nv_bfloat162 h = __floats2bfloat162_rn(acc[2 * k], acc[2 * k + 1]);
            w[k] = *reinterpret_cast<uint32_t*>(&h);
          } else {
            __half2 h = __floats2half2_rn(acc[2 * k], acc[2 * k + 1]);
            w[k] = *reinterpret_cast<uint32_t*>(&h);
          }
        }
        *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + int64_t(tok) * p.o_st + int64_t(head) * p.o_sh + c * 8) = v;
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k)
          store_elt(p.out, int64_t(tok) * p.o_st + int64_t(head) * p.o_sh + int64_t(c * 8 + k) * p.o_sd, p.out_t, acc[k]);
      }
    }
    __syncthreads();  // smem reused by the next work unit
    if (!SMALL && tl != nullptr) {
      if (uint64_t* r = tl_unit()) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        r[3] = gtimer();
        r[4] = uint64_t(smid) | (uint64_t(blockIdx.x) << 16) | (uint64_t(n_tiles) << 40);
        r[5] = wait_ns;
      }
    }
    if constexpr (SMALL) {
      if (split_run) {
        // the last piece of this unit to arrive merges the unit's pieces (threadFenceReduction
        // pattern): every thread's partial stores are made visible before thread 0 counts the
        // arrival; the counter is put back to 0 by the last arrival, so the next launch (or
        // CUDA-graph replay) finds it at 0
        __threadfence();
        __syncthreads();
        if (tid == 0) {
          int32_t* ctr = plan.small_ctr + s_sm.uex[it.req] + it.rtile * p.hkv + hk;
          const int last = atomicAdd(ctr, 1) == ri.splits - 1;
          if (last) atomicExch(ctr, 0);
          s_work = last;
        }
        __syncthreads();
        if (s_work) {
          __threadfence();
          const int nrows = min(C::kRows, rows_r - row0);
          small_merge<D, C::kRows, C::kThreads>(p, plan, ri.splits, nrows, s_rtok, s_rhead, kv_out_factor, smem,
                                                C::kSmemMain);
        }
        __syncthreads();
      }
      break;  // one piece per CTA (the per-CTA plan keeps the pieces within the grid)
    }
  }
}

// Combine the splits of split requests: one warp per (token, qo head); lane s holds split
// s's LSE (and s + 32, ...).  Two dependent round trips: the token's split count, then every
// LSE and (for <= kMergeRegSplits splits, D <= 128) every partial O vector at once — lane l
// holds dims 4l..4l+3 of each split (v6 walked the dims in 4 serial rounds after the LSEs:
// ~10-13 us for 128 x 4096 in the decode timeline).
constexpr int kMergeRegSplits = 8;
// SK (stream-K decode): plan.tok_splits is the per-(token, qo head) piece-count map.
template <bool SK = false>
__device__ __forceinline__ void merge_splits_body(const AttnParams& p, const Plan& plan, float kv_out_factor) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= p.num_tokens * p.hq) return;
  const int64_t tok = row / p.hq;
  const int head = static_cast<int>(row % p.hq);
  const int ns = plan.tok_splits[SK ? row : tok];  // stream-K: the (token, qo head) map
  if (ns <= 1) return;
  const int64_t stride = p.num_tokens * p.hq;  // between splits
  const int64_t base = tok * p.hq + head;
  const bool in_regs = ns <= kMergeRegSplits && p.head_dim <= 128;
  const int d4 = 4 * lane;
  float4 v[kMergeRegSplits];
  if (in_regs && d4 < p.head_dim) {
#pragma unroll
    for (int s = 0; s < kMergeRegSplits; ++s)
      if (s < ns) v[s] = __ldcg(reinterpret_cast<const float4*>(plan.part_o + (s * stride + base) * p.head_dim + d4));
  }
  constexpr int kMaxPerLane = 4;  // up to 128 splits
  float ls[kMaxPerLane];
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int s = lane + 32 * k;
    ls[k] = s < ns ? plan.part_lse[s * stride + base] : -INFINITY;
  }
  float M = -INFINITY;
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) M = fmaxf(M, ls[k]);
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  float s2 = -INFINITY;
  if (p.sinks != nullptr) s2 = p.sinks[int64_t(head) * p.sinks_s] * kLog2e;
  const float Mf = fmaxf(M, s2);
  const float Mu = (Mf == -INFINITY) ? 0.f : Mf;
  __shared__ float s_w[8][128];  // blockDim 256 = 8 warps, up to 128 splits
  float* sw = s_w[(threadIdx.x >> 5) & 7];
  float denom = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const float w = exp2f(ls[k] - Mu);
    if (lane + 32 * k < 128) sw[lane + 32 * k] = w;
    denom += w;
  }
  __syncwarp();
  for (int o = 16; o > 0; o >>= 1) denom += __shfl_xor_sync(0xffffffffu, denom, o);
  if (p.sinks != nullptr) denom += exp2f(s2 - Mu);
  const float lse2 = denom > 0.f ? Mu + log2f(denom) : -INFINITY;
  const float inv = (denom > 0.f && M != -INFINITY) ? p.v_scale * kv_out_factor / denom : 0.f;
  const int64_t ob = tok * p.o_st + int64_t(head) * p.o_sh;
  if (in_regs) {
    if (d4 < p.head_dim) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int s = 0; s < kMergeRegSplits; ++s) {
        if (s < ns) {
          const float w = sw[s];
          acc.x += w * v[s].x; acc.y += w * v[s].y; acc.z += w * v[s].z; acc.w += w * v[s].w;
        }
      }
      store_elt(p.out, ob + int64_t(d4) * p.o_sd, p.out_t, acc.x * inv);
      store_elt(p.out, ob + int64_t(d4 + 1) * p.o_sd, p.out_t, acc.y * inv);
      store_elt(p.out, ob + int64_t(d4 + 2) * p.o_sd, p.out_t, acc.z * inv);
      store_elt(p.out, ob + int64_t(d4 + 3) * p.o_sd, p.out_t, acc.w * inv);
    }
  } else {
    // many splits or D 256: dims in rounds of 32 (every split wrote its partial, zeros when
    // empty, so the loads are unconditional and independent)
    for (int d0 = 0; d0 < p.head_dim; d0 += 32) {
      const int d = d0 + lane;
      float acc = 0.f;
#pragma unroll 8
      for (int s = 0; s < ns; ++s) acc += sw[s] * plan.part_o[(s * stride + base) * p.head_dim + d];
      store_elt(p.out, ob + int64_t(d) * p.o_sd, p.out_t, acc * inv);
    }
  }
  if (lane == 0 && p.lse != nullptr)
    p.lse[tok * p.lse_st + int64_t(head) * p.lse_sh] = p.lse_natural ? lse2 * kLn2 : lse2;
}
__global__ void merge_splits_kernel(AttnParams p, Plan plan, float kv_out_factor) {
  if (p.kv_t == Elt::e4m3) kv_out_factor = kE4m3Factor;  // same factor as the attention kernel
  if (plan.tl != nullptr && threadIdx.x == 0) atomicMin(reinterpret_cast<unsigned long long*>(plan.tl + 2), gtimer());
  merge_splits_body(p, plan, kv_out_factor);
  if (plan.tl != nullptr) {
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned long long*>(plan.tl + 3), gtimer());
  }
}
__global__ void merge_streamk_kernel(AttnParams p, Plan plan, float kv_out_factor) {
  if (p.kv_t == Elt::e4m3) kv_out_factor = kE4m3Factor;
  merge_splits_body<true>(p, plan, kv_out_factor);
}

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
  // stream-K tables, reserved for every v6 decode-config call so the knob can change between
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

// ---- v6-path knobs (environment, read once; tests and benchmarks set them directly) ----------
// Plan::opts of the v6 path: kOptWaveSplits unless KVATTN_DECODE_SPLIT_RULE=v6 (the v6 rule
// for every call; `waves`, the default, is the measured-faster side).
// kOptFp8Fast (the fp8 fast variant of the decode config) unless KVATTN_FP8_FAST=0 (default on
// fp8 256 x 8192 1257 vs 1592 us in one process on an H200).
// kOptRemSplits (non-dividing chunks for uniform lengths) unless KVATTN_DECODE_REM_SPLITS=0.
// kOptStreamKFp8 (stream-K for fp8 caches with a pair per CTA) unless KVATTN_DECODE_STREAMK_FP8=0.
constexpr int kDefaultDecodeOpts = kOptWaveSplits | kOptFp8Fast | kOptRemSplits | kOptStreamKFp8 | kOptStreamKMixed;
constexpr int kDecodeOptsMask =
    kOptWaveSplits | kOptFp8Fast | kOptRemSplits | kOptStreamK | kOptStreamKFp8 | kOptStreamKMixed;
std::atomic<int> g_decode_opts{-1};
int decode_opts_now() {
  int m = g_decode_opts.load(std::memory_order_relaxed);
  if (m >= 0) return m;
  m = kDefaultDecodeOpts;
  if (const char* e = std::getenv("KVATTN_DECODE_SPLIT_RULE"))
    m = (m & ~kOptWaveSplits) | (std::strcmp(e, "v6") == 0 ? 0 : kOptWaveSplits);
  if (const char* e = std::getenv("KVATTN_FP8_FAST")) m = std::atoi(e) == 0 ? (m & ~kOptFp8Fast) : (m | kOptFp8Fast);
  if (const char* e = std::getenv("KVATTN_DECODE_REM_SPLITS"))
    m = std::atoi(e) == 0 ? (m & ~kOptRemSplits) : (m | kOptRemSplits);
  // KVATTN_DECODE_STREAMK=1: stream-K schedule of the decode config (default off)
  if (const char* e = std::getenv("KVATTN_DECODE_STREAMK")) m = std::atoi(e) == 0 ? (m & ~kOptStreamK) : (m | kOptStreamK);
  if (const char* e = std::getenv("KVATTN_DECODE_STREAMK_FP8"))
    m = std::atoi(e) == 0 ? (m & ~kOptStreamKFp8) : (m | kOptStreamKFp8);
  if (const char* e = std::getenv("KVATTN_DECODE_STREAMK_MIXED"))
    m = std::atoi(e) == 0 ? (m & ~kOptStreamKMixed) : (m | kOptStreamKMixed);
  g_decode_opts.store(m, std::memory_order_relaxed);
  return m;
}
// A non-negative count knob: the setter's value, else the environment variable's (read once;
// unset, negative or not a number: 0).  -1 in `g` = not read yet.
int count_knob(std::atomic<int>& g, const char* env) {
  int m = g.load(std::memory_order_relaxed);
  if (m >= 0) return m;
  m = 0;
  if (const char* e = std::getenv(env)) m = std::max(0, std::atoi(e));
  g.store(m, std::memory_order_relaxed);
  return m;
}
// KVATTN_DECODE_SPLITS: cut every request of a v6-path call into this many KV chunks (0 = the
// plan kernel's rule).  A measurement knob: how the time depends on the unit count.
std::atomic<int> g_decode_splits{-1};
int decode_splits_now() { return count_knob(g_decode_splits, "KVATTN_DECODE_SPLITS"); }
// KVATTN_DECODE_CHUNK_TILES: uniform-length calls under the remainder rule (option bit 8) take
// units of this many tiles (the last one per request shorter, handed out after all long ones)
// instead of the model's choice (0 = the model).  A measurement knob for the tail.
std::atomic<int> g_decode_chunk{-1};
int decode_chunk_now() { return count_knob(g_decode_chunk, "KVATTN_DECODE_CHUNK_TILES"); }

// KVATTN_DECODE_TIMELINE=N: the Nth v6-path call (of the process, or since the last knob setter) records %globaltimer stamps (plan kernel
// start/end, each CTA's entry/exit, each unit's start / first tile ready / tile loop done / end,
// merge first start / last end), synchronises and prints a summary to stderr.  Debug only: the
// reported call syncs the device (not capturable), the other calls run unchanged.
int timeline_every() {
  static const int v = [] {
    const char* e = std::getenv("KVATTN_DECODE_TIMELINE");
    return e != nullptr ? std::max(0, std::atoi(e)) : 0;
  }();
  return v;
}
constexpr int kTlCap = 1 << 20;  // unit records
uint64_t* timeline_buffer(int grid) {
  static uint64_t* buf = nullptr;
  static int64_t words = 0;
  const int64_t need = kTlHeader + 2 * int64_t(grid) + int64_t(kTlCap) * kTlUnitWords;
  if (words < need) {
    if (buf != nullptr) cudaFree(buf);
    buf = nullptr;
    words = 0;
    if (cudaMalloc(&buf, size_t(need) * 8) != cudaSuccess) { (void)cudaGetLastError(); return nullptr; }
    words = need;
  }
  cudaMemset(buf, 0, size_t(need) * 8);
  const uint64_t init[4] = {0, 0, ~0ull, 0};
  cudaMemcpy(buf, init, sizeof(init), cudaMemcpyHostToDevice);
  return buf;
}
void timeline_report(const AttnParams& p, const Plan& plan, int grid, uint64_t* dbuf, double tile_bytes) {
  cudaDeviceSynchronize();
  int32_t items = 0, chunk = 0;
  cudaMemcpy(&items, plan.num_items, 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(&chunk, plan.chunk, 4, cudaMemcpyDeviceToHost);
  const int64_t units = std::min<int64_t>(int64_t(items) * p.hkv, kTlCap);
  std::vector<uint64_t> h(size_t(kTlHeader + 2 * int64_t(grid) + units * kTlUnitWords));
  cudaMemcpy(h.data(), dbuf, h.size() * 8, cudaMemcpyDeviceToHost);
  const double t0 = double(h[0]);
  auto us = [&](uint64_t t) { return (double(t) - t0) * 1e-3; };
  double ent_min = 1e30, ent_max = 0, ex_min = 1e30, ex_max = 0, ex_sum = 0;
  for (int c = 0; c < grid; ++c) {
    const double a = us(h[kTlHeader + 2 * c]), b = us(h[kTlHeader + 2 * c + 1]);
    ent_min = std::min(ent_min, a); ent_max = std::max(ent_max, a);
    ex_min = std::min(ex_min, b); ex_max = std::max(ex_max, b); ex_sum += b;
  }
  const uint64_t* u = h.data() + kTlHeader + 2 * grid;
  double chain = 0, loop = 0, epi = 0, busy = 0, tiles = 0, n = 0, nt = 0;
  std::vector<double> chains;
  std::vector<std::pair<uint64_t, int64_t>> order;  // (cta << 40 | start) per unit
  std::vector<int> per_cta(size_t(grid), 0);
  for (int64_t w = 0; w < units; ++w) {
    const uint64_t* r = u + w * kTlUnitWords;
    if (r[0] == 0 || r[3] == 0) continue;
    const int cta = int((r[4] >> 16) & 0xffffff);
    const int64_t ntl = int64_t(r[4] >> 40);
    n += 1;
    busy += (double(r[3]) - double(r[0])) * 1e-3;
    epi += (double(r[3]) - double(r[2])) * 1e-3;
    if (ntl > 0 && r[1] != 0) {
      const double c = (double(r[1]) - double(r[0])) * 1e-3;
      chain += c;
      chains.push_back(c);
      loop += (double(r[2]) - double(r[1])) * 1e-3;
      tiles += double(ntl);
      nt += 1;
    }
    if (cta < grid) per_cta[size_t(cta)]++;
    order.push_back({(uint64_t(cta) << 44) | (r[0] - h[0]), w});
  }
  std::sort(order.begin(), order.end());
  double gap = 0, ngap = 0;
  for (size_t i = 1; i < order.size(); ++i) {
    if ((order[i].first >> 44) != (order[i - 1].first >> 44)) continue;
    const uint64_t* a = u + order[i - 1].second * kTlUnitWords;
    const uint64_t* b = u + order[i].second * kTlUnitWords;
    gap += (double(b[0]) - double(a[3])) * 1e-3;
    ngap += 1;
  }
  std::sort(chains.begin(), chains.end());
  auto pct = [&](double q) { return chains.empty() ? 0.0 : chains[size_t(q * double(chains.size() - 1))]; };
  const int pc_min = grid > 0 ? *std::min_element(per_cta.begin(), per_cta.end()) : 0;
  const int pc_max = grid > 0 ? *std::max_element(per_cta.begin(), per_cta.end()) : 0;
  const double span = ex_max - ent_min;
  const bool merged = h[2] != ~0ull && h[3] != 0;
  std::fprintf(stderr,
               "[timeline] batch %lld tokens %lld grid %d units %lld chunk %d keys | plan %.1f us, gap to attn %.1f us"
               " | attn span %.1f us (CTA entries %.1f..%.1f, exits %.1f..%.1f, mean exit %.1f) | merge %s%.1f us after"
               " attn, %.1f us long | total %.1f us\n",
               (long long)p.batch, (long long)p.num_tokens, grid, (long long)n, chunk, us(h[1]), ent_min - us(h[1]),
               span, ent_min, ent_max, ex_min, ex_max, ex_sum / std::max(grid, 1), merged ? "" : "(none) ",
               merged ? us(h[2]) - ex_max : 0.0, merged ? us(h[3]) - us(h[2]) : 0.0,
               merged ? us(h[3]) : ex_max);
  if (h[4] != 0 && h[5] != 0)
    std::fprintf(stderr, "[timeline]   plan kernel: index words loaded and reduced %.1f us, chunk chosen %.1f us, items written %.1f us\n",
                 us(h[4]), us(h[5]), us(h[1]));
  std::fprintf(stderr,
               "[timeline]   per unit: start->first tile %.2f us (p10 %.2f p50 %.2f p90 %.2f), tile loop %.2f us"
               " (%.1f tiles, %.3f us/tile), epilogue %.2f us, between units %.2f us | units/CTA %d..%d | CTA time"
               " in units %.1f %%, in tile loops %.1f %%, idle after own exit %.1f %%\n",
               nt > 0 ? chain / nt : 0.0, pct(0.1), pct(0.5), pct(0.9), nt > 0 ? loop / nt : 0.0,
               nt > 0 ? tiles / nt : 0.0, tiles > 0 ? loop / tiles : 0.0, n > 0 ? epi / n : 0.0,
               ngap > 0 ? gap / ngap : 0.0, pc_min, pc_max, 100.0 * busy / (grid * span),
               100.0 * loop / (grid * span), 100.0 * (grid * ex_max - ex_sum) / (grid * span));
  // K/V read rate over the attention span, in 20 bins: each unit's tiles spread evenly over its
  // tile loop (first tile ready .. loop done), with the CTAs in a tile loop per bin (where the
  // call falls under the loop rate: the start, the tail)
  constexpr int kBins = 20;
  if (span > 0) {
    double tl_tiles[kBins] = {}, tl_ctas[kBins] = {};
    const double bw = span / kBins;
    for (int64_t w = 0; w < units; ++w) {
      const uint64_t* r = u + w * kTlUnitWords;
      const int64_t ntl = int64_t(r[4] >> 40);
      if (r[0] == 0 || r[1] == 0 || r[2] == 0 || ntl <= 0) continue;
      const double a = us(r[1]) - ent_min, b = us(r[2]) - ent_min;
      if (b <= a) continue;
      for (int i = std::max(0, int(a / bw)); i < kBins && i * bw < b; ++i) {
        const double ov = std::min(b, (i + 1) * bw) - std::max(a, i * bw);
        if (ov <= 0) continue;
        tl_tiles[i] += double(ntl) * ov / (b - a);
        tl_ctas[i] += ov / bw;
      }
    }
    std::string rates, ctas;
    for (int i = 0; i < kBins; ++i) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), " %.2f", tl_tiles[i] * tile_bytes / (bw * 1e-6) / 1e12);
      rates += buf;
      std::snprintf(buf, sizeof(buf), " %.0f", tl_ctas[i]);
      ctas += buf;
    }
    std::fprintf(stderr, "[timeline]   TB/s by 5 %% of the span:%s\n[timeline]   CTAs in tile loops:   %s\n",
                 rates.c_str(), ctas.c_str());
    // thread 0's wait for each tile (cp.async wait + barrier), of all units and of the units whose
    // tile loop ends in the last 10 % of the span (few CTAs streaming: a tile's own latency)
    double w_all = 0, t_all = 0, w_end = 0, t_end = 0;
    for (int64_t w = 0; w < units; ++w) {
      const uint64_t* r = u + w * kTlUnitWords;
      const int64_t ntl = int64_t(r[4] >> 40);
      if (r[0] == 0 || r[2] == 0 || ntl <= 0) continue;
      w_all += double(r[5]) * 1e-3;
      t_all += double(ntl);
      if (us(r[2]) - ent_min > 0.9 * span) { w_end += double(r[5]) * 1e-3; t_end += double(ntl); }
    }
    std::fprintf(stderr, "[timeline]   wait per tile %.3f us (all units), %.3f us (loops ending in the last 10 %%)\n",
                 t_all > 0 ? w_all / t_all : 0.0, t_end > 0 ? w_end / t_end : 0.0);
  }
}
std::atomic<int64_t> g_v6_calls{0};

std::atomic<int64_t> g_streamk_launches{0};
// Stream-K decode (kOptStreamK): plan_streamk_kernel, attn_kernel<..., SK>, merge_streamk_kernel.
// No timeline in this mode (KVATTN_DECODE_TIMELINE prints that it is off).
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
  const int tl_every = timeline_every();
  if (tl_every > 0 && g_v6_calls.fetch_add(1, std::memory_order_relaxed) + 1 == tl_every)
    std::fprintf(stderr, "[timeline] off in stream-K mode (KVATTN_DECODE_STREAMK): no report for this call\n");
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
  if (e == cudaSuccess) g_streamk_launches.fetch_add(1, std::memory_order_relaxed);
  return static_cast<int>(e);
}
// Stream-K runs for the decode config of the v6 path with room for >= 4 partial slots per row
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
  const int tl_every = timeline_every();
  if (tl_every > 0 && g_v6_calls.fetch_add(1, std::memory_order_relaxed) + 1 == tl_every) {
    if (s.reuse_plan) {
      std::fprintf(stderr, "[timeline] call %d reused a kept plan (no plan kernel): no report for this call\n", tl_every);
    } else {
      plan.tl = timeline_buffer(s.grid);
      plan.tl_cap = plan.tl != nullptr ? kTlCap : 0;
    }
  }
  cudaError_t e = cudaSuccess;
  if (!s.reuse_plan) {  // a kept plan (PagedAttentionPlan) holds the tables already
    plan_kernel<C::kRows, C::kTile><<<1, kPlanThreads>>>(p, plan, s.max_splits, s.max_items, s.target_ctas,
                                                        s.max_splits > 1, decode_splits_now(), decode_chunk_now());
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
  if (plan.tl != nullptr && e == cudaSuccess) timeline_report(p, plan, s.grid, plan.tl, 2.0 * C::kStageBytes);
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

std::atomic<int> g_small_mode{-1};  // SmallDecodeMode, -1 = not read from the environment yet
std::atomic<int64_t> g_small_launches{0};
int small_mode_now() { return knob(g_small_mode, "KVATTN_SMALL_DECODE", off_or_force); }
// Fewest KV tiles per piece on the small path (KVATTN_SMALL_MIN_TILES, default 1).
int small_min_tiles() {
  static const int v = [] {
    const char* e = std::getenv("KVATTN_SMALL_MIN_TILES");
    const int x = e != nullptr ? std::atoi(e) : 1;
    return x >= 1 ? x : 1;
  }();
  return v;
}

template <typename KV, int D, int WM, int WN>
int run_small(const AttnParams& p, const AttnPlanShape& s, Plan plan, float lf, float of) {
  if (s.cluster > 0) {  // the cluster kernel (small_decode.cu) covers this call
    const int e = launch_cluster_decode(p, s.cluster);
    if (e == 0) g_small_launches.fetch_add(1, std::memory_order_relaxed);
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
  plan.small_min_tiles = small_min_tiles();
  kern<<<s.grid, C::kThreads, C::kSmem>>>(p, plan, lf, of);
  g_small_launches.fetch_add(1, std::memory_order_relaxed);
  return static_cast<int>(cudaGetLastError());
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

std::atomic<int64_t> g_fp8_fast_launches{0};
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
        if (e == 0) g_fp8_fast_launches.fetch_add(1, std::memory_order_relaxed);
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
  const int mode = small_mode_now();
  if (s->config == 0 && mode != 1 && p.batch <= kSmallMaxBatch) {
    const int64_t units = rtiles * p.hkv;
    AttnPlanShape t = *s;
    t.small = 1;
    int occ_s = 1;
    e = dispatch(p, &t, nullptr, true, &occ_s);
    if (e != 0) return e;
    const int64_t grid_s = std::max(1, num_sms * occ_s);
    // one piece per CTA: the per-CTA plan needs units < grid (force) and is given room for
    // >= 2 pieces per unit on average (automatic)
    if (units < grid_s && (mode == 2 || 2 * units <= grid_s)) {
      s->small = 1;
      s->grid = static_cast<int>(grid_s);
      s->target_ctas = s->grid;
      s->max_splits = static_cast<int>(std::min<int64_t>(smax, kSmallMaxSplits));
      s->small_units = static_cast<int>(units);
      s->max_items = rtiles;
      s->cluster = cluster_decode_pieces(p, num_sms, mode == 2);  // 0: attn_kernel<..., SMALL> runs it
    }
  }
  const WsLayout w = ws_layout(p, *s);
  s->plan_bytes = w.plan_total;
  s->scratch_bytes = w.scratch_total;
  s->workspace_bytes = w.plan_total + w.scratch_total;
  return 0;
}

// (the setters restart the timeline's call count, so each setting gets its own report)
void set_decode_options(int opts) {
  g_decode_opts.store(opts & kDecodeOptsMask, std::memory_order_relaxed);
  g_v6_calls.store(0, std::memory_order_relaxed);
}
int decode_options() { return decode_opts_now(); }
void set_decode_splits(int n) {
  g_decode_splits.store(std::max(0, n), std::memory_order_relaxed);
  g_v6_calls.store(0, std::memory_order_relaxed);
}
int decode_splits() { return decode_splits_now(); }
void set_decode_chunk(int tiles) {
  g_decode_chunk.store(std::max(0, tiles), std::memory_order_relaxed);
  g_v6_calls.store(0, std::memory_order_relaxed);
}
int decode_chunk() { return decode_chunk_now(); }
void set_small_decode_mode(SmallDecodeMode m) { g_small_mode.store(static_cast<int>(m), std::memory_order_relaxed); }
SmallDecodeMode small_decode_mode() { return static_cast<SmallDecodeMode>(small_mode_now()); }
int64_t small_decode_launches() { return g_small_launches.load(std::memory_order_relaxed); }
int64_t fp8_fast_launches() { return g_fp8_fast_launches.load(std::memory_order_relaxed); }
int64_t rem_split_plans() {
  unsigned long long n = 0;
  if (cudaMemcpyFromSymbol(&n, g_rem_split_plans, sizeof(n)) != cudaSuccess) return -1;
  return static_cast<int64_t>(n);
}
int64_t streamk_launches() { return g_streamk_launches.load(std::memory_order_relaxed); }

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
