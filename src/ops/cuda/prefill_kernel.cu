// src/ops/cuda/prefill_kernel.cu — the paged PREFILL attention kernel (FA2-class, mma.sync).
//
// Serves paged_attention calls with many query rows per request (prefill, chunked prefill)
// over bf16/f16 caches; everything else (decode, fp8 pages, XQA masks, PrefixLM ranges, small
// batches that need split-KV) stays on attn_kernel in paged_attention.cu.  The routing
// decision is prefill_eligible(); dispatch.cpp calls it first.
//
// Work decomposition: unit = (request, 128-row tile, KV head).  Rows are (token, head in the
// GQA group) pairs of one KV head — row = token * group + h — so one CTA's rows share their K/V
// tiles.  A one-CTA plan kernel lists the (request, row tile) items sorted by decreasing cost
// (number of KV tiles, counting sort); a persistent grid pulls (item, KV head) units from an
// atomic counter (heaviest first, so the tail is made of short units).
//
// Per unit: the row table (token, head) goes to shared memory, Q rows are copied with 16-byte
// cp.async into a swizzled shared tile, K and V tiles of 64 keys stream through a 2–3 stage
// cp.async ring (byte offsets of each key row resolved once per tile, from page ids fetched one
// tile ahead).  Each warp owns 16*MT query rows: S = Q K^T and O += P V with mma.sync m16n8k16
// (f32 accumulate), K fragments by ldmatrix, V by ldmatrix.trans, P converted from the S
// accumulators to A fragments in registers.  Q fragments stay in registers when MT*D <= 128,
// otherwise they are re-read from shared memory per tile.  Online softmax in base 2 with the
// scale folded into one FFMA per element; tiles entirely above a warp's causal diagonal (or
// before its window) are skipped, masks are evaluated only on tiles that need them.
// Epilogue: sinks, LSE (base 2 or e), O scaled and staged through the warp's own rows of the
// Q tile for 16-byte row stores.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/hopper_prefill.h"
#include "ops/cuda/prefill_plan_order.h"
#include "ops/cuda/routing.h"
#include "ops/cuda/softmax.cuh"
#include "ops/cuda/swizzle.cuh"
#include "ops/cuda/ptx.cuh"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

namespace kvattn::ops::cuda_impl::k {
namespace {

constexpr int kPlanThreads = 1024;
constexpr int kBuckets = 2048;  // cost buckets of the plan's counting sort (KV tiles, clamped)
constexpr int kRowsPerCta = 128;  // rows per CTA of the default configs (64 for variant C)
constexpr int kKeyTile = 64;  // keys per K/V tile (variant D: 32); the plan's cost unit
// lazy rescale threshold (log2 units): P = 2^(s - m_ref) <= 2^8, exact in f32 accumulators and
// as bf16/f16 MMA inputs (relative precision does not depend on the scale)
constexpr float kLazy = 8.f;

// ---- PTX wrappers (the shared ones are in ptx.cuh) -----------------------------------------------
// 16-byte cp.async to shared address dst + kImm (paired-row loader: the immediate folds into the
// instruction, one destination register per thread and tile; no zero-fill operand)
template <int kImm>
__device__ __forceinline__ void cpa16_at(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0+%2], [%1], 16;\n" ::"r"(dst), "l"(src), "n"(kImm));
}
// f(integral_constant<int, 0>) ... f(integral_constant<int, N - 1>), unrolled at compile time
template <class F, int... I>
__device__ __forceinline__ void static_for_seq(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class F>
__device__ __forceinline__ void static_for(F&& f) {
  static_for_seq(f, std::make_integer_sequence<int, N>{});
}
// a + x in the low 32 bits only (one IADD): PAIRED adds a chunk offset x < row bytes to a row
// address aligned to the row bytes (a power of two <= 512), which never carries
__device__ __forceinline__ const void* add_lo32(int64_t a, uint32_t x) {
  uint32_t lo, hi;
  asm("mov.b64 {%0, %1}, %2;" : "=r"(lo), "=r"(hi) : "l"(a));
  int64_t r;
  asm("mov.b64 %0, {%1, %2};" : "=l"(r) : "r"(lo + x), "r"(hi));
  return reinterpret_cast<const void*>(r);
}
// paired-row loader: K/V rows to zero-fill (past the range, invalid page ids) read this zeroed row
// (static device memory, zero at module load, never written; >= one row of head_dim 256, and
// aligned to it like every row PAIRED reads)
__device__ __align__(512) unsigned char g_pf_zero_row[512];


// ---- plan ----------------------------------------------------------------------------------------
struct PfReq {
  int32_t q_start, q_len, kv_len, tile_start;
};
struct PfPlan {
  PfReq* req;           // [batch]
  int64_t* page_base;   // [batch] first page id offset (paged form)
  int2* items;          // [max_items] (request, row tile), heaviest first
  int32_t* num_items;   // [1]
  int32_t* counter;     // [1] work counter: 0 at every launch (set by the plan kernel, put back by the last draw)
  // the wgmma kernel's plan (pf_plan_l2_kernel) instead of items: its entries, the tail's cut
  // units and two scratch tables
  int4* units;          // [num_items * hkv + kTailMaxPieces * grid] entries (HopperPlanTables)
  int2* splits;         // [grid] per cut unit: its first partial-result slot, its pieces
  int32_t* split_count; // [2 * grid] per cut unit and consumer warpgroup: pieces finished (0 between launches)
  int32_t* sections;    // [batch * hkv] scratch: per section, its first sort key
  int32_t* keys;        // [num_items * hkv] scratch: per sort key, its first unit (before that: per section, its units)
};

// Block-wide exclusive scan of one int per thread (blockDim.x = kPlanThreads).
__device__ __forceinline__ int block_excl_scan(int v, int* s_warp, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) s_warp[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    int acc = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) { const int t = s_warp[w]; s_warp[w] = acc; acc += t; }
    s_warp[32] = acc;
  }
  __syncthreads();
  const int r = s_warp[warp] + x - v;
  *total = s_warp[32];
  __syncthreads();
  return r;
}

// Cost (KV tiles to visit, + 1 for the unit's fixed work) of row tile t of a request.
__device__ __forceinline__ int item_cost(const AttnParams& p, const PfReq& r, int t, int cta_rows) {
  return po::row_tile_cost(r.q_len, r.kv_len, t, cta_rows, p.group, p.causal, p.window_left, kKeyTile);
}

__device__ __forceinline__ int find_req(const PfPlan& plan, int batch, int i) {
  int lo = 0, hi = batch - 1;  // largest r with tile_start <= i
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (plan.req[mid].tile_start <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Row tiles (items) of a request of q_len query tokens: its q_len * group rows in tiles of cta_rows.
__device__ __forceinline__ int request_tiles(const AttnParams& p, int q_len, int cta_rows) {
  return (q_len * p.group + cta_rows - 1) / cta_rows;
}
// The request table (plan.req, plan.page_base): each request's rows, KV length and first item
// (tiles of cta_rows rows, numbered across the batch).  Returns the number of items.
__device__ __forceinline__ int plan_requests(const AttnParams& p, const PfPlan& plan, int cta_rows, int* s_warp) {
  const int tid = threadIdx.x;
  int base = 0;
  for (int r0 = 0; r0 < p.batch; r0 += blockDim.x) {
    const int r = r0 + tid;
    int nt = 0;
    PfReq ri{0, 0, 0, 0};
    int64_t pb = 0;
    if (r < p.batch) {
      const RequestBounds rb = load_request_bounds(p, r);
      pb = rb.page_base;
      ri.q_start = static_cast<int32_t>(rb.q_begin);
      ri.q_len = static_cast<int32_t>(rb.q_end - rb.q_begin);
      ri.kv_len = static_cast<int32_t>(rb.kv_len);
      nt = request_tiles(p, ri.q_len, cta_rows);
    }
    int tot = 0;
    const int off = block_excl_scan(nt, s_warp, &tot);
    if (r < p.batch) {
      ri.tile_start = base + off;
      plan.req[r] = ri;
      plan.page_base[r] = pb;
    }
    base += tot;
  }
  return base;
}

__global__ void __launch_bounds__(kPlanThreads) pf_plan_kernel(AttnParams p, PfPlan plan, int64_t max_items, int cta_rows) {
  __shared__ int s_hist[kBuckets];
  __shared__ int s_warp[33];
  const int tid = threadIdx.x;
  for (int i = tid; i < kBuckets; i += blockDim.x) s_hist[i] = 0;
  const int base = plan_requests(p, plan, cta_rows, s_warp);
  const int T = static_cast<int>(min(int64_t(base), max_items));
  __syncthreads();  // plan.req visible to the block
  for (int i = tid; i < T; i += blockDim.x) {
    const int r = find_req(plan, p.batch, i);
    const PfReq ri = plan.req[r];
    const int c = min(item_cost(p, ri, i - ri.tile_start, cta_rows), kBuckets - 1);
    atomicAdd(&s_hist[c], 1);
  }
  __syncthreads();
  // descending-cost exclusive scan: thread t owns buckets B-1-2t and B-2-2t
  {
    const int b0 = kBuckets - 1 - 2 * tid, b1 = b0 - 1;
    const int h0 = b0 >= 0 ? s_hist[b0] : 0, h1 = b1 >= 0 ? s_hist[b1] : 0;
    int tot = 0;
    const int start = block_excl_scan(h0 + h1, s_warp, &tot);
    if (b0 >= 0) s_hist[b0] = start;
    if (b1 >= 0) s_hist[b1] = start + h0;
  }
  __syncthreads();
  for (int i = tid; i < T; i += blockDim.x) {
    const int r = find_req(plan, p.batch, i);
    const PfReq ri = plan.req[r];
    const int t = i - ri.tile_start;
    const int c = min(item_cost(p, ri, t, cta_rows), kBuckets - 1);
    const int pos = atomicAdd(&s_hist[c], 1);
    plan.items[pos] = make_int2(r, t);
  }
  if (tid == 0) {
    plan.num_items[0] = T;
    plan.counter[0] = 0;
  }
}

// Exclusive scan of a[0, n) in place by the block; returns the sum.
__device__ int block_scan_array(int32_t* a, int n, int* s_warp) {
  int carry = 0;
  for (int i0 = 0; i0 < n; i0 += blockDim.x) {
    const int i = i0 + threadIdx.x;
    const int v = i < n ? a[i] : 0;
    int tot = 0;
    const int off = block_excl_scan(v, s_warp, &tot);
    if (i < n) a[i] = carry + off;
    carry += tot;
  }
  __syncthreads();
  return carry;
}

// The tail of the wgmma plan's round-robin list (po::tail_ctas): after the W = U / G full waves
// of G CTAs, the m = U - W G last units' key tiles (128 keys, the units one after another) are
// shared out as contiguous ranges, CTA g's range as its entries W G + k G + g (k = 0, 1, ...: one
// piece per unit the range touches, the piece's tiles in the entry), followed by holes (request
// -1: the CTA's list ends) up to the busiest CTA's piece count.  A unit cut into pieces gets a
// split id (entry .w: piece index << 16 | split id), its pieces consecutive partial-result slots
// (plan.splits) and a counter per consumer warpgroup (plan.split_count, zeroed here, put back to
// zero by the piece that merges).  tail_mode: 0 automatic, 1 off, 2 forced (KernelRouting::
// prefill_tail_split).  Returns the list's entry count (U where the tail stays whole units).
// Block-uniform: every thread returns the same count.
__device__ int plan_tail(const AttnParams& p, const PfPlan& plan, int U, int G, int tail_mode, int cta_rows, int* s_warp) {
  __shared__ int4 s_unit[kPlanThreads];      // tail unit i's entry
  __shared__ int s_first[kPlanThreads + 1];  // its first tile in the tail; [m]: the tail's tiles
  __shared__ int s_sid[kPlanThreads];        // its split id (-1: one piece)
  __shared__ int s_max, s_bad, s_kmax;
  const int tid = threadIdx.x;
  if (tail_mode == 1 || G < 2 || G > kPlanThreads || plan.splits == nullptr) return U;
  const int W = U / G, m = U - W * G;
  if (m == 0) return U;
  if (tid == 0) s_max = s_bad = s_kmax = 0;
  int n = 0;
  if (tid < m) {
    const int4 e = plan.units[W * G + tid];
    const PfReq q = plan.req[e.x];
    n = po::row_tile_cost(q.q_len, q.kv_len, e.y / p.hkv, cta_rows, p.group, p.causal, p.window_left, 128) - 1;
    s_unit[tid] = e;
  }
  int S = 0;
  const int first = block_excl_scan(n, s_warp, &S);  // (its barriers publish s_max / s_bad's zeros)
  if (tid < m) {
    s_first[tid] = first;
    atomicMax(&s_max, n);
    if (n <= 0 || n >= (1 << 16)) atomicOr(&s_bad, 1);  // an entry holds 16-bit tile counts; no empty units
  }
  if (tid == 0) s_first[m] = S;
  __syncthreads();
  const int Gt = po::tail_ctas(G, W, m, S, s_max, tail_mode == 2);
  if (Gt == 0 || s_bad != 0) return U;
  auto unit_of = [&](int64_t x) {  // the tail unit holding tile x: the largest i with s_first[i] <= x
    int lo = 0, hi = m - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (s_first[mid] <= x) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  };
  // this thread as tail CTA g = tid: its range [a, b), first unit, pieces
  int64_t a = 0, b = 0;
  int u0 = 0, kg = 0;
  if (tid < Gt) {
    a = po::tail_start(tid, Gt, S);
    b = po::tail_start(tid + 1, Gt, S);
    u0 = unit_of(a);
    kg = unit_of(b - 1) - u0 + 1;
    atomicMax(&s_kmax, kg);
  }
  // this thread as tail unit i = tid: its pieces (the CTAs its tiles span), split id, first slot
  int np = 0;
  if (tid < m) np = po::tail_owner(first + n - 1, Gt, S) - po::tail_owner(first, Gt, S) + 1;
  const bool cut = np > 1;
  int num_cut = 0, num_slots = 0;
  const int sid = block_excl_scan(cut ? 1 : 0, s_warp, &num_cut);
  const int slot0 = block_excl_scan(cut ? np : 0, s_warp, &num_slots);  // (publishes s_kmax)
  const int kmax = s_kmax;
  if (kmax > po::kTailMaxPieces || num_slots > po::tail_slots(G)) return U;
  if (tid < m) {
    s_sid[tid] = cut ? sid : -1;
    if (cut) {
      plan.splits[sid] = make_int2(slot0, np);
      plan.split_count[2 * sid] = 0;
      plan.split_count[2 * sid + 1] = 0;
    }
  }
  __syncthreads();
  if (tid < G) {
    for (int k = 0; k < kmax; ++k) {
      int4 e = make_int4(-1, 0, 0, -1);
      if (k < kg) {
        const int i = u0 + k;
        const int f = s_first[i], fe = s_first[i + 1];
        const int lo = static_cast<int>(max(a, int64_t(f))) - f, hi = static_cast<int>(min(b, int64_t(fe))) - f;
        const int j = tid - po::tail_owner(f, Gt, S);  // the piece's index in its unit
        e = s_unit[i];
        e.z = (lo << 16) | (hi - lo);
        e.w = s_sid[i] >= 0 ? (j << 16) | s_sid[i] : -1;
      }
      plan.units[W * G + k * G + tid] = e;
    }
  }
  return W * G + kmax * G;
}

// The wgmma kernel's plan: the request table, and its (item, KV head) units in the order its
// CTAs take them (with 16-bit pages round-robin, unit w to CTA w % rr_ctas; with fp8 pages drawn
// from plan.counter in list order: rr_ctas = 0).  Two aims: the CTAs running at once read K/V
// that L2 holds, and every CTA finishes at about the same time.
//  * L2 sections: the groups (request, KV head), request-major, are cut into sections of
//    consecutive groups whose K/V together fit `l2_budget` bytes (at the batch's mean KV length,
//    kv_token_bytes per token and head), and the sections follow one another, so the grid reads
//    about one section's K/V at a time.  Heaviest-first over the whole batch keeps every group's
//    K/V in use at once, more than L2 holds (FlashAttention-3's scheduler sections its heads the
//    same way).
//  * Within a section, units go by cost (item_cost: key tiles + 1), the last section costliest
//    first and the sections before it alternately cheapest and costliest first, so the list's
//    costs run without a jump from one section into the next (a section ending in 1-tile units
//    followed by one starting with 64-tile units left whole waves unbalanced).
//  * Round-robin: where sections average a wave of rr_ctas units or more, the list is dealt
//    in waves, every other wave in reverse, so a CTA that took a wave's costliest unit takes the
//    next wave's cheapest (po::deal_ctas).
// Sort key of a unit: its section's first key + its cost's place in the section (the section's
// key range is its largest cost, at most its number of units: costs past it share the end key);
// keys are counted, scanned and the units placed by atomics (units of one key land in any order).
__global__ void __launch_bounds__(kPlanThreads) pf_plan_l2_kernel(AttnParams p, PfPlan plan, int64_t max_items, int cta_rows,
                                                                 int64_t l2_budget, int kv_token_bytes, int rr_ctas,
                                                                 int tail_mode) {
  __shared__ int s_warp[33];
  __shared__ unsigned long long s_kv_sum;
  __shared__ int s_per_sec, s_num_sec;
  const int tid = threadIdx.x;
  if (tid == 0) s_kv_sum = 0;
  __syncthreads();
  const int base = plan_requests(p, plan, cta_rows, s_warp);
  const int T = static_cast<int>(min(int64_t(base), max_items));
  __syncthreads();  // plan.req visible to the block
  const int hkv = p.hkv;
  const int groups = p.batch * hkv;
  unsigned long long kv = 0;
  for (int r = tid; r < p.batch; r += blockDim.x) kv += static_cast<unsigned long long>(plan.req[r].kv_len);
  atomicAdd(&s_kv_sum, kv);
  __syncthreads();
  if (tid == 0) {
    const int64_t group_bytes = max(int64_t(1), int64_t(s_kv_sum / p.batch) * kv_token_bytes);
    const int64_t fit = max(int64_t(1), min(int64_t(groups), l2_budget / group_bytes));
    const int num_sec = static_cast<int>((groups + fit - 1) / fit);
    s_num_sec = num_sec;
    s_per_sec = (groups + num_sec - 1) / num_sec;  // sections of equal size (the last may be smaller)
  }
  __syncthreads();
  const int per_sec = s_per_sec, num_sec = s_num_sec;
  // per section: its largest unit cost (plan.sections) and its number of units (plan.keys, as
  // scratch: num_sec <= groups <= max_items * hkv), then its key range (the smaller, at least 1),
  // scanned into its first key
  for (int s = tid; s < num_sec; s += blockDim.x) plan.sections[s] = plan.keys[s] = 0;
  __syncthreads();
  for (int r = tid; r < p.batch; r += blockDim.x) {
    const PfReq q = plan.req[r];
    const int n = request_tiles(p, q.q_len, cta_rows);
    if (n == 0) continue;
    // a row tile's key range moves with the tile (causal, window): the first or the last is the costliest
    const int c = max(item_cost(p, q, 0, cta_rows), item_cost(p, q, n - 1, cta_rows));
    for (int s = r * hkv / per_sec; s <= (r * hkv + hkv - 1) / per_sec; ++s) {
      const int in_s = min(r * hkv + hkv, (s + 1) * per_sec) - max(r * hkv, s * per_sec);
      atomicMax(&plan.sections[s], c);
      atomicAdd(&plan.keys[s], in_s * n);
    }
  }
  __syncthreads();
  for (int s = tid; s < num_sec; s += blockDim.x) plan.sections[s] = max(1, min(plan.sections[s], plan.keys[s]));
  __syncthreads();
  const int num_keys = block_scan_array(plan.sections, num_sec, s_warp);
  const int U = T * hkv;
  auto key_of = [&](int u) {
    const int i = u / hkv, hk = u - i * hkv;
    const int r = find_req(plan, p.batch, i);
    const PfReq q = plan.req[r];
    const int s = (r * hkv + hk) / per_sec;
    const int first = plan.sections[s];
    const int range = (s + 1 < num_sec ? plan.sections[s + 1] : num_keys) - first;
    return po::section_key(first, range, item_cost(p, q, i - q.tile_start, cta_rows), s, num_sec);
  };
  for (int k = tid; k < num_keys; k += blockDim.x) plan.keys[k] = 0;
  __syncthreads();
  for (int u = tid; u < U; u += blockDim.x) atomicAdd(&plan.keys[key_of(u)], 1);
  __syncthreads();
  block_scan_array(plan.keys, num_keys, s_warp);
  const int deal = po::deal_ctas(rr_ctas, U, num_sec);
  for (int u = tid; u < U; u += blockDim.x) {
    const int pos = po::dealt_position(atomicAdd(&plan.keys[key_of(u)], 1), deal, U);
    const int i = u / hkv;
    const int r = find_req(plan, p.batch, i);
    plan.units[pos] = make_int4(r, (i - plan.req[r].tile_start) * hkv + (u % hkv), 0, -1);
  }
  __syncthreads();
  const int entries = plan_tail(p, plan, U, rr_ctas, tail_mode, cta_rows, s_warp);
  if (tid == 0) {
    plan.num_items[0] = T;
    plan.num_items[1] = entries;
    plan.counter[0] = 0;
  }
}

// ---- the attention kernel ---------------------------------------------------------------------------
// MT m-tiles of 16 rows per warp, NW warps: 16 * MT * NW rows per CTA.
template <int D, int MT, int NW>
struct PfCfg {
  static constexpr int kMT = MT, kNW = NW;
  static constexpr int kThreads = 32 * NW;
  static constexpr int kRows = 16 * MT * NW;
  static constexpr int kTile = kKeyTile;
  static constexpr bool kQRegs = MT * D <= 128;  // Q fragments held in registers
  static constexpr bool kFragDB = MT * D <= 128;  // K fragments double-buffered in registers
  using QRegFrags = uint32_t[kQRegs ? D / 16 : 1][4];                       // Q fragments held (kQRegs)
  using KFrags = uint32_t[kFragDB ? 2 : 1][kTile / 16][4];                  // K fragments of a k-step
  using QTileFrags = uint32_t[kQRegs ? 1 : (kFragDB ? 2 : 1)][MT][4];       // Q fragments read per k-step
  static constexpr int kCPR = D * 2 / 16;
  static constexpr int kStageBytes = kTile * D * 2;  // one of K / V
  static constexpr int kQBytes = kRows * D * 2;
  static constexpr int kMinBlocks = (NW == 4 || D == 64) ? 2 : 1;
  static constexpr int kBudget = 227 * 1024 / kMinBlocks - 2048;
  static constexpr int kStagesFit = (kBudget - kQBytes) / (2 * kStageBytes + 2 * kTile * 8);
  static constexpr int kStages = kStagesFit >= 3 ? 3 : 2;
  static constexpr int kOffBase = kQBytes + kStages * 2 * kStageBytes;
  static constexpr int kSmem = kOffBase + kStages * 2 * kTile * 8;
  // row tables after kSmem (the launch adds them): Q and O element offsets (int64) and query
  // position per CTA row
  static constexpr int kRowTableBytes = kRows * (8 + 8 + 4);
  static constexpr int kChunksPerThread = kTile * kCPR / kThreads;
  static constexpr int kRowStep = kThreads / kCPR;
  static_assert(kStagesFit >= 2, "shared memory");
  static_assert((kTile * kCPR) % kThreads == 0 && kThreads % kCPR == 0, "loader mapping");
  static_assert(kThreads >= 2 * kTile, "one offset per thread");
};

// ---- the attention kernel's phases.  They take the kernel's variables by reference, scalars too,
// and the register buffers a phase fills (kf / qa, vf / a) are declared by the kernel: so the
// compiler's code for the kernel is the one it makes of the phases written inline.  Arrays of the
// phases' own changed it, and so did moving the masks, the online softmax or the epilogue out as
// well (scripts/dev/sass_diff.sh tells).

// Row tid of the unit's row table (rows row0 .. of the request's rows_r, KV head hk): its token
// (-1 past the end), head, query position (rows past the end: the last row's), and the element
// offsets of its Q and O rows (-1 past the end).
__device__ __forceinline__ void fill_row_table(const AttnParams& p, const PfReq& ri, const int& row0, const int& rows_r,
                                               const int& hk, const int& ctx, const int& tid, int* const& s_rtok,
                                               int* const& s_rhead, int* const& s_rpos, int64_t* const& s_qoff,
                                               int64_t* const& s_ooff) {
  const int rr = row0 + tid;
  const bool v = rr < rows_r;
  const int tk = min(rr, rows_r - 1) / p.group;  // rows past the end: the last row's position
  const int tok = ri.q_start + tk;
  const int head = hk * p.group + (v ? rr - tk * p.group : 0);
  s_rtok[tid] = v ? tok : -1;
  s_rhead[tid] = head;
  s_rpos[tid] = ctx + tk;
  s_qoff[tid] = v ? int64_t(tok) * p.q_st + int64_t(head) * p.q_sh : int64_t(-1);
  s_ooff[tid] = v ? int64_t(tok) * p.o_st + int64_t(head) * p.o_sh : int64_t(-1);
}
// The unit's Q rows into the swizzled Q tile sQ from 16-byte query rows of the MMA type: a fixed
// 16-byte chunk my_chunk of rows my_row0 + i * kRowStep per thread, by cp.async from the row
// table's offsets (-1: zero-fill).
template <int D, int MT, int NW>
__device__ __forceinline__ void stage_q_rows(const AttnParams& p, unsigned char* const& sQ, const int64_t* const& s_qoff,
                                             const int& my_row0, const int& my_chunk) {
  using C = PfCfg<D, MT, NW>;
  constexpr int kCPR = C::kCPR;
  // kRowStep is a multiple of 8, so the swizzle (row & 7) is the same for all of a thread's rows
  static_assert(C::kRowStep % 8 == 0 && (C::kRows * kCPR) % C::kThreads == 0, "Q mapping");
  constexpr int kQIters = C::kRows * kCPR / C::kThreads;
  const uint32_t dq = smem_u32(sQ + swz<kCPR>(my_row0, my_chunk));
  const uint16_t* qsrc = static_cast<const uint16_t*>(p.q) + my_chunk * 8;
#pragma unroll
  for (int i = 0; i < kQIters; ++i) {
    const int64_t off = s_qoff[my_row0 + i * C::kRowStep];
    cpa16z(dq + i * C::kRowStep * kCPR * 16, qsrc + (off < 0 ? int64_t(0) : off), off < 0 ? 1u : 0u);
  }
}
// The same element by element (other query types or layouts), converted to the MMA type.
template <bool BF16, int D, int MT, int NW>
__device__ __forceinline__ void stage_q_elements(const AttnParams& p, unsigned char* const& sQ,
                                                 const int (&s_rtok)[16 * MT * NW], const int (&s_rhead)[16 * MT * NW],
                                                 const int& tid) {
  using C = PfCfg<D, MT, NW>;
  constexpr int kCPR = C::kCPR;
  for (int idx = tid; idx < C::kRows * (D / 2); idx += C::kThreads) {
    const int row = idx / (D / 2), d = 2 * (idx % (D / 2));
    const int tok = s_rtok[row];
    float x0 = 0.f, x1 = 0.f;
    if (tok >= 0) {
      const int64_t b = int64_t(tok) * p.q_st + int64_t(s_rhead[row]) * p.q_sh;
      x0 = load_elt(p.q, b + int64_t(d) * p.q_sd, p.q_t);
      x1 = load_elt(p.q, b + int64_t(d + 1) * p.q_sd, p.q_t);
    }
    *reinterpret_cast<uint32_t*>(sQ + swz<kCPR>(row, d >> 3) + (d & 7) * 2) = pack2<BF16>(x0, x1);
  }
}

// ---- the K/V loader (called through the kernel's lambdas load_page, page_id, store_off, issue)

// Page-id word of key row tid of tile `tile` (keys from tile0 + tile * kTile, below hi; n_tiles
// tiles) of request req, loaded ahead (load_idx_word: nothing waits for it here); kv_page_id
// checks it where it is used.
__device__ __forceinline__ IdxWord kv_page_word(const AttnParams& p, const int64_t& pbase, const int& req, const int& tile0,
                                                const int& hi, const int& n_tiles, const int& tid, int tile) {
  constexpr int kTile = kKeyTile;
  const int j = tile0 + tile * kTile + (tid & (kTile - 1));
  const bool valid = tid < 2 * kTile && tile < n_tiles && j < hi;
  const int blk = p.page_shift >= 0 ? (j >> p.page_shift) : (j / p.page_size);
  return load_idx_word(page_index(p), page_elem(p, pbase, req, blk), valid);
}
// The page id of a page-id word, -1 (a zero-filled row) outside [0, num_pages).
__device__ __forceinline__ int64_t kv_page_id(const AttnParams& p, IdxWord w) {
  const int64_t pg = idx_word_value(page_index(p), w);
  return (pg < 0 || pg >= p.num_pages) ? int64_t(-1) : pg;
}
// K and V row addresses of key row tid & (kTile - 1) of tile `tile` (page pg, -1: zero-fill) for
// KV head hk into the offset table sOff: PAIRED [stage][row][K, V], a row to zero-fill pointing
// at g_pf_zero_row; else [stage][K|V][row], a row to zero-fill flagged in bit 0.
template <int D, int MT, int NW, bool PAIRED>
__device__ __forceinline__ void store_kv_offsets(const AttnParams& p, int64_t* const& sOff, const unsigned char* const& kb,
                                                 const unsigned char* const& vb, const int& hk, const int& tile0,
                                                 const int& tid, int tile, int64_t pg) {
  constexpr int kTile = kKeyTile, kS = PfCfg<D, MT, NW>::kStages;
  if (tid >= 2 * kTile) return;
  const int row = tid & (kTile - 1), which = tid / kTile;
  const int j = tile0 + tile * kTile + row;
  const int slot = p.page_shift >= 0 ? (j & (p.page_size - 1)) : (j % p.page_size);
  const int64_t off = which == 0 ? pg * p.k_sb + int64_t(slot) * p.k_so + int64_t(hk) * p.k_sh
                                 : pg * p.v_sb + int64_t(slot) * p.v_so + int64_t(hk) * p.v_sh;
  if constexpr (PAIRED) {
    // [stage][row][K, V] absolute addresses; a row to zero-fill reads the zero row
    const unsigned char* base = which == 0 ? kb : vb;
    sOff[(((tile % kS) * kTile + row) << 1) + which] =
        pg < 0 ? reinterpret_cast<int64_t>(g_pf_zero_row) : reinterpret_cast<int64_t>(base + off);
  } else {
    // absolute address; a row to zero-fill keeps the (readable, 16-byte aligned) base | 1
    const unsigned char* base = which == 0 ? kb : vb;
    sOff[((tile % kS) * 2 + which) * kTile + row] =
        pg < 0 ? (reinterpret_cast<int64_t>(base) | 1) : reinterpret_cast<int64_t>(base + off);
  }
}
// This thread's cp.async of tile `tile`'s K and V rows (addresses from sOff) into its stage of the
// ring sKV: rows my_row0 + i * kRowStep, 16-byte chunk my_chunk.
template <int D, int MT, int NW, bool PAIRED>
__device__ __forceinline__ void issue_kv_tile(unsigned char* const& sKV, int64_t* const& sOff, const int& my_row0,
                                              const int& my_chunk, int tile) {
  using C = PfCfg<D, MT, NW>;
  constexpr int kTile = C::kTile, kCPR = C::kCPR, kS = C::kStages;
  const int st = tile % kS;
  if constexpr (PAIRED) {
    // rows my_row0 + i * kRowStep (kRowStep a multiple of 8: one swizzle per thread), K and
    // V of a row from one 16-byte shared load; destinations = d0 + immediates
    static_assert(C::kRowStep % 8 == 0 && kCPR * 16 <= int(sizeof(g_pf_zero_row)), "paired-row loader mapping");
    const uint32_t d0 = smem_u32(sKV + st * 2 * C::kStageBytes + swz<kCPR>(my_row0, my_chunk));
    const int64_t* pr = sOff + ((st * kTile + my_row0) << 1);
    static_for<C::kChunksPerThread>([&](auto ic) {
      constexpr int kR = decltype(ic)::value * C::kRowStep;
      const longlong2 a = *reinterpret_cast<const longlong2*>(pr + 2 * kR);
      // rows aligned to their size (host check pf_rows_aligned): chunk offset in the low word
      cpa16_at<kR * kCPR * 16>(d0, add_lo32(a.x, uint32_t(my_chunk) * 16u));
      cpa16_at<kR * kCPR * 16 + C::kStageBytes>(d0, add_lo32(a.y, uint32_t(my_chunk) * 16u));
    });
    return;
  }
  const uint32_t sk = smem_u32(sKV + st * 2 * C::kStageBytes);
  const uint32_t sv = sk + C::kStageBytes;
  const int64_t* offk = sOff + st * 2 * kTile;
  const int64_t* offv = offk + kTile;
#pragma unroll
  for (int i = 0; i < C::kChunksPerThread; ++i) {
    const int row = my_row0 + i * C::kRowStep;
    const int so = swz<kCPR>(row, my_chunk);
    const int64_t ok = offk[row], ov = offv[row];
    const uint32_t zk = uint32_t(ok) & 1u, zv = uint32_t(ov) & 1u;
    cpa16z(sk + so, reinterpret_cast<const unsigned char*>(ok - zk) + my_chunk * 16, zk);
    cpa16z(sv + so, reinterpret_cast<const unsigned char*>(ov - zv) + my_chunk * 16, zv);
  }
}

// ---- one tile's math

// S = Q K^T of the warp's MT m-tiles (rows from wrow0) and the tile's keys (tK).  Per k-step (16
// dims): one ldmatrix.x4 gives the B fragments of two 8-key n-tiles (kf); the next k-step's
// fragments are loaded before this k-step's MMAs (register double buffer, C::kFragDB).  Q
// fragments: qf (C::kQRegs), else read from the Q tile sQ per k-step (qa).
template <bool BF16, int D, int MT, int NW>
__device__ __forceinline__ void qk_tile(float (&s)[MT][kKeyTile / 8][4], typename PfCfg<D, MT, NW>::QRegFrags& qf,
                                        typename PfCfg<D, MT, NW>::KFrags& kf, typename PfCfg<D, MT, NW>::QTileFrags& qa,
                                        const unsigned char* const& sQ, const unsigned char* const& tK, const int& wrow0,
                                        const int& lane) {
  using C = PfCfg<D, MT, NW>;
  constexpr int kCPR = C::kCPR, kKSteps = D / 16, kNTs = kKeyTile / 8;
  auto load_k = [&](int ks, uint32_t (&b)[kNTs / 2][4]) {
#pragma unroll
    for (int jj = 0; jj < kNTs / 2; ++jj)
      ldsm_x4(smem_u32(tK + swz<kCPR>(16 * jj + ((lane >> 4) << 3) + (lane & 7), 2 * ks + ((lane >> 3) & 1))), b[jj]);
  };
  auto load_q = [&](int ks, uint32_t (&a)[MT][4]) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
      ldsm_x4(smem_u32(sQ + swz<kCPR>(wrow0 + 16 * m + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * ks + (lane >> 4))), a[m]);
  };
  if constexpr (C::kFragDB) {
    load_k(0, kf[0]);
    if constexpr (!C::kQRegs) load_q(0, qa[0]);
  }
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    const int cur = C::kFragDB ? (ks & 1) : 0;
    if constexpr (C::kFragDB) {
      if (ks + 1 < kKSteps) {
        load_k(ks + 1, kf[(ks + 1) & 1]);
        if constexpr (!C::kQRegs) load_q(ks + 1, qa[(ks + 1) & 1]);
      }
    } else {
      load_k(ks, kf[0]);
      if constexpr (!C::kQRegs) load_q(ks, qa[0]);
    }
#pragma unroll
    for (int jj = 0; jj < kNTs / 2; ++jj)
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const uint32_t(&a)[4] = C::kQRegs ? qf[C::kQRegs ? ks : 0] : qa[C::kQRegs ? 0 : cur][m];
        mma16816<BF16, false>(s[m][2 * jj], a, kf[cur][jj][0], kf[cur][jj][1]);
        mma16816<BF16, false>(s[m][2 * jj + 1], a, kf[cur][jj][2], kf[cur][jj][3]);
      }
  }
}
// Soft cap of the tile's scores: cap_out tanh(s cap_in).
template <int MT>
__device__ __forceinline__ void soft_cap(float (&s)[MT][kKeyTile / 8][4], const float& cap_in, const float& cap_out) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < kKeyTile / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[m][j][e] = cap_out * tanhf(s[m][j][e] * cap_in);
}
// O rescaled by alpha (rows g and g + 8 of each m-tile).
template <int D, int MT>
__device__ __forceinline__ void rescale_o(float (&o)[MT][D / 8][4], const float (&alpha)[MT][2]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[m][n][0] *= alpha[m][0];
      o[m][n][1] *= alpha[m][0];
      o[m][n][2] *= alpha[m][1];
      o[m][n][3] *= alpha[m][1];
    }
}
// O += P V over the tile: P stays in registers (the S accumulator layout is the A layout: a); V
// fragments by ldmatrix.trans from tV, loaded two steps ahead of their MMAs (ring of three: vf).
template <bool BF16, int D, int MT>
__device__ __forceinline__ void pv_tile(float (&o)[MT][D / 8][4], const float (&s)[MT][kKeyTile / 8][4],
                                        uint32_t (&vf)[3][4], uint32_t (&a)[MT][4], const unsigned char* const& tV,
                                        const int& lane) {
  constexpr int kCPR = D * 2 / 16;
  constexpr int kNP = D / 16;                 // n-tile pairs per 16-key step
  constexpr int kNV = (kKeyTile / 16) * kNP;  // ldmatrix.x4.trans per tile
  auto load_v = [&](int idx, uint32_t (&b)[4]) {
    const int kk = idx / kNP, np = idx % kNP;
    ldsm_x4_t(smem_u32(tV + swz<kCPR>(16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * np + (lane >> 4))), b);
  };
  load_v(0, vf[0]);
  if (kNV > 1) load_v(1, vf[1]);
#pragma unroll
  for (int idx = 0; idx < kNV; ++idx) {
    if (idx + 2 < kNV) load_v(idx + 2, vf[(idx + 2) % 3]);
    const int kk = idx / kNP, n = 2 * (idx % kNP);
    if (n == 0) {
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        a[m][0] = pack2<BF16>(s[m][2 * kk][0], s[m][2 * kk][1]);
        a[m][1] = pack2<BF16>(s[m][2 * kk][2], s[m][2 * kk][3]);
        a[m][2] = pack2<BF16>(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
        a[m][3] = pack2<BF16>(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
      }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      mma16816<BF16, false>(o[m][n], a[m], vf[idx % 3][0], vf[idx % 3][1]);
      mma16816<BF16, false>(o[m][n + 1], a[m], vf[idx % 3][2], vf[idx % 3][3]);
    }
  }
}

// The kernel's steps, each measured on an H200 when it landed:
//  * lazy O rescale: a row's reference max moves only when the tile max exceeds it by more than
//    kLazy (log2 units), so P <= 2^kLazy and O / l are rescaled on few tiles instead of ~90 %;
//  * masks specialised per case (causal-only tiles skip the per-element window test; without a
//    window, one compare of an immediate against a per-row limit per element);
//  * a row table per unit with each row's token, head, Q and O element offsets and query position
//    (one division per row, by its own thread), so the warps' positions, the Q staging copies and
//    the output row stores need no divisions or 64-bit multiplies per element / chunk;
//  * Q staging with a fixed 16-byte chunk per thread (swizzle constant per thread);
//  * a warp's first computed tile skips the O rescale (O is still zero);
//  * epilogue: the output pack type chosen once per unit instead of per packed pair;
//  * K/V loader with absolute source addresses in shared memory and the ignore-src form of
//    cp.async (no per-copy src-size or cache-base arithmetic).  Two forms: PAIRED (the default, for
//    calls whose K/V rows are aligned to their size, pf_rows_aligned) holds each key row's K and
//    V addresses side by side (one 16-byte shared load per row for both copies), points rows to
//    zero-fill at g_pf_zero_row (no mask / subtract / predicate per copy) and keeps the shared
//    destinations as one register + immediates per thread and tile; the other (!PAIRED, any
//    strides, or KernelRouting::prefill_paired_rows off) flags a row to zero-fill in bit 0 of its address.
template <bool BF16, int D, int MT, int NW, bool PAIRED>
__global__ void __launch_bounds__(PfCfg<D, MT, NW>::kThreads, PfCfg<D, MT, NW>::kMinBlocks)
    pf_attn_kernel(AttnParams p, PfPlan plan) {
  using C = PfCfg<D, MT, NW>;
  constexpr int kTile = C::kTile, kCPR = C::kCPR, kS = C::kStages;
  constexpr int kKSteps = D / 16;
  constexpr int kNTs = kTile / 8;  // S n-tiles
  constexpr int kNTo = D / 8;      // O n-tiles
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* sQ = smem;
  unsigned char* sKV = smem + C::kQBytes;
  int64_t* sOff = reinterpret_cast<int64_t*>(smem + C::kOffBase);  // [stage][K|V][kTile]
  __shared__ int s_work[2];
  __shared__ int s_rtok[C::kRows], s_rhead[C::kRows];
  // row tables (dynamic shared memory after kSmem; the launch adds kRowTableBytes)
  int64_t* s_qoff = reinterpret_cast<int64_t*>(smem + C::kSmem);
  int64_t* s_ooff = s_qoff + C::kRows;
  int* s_rpos = reinterpret_cast<int*>(s_ooff + C::kRows);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int wrow0 = warp * 16 * MT;  // first CTA-local row of this warp
  const int total = plan.num_items[0] * p.hkv;
  const bool softcap = p.soft_cap > 0.f;
  // log2-domain factor applied by the exp2 FFMA: sm_scale*log2e, or 1 after the soft cap
  const float c_exp = softcap ? 1.f : p.sm_scale * kLog2e;
  const float cap_in = softcap ? p.sm_scale / p.soft_cap : 0.f;
  const float cap_out = p.soft_cap * kLog2e;
  const bool q_fast = p.q_vec && p.q_t == (BF16 ? Elt::bf16 : Elt::f16);
  const int my_chunk = tid % kCPR, my_row0 = tid / kCPR;
  const unsigned char* kb = static_cast<const unsigned char*>(p.k);
  const unsigned char* vb = static_cast<const unsigned char*>(p.v);

  if (tid == 0) s_work[0] = atomicAdd(plan.counter, 1);
  for (int iter = 0;; ++iter) {
    __syncthreads();
    const int w = s_work[iter & 1];
    if (w >= total) {
      // one draw >= total per CTA, so the largest (total + grid - 1) is the launch's last draw:
      // its CTA puts the counter back to 0 for the next launch on a kept plan (no plan kernel)
      if (tid == 0 && w == total + static_cast<int>(gridDim.x) - 1) *plan.counter = 0;
      break;
    }
    if (tid == 0) s_work[(iter + 1) & 1] = atomicAdd(plan.counter, 1);  // next unit, early
    const int2 it = plan.items[w / p.hkv];
    const int hk = w % p.hkv;
    const PfReq ri = plan.req[it.x];
    const int rows_r = ri.q_len * p.group;
    const int row0 = it.y * C::kRows;
    const int ctx = ri.kv_len - ri.q_len;
    const int last_row = min(rows_r, row0 + C::kRows) - 1;
    const int qpos_first = ctx + row0 / p.group, qpos_last = ctx + last_row / p.group;
    int hi = ri.kv_len;
    if (p.causal) hi = min(hi, qpos_last + 1);
    int lo = 0;
    if (p.window_left >= 0) lo = static_cast<int>(max(int64_t(0), int64_t(qpos_first) - p.window_left));
    const int tile0 = (lo / kTile) * kTile;
    const int n_tiles = hi > lo ? (hi - tile0 + kTile - 1) / kTile : 0;
    const int64_t pbase = plan.page_base[it.x];

    const bool warp_valid = row0 + wrow0 < rows_r;
    // the unit's row table: token, head, query position, Q and O element offsets per CTA row
    if (tid < C::kRows) fill_row_table(p, ri, row0, rows_r, hk, ctx, tid, s_rtok, s_rhead, s_rpos, s_qoff, s_ooff);
    __syncthreads();
    // this warp's rows: positions (for masks) and the warp's position range (for skips); rows
    // past the end are clamped to the last row, w_first of a warp without valid rows is never used
    int qp[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) qp[m][h] = s_rpos[wrow0 + 16 * m + g + 8 * h];
    const int w_first = s_rpos[wrow0];
    const int w_last = s_rpos[wrow0 + 16 * MT - 1];
    // ---- Q -> shared (swizzled, MMA element type) ----
    if (q_fast) {
      stage_q_rows<D, MT, NW>(p, sQ, s_qoff, my_row0, my_chunk);
    } else {
      stage_q_elements<BF16, D, MT, NW>(p, sQ, s_rtok, s_rhead, tid);
    }
    cp_async_commit();

    // ---- K/V loader: page ids a tile ahead, row addresses in shared memory, the tile's copies ----
    auto load_page = [&](int tile) -> IdxWord { return kv_page_word(p, pbase, it.x, tile0, hi, n_tiles, tid, tile); };
    auto page_id = [&](IdxWord w) -> int64_t { return kv_page_id(p, w); };
    auto store_off = [&](int tile, int64_t pg) {
      store_kv_offsets<D, MT, NW, PAIRED>(p, sOff, kb, vb, hk, tile0, tid, tile, pg);
    };
    auto issue = [&](int tile) { issue_kv_tile<D, MT, NW, PAIRED>(sKV, sOff, my_row0, my_chunk, tile); };

    IdxWord pg_pref{0xffffffffu, 0xffffffffu};
    if (n_tiles > 0) {
      IdxWord pgs[kS];
#pragma unroll
      for (int t = 0; t < kS; ++t) pgs[t] = load_page(t);
#pragma unroll
      for (int t = 0; t < kS; ++t) store_off(t, page_id(pgs[t]));
      pg_pref = load_page(kS);
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < kS - 1; ++t) {
      if (t < n_tiles) issue(t);
      cp_async_commit();
    }

    uint32_t qf[C::kQRegs ? kKSteps : 1][4];
    if constexpr (C::kQRegs) {
      cp_async_wait<kS - 1>();  // the Q group
      __syncthreads();
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        ldsm_x4(smem_u32(sQ + swz<kCPR>(wrow0 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * ks + (lane >> 4))), qf[ks]);
    }

    float o[MT][kNTo][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int n = 0; n < kNTo; ++n) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.f;
    float m_r[MT][2], l_r[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m) m_r[m][0] = m_r[m][1] = -INFINITY, l_r[m][0] = l_r[m][1] = 0.f;
    bool fresh = true;  // no tile computed yet by this warp in this unit

    for (int tile = 0; tile < n_tiles; ++tile) {
      cp_async_wait<kS - 2>();
      __syncthreads();
      {
        const int nt = tile + kS - 1;
        if (nt < n_tiles) issue(nt);
        cp_async_commit();
        store_off(tile + kS, page_id(pg_pref));  // slot of `tile`, whose copies were issued long ago
        pg_pref = load_page(tile + kS + 1);
      }
      const int kt0 = tile0 + tile * kTile;
      bool skip = !warp_valid;
      if (p.causal && kt0 > w_last) skip = true;
      if (p.window_left >= 0 && int64_t(kt0 + kTile - 1) < int64_t(w_first) - p.window_left) skip = true;
      if (skip) continue;
      const int st = tile % kS;
      const unsigned char* tK = sKV + st * 2 * C::kStageBytes;
      const unsigned char* tV = tK + C::kStageBytes;

      // ---- S = Q K^T ----
      float s[MT][kNTs][4];
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < kNTs; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.f;
      {
        typename C::KFrags kf;
        typename C::QTileFrags qa;
        qk_tile<BF16, D, MT, NW>(s, qf, kf, qa, sQ, tK, wrow0, lane);
      }
      // ---- soft cap, mask (each a uniform branch around the whole tile) ----
      if (softcap) soft_cap<MT>(s, cap_in, cap_out);
      const bool need_mask = (kt0 + kTile > ri.kv_len) || (p.causal && kt0 + kTile - 1 > w_first) ||
                             (p.window_left >= 0 && int64_t(kt0) < int64_t(w_last) - p.window_left);
      if (need_mask && p.window_left < 0) {
        // as below, with the per-element key folded into an immediate: key >= lim  <=>
        // 8j + (e & 1) >= lim - kt0 - 2 t4 (one ISETP with an immediate + one select per element)
        int dl[MT][2];
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h) dl[m][h] = (p.causal ? qp[m][h] + 1 : ri.kv_len) - kt0 - 2 * t4;
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int j = 0; j < kNTs; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (8 * j + (e & 1) >= dl[m][e >> 1]) s[m][j][e] = -INFINITY;
      } else if (need_mask) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int j = 0; j < kNTs; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = kt0 + 8 * j + 2 * t4 + (e & 1);
              const int q = qp[m][e >> 1];
              bool vis = key < ri.kv_len;
              if (p.causal && key > q) vis = false;
              if (p.window_left >= 0 && int64_t(key) < int64_t(q) - p.window_left) vis = false;
              if (!vis) s[m][j][e] = -INFINITY;
            }
      }
      // ---- online softmax (rows g, g+8 of each m-tile; state per thread, l summed at the end) ----
      bool moved = false;
      float alpha[MT][2];
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = -INFINITY;
#pragma unroll
          for (int j = 0; j < kNTs; ++j) mx = fmaxf(mx, fmaxf(s[m][j][2 * h], s[m][j][2 * h + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          float m_new = fmaxf(m_r[m][h], mx * c_exp);
          // keep the old reference max unless the tile's exceeds it by more than kLazy
          // (-inf + kLazy = -inf: a row's first visible tile always moves it)
          m_new = m_new > m_r[m][h] + kLazy ? m_new : m_r[m][h];
          const float m_use = (m_new == -INFINITY) ? 0.f : m_new;
          alpha[m][h] = ex2_ftz(m_r[m][h] - m_use);
          moved |= m_new != m_r[m][h];
          m_r[m][h] = m_new;
          float sum = 0.f;
#pragma unroll
          for (int j = 0; j < kNTs; ++j) {
            const float a0 = ex2_ftz(fmaf(s[m][j][2 * h], c_exp, -m_use));
            const float a1 = ex2_ftz(fmaf(s[m][j][2 * h + 1], c_exp, -m_use));
            s[m][j][2 * h] = a0;
            s[m][j][2 * h + 1] = a1;
            sum += a0 + a1;
          }
          l_r[m][h] = l_r[m][h] * alpha[m][h] + sum;
        }
      // on the warp's first computed tile O is still zero (alpha = 0 or 1): nothing to scale
      if (!fresh && __any_sync(0xffffffffu, moved)) rescale_o<D, MT>(o, alpha);
      fresh = false;
      // ---- O += P V ----
      {
        uint32_t vf[3][4];
        uint32_t a[MT][4];
        pv_tile<BF16, D, MT>(o, s, vf, a, tV, lane);
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // Q tile free: each warp stages its output in its own rows

    // ---- epilogue ----
    float sc[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float L = quad_sum(l_r[m][h]);
        const int lr = wrow0 + 16 * m + g + 8 * h;
        const int tok = s_rtok[lr], head = s_rhead[lr];
        const float M = m_r[m][h];
        const float Mu = (M == -INFINITY) ? 0.f : M;
        float Mf = M, Lf = L, scale_o;
        if (p.sinks != nullptr) {
          const float s2 = p.sinks[int64_t(head) * p.sinks_s] * kLog2e;
          scale_o = fold_sink(M, Mu, L, s2, Mf, Lf);
        } else {
          scale_o = L > 0.f ? 1.f / L : 0.f;
        }
        sc[m][h] = scale_o * p.v_scale;
        if (p.lse != nullptr && t4 == 0 && tok >= 0) {
          const float lse2 = Lf > 0.f ? Mf + log2f(Lf) : -INFINITY;
          p.lse[int64_t(tok) * p.lse_st + int64_t(head) * p.lse_sh] = p.lse_natural ? lse2 * kLn2 : lse2;
        }
      }
    if (p.o_vec) {
      const bool obf = p.out_t == Elt::bf16;
      // the output type chosen once per unit, not per packed pair (no runtime select per pair)
      auto stage = [&](auto bf_tag) {
        constexpr bool kBf = decltype(bf_tag)::value;
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int lr = wrow0 + 16 * m + g + 8 * h;
#pragma unroll
            for (int n = 0; n < kNTo; ++n)
              *reinterpret_cast<uint32_t*>(sQ + swz<kCPR>(lr, n) + 4 * t4) =
                  pack2<kBf>(o[m][n][2 * h] * sc[m][h], o[m][n][2 * h + 1] * sc[m][h]);
          }
      };
      if (obf) stage(std::true_type{});
      else stage(std::false_type{});
      __syncwarp();
      // lane = fixed chunk (kCPR >= 8 divides 32 or is a multiple of it)
      uint16_t* ob = static_cast<uint16_t*>(p.out);
#pragma unroll
      for (int idx = lane; idx < 16 * MT * kCPR; idx += 32) {
        const int lr = wrow0 + idx / kCPR, c = idx % kCPR;
        const int64_t off = s_ooff[lr];
        if (off < 0) continue;
        *reinterpret_cast<uint4*>(ob + off + c * 8) = *reinterpret_cast<const uint4*>(sQ + swz<kCPR>(lr, c));
      }
    } else {
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int lr = wrow0 + 16 * m + g + 8 * h;
          const int tok = s_rtok[lr];
          if (tok < 0) continue;
          const int64_t b = int64_t(tok) * p.o_st + int64_t(s_rhead[lr]) * p.o_sh;
#pragma unroll
          for (int n = 0; n < kNTo; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              store_elt(p.out, b + int64_t(8 * n + 2 * t4 + e) * p.o_sd, p.out_t, o[m][n][2 * h + e] * sc[m][h]);
        }
    }
  }
}

// ---- host side ------------------------------------------------------------------------------------
// The paired-row K/V loader (K and V row addresses paired, a zero row instead of zero-fill flags:
// fewer instructions per tile; template flag PAIRED).  It serves the calls whose K/V rows are
// aligned to their size (pf_rows_aligned; the others take the flag-bit loader), measured on an
// H200 (alternated twice): causal 8 x 2048 295.3-295.6 -> 298.7-298.9 TFLOP/s, non-causal
// 319.0-319.1 -> 324.2-324.4, causal 1 x 8192 332.9-333.0 -> 338.1-338.2.  Tests turn it off
// (KernelRouting::prefill_paired_rows) to reach the flag-bit loader with vLLM's layouts too.

// The paired-row loader adds the chunk offset to the low 32 bits of a row address: every K/V row must start at a
// multiple of its size (head_dim * 2 bytes, a power of two), i.e. both base pointers and all
// byte strides (page, slot, head) are multiples of it (vLLM's layouts are; other views take the
// flag-bit loader).
bool pf_rows_aligned(const AttnParams& p) {
  const int64_t rb = int64_t(p.head_dim) * 2;
  auto al = [rb](int64_t x) { return x % rb == 0; };
  return al(static_cast<int64_t>(reinterpret_cast<uintptr_t>(p.k))) &&
         al(static_cast<int64_t>(reinterpret_cast<uintptr_t>(p.v))) && al(p.k_sb) && al(p.k_so) &&
         al(p.k_sh) && al(p.v_sb) && al(p.v_so) && al(p.v_sh);
}

// The CTA shape per head dim: 8 warps x 16 rows, except head_dim 128: 4 warps x 32 rows (two
// CTAs per SM; 14 % faster than 8 x 16 on the H200, and faster than the 4 x 16 and 32-key tile
// variants it was measured against).
template <int D>
using PfCfgOf = PfCfg<D, D == 128 ? 2 : 1, D == 128 ? 4 : 8>;

struct PfWs {
  int64_t req, page_base, items, num_items, counter, units, splits, split_count, sections, keys, total;
};
// num_sms bounds the wgmma kernel's grid (its tail pieces and cut units).
PfWs pf_ws(const AttnParams& p, int num_sms) {
  auto al = [](int64_t x) { return (x + 255) / 256 * 256; };
  // 64 rows: no CTA tile is smaller (PfCfgOf: 128 rows each), so this bounds every launch's items
  const int64_t max_items = (p.num_tokens * p.group + 63) / 64 + p.batch;
  PfWs w{};
  int64_t off = 0;
  w.req = off; off += al(int64_t(p.batch) * sizeof(PfReq) + 16);
  w.page_base = off; off += al(int64_t(p.batch) * 8 + 16);
  w.items = off; off += al(max_items * int64_t(sizeof(int2)) + 16);
  w.num_items = off; off += 256;
  w.counter = off; off += 256;
  const int64_t grid = std::max(num_sms, 1);
  w.units = off; off += al((max_items * p.hkv + po::kTailMaxPieces * grid) * int64_t(sizeof(int4)) + 16);
  w.splits = off; off += al(grid * int64_t(sizeof(int2)) + 16);
  w.split_count = off; off += al(2 * grid * 4 + 16);
  w.sections = off; off += al(int64_t(p.batch) * p.hkv * 4 + 16);
  w.keys = off; off += al(max_items * p.hkv * 4 + 16);
  w.total = off;
  return w;
}

template <bool BF16, bool PAIRED, int D>
int pf_run(const AttnParams& p, int num_sms, const PfPlan& plan, bool run_plan) {
  using C = PfCfgOf<D>;
  const int64_t max_items = (p.num_tokens * p.group + C::kRows - 1) / C::kRows + p.batch;
  auto kern = pf_attn_kernel<BF16, D, C::kMT, C::kNW, PAIRED>;
  constexpr int kSmem = C::kSmem + C::kRowTableBytes;
  static int occ_cache[64] = {};  // per device (the smem attribute is per device too)
  int dev = 0;
  cudaGetDevice(&dev);
  int& occ = occ_cache[dev & 63];
  if (occ == 0) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (e != cudaSuccess) return static_cast<int>(e);
    int n = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, C::kThreads, kSmem);
    if (e != cudaSuccess) return static_cast<int>(e);
    occ = n > 0 ? n : 1;
  }
  if (run_plan) {  // else a kept plan (PagedAttentionPlan) holds the tables already
    pf_plan_kernel<<<1, kPlanThreads>>>(p, plan, max_items, C::kRows);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  // never more CTAs than units
  const int64_t units = max_items * p.hkv;
  const int grid = static_cast<int>(std::min<int64_t>(int64_t(num_sms) * occ, std::max<int64_t>(units, 1)));
  kern<<<grid, C::kThreads, kSmem>>>(p, plan);
  return static_cast<int>(cudaGetLastError());
}

template <bool BF16, bool PAIRED>
int pf_dispatch(const AttnParams& p, int num_sms, const PfPlan& plan, bool run_plan) {
  switch (p.head_dim) {
    case 64: return pf_run<BF16, PAIRED, 64>(p, num_sms, plan, run_plan);
    case 128: return pf_run<BF16, PAIRED, 128>(p, num_sms, plan, run_plan);
    case 256: return pf_run<BF16, PAIRED, 256>(p, num_sms, plan, run_plan);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace

bool prefill_supported(const AttnParams& p) {
  const int optin = device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>();
  if (optin == 0) return false;
  const int need = p.head_dim == 64    ? PfCfgOf<64>::kSmem + PfCfgOf<64>::kRowTableBytes
                   : p.head_dim == 128 ? PfCfgOf<128>::kSmem + PfCfgOf<128>::kRowTableBytes
                                       : PfCfgOf<256>::kSmem + PfCfgOf<256>::kRowTableBytes;
  // + 2048: the static row arrays and work slots
  if (need + 2048 > optin) return false;  // e.g. head_dim 256 on sm_80 (164 KB)
  const bool fp8 = p.kv_t == Elt::e4m3 || p.kv_t == Elt::e5m2;
  if (p.kv_t != Elt::bf16 && p.kv_t != Elt::f16 && !fp8) return false;
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) return false;
  if (p.xqa != nullptr || p.mm != nullptr) return false;  // XQA draft masks, PrefixLM: attn_kernel
  if (p.kv_t == Elt::bf16 && p.q_t == Elt::f16) return false;  // unsupported on CUDA altogether
  if (!(p.sm_scale > 0.f)) return false;
  if (p.batch <= 0 || p.num_tokens <= 0) return false;
  // fp8 pages: only the wgmma kernel reads them (the mma.sync kernel does not); else attn_kernel
  if (fp8 && (p.head_dim != 128 || hopper_prefill_choice(p).path != PrefillPath::wgmma)) return false;
  return true;
}

bool prefill_eligible(const AttnParams& p, int num_sms) {
  const Route m = kernel_routing().prefill;
  if (m == Route::off || !prefill_supported(p)) return false;
  if (m == Route::force) return true;
  // many query rows per request, and enough 128-row units to fill the machine without
  // splitting the KV range (attn_kernel splits long KV ranges of few rows)
  const int64_t rows = p.num_tokens * p.group;
  const int64_t rows_avg = rows / p.batch;
  const int64_t units = (rows / kRowsPerCta) * p.hkv;
  return rows_avg >= kRowsPerCta && units >= num_sms;
}

int64_t prefill_workspace_bytes(const AttnParams& p, int num_sms) { return pf_ws(p, num_sms).total; }

int64_t prefill_scratch_bytes(const AttnParams& p, int num_sms) {
  // the wgmma kernel's partial results of cut tail units: only a plan dealt round-robin to two
  // CTAs or more cuts its tail (plan_tail)
  if (p.head_dim != 128 || hopper_prefill_round_robin_ctas(p, num_sms) < 2) return 0;
  return int64_t(po::tail_slots(std::max(num_sms, 1))) * kHopperPartialFloats * 4;
}

int launch_prefill_attention(const AttnParams& p, int num_sms, void* workspace, void* scratch, bool run_plan) {
  if (p.batch == 0 || p.num_tokens == 0) return 0;
  const PfWs w = pf_ws(p, num_sms);
  char* base = static_cast<char*>(workspace);
  PfPlan plan;
  plan.req = reinterpret_cast<PfReq*>(base + w.req);
  plan.page_base = reinterpret_cast<int64_t*>(base + w.page_base);
  plan.items = reinterpret_cast<int2*>(base + w.items);
  plan.num_items = reinterpret_cast<int32_t*>(base + w.num_items);
  plan.counter = reinterpret_cast<int32_t*>(base + w.counter);
  plan.units = reinterpret_cast<int4*>(base + w.units);
  // no scratch for partial results: the tail stays whole units
  plan.splits = scratch != nullptr ? reinterpret_cast<int2*>(base + w.splits) : nullptr;
  plan.split_count = reinterpret_cast<int32_t*>(base + w.split_count);
  plan.sections = reinterpret_cast<int32_t*>(base + w.sections);
  plan.keys = reinterpret_cast<int32_t*>(base + w.keys);
  // head_dim 128 on sm_90a: the TMA + wgmma kernel (hopper_prefill.cu) for the calls it covers,
  // on a plan of its own (pf_plan_l2_kernel: PfCfgOf<128>'s 128-row tiles, its units in L2
  // sections); the plan key holds the routing setting, so a kept plan is of the kernel it serves
  PrefillChoice choice = p.head_dim == 128 ? hopper_prefill_choice(p)
                                           : PrefillChoice{PrefillPath::mma_sync, "head_dim is not 128"};
  if (choice.path == PrefillPath::wgmma) {
    static_assert(PfCfgOf<128>::kRows == 128 && sizeof(PfReq) == 16 && sizeof(int2) == 8, "plan tables");
    if (run_plan) {
      const int64_t max_items = (p.num_tokens * p.group + 127) / 128 + p.batch;
      // L2 sections of 5/8 of the L2 (FlashAttention-3 sections 32 MB of its H100's 50 MB)
      const int64_t l2_set = kernel_routing().prefill_l2_budget;
      const int64_t l2_budget = l2_set > 0 ? l2_set : int64_t(device_attribute<cudaDevAttrL2CacheSize>()) * 5 / 8;
      const int kv_token_bytes = 2 * p.head_dim * elt_size(p.kv_t);  // K and V of one head
      pf_plan_l2_kernel<<<1, kPlanThreads>>>(p, plan, max_items, 128, std::max<int64_t>(l2_budget, 1), kv_token_bytes,
                                             hopper_prefill_round_robin_ctas(p, num_sms), kernel_routing().prefill_tail_split);
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return static_cast<int>(e);
    }
    const HopperPlanTables tables{.req = plan.req,
                                  .page_base = plan.page_base,
                                  .units = plan.units,
                                  .num_items = plan.num_items,
                                  .counter = plan.counter,
                                  .splits = plan.splits,
                                  .split_count = plan.split_count,
                                  .partial = static_cast<float*>(scratch)};
    const int rc = launch_hopper_prefill(p, num_sms, tables);
    if (rc != -1) {
      if (rc == 0) {
        note_launch(KernelLaunch::prefill, choice.reason);
        note_launch(KernelLaunch::prefill_wgmma, choice.reason);
      }
      return rc;
    }
    // (the choice encodes the same maps, so this is not expected; fp8 pages have no other
    // prefill kernel)
    if (p.kv_t == Elt::e4m3 || p.kv_t == Elt::e5m2) return static_cast<int>(cudaErrorNotSupported);
    choice = PrefillChoice{PrefillPath::mma_sync, "the driver rejected the K/V tensor maps"};
    run_plan = true;  // the mma.sync kernel's own plan (items)
  }
  const bool paired = kernel_routing().prefill_paired_rows && pf_rows_aligned(p);
  int rc = 0;
  if (p.kv_t == Elt::bf16)
    rc = paired ? pf_dispatch<true, true>(p, num_sms, plan, run_plan) : pf_dispatch<true, false>(p, num_sms, plan, run_plan);
  else
    rc = paired ? pf_dispatch<false, true>(p, num_sms, plan, run_plan) : pf_dispatch<false, false>(p, num_sms, plan, run_plan);
  if (rc == 0) note_launch(KernelLaunch::prefill, choice.reason);
  return rc;
}

}  // namespace kvattn::ops::cuda_impl::k
