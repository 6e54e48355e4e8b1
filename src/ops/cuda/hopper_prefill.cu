// src/ops/cuda/hopper_prefill.cu — paged PREFILL attention for sm_90a: TMA page gathers by a
// producer warp, wgmma in two consumer warpgroups, an mbarrier ring of two K/V stages.
//
// Covers: head_dim 128; bf16 query / K / V / output, f16 query / K / V / output, or fp8 (e4m3 /
// e5m2) K / V with a bf16 or f16 query and output of its type (16-byte rows); GQA, causal or not,
// sliding window, logit soft cap, pages of 8..128 tokens (a divisor of the 128-key tile) through
// either page form, LSE (both bases), sinks, q/k/v scales.  Everything else (head dims 64 / 256,
// f32 query or output, PrefixLM / XQA masks) stays on the mma.sync kernel (prefill_kernel.cu), which
// also builds the plan this kernel reads (same 128-row tiles; hopper_prefill_choice() says which
// kernel serves a call and why), or for fp8 pages on attn_kernel (the mma.sync kernel reads no fp8).
//
// CTA = 3 warpgroups.  Warpgroup 0, the producer: warp 0 brings K / V, warps 1-3 the queries
// (16-bit pages) or widen fp8 K / V (below).  Per 128-key tile warp 0 reads the tile's page ids
// from the block table / kv_indices and issues one TMA box per page and 64-column half into the
// stage's K and V buffers (128-byte swizzle, the wgmma operand layout).  A page id out of
// range reads as -1: the box lies outside the tensor map and TMA fills it with zeros.  Where the
// last page of a request holds slots past kv_len (their bytes may be anything, NaN too), the
// producer waits for the V box itself, zeroes those rows and then releases V (masked scores give
// P = 0, but 0 * NaN is NaN).
// Warpgroups 1 and 2: 64 query rows each (rows = (token, head in the GQA group) pairs of one KV
// head, as prefill_kernel.cu).  16-bit pages: producer warps 1-3 gather each unit's Q rows with
// cp.async into the swizzled layout of one of two Q tiles, with the unit's row tables and its
// record (the unit's key range, lengths and split, which the consumers read there instead of
// loading the plan), while the consumers still work on the unit before (barriers q_full / q_empty
// per Q tile), so a unit starts without waiting for its query (short requests have units of 1-4
// key tiles, where that wait showed as the top stall); fp8 pages leave no room for a second Q tile, so there the
// consumers gather their own rows at each unit's start.  S = Q K^T by wgmma m64n128k16 from
// shared memory; K(t) is released as soon as S(t) is done, V(t) once P(t) V(t) is (separate
// empty barriers: under the overlapped schedules P V trails S by a tile, and one barrier per
// stage held K back with V, so the producer refilled K just before S needed it); mask only on
// diagonal / tail tiles, as per-row limits of constant column offsets (a compare and a select per
// element); online softmax in base 2 (lazy rescale, as prefill_kernel.cu); P converted to bf16 A
// fragments in registers; O += P V by wgmma m64n128k16 (V N-major: the two 64-column halves one
// operand, the descriptor's leading byte offset stepping between them).  A warpgroup's visible
// tiles are one contiguous range: those above its
// causal diagonal and left of its window are only waited for and released (a unit's key range
// already starts at its first row's window).
// Soft cap: s -> cap * tanh(s * sm_scale / cap) before the mask, as prefill_kernel.cu.
// Consumer schedule, a template parameter chosen per launch (KVATTN_PREFILL_HOPPER_SCHED):
//   serial   per tile: S, wait, softmax, P V, wait.
//   overlap  per tile t: S(t) and P(t-1) V(t-1) issued back to back, wait_group 1 (S(t) done),
//            softmax of t while P V runs on the tensor cores, wait_group 0, V(t-1)
//            released, O rescaled, P(t) formed (FA3's intra-warpgroup pipelining; one more
//            64-float accumulator live: no spills under setmaxnreg 224).
//   pingpong overlap, and the two consumer warpgroups take turns at issuing each tile's GEMMs
//            (named barriers 3 + c: bar.sync on one's own, bar.arrive on the other's, 256
//            threads; one turn per tile, skipped tiles too), so one warpgroup's softmax runs
//            under the other's GEMMs.
//   turns    serial, with the pingpong turns around each tile's S (P V issued outside them).
// Unset, a call takes turns where its units are long on average (16-bit pages), else pingpong
// (hopper_sched_for, routing.h, with the measurements behind it).
// Three K/V stages do not fit: two Q tiles (64 KB) + 3 x 64 KB exceed 227 KB, and so do one Q
// tile + 3 x 64 KB with the row tables and the base's alignment.
// Registers: the producer warpgroup 56 per thread, the consumers 224: nothing spills (ptxas -v;
// at 24 / 240 the fp8 widening spilled 48-60 bytes, at 40 / 232 the producer of 16-bit pages
// 12-36; the consumers fit 224).
// fp8 pages (kKV e4m3 / e5m2): the producer warp's TMA boxes (one per page, 128 one-byte dims)
// land in two stages of K and V staging tiles (16 KB each, 128-byte swizzle); warps 1-3 of the producer
// warpgroup widen each into the f16 operand tile of the next K/V stage (e4m3 by the hardware cvt,
// e5m2 as the high byte of an f16: exact, so k_scale / v_scale stay in sm_scale / the epilogue),
// write zeros for keys past kv_len, and arrive on the stage's full barriers (3 arrivals); the
// consumers then run f16 wgmma, a bf16 query rounded to f16 as it is staged (as attn_kernel's fp8
// path computes in f16).
// Units (item, KV head) are taken in the plan's order.  16-bit pages: round-robin, CTA b the
// units b, b + grid, ... (no counter: the producer and consumers walk the same list
// independently).  fp8 pages: each CTA draws its next unit from the plan's counter (a ring of
// unit slots hands the index from producer warp 0 to the other warps), so CTAs that drew short
// units draw more.  In the 16-bit kernels the same ring cost 3.5-5.6 % on the shapes of long units
// (non-causal, 4 x 4096, chunked) even when it handed on the round-robin sequence, more than
// drawing gained elsewhere (src/ops/DESIGN.md), so they keep round-robin.  The plan
// (prefill_kernel.cu pf_plan_l2_kernel) lists the units by L2 section of (request, KV head)
// groups, so the CTAs running at once share their K/V in L2, and within a section by cost, in
// waves of one unit per CTA dealt alternately forwards and backwards for round-robin, so the
// CTAs' sums of unit costs come out even (prefill_plan_order.h, hopper_prefill_round_robin_ctas).
// Round-robin, the list's tail (the units past its last full wave) may be cut stream-K style
// (prefill_plan_order.h tail_ctas): each CTA's list ends with pieces (a key-tile range of a unit)
// and holes (request -1: the producer and consumers stop there alike); a piece's consumers
// write its partial result to the plan's scratch and the piece that finishes last merges them
// (hp_piece_done), so a few long units no longer leave most CTAs idle while the rest finish
// (a long context's chunk, 1 x (q 2048, kv 32768): 573 against 556 TFLOP/s on an H200, 578
// against 523 on an H100, where one shape's rate varies up to 3 % run to run).
#include <cuda.h>
#include <cudaTypedefs.h>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/hopper_prefill.h"
#include "ops/cuda/routing.h"
#include "ops/cuda/softmax.cuh"
#include "ops/cuda/tile_mask.h"
#include "ops/cuda/wgmma.cuh"
#include "ops/cuda/ptx.cuh"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

namespace kvattn::ops::cuda_impl::k {
namespace {

constexpr int kD = 128;          // head dim
constexpr int kRows = 128;       // rows per CTA (2 consumer warpgroups x 64)
constexpr int kKeys = 128;       // keys per K/V tile
constexpr int kStages = 2;
constexpr int kThreads = 384;
constexpr int kHalf = kKeys * 128;     // bytes of one 64-column half of a 128-row tile
constexpr int kTileBytes = 2 * kHalf;  // one K or V tile (or a Q tile)
constexpr int kStageBytes = 2 * kTileBytes;
// The K/V cache element type the kernel reads (its second template parameter).  bf16 and f16
// pages go from TMA straight into the wgmma operand tiles; fp8 pages (e4m3, e5m2) land in
// staging tiles and the producer warpgroup's three other warps widen them into f16 operand tiles
// (exact: every e4m3 / e5m2 value is an f16), so fp8 calls run f16 wgmma.
enum HpKv : int { kKvBf16 = 0, kKvF16 = 1, kKvE4m3 = 2, kKvE5m2 = 3 };
constexpr int kNumKv = 4;
// Shared memory: the Q tile(s), kStages K/V stages, (fp8) kStages8 stages of K and V staging
// tiles, the mbarriers, the row tables (position, token, head; 16-bit pages also each row's
// output offset) of each Q tile, the unit slots' indices.
// 16-bit pages: two Q tiles, each with its row tables and unit record.  The producer
// warpgroup's warps 1-3 gather unit n's Q rows into tile n % 2 while the consumers work on unit
// n - 1 (barriers per Q tile: full, empty), so a unit starts without waiting for its query:
// 64 + 128 KB + 5 KB of tables.
// fp8 pages: those warps widen K / V, so the consumers gather their own Q at each unit's start
// into the one Q tile; two staging stages fit only with output offsets computed from token and
// head: 32 + 128 + 64 KB + 192 bytes of barriers + 1.5 KB of tables + 16 bytes of unit slots +
// 1 KB of alignment = 232,144 bytes of the 232,448 a CTA may have.
// fp8 pages: the units a CTA takes are drawn from the plan's counter by producer warp 0 and
// passed to the others through a ring of this many slots (a slot per unit: its index, a full and
// an empty barrier).
constexpr int kUnitSlots = 4;
// 16-bit pages: the fields of a unit the consumers use, written by producer warps 1-3 into its Q
// tile's record with the tile's rows (the consumers then read them from shared memory after
// q_full instead of loading the plan at the unit's start: two dependent global loads and a
// division).  kRecR < 0: a hole, the CTA's list ends.  kRecSplit: the plan entry's .w (a piece
// of a cut unit, or -1).
enum HpRec : int { kRecR, kRecT0, kRecTiles, kRecKvLen, kRecRow0, kRecRows, kRecSplit, kRecInts };
template <int kKV>
struct HpLayout {
  static constexpr bool kFp8 = kKV >= kKvE4m3;
  static constexpr int kQTiles = kFp8 ? 1 : 2;     // 2: Q gathered ahead by the producer warpgroup
  static constexpr int kStages8 = kFp8 ? 2 : 0;
  static constexpr bool kRowOffsets = !kFp8;  // output offset per row in the table, else computed
  // units drawn from the plan's counter (fp8 pages), else taken round-robin: see hp_draw_issue
  static constexpr bool kDrawn = kFp8;
  static constexpr int kSlots = kDrawn ? kUnitSlots : 0;  // the unit ring's slots
  static constexpr int kOffK = kQTiles * kTileBytes;
  static constexpr int kOffStage8 = kOffK + kStages * kStageBytes;
  static constexpr int kStage8Tile = kKeys * kD;  // 128 keys x 128 one-byte dims
  static constexpr int kOffBar = kOffStage8 + kStages8 * 2 * kStage8Tile;
  // full K, full V, empty K, empty V, aux per stage; fp8: staging full K, full V, empty per staging stage;
  // two Q tiles: full, empty per tile; unit slots: full, empty per slot
  static constexpr int kBars = 5 * kStages + 3 * kStages8 + (kQTiles == 2 ? 4 : 0) + 2 * kSlots;
  static constexpr int kOffTab = kOffBar + 8 * kBars;
  static constexpr int kTabRow = (kRowOffsets ? 8 : 0) + 4 + 4 + 4;  // bytes per row of one Q tile
  static constexpr int kTabBytes = kQTiles * kRows * kTabRow;
  static constexpr int kOffUnits = kOffTab + kTabBytes;  // the unit slots' unit indices (int32)
  // round-robin: per consumer warpgroup, the count a piece of a cut unit read at its end
  // (hp_piece_done); per Q tile, its unit's record (HpRec), written with the tile's rows
  static constexpr int kFlags = kDrawn ? 0 : 2 + 2 * kRecInts;
  static constexpr int kSmem = kOffUnits + 4 * (kSlots + kFlags) + 1024;  // + alignment of the base to 1024
  static_assert(kSmem <= 232448, "shared memory per CTA (227 KB)");
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVATTN_HP_BODY 1
__device__ int g_hp_arch = 1;  // this image holds the wgmma kernel's body
#else
__device__ int g_hp_arch = 0;
#endif

#if defined(KVATTN_HP_BODY)
constexpr float kLazy = 8.f;
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 x;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w) : "r"(addr) : "memory");
  return x;
}
// The unit's key range: [lo, hi) (causal: up to the last row's position; sliding window: from
// the first row's window start), in n_tiles tiles from tile t0 (keys t0 * 128 ...).
// A piece of a unit cut in the plan's tail (entry .w >= 0: piece index << 16 | split id) covers
// n_tiles tiles of the unit's range from t0.  r = -1: a hole, the CTA's list ends.
struct HpUnit {
  int r, tile, hk, q_start, q_len, kv_len, rows, row0, ctx, hi, t0, n_tiles;
  int64_t pbase;
};
__device__ __forceinline__ HpUnit hp_unit(const AttnParams& p, const HopperPlanTables& plan, int w) {
  HpUnit u;
  const int4 it = static_cast<const int4*>(plan.units)[w];
  u.r = it.x;
  // a hole reads request 0's row (its fields go unused): with an early return instead, the
  // consumers' registers spilled (ptxas -v)
  const int rq_i = max(it.x, 0);
  u.tile = it.y / p.hkv;
  u.hk = it.y - u.tile * p.hkv;
  const int4 rq = static_cast<const int4*>(plan.req)[rq_i];
  u.q_start = rq.x;
  u.q_len = rq.y;
  u.kv_len = rq.z;
  u.rows = u.q_len * p.group;
  u.row0 = u.tile * kRows;
  u.ctx = u.kv_len - u.q_len;
  const int last_row = min(u.rows, u.row0 + kRows) - 1;
  u.hi = u.kv_len;
  if (p.causal) u.hi = min(u.hi, u.ctx + last_row / p.group + 1);
  int lo = 0;
  if (p.window_left >= 0) lo = static_cast<int>(max(int64_t(0), int64_t(u.ctx + u.row0 / p.group) - p.window_left));
  u.t0 = lo / kKeys;
  u.n_tiles = u.hi > lo ? (u.hi - u.t0 * kKeys + kKeys - 1) / kKeys : 0;
  if (it.w >= 0) {
    u.t0 += it.z >> 16;
    u.n_tiles = it.z & 0xffff;
  }
  u.pbase = plan.page_base[rq_i];
  return u;
}
// The page id of this lane's page of the key tile at kt0 (lanes < pages per tile; -1 past the
// end or out of range: the TMA box then lies outside the tensor map and reads zeros).
__device__ __forceinline__ int hp_page(const AttnParams& p, const HpUnit& u, int kt0, int lane, int ppt) {
  const int P = p.page_size;
  int pg = -1;
  const int j0 = kt0 + lane * P;
  if (lane < ppt && j0 < u.kv_len) {
    const int blk = p.page_shift >= 0 ? (j0 >> p.page_shift) : (j0 / P);
    const int64_t v = idx_word_value(page_index(p), load_idx_word(page_index(p), page_elem(p, u.pbase, u.r, blk), true));
    pg = (v < 0 || v >= p.num_pages) ? -1 : static_cast<int>(v);
  }
  return pg;
}
// Row lr (CTA-local) of unit u: its token (-1: no row), query head and the token's position.
struct HpRow {
  int tok, head, pos;
};
__device__ __forceinline__ HpRow hp_row(const AttnParams& p, const HpUnit& u, int lr) {
  const int rr = u.row0 + lr;
  const bool v = rr < u.rows;
  const int tk = max(min(rr, u.rows - 1), 0) / p.group;
  return {v ? u.q_start + tk : -1, u.hk * p.group + (v ? rr - tk * p.group : 0), u.ctx + tk};
}
// fp8 widening: one tensor's staging tile (128 keys x 128 bytes, 128-byte swizzle) -> its f16
// operand tile (two 64-column halves of 128 keys x 128 bytes, 128-byte swizzle); keys from
// `valid` on are written as zeros (bytes past kv_len may be anything, NaN too).  Warp cw of 3
// takes the (8-key block, 64-dim half) items cw, cw + 3, ...; lane = (key in the block, 16-dim
// group): 8 lanes of one 16-byte access phase hit 8 different bank groups on both sides.
// A whole tile (valid >= 128 keys, all but a request's last) takes the unrolled form: items k
// and k + 2 of a warp are 24 keys apart in the same half, so two base addresses (k even, k odd)
// and constant offsets address them all, and no row is checked (these warps share their SM
// sub-partitions' issue slots with the consumers: the general loop spent about 36 instructions
// per item where the load, 8 conversions and 2 stores are 11).
template <bool kE4m3>
__device__ __forceinline__ void hp_widen_item(uint4 x, uint32_t row, uint32_t c_lo, uint32_t c_hi) {
  uint32_t y0, y1, y2, y3;  // one 16-byte chunk of output at a time
  fp8x4_to_f16x2x2<kE4m3>(x.x, y0, y1);
  fp8x4_to_f16x2x2<kE4m3>(x.y, y2, y3);
  st_shared_v4(row + c_lo, y0, y1, y2, y3);
  fp8x4_to_f16x2x2<kE4m3>(x.z, y0, y1);
  fp8x4_to_f16x2x2<kE4m3>(x.w, y2, y3);
  st_shared_v4(row + c_hi, y0, y1, y2, y3);
}
template <bool kE4m3>
__device__ __forceinline__ void hp_widen_tile(uint32_t src, uint32_t dst, int valid, int cw, int lane) {
  const int sw = lane & 7, q = lane >> 3;
  const uint32_t c_lo = uint32_t((2 * q) ^ sw) << 4, c_hi = uint32_t((2 * q + 1) ^ sw) << 4;
  if (valid >= kKeys) {
    uint32_t s_base[2], d_base[2];
#pragma unroll
    for (int par = 0; par < 2; ++par) {
      const int i = cw + 3 * par;
      const int h = i & 1, r = (i >> 1) * 8 + sw;
      s_base[par] = src + r * 128 + (uint32_t((4 * h + q) ^ sw) << 4);
      d_base[par] = dst + h * kHalf + r * 128;
    }
#pragma unroll
    for (int k = 0; k < 11; ++k) {
      if (k < 10 || cw < 2) {  // item cw + 3k < 32
        const uint32_t off = uint32_t(k >> 1) * (24 * 128);
        hp_widen_item<kE4m3>(ld_shared_v4(s_base[k & 1] + off), d_base[k & 1] + off, c_lo, c_hi);
      }
    }
    return;
  }
  for (int i = cw; i < 32; i += 3) {
    const int h = i & 1, r = (i >> 1) * 8 + sw;
    const uint4 x = r < valid ? ld_shared_v4(src + r * 128 + (uint32_t((4 * h + q) ^ sw) << 4)) : make_uint4(0u, 0u, 0u, 0u);
    hp_widen_item<kE4m3>(x, dst + h * kHalf + r * 128, c_lo, c_hi);
  }
}

// The kernel's shared memory by role (addresses in the shared window; base aligned to 1024).
template <int kKV>
struct HpSmem {
  using L = HpLayout<kKV>;
  uint32_t base;
  uint32_t bars;  // base + L::kOffBar
  unsigned char* sbase;
  __device__ __forceinline__ uint32_t q_tile(int b) const { return base + b * kTileBytes; }
  __device__ __forceinline__ uint32_t k(int s) const { return base + L::kOffK + s * kStageBytes; }
  __device__ __forceinline__ uint32_t v(int s) const { return base + L::kOffK + s * kStageBytes + kTileBytes; }
  __device__ __forceinline__ uint32_t bar(int i) const { return bars + 8 * i; }
  __device__ __forceinline__ uint32_t full_k(int s) const { return bar(s); }
  __device__ __forceinline__ uint32_t full_v(int s) const { return bar(kStages + s); }
  // K and V of a stage are released apart: K once S = Q K^T is done, V once O += P V is (under
  // the overlapped schedules a tile's P V runs a tile later, so one barrier held K back with V)
  __device__ __forceinline__ uint32_t empty_k(int s) const { return bar(2 * kStages + s); }
  __device__ __forceinline__ uint32_t empty_v(int s) const { return bar(3 * kStages + s); }
  __device__ __forceinline__ uint32_t aux(int s) const { return bar(4 * kStages + s); }
  // fp8: the staging tiles and their barriers (filled by TMA, emptied by the widening)
  __device__ __forceinline__ uint32_t k8(int s) const { return base + L::kOffStage8 + s * 2 * L::kStage8Tile; }
  __device__ __forceinline__ uint32_t v8(int s) const {
    return base + L::kOffStage8 + s * 2 * L::kStage8Tile + L::kStage8Tile;
  }
  __device__ __forceinline__ uint32_t st_full_k(int s) const { return bar(5 * kStages + s); }
  __device__ __forceinline__ uint32_t st_full_v(int s) const { return bar(5 * kStages + L::kStages8 + s); }
  __device__ __forceinline__ uint32_t st_empty(int s) const { return bar(5 * kStages + 2 * L::kStages8 + s); }
  // two Q tiles: tile b filled (the 96 threads of producer warps 1-3 arrive) and free again (the
  // 256 consumer threads)
  __device__ __forceinline__ uint32_t q_full(int b) const { return bar(5 * kStages + 3 * L::kStages8 + b); }
  __device__ __forceinline__ uint32_t q_empty(int b) const { return bar(5 * kStages + 3 * L::kStages8 + 2 + b); }
  // unit slot i: drawn (producer warp 0 arrives) and read by all (the 96 threads of producer
  // warps 1-3 and the 256 consumer threads arrive)
  static constexpr int kUnitBar0 = 5 * kStages + 3 * L::kStages8 + (L::kQTiles == 2 ? 4 : 0);
  __device__ __forceinline__ uint32_t unit_full(int i) const { return bar(kUnitBar0 + i); }
  __device__ __forceinline__ uint32_t unit_empty(int i) const { return bar(kUnitBar0 + kUnitSlots + i); }
  __device__ __forceinline__ int* unit_slot(int i) const { return reinterpret_cast<int*>(sbase + L::kOffUnits) + i; }
  __device__ __forceinline__ int* piece_count(int c) const {
    return reinterpret_cast<int*>(sbase + L::kOffUnits) + L::kSlots + c;
  }
  // Q tile b's unit record (16-bit pages), HpRec's fields
  __device__ __forceinline__ int* unit_rec(int b) const {
    return reinterpret_cast<int*>(sbase + L::kOffUnits) + L::kSlots + 2 + kRecInts * b;
  }
  // Q tile b's row tables: output offsets (kRowOffsets), then positions, tokens, heads
  __device__ __forceinline__ int64_t* tab_ooff(int b) const {
    return reinterpret_cast<int64_t*>(sbase + L::kOffTab) + b * kRows;
  }
  __device__ __forceinline__ int* tab_pos(int b) const {
    return reinterpret_cast<int*>(sbase + L::kOffTab + (L::kRowOffsets ? 8 * kRows * L::kQTiles : 0)) + b * 3 * kRows;
  }
  // where 16-byte chunk ch (of 16) of row lr of Q tile b lies (128-byte swizzle, two 64-column halves)
  __device__ __forceinline__ uint32_t q_chunk(int b, int lr, int ch) const {
    return q_tile(b) + (ch >> 3) * kHalf + lr * 128 + (((ch & 7) ^ (lr & 7)) << 4);
  }
};
// row lr of unit u into Q tile b's tables
template <int kKV>
__device__ __forceinline__ void hp_put_row(const AttnParams& p, const HpSmem<kKV>& sm, const HpUnit& u, int b, int lr) {
  const HpRow r = hp_row(p, u, lr);
  int* pos = sm.tab_pos(b);
  pos[lr] = r.pos;
  pos[kRows + lr] = r.tok;
  pos[2 * kRows + lr] = r.head;
  if constexpr (HpLayout<kKV>::kRowOffsets)
    sm.tab_ooff(b)[lr] = r.tok < 0 ? int64_t(-1) : int64_t(r.tok) * p.o_st + int64_t(r.head) * p.o_sh;
}
// row lr's Q element offset in unit u (-1: no row)
__device__ __forceinline__ int64_t hp_q_off(const AttnParams& p, const HpUnit& u, int lr) {
  const HpRow r = hp_row(p, u, lr);
  return r.tok < 0 ? int64_t(-1) : int64_t(r.tok) * p.q_st + int64_t(r.head) * p.q_sh;
}
// ---- fp8 pages: the CTA's units drawn from the plan's counter in list order ----
// Producer warp 0 draws the CTA's units and hands each on through slot n % kUnitSlots (all its
// lanes get the index; >= total: none left).  It draws unit n + 1 as it starts unit n: one unit
// in hand, so a warp that gathers ahead of the consumers knows the next unit a unit early (with
// the Q-gathering warps of the 16-bit layout, drawing only once unit n's tiles were all issued
// left the Q gather exposed at every unit start); the balance lost is at most one unit per CTA,
// of the tens each takes.  The draw is split in two so the atomic's round trip stays off the
// path of the TMA issue: hp_draw_issue sends it, hp_hand_on (after the unit's first tile is on
// its way) waits for its answer and fills the slot.
// Every CTA draws until it gets an index >= total, so a launch makes total + grid draws; the
// one that returns the last of them puts the counter back to 0 for the next launch on the plan.
__device__ __forceinline__ int hp_draw_issue(int* counter, int lane) { return lane == 0 ? atomicAdd(counter, 1) : 0; }
template <int kKV>
__device__ __forceinline__ int hp_hand_on(const HpSmem<kKV>& sm, int* counter, int drawn, int total, int n, int lane) {
  if (lane == 0) {
    if (drawn == total + static_cast<int>(gridDim.x) - 1) atomicExch(counter, 0);
    const int slot = n % kUnitSlots;
    mbar_wait(sm.unit_empty(slot), ((n / kUnitSlots) & 1) ^ 1);
    *sm.unit_slot(slot) = drawn;
    mbar_arrive(sm.unit_full(slot));
  }
  return __shfl_sync(0xffffffffu, drawn, 0);
}
// The other threads: the CTA's n-th unit, once drawn (each thread reads, then arrives).  The
// index is shuffled from lane 0 so the compiler sees it warp-uniform, as the unit loop's index
// was when it counted from blockIdx.x: the unit's fields and the loop's exit then stay uniform
// (a wgmma on a path the compiler cannot prove uniform is serialised).
template <int kKV>
__device__ __forceinline__ int hp_take_unit(const HpSmem<kKV>& sm, int n) {
  const int slot = n % kUnitSlots;
  mbar_wait(sm.unit_full(slot), (n / kUnitSlots) & 1);
  const int w = *sm.unit_slot(slot);
  mbar_arrive(sm.unit_empty(slot));
  return __shfl_sync(0xffffffffu, w, 0);
}

// ---- pieces of units cut in the plan's tail (16-bit pages) ----
// Consumer warpgroup c's end of a piece (split = piece index << 16 | split id): its 64 rows'
// partial result go to the piece's slot (O / l in f32, log2 LSE m + log2 l per row), then the
// warpgroup counts the piece done on the unit's counter.  The piece that counts last merges:
// every piece's result, its own too, read back in piece order (so the sum does not depend on
// which finished last), becomes o, m, l as one whole range would have left them (up to
// rounding), and it returns true (the unit's epilogue then writes O and the LSE, sinks
// included, as for a whole unit); the others return false.  It puts the counter back to 0 for
// the next launch on the plan.  l: the rows' sums over the quad, in every lane of it.
template <int kKV>
__device__ __forceinline__ bool hp_piece_done(const HopperPlanTables& plan, const HpSmem<kKV>& sm, int split, int c,
                                              int tw, int rl, int t4, float (&o)[2][32], float (&m)[2], float (&l)[2]) {
  const int sid = split & 0xffff, j = split >> 16;
  const int2 sp = static_cast<const int2*>(plan.splits)[sid];  // first slot, pieces
  constexpr int kLse = kRows * kD;                             // a slot's LSE column after its O
  float* slot = plan.partial + int64_t(sp.x + j) * kHopperPartialFloats;
  float inv[2], lse[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    inv[h] = l[h] > 0.f ? 1.f / l[h] : 0.f;
    lse[h] = (l[h] > 0.f && m[h] != -INFINITY) ? m[h] + log2f(l[h]) : -INFINITY;
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const int col = hh * 64 + 8 * jj + 2 * t4;
      __stcg(reinterpret_cast<float2*>(slot + rl * kD + col), make_float2(o[hh][4 * jj] * inv[0], o[hh][4 * jj + 1] * inv[0]));
      __stcg(reinterpret_cast<float2*>(slot + (rl + 8) * kD + col),
             make_float2(o[hh][4 * jj + 2] * inv[1], o[hh][4 * jj + 3] * inv[1]));
    }
  if (t4 == 0) {
    __stcg(slot + kLse + rl, lse[0]);
    __stcg(slot + kLse + rl + 8, lse[1]);
  }
  // thread 0 publishes the warpgroup's stores (ordered before its release by the barrier) with
  // its count, and the last piece's thread 0 acquires the others' before the barrier releases
  // the warpgroup to read them (one fence per warpgroup, not per thread)
  named_sync(1 + c, 128);
  int* count = sm.piece_count(c);
  if (tw == 0) {
    __threadfence();
    const int done = atomicAdd(&plan.split_count[2 * sid + c], 1);
    if (done == sp.y - 1) {
      plan.split_count[2 * sid + c] = 0;  // for the next launch on the plan
      __threadfence();
    }
    *count = done;
  }
  named_sync(1 + c, 128);
  // shuffled from lane 0, so the compiler sees the branch warp-uniform: with the shared value
  // read per thread, the unit loop's stage and phase arithmetic left the uniform datapath (5 %
  // more instructions issued on every call, cut units or not)
  if (__shfl_sync(0xffffffffu, *count, 0) != sp.y - 1) return false;
  // the merge, in piece order with a running maximum: each piece's LSE and O loads go out
  // together, one round trip per piece
  const float* first = plan.partial + int64_t(sp.x) * kHopperPartialFloats;
  float mx[2] = {-INFINITY, -INFINITY};
  l[0] = l[1] = 0.f;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
#pragma unroll
    for (int i = 0; i < 32; ++i) o[hh][i] = 0.f;
  for (int k = 0; k < sp.y; ++k) {
    const float* sk = first + k * kHopperPartialFloats;
    float lk[2];
    float2 a[2][8], b[2][8];
#pragma unroll
    for (int h = 0; h < 2; ++h) lk[h] = __ldcg(sk + kLse + rl + 8 * h);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const int col = hh * 64 + 8 * jj + 2 * t4;
        a[hh][jj] = __ldcg(reinterpret_cast<const float2*>(sk + rl * kD + col));
        b[hh][jj] = __ldcg(reinterpret_cast<const float2*>(sk + (rl + 8) * kD + col));
      }
    float keep[2], wt[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float mn = fmaxf(mx[h], lk[h]);
      keep[h] = mx[h] == -INFINITY ? 0.f : exp2f(mx[h] - mn);
      wt[h] = lk[h] == -INFINITY ? 0.f : exp2f(lk[h] - mn);
      l[h] = fmaf(l[h], keep[h], wt[h]);
      mx[h] = mn;
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        o[hh][4 * jj] = fmaf(o[hh][4 * jj], keep[0], wt[0] * a[hh][jj].x);
        o[hh][4 * jj + 1] = fmaf(o[hh][4 * jj + 1], keep[0], wt[0] * a[hh][jj].y);
        o[hh][4 * jj + 2] = fmaf(o[hh][4 * jj + 2], keep[1], wt[1] * b[hh][jj].x);
        o[hh][4 * jj + 3] = fmaf(o[hh][4 * jj + 3], keep[1], wt[1] * b[hh][jj].y);
      }
  }
  m[0] = mx[0];
  m[1] = mx[1];
  return true;
}

// ---- the producer warpgroup's roles (each runs until the CTA's last unit) ----
// fp8 pages: warp 0 brings each tile's pages into the staging tiles (TMA), warps 1-3 widen them
// into the f16 operand tiles of stage it % kStages.
template <int kKV>
__device__ __forceinline__ void hp_fp8_producer(const AttnParams& p, const HopperPlanTables& plan, const HpSmem<kKV>& sm,
                                                const CUtensorMap* tm_k, const CUtensorMap* tm_v, int total, int P, int ppt,
                                                int warp, int lane) {
  using L = HpLayout<kKV>;
  int it = 0;
  if (warp == 0) {  // TMA: each tile's pages into the staging tiles
    int w = hp_hand_on(sm, plan.counter, hp_draw_issue(plan.counter, lane), total, 0, lane);
    for (int n = 0; w < total; ++n) {
      const int drawn = hp_draw_issue(plan.counter, lane);  // unit n + 1 (one in hand: see hp_draw_issue)
      int w_next = total;
      const HpUnit u = hp_unit(p, plan, w);
      if (u.n_tiles == 0) w_next = hp_hand_on(sm, plan.counter, drawn, total, n + 1, lane);
      for (int t = 0; t < u.n_tiles; ++t, ++it) {
        const int kt0 = (u.t0 + t) * kKeys;
        const int pg = hp_page(p, u, kt0, lane, ppt);
        const int s8 = it % L::kStages8;
        mbar_wait(sm.st_empty(s8), ((it / L::kStages8) & 1) ^ 1);
        if (lane == 0) {
          mbar_expect_tx(sm.st_full_k(s8), L::kStage8Tile);
          mbar_expect_tx(sm.st_full_v(s8), L::kStage8Tile);
        }
        __syncwarp();
        if (lane < ppt) {
          tma_load_4d(sm.k8(s8) + lane * P * 128, tm_k, sm.st_full_k(s8), 0, 0, u.hk, pg);
          tma_load_4d(sm.v8(s8) + lane * P * 128, tm_v, sm.st_full_v(s8), 0, 0, u.hk, pg);
        }
        if (t == 0) w_next = hp_hand_on(sm, plan.counter, drawn, total, n + 1, lane);
      }
      w = w_next;
    }
  } else {  // warps 1-3: staging tiles -> f16 operand tiles of stage it % kStages
    const int cw = warp - 1;
    for (int n = 0;; ++n) {
      const int w = hp_take_unit(sm, n);
      if (w >= total) break;
      const HpUnit u = hp_unit(p, plan, w);
      // the unit's query rows into L2 before the consumers gather them at its start (these warps
      // take a unit a tile or two ahead of the consumers; a row's 256 bytes span up to 3 lines)
#pragma unroll 1
      for (int lr = cw * 32 + lane; lr < kRows; lr += 96) {
        const int64_t off = hp_q_off(p, u, lr);
        if (off >= 0) {
          const char* a = reinterpret_cast<const char*>(static_cast<const uint16_t*>(p.q) + off);
          asm volatile("prefetch.global.L2 [%0];\nprefetch.global.L2 [%1];\nprefetch.global.L2 [%2];\n" ::"l"(a),
                       "l"(a + 128), "l"(a + 255));
        }
      }
      for (int t = 0; t < u.n_tiles; ++t, ++it) {
        const int s = it % kStages;
        const uint32_t ph = (it / kStages) & 1;
        const int s8 = it % L::kStages8;
        const uint32_t ph8 = (it / L::kStages8) & 1;
        const int valid = u.kv_len - (u.t0 + t) * kKeys;
        mbar_wait(sm.empty_k(s), ph ^ 1);
        mbar_wait(sm.st_full_k(s8), ph8);
        hp_widen_tile<kKV == kKvE4m3>(sm.k8(s8), sm.k(s), valid, cw, lane);
        fence_proxy_async();  // the generic-proxy stores, before wgmma reads them
        __syncwarp();
        if (lane == 0) mbar_arrive(sm.full_k(s));
        mbar_wait(sm.empty_v(s), ph ^ 1);
        mbar_wait(sm.st_full_v(s8), ph8);
        hp_widen_tile<kKV == kKvE4m3>(sm.v8(s8), sm.v(s), valid, cw, lane);
        fence_proxy_async();
        __syncwarp();
        if (lane == 0) {
          mbar_arrive(sm.full_v(s));
          mbar_arrive(sm.st_empty(s8));
        }
      }
    }
  }
}
// 16-bit pages, warps 1-3: each unit's Q rows, row tables and record into Q tile n % 2 (a hole:
// only the record, which ends the consumers' list too).
template <int kKV>
__device__ __forceinline__ void hp_q_producer(const AttnParams& p, const HopperPlanTables& plan, const HpSmem<kKV>& sm,
                                              int total, int tid) {
  const int pt = tid - 32;  // 0..95: a fixed 16-byte chunk (96 = 6 rows x 16 chunks), rows pt / 16 + 6 k
  const int ch = pt & 15;
  const uint16_t* qsrc = static_cast<const uint16_t*>(p.q) + ch * 8;
  int n = 0;
  for (int w = blockIdx.x; w < total; w += gridDim.x, ++n) {
    const HpUnit u = hp_unit(p, plan, w);
    const int b = n & 1;
    mbar_wait(sm.q_empty(b), ((n >> 1) & 1) ^ 1);
    int* rec = sm.unit_rec(b);
    if (u.r < 0) {  // a hole: the CTA's list ends (the consumers read it from the record)
      if (pt == 0) rec[kRecR] = -1;
      mbar_arrive(sm.q_full(b));
      break;
    }
#pragma unroll 1
    for (int lr = pt; lr < kRows; lr += 96) hp_put_row(p, sm, u, b, lr);
    if (pt == 0) {
      rec[kRecR] = u.r;
      rec[kRecT0] = u.t0;
      rec[kRecTiles] = u.n_tiles;
      rec[kRecKvLen] = u.kv_len;
      rec[kRecRow0] = u.row0;
      rec[kRecRows] = u.rows;
      rec[kRecSplit] = static_cast<const int4*>(plan.units)[w].w;
    }
#pragma unroll 1
    for (int lr = pt >> 4; lr < kRows; lr += 6) {
      const int64_t off = hp_q_off(p, u, lr);
      cpa16z(sm.q_chunk(b, lr, ch), qsrc + (off < 0 ? int64_t(0) : off), off < 0 ? 1u : 0u);
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
    fence_proxy_async();  // the rows, before wgmma reads them
    mbar_arrive(sm.q_full(b));
  }
}
// 16-bit pages, warp 0: each tile's pages into the stage's K and V tiles (TMA).
template <int kKV>
__device__ __forceinline__ void hp_kv_producer(const AttnParams& p, const HopperPlanTables& plan, const HpSmem<kKV>& sm,
                                               const CUtensorMap* tm_k, const CUtensorMap* tm_v, int total, int P, int ppt,
                                               int lane) {
  int it = 0;
  uint32_t aux_par = 0;  // per stage: parity of aux's next phase
  for (int w = blockIdx.x; w < total; w += gridDim.x) {
    const HpUnit u = hp_unit(p, plan, w);
    if (u.r < 0) break;  // a hole: the CTA's list ends
    for (int t = 0; t < u.n_tiles; ++t, ++it) {
      const int s = it % kStages;
      const uint32_t ph = (it / kStages) & 1;
      const int kt0 = (u.t0 + t) * kKeys;
      const int pg = hp_page(p, u, kt0, lane, ppt);
      const bool partial = kt0 + kKeys > u.kv_len && (u.kv_len % P) != 0;
      const uint32_t vb = partial ? sm.aux(s) : sm.full_v(s);
      mbar_wait(sm.empty_k(s), ph ^ 1);
      if (lane == 0) mbar_expect_tx(sm.full_k(s), kTileBytes);
      __syncwarp();
      if (lane < ppt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) tma_load_4d(sm.k(s) + h * kHalf + lane * P * 128, tm_k, sm.full_k(s), h * 64, 0, u.hk, pg);
      }
      mbar_wait(sm.empty_v(s), ph ^ 1);
      if (lane == 0) mbar_expect_tx(vb, kTileBytes);
      __syncwarp();
      if (lane < ppt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) tma_load_4d(sm.v(s) + h * kHalf + lane * P * 128, tm_v, vb, h * 64, 0, u.hk, pg);
      }
      if (partial) {
        // the V rows past kv_len: zeroed once the box has landed, then V is released
        mbar_wait(sm.aux(s), (aux_par >> s) & 1);
        aux_par ^= 1u << s;
        const int r0 = u.kv_len - kt0;  // first row to zero (> 0)
        const int n = (kKeys - r0) * 2 * 8;  // 16-byte chunks over both halves
        for (int i = lane; i < n; i += 32) {
          const int row = r0 + (i >> 4), h = (i >> 3) & 1, c = i & 7;
          asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(sm.v(s) + h * kHalf + row * 128 + c * 16), "r"(0)
                       : "memory");
        }
        fence_proxy_async();
        __syncwarp();
        if (lane == 0) mbar_arrive(sm.full_v(s));
      }
    }
  }
}

template <int kSched, int kKV>
__global__ void __launch_bounds__(kThreads, 1)
    hp_prefill_kernel(const AttnParams p, const HopperPlanTables plan, const __grid_constant__ CUtensorMap tm_k,
                      const __grid_constant__ CUtensorMap tm_v) {
  constexpr bool kOverlap = kSched == 1 || kSched == 2, kPing = kSched >= 2;
  using L = HpLayout<kKV>;
  constexpr bool kFp8 = L::kFp8;
  constexpr bool kBf16 = kKV == kKvBf16;  // the wgmma operand type: bf16, else f16
  // registers per thread (the CTA's 384 x 168): producer warpgroup 56, consumers what is left
  // (128 x 56 + 256 x 224 = 384 x 168; setmaxnreg.inc waits for registers the others released)
  constexpr int kProducerRegs = 56, kConsumerRegs = 224;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* sbase = smem_raw + (base - raw);
  const HpSmem<kKV> sm{base, base + L::kOffBar, sbase};

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(sm.full_k(s), kFp8 ? 3 : 1);  // fp8: the three widening warps arrive, else TMA
      mbar_init(sm.full_v(s), kFp8 ? 3 : 1);
      mbar_init(sm.empty_k(s), 2 * 128);
      mbar_init(sm.empty_v(s), 2 * 128);
      mbar_init(sm.aux(s), 1);
    }
    for (int s = 0; s < L::kStages8; ++s) {
      mbar_init(sm.st_full_k(s), 1);
      mbar_init(sm.st_full_v(s), 1);
      mbar_init(sm.st_empty(s), 3);
    }
    if constexpr (L::kQTiles == 2) {
      for (int b = 0; b < 2; ++b) {
        // every thread arrives after its own accesses (an arrival releases what its thread
        // wrote or read; compute-sanitizer's racecheck follows that, not a warp's __syncwarp)
        mbar_init(sm.q_full(b), 96);      // producer warps 1-3
        mbar_init(sm.q_empty(b), 2 * 128);  // the consumer threads
      }
    }
    for (int i = 0; i < L::kSlots; ++i) {
      mbar_init(sm.unit_full(i), 1);               // producer warp 0's lane 0
      mbar_init(sm.unit_empty(i), 96 + 2 * 128);  // producer warps 1-3 and the consumers, per thread
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int total = plan.num_items[1];  // the list's entries
  const int P = p.page_size, ppt = kKeys / P;

  if (warp < 4) {  // ---- producer warpgroup ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if constexpr (kFp8)
      hp_fp8_producer<kKV>(p, plan, sm, &tm_k, &tm_v, total, P, ppt, warp, lane);
    else if (warp != 0)
      hp_q_producer<kKV>(p, plan, sm, total, tid);
    else
      hp_kv_producer<kKV>(p, plan, sm, &tm_k, &tm_v, total, P, ppt, lane);
    return;
  }

  // ---- consumer warpgroups ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  // 0 or 1; shuffled from lane 0 so the compiler sees it warp-uniform (the Q operand's descriptor
  // then stays on the uniform datapath: 2 % fewer instructions issued at causal 8 x 2048)
  const int c = __shfl_sync(0xffffffffu, warp / 4 - 1, 0);
  const int tw = tid & 127, wq = tw >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int rl = c * 64 + wq * 16 + g;  // this thread's rows rl, rl + 8 (CTA-local)
  const bool softcap = p.soft_cap > 0.f;
  // log2-domain factor of the exp2 FFMA: sm_scale * log2e, or 1 after the soft cap
  // (s -> soft_cap * log2e * tanh(s * sm_scale / soft_cap), as prefill_kernel.cu)
  const float c_exp = softcap ? 1.f : p.sm_scale * kLog2e;
  const float cap_in = softcap ? p.sm_scale / p.soft_cap : 0.f;
  const float cap_out = p.soft_cap * kLog2e;
  const int bar_id = 1 + c;
  int it = 0;
  // ping-pong: barrier 3 + c opens warpgroup c's turn (256 = both warpgroups: one syncs, the
  // other arrives); warpgroup 0 goes first
  if constexpr (kPing) {
    if (c == 1) named_arrive(3, 256);
  }
  for (int n = 0, w_rr = blockIdx.x;; ++n, w_rr += gridDim.x) {  // n: units done; this unit's Q tile is n % kQTiles
    const int w = L::kDrawn ? hp_take_unit(sm, n) : w_rr;
    if (w >= total) break;
    const int qb = L::kQTiles == 2 ? (n & 1) : 0;
    HpUnit u{};
    if constexpr (L::kQTiles == 2) {
      mbar_wait(sm.q_full(qb), (n >> 1) & 1);  // gathered by producer warps 1-3
      // the unit's fields from the tile's record, shuffled from lane 0 so the compiler sees them
      // warp-uniform (the tile loops' stage arithmetic then stays on the uniform datapath)
      const int* rec = sm.unit_rec(qb);
      u.r = __shfl_sync(0xffffffffu, rec[kRecR], 0);
      if (u.r < 0) break;  // a hole: the CTA's list ends
      u.t0 = __shfl_sync(0xffffffffu, rec[kRecT0], 0);
      u.n_tiles = __shfl_sync(0xffffffffu, rec[kRecTiles], 0);
      u.kv_len = __shfl_sync(0xffffffffu, rec[kRecKvLen], 0);
      u.row0 = __shfl_sync(0xffffffffu, rec[kRecRow0], 0);
      u.rows = __shfl_sync(0xffffffffu, rec[kRecRows], 0);
    } else {
      u = hp_unit(p, plan, w);
      if (u.r < 0) break;  // a hole: the CTA's list ends
      // this warpgroup's 64 rows: tables, then Q (thread = fixed 16-byte chunk, 8 rows)
      named_sync(bar_id, 128);  // the previous unit's Q and row-table reads are done
      if (tw < 64) hp_put_row(p, sm, u, 0, c * 64 + tw);
      const int ch = tw & 15;
      const uint16_t* qsrc = static_cast<const uint16_t*>(p.q) + ch * 8;
      if (p.q_t == Elt::bf16) {  // fp8 pages run f16 wgmma: bf16 rows widened, rounded to f16
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int lr = c * 64 + (tw >> 4) + 8 * i;
          const int64_t off = hp_q_off(p, u, lr);
          uint4 x = make_uint4(0u, 0u, 0u, 0u);
          if (off >= 0) x = *reinterpret_cast<const uint4*>(qsrc + off);
          auto f16x2 = [](uint32_t v) { return pack2<false>(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u)); };
          st_shared_v4(sm.q_chunk(0, lr, ch), f16x2(x.x), f16x2(x.y), f16x2(x.z), f16x2(x.w));
        }
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int lr = c * 64 + (tw >> 4) + 8 * i;
          const int64_t off = hp_q_off(p, u, lr);
          cpa16z(sm.q_chunk(0, lr, ch), qsrc + (off < 0 ? int64_t(0) : off), off < 0 ? 1u : 0u);
        }
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
      }
      fence_proxy_async();
      named_sync(bar_id, 128);
    }
    const uint32_t sQ = sm.q_tile(qb);
    const int* s_pos = sm.tab_pos(qb);
    const int* s_tok = s_pos + kRows;
    const int* s_head = s_tok + kRows;
    const int qp0 = s_pos[rl], qp1 = s_pos[rl + 8];
    const int wg_first = s_pos[c * 64], wg_last = s_pos[c * 64 + 63];
    const bool wg_valid = u.row0 + c * 64 < u.rows;
    // The warpgroup's visible tiles [vb, ve): tiles above its causal diagonal (a suffix) and left
    // of its window (a prefix) are only waited for and released.  Warp-uniform as the compiler
    // sees it (shuffled from lane 0): a wgmma on a path it cannot prove uniform is serialised.
    int vb = 0, ve = u.n_tiles;
    if (p.window_left >= 0) {
      const int64_t x = int64_t(wg_first) - p.window_left - (kKeys - 1);  // first visible key tile start >= x
      if (x > int64_t(u.t0) * kKeys) vb = static_cast<int>(min(int64_t(u.n_tiles), (x + kKeys - 1) / kKeys - u.t0));
    }
    if (p.causal) ve = min(ve, max(0, wg_last / kKeys - u.t0 + 1));
    if (!wg_valid || ve < vb) ve = vb;
    vb = __shfl_sync(0xffffffffu, vb, 0);
    ve = __shfl_sync(0xffffffffu, ve, 0);

    float o[2][32];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 32; ++i) o[h][i] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    uint32_t pa[8][4];  // P of the last softmax (bf16 A fragments)
    float sacc[64];     // sacc[4j + e]: row rl + 8 * (e >> 1), key kt0 + 8j + 2 t4 + (e & 1)
    constexpr uint32_t kDescHi = desc_sw128_hi(1024);
    const uint32_t q_lo = desc_sw128_lo(sQ + c * 64 * 128, 16);
    auto issue_s = [&](int s) {
      const uint32_t k_lo = desc_sw128_lo(sm.k(s), 16);
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        const uint32_t off = (ks >> 2) * kHalf + (ks & 3) * 32;
        wgmma_ss_m64n128<kBf16>(sacc, desc_at(q_lo, kDescHi, off), desc_at(k_lo, kDescHi, off), ks > 0);
      }
      wg_commit();
    };
    auto issue_pv = [&](int s) {  // one m64n128k16 per 16 keys over both 64-column halves of V
      const uint32_t v_lo = desc_sw128_lo(sm.v(s), kHalf);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) wgmma_rs_m64n128_tb<kBf16>(o[0], o[1], pa[kk], desc_at(v_lo, kDescHi, kk * 16 * 128));
      wg_commit();
    };
    // soft cap, mask, online softmax of sacc (tile at key kt0); alpha = the O rescale factors
    auto softmax = [&](int kt0, float (&alpha)[2]) -> bool {
      if (softcap) {
#pragma unroll
        for (int i = 0; i < 64; ++i) sacc[i] = cap_out * tanhf(sacc[i] * cap_in);
      }
      const bool need_mask = kt0 + kKeys > u.kv_len || (p.causal && kt0 + kKeys - 1 > wg_first) ||
                             (p.window_left >= 0 && int64_t(kt0) < int64_t(wg_last) - p.window_left);
      if (need_mask) {
        // Each row's visible keys of this tile as offsets from this thread's first column
        // (kt0 + 2 t4): [lo, hi), hi from kv_len and the causal diagonal, lo from the window, both
        // clamped into [-1, kKeys]; an element's offset 8 j + (e & 1) is then a constant, so a
        // column costs a compare and a select (a key per element and three tests cost ~7
        // instructions each: the diagonal tile's mask ran as long as a whole tile's softmax)
        // (tile_mask.h, checked on the CPU against the key-by-key rule)
        const int64_t col0 = int64_t(kt0) + 2 * t4;
        int hi[2], lo[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const tm::ColumnLimits lim = tm::column_limits(h ? qp1 : qp0, u.kv_len, p.causal, p.window_left, col0, kKeys);
          hi[h] = lim.hi;
          lo[h] = lim.lo;
        }
        if (p.window_left >= 0) {
#pragma unroll
          for (int j = 0; j < 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int off = 8 * j + (e & 1);
              if (off >= hi[e >> 1] || off < lo[e >> 1]) sacc[4 * j + e] = -INFINITY;
            }
        } else {
#pragma unroll
          for (int j = 0; j < 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (8 * j + (e & 1) >= hi[e >> 1]) sacc[4 * j + e] = -INFINITY;
        }
      }
      bool moved = false;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // the row's maximum by four interleaved chains (a dependent chain of 32 FMNMX sat between
        // S and the first exp2)
        float m4[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) m4[j] = fmaxf(sacc[4 * j + 2 * h], sacc[4 * j + 2 * h + 1]);
#pragma unroll
        for (int j = 4; j < 16; ++j) m4[j & 3] = fmaxf(m4[j & 3], fmaxf(sacc[4 * j + 2 * h], sacc[4 * j + 2 * h + 1]));
        float mx = fmaxf(fmaxf(m4[0], m4[1]), fmaxf(m4[2], m4[3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float m_new = fmaxf(m_r[h], mx * c_exp);
        m_new = m_new > m_r[h] + kLazy ? m_new : m_r[h];
        const float m_use = (m_new == -INFINITY) ? 0.f : m_new;
        alpha[h] = ex2_ftz(m_r[h] - m_use);
        moved |= m_new != m_r[h];
        m_r[h] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const float a0 = ex2_ftz(fmaf(sacc[4 * j + 2 * h], c_exp, -m_use));
          const float a1 = ex2_ftz(fmaf(sacc[4 * j + 2 * h + 1], c_exp, -m_use));
          sacc[4 * j + 2 * h] = a0;
          sacc[4 * j + 2 * h + 1] = a1;
          sum += a0 + a1;
        }
        l_r[h] = l_r[h] * alpha[h] + sum;
      }
      return moved;
    };
    auto rescale_o = [&](const float (&alpha)[2]) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          o[hh][4 * j + 0] *= alpha[0];
          o[hh][4 * j + 1] *= alpha[0];
          o[hh][4 * j + 2] *= alpha[1];
          o[hh][4 * j + 3] *= alpha[1];
        }
    };
    auto convert_p = [&] {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        pa[kk][0] = pack2<kBf16>(sacc[8 * kk + 0], sacc[8 * kk + 1]);
        pa[kk][1] = pack2<kBf16>(sacc[8 * kk + 2], sacc[8 * kk + 3]);
        pa[kk][2] = pack2<kBf16>(sacc[8 * kk + 4], sacc[8 * kk + 5]);
        pa[kk][3] = pack2<kBf16>(sacc[8 * kk + 6], sacc[8 * kk + 7]);
      }
    };
    // a tile with nothing visible to this warpgroup: wait for the fill, release it (ping-pong:
    // the turn is still taken and passed, so both warpgroups count the same turns)
    auto skip_tile = [&](int s, uint32_t ph) {
      if constexpr (kPing) {
        named_sync(3 + c, 256);
        named_arrive(3 + (1 - c), 256);
      }
      mbar_wait(sm.full_k(s), ph);
      mbar_wait(sm.full_v(s), ph);
      mbar_arrive(sm.empty_k(s));
      mbar_arrive(sm.empty_v(s));
    };

    int t = 0;
    for (; t < vb; ++t, ++it) skip_tile(it % kStages, (it / kStages) & 1);
    if constexpr (!kOverlap) {
      bool fresh = true;
      for (; t < ve; ++t, ++it) {
        const int s = it % kStages;
        const uint32_t ph = (it / kStages) & 1;
        if constexpr (kPing) named_sync(3 + c, 256);
        mbar_wait(sm.full_k(s), ph);
        wg_fence();
        issue_s(s);
        if constexpr (kPing) named_arrive(3 + (1 - c), 256);
        wg_wait0();
        reg_fence(sacc);
        mbar_arrive(sm.empty_k(s));
        float alpha[2];
        const bool moved = softmax((u.t0 + t) * kKeys, alpha);
        if (!fresh && moved) rescale_o(alpha);
        fresh = false;
        convert_p();
        mbar_wait(sm.full_v(s), ph);
        reg_fence(o[0]);
        reg_fence(o[1]);
        wg_fence();
        issue_pv(s);
        wg_wait0();
        reg_fence(o[0]);
        reg_fence(o[1]);
        mbar_arrive(sm.empty_v(s));
      }
    } else if (t < ve) {
      // Tile t's S = Q K^T is issued before the softmax of tile t - 1's... (FA3's intra-warpgroup
      // pipelining): per tile, S(t) and then O += P(t-1) V(t-1) are issued, S(t) is waited for
      // (wait_group 1) and K(t) released, its softmax runs while P V runs, then P V is waited for
      // (wait_group 0), V(t - 1) released, O rescaled and P(t) formed.
      int ps = it % kStages;
      uint32_t pph = (it / kStages) & 1;
      {
        if constexpr (kPing) named_sync(3 + c, 256);
        mbar_wait(sm.full_k(ps), pph);
        wg_fence();
        issue_s(ps);
        if constexpr (kPing) named_arrive(3 + (1 - c), 256);
        wg_wait0();
        reg_fence(sacc);
        mbar_arrive(sm.empty_k(ps));
        float alpha[2];
        softmax((u.t0 + t) * kKeys, alpha);  // O is zero: nothing to rescale
        convert_p();
        ++t;
        ++it;
      }
      for (; t < ve; ++t, ++it) {
        const int s = it % kStages;
        const uint32_t ph = (it / kStages) & 1;
        if constexpr (kPing) named_sync(3 + c, 256);
        mbar_wait(sm.full_k(s), ph);
        mbar_wait(sm.full_v(ps), pph);
        reg_fence(o[0]);
        reg_fence(o[1]);
        wg_fence();
        issue_s(s);
        issue_pv(ps);
        if constexpr (kPing) named_arrive(3 + (1 - c), 256);
        wg_wait1();
        reg_fence(sacc);
        mbar_arrive(sm.empty_k(s));
        float alpha[2];
        const bool moved = softmax((u.t0 + t) * kKeys, alpha);
        wg_wait0();
        reg_fence(o[0]);
        reg_fence(o[1]);
        mbar_arrive(sm.empty_v(ps));
        if (moved) rescale_o(alpha);
        convert_p();
        ps = s;
        pph = ph;
      }
      mbar_wait(sm.full_v(ps), pph);
      reg_fence(o[0]);
      reg_fence(o[1]);
      wg_fence();
      issue_pv(ps);
      wg_wait0();
      reg_fence(o[0]);
      reg_fence(o[1]);
      mbar_arrive(sm.empty_v(ps));
    }
    for (; t < u.n_tiles; ++t, ++it) skip_tile(it % kStages, (it / kStages) & 1);

    // ---- epilogue: (a piece of a cut unit: its partial result; the last to finish merges) sinks, LSE, O ----
    float l_sum[2];  // the rows' sums, over the quad's columns
#pragma unroll
    for (int h = 0; h < 2; ++h) l_sum[h] = quad_sum(l_r[h]);
    if constexpr (!L::kDrawn) {
      // the entry's split, from the Q tile's tables (a register kept through the unit cost about
      // 1 %, and a global load here its latency at every unit's end)
      const int split = __shfl_sync(0xffffffffu, sm.unit_rec(qb)[kRecSplit], 0);
      if (split >= 0 && !hp_piece_done(plan, sm, split, c, tw, rl, t4, o, m_r, l_sum)) {
        if constexpr (L::kQTiles == 2) mbar_arrive(sm.q_empty(qb));  // done with the Q tile and its tables
        continue;  // another piece of the unit finishes it
      }
    }
    float sc[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float L = l_sum[h];
      const int lr = rl + 8 * h;
      const int tok = s_tok[lr], head = s_head[lr];
      const float M = m_r[h];
      const float Mu = (M == -INFINITY) ? 0.f : M;
      float Mf = M, Lf = L, scale_o;
      if (p.sinks != nullptr) {
        const float s2 = p.sinks[int64_t(head) * p.sinks_s] * kLog2e;
        Mf = fmaxf(M, s2);
        Lf = L * exp2f(M - Mf) + exp2f(s2 - Mf);
        scale_o = Lf > 0.f ? exp2f(Mu - Mf) / Lf : 0.f;
        if (M == -INFINITY) scale_o = 0.f;
      } else {
        scale_o = L > 0.f ? 1.f / L : 0.f;
      }
      sc[h] = scale_o * p.v_scale;
      if (p.lse != nullptr && t4 == 0 && tok >= 0) {
        const float lse2 = Lf > 0.f ? Mf + log2f(Lf) : -INFINITY;
        p.lse[int64_t(tok) * p.lse_st + int64_t(head) * p.lse_sh] = p.lse_natural ? lse2 * kLn2 : lse2;
      }
    }
    // a row's output element offset (-1: no row): from the table, or from its token and head
    auto o_off = [&](int lr) -> int64_t {
      if constexpr (L::kRowOffsets) return sm.tab_ooff(qb)[lr];
      const int tok = s_tok[lr];
      return tok < 0 ? int64_t(-1) : int64_t(tok) * p.o_st + int64_t(s_head[lr]) * p.o_sh;
    };
    uint16_t* ob = static_cast<uint16_t*>(p.out);
    // the output's type is the query's: bf16 for bf16 pages, f16 for f16 pages, either for fp8
    const bool out_bf16 = kKV == kKvBf16 || (kKV != kKvF16 && p.out_t == Elt::bf16);
    auto pk = [&](float a, float b) { return out_bf16 ? pack2<true>(a, b) : pack2<false>(a, b); };
    // O goes out through this warp's own 16 rows of the Q tile (their last Q K^T is done): stmatrix
    // puts the accumulator fragments there as rows of 16-byte chunks (the tile's swizzle, so the 8
    // rows of a matrix hit distinct banks), then each lane copies 16-byte chunks, a row's 256 bytes
    // by 16 lanes: 8 16-byte stores per thread filling whole sectors, instead of 32 scattered
    // 4-byte ones, which backed up the store queue at each unit's end (ncu: the next unit's first
    // address register waited on them)
    const int wr0 = c * 64 + wq * 16;  // this warp's first row
    {
      const int m = lane >> 3;  // stmatrix: lanes 8m..8m+7 give the rows of matrix m
      const int srow = wr0 + (m & 1) * 8 + (lane & 7);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int jp = 0; jp < 4; ++jp) {
          const int j = 2 * jp;  // matrices: (j, rows 0-7), (j, rows 8-15), (j + 1, rows 0-7), (j + 1, rows 8-15)
          const uint32_t a = sm.q_chunk(qb, srow, hh * 8 + j + (m >> 1));
          asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a),
                       "r"(pk(o[hh][4 * j + 0] * sc[0], o[hh][4 * j + 1] * sc[0])),
                       "r"(pk(o[hh][4 * j + 2] * sc[1], o[hh][4 * j + 3] * sc[1])),
                       "r"(pk(o[hh][4 * j + 4] * sc[0], o[hh][4 * j + 5] * sc[0])),
                       "r"(pk(o[hh][4 * j + 6] * sc[1], o[hh][4 * j + 7] * sc[1]))
                       : "memory");
        }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int row = wr0 + 2 * i + (lane >> 4), ch = lane & 15;
      const int64_t off = o_off(row);
      if (off < 0) continue;
      *reinterpret_cast<uint4*>(ob + off + ch * 8) = ld_shared_v4(sm.q_chunk(qb, row, ch));
    }
    if constexpr (L::kQTiles == 2) mbar_arrive(sm.q_empty(qb));  // done with the Q tile and its tables
  }
  // ping-pong: warpgroup 1 arrived once more on barrier 3 than warpgroup 0 synced (the opening
  // turn); this sync completes that last phase
  if constexpr (kPing) {
    if (c == 0) named_sync(3, 256);
  }
}

#else
template <int kSched, int kKV>
__global__ void __launch_bounds__(kThreads, 1)
    hp_prefill_kernel(const AttnParams, const HopperPlanTables, const __grid_constant__ CUtensorMap,
                      const __grid_constant__ CUtensorMap) {}
#endif  // KVATTN_HP_BODY

// ---- host side ------------------------------------------------------------------------------------
constexpr int kNumSched = 4;  // consumer schedules (KernelRouting::hopper_sched)

// Whether automatic mode selects the wgmma kernel for the calls it covers (its test matrix passes
// on an H200 and CudaPrefill.HopperWgmmaSmall runs clean under compute-sanitizer memcheck and
// racecheck); KVATTN_PREFILL_HOPPER=off keeps every call on the mma.sync kernel.
constexpr bool kDefaultOn = true;

// Whether the loaded image of this module holds the wgmma kernel's body (an sm_90a build on an
// sm_90 device), read once per device by a synchronous copy of g_hp_arch (like the workspace
// allocation, the first call on a device must not be inside a graph capture).
bool hopper_code_loaded() {
  static std::atomic<int> cache[64];
  static std::once_flag init;
  std::call_once(init, [] {
    for (auto& c : cache) c.store(-1);
  });
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  int v = cache[dev & 63].load();
  if (v < 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    int flag = 0;
    if (major == 9 && minor == 0 && cudaMemcpyFromSymbol(&flag, g_hp_arch, sizeof(int)) != cudaSuccess) flag = 0;
    cudaGetLastError();
    v = (major == 9 && minor == 0 && flag == 1) ? 1 : 0;
    cache[dev & 63].store(v);
  }
  return v == 1;
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    cudaGetLastError();
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// The kernel's element-type parameter for a cache type (-1: none).
int hp_kv(Elt t) {
  switch (t) {
    case Elt::bf16: return kKvBf16;
    case Elt::f16: return kKvF16;
    case Elt::e4m3: return kKvE4m3;
    case Elt::e5m2: return kKvE5m2;
    default: return -1;
  }
}

// A 4-D tensor map over one cache view: (dim, slot, head, page), box = one page of 128 bytes per
// slot (64 dims of a 16-bit cache: two boxes per page; 128 dims of an fp8 cache: one), 128-byte
// swizzle; out-of-range boxes read zeros.
bool encode_cache_map(CUtensorMap* map, const void* ptr, const AttnParams& p, int64_t sb, int64_t so, int64_t sh) {
  auto fn = encode_fn();
  if (fn == nullptr) return false;
  const int kv = hp_kv(p.kv_t);
  if (kv < 0) return false;
  const bool fp8 = kv >= kKvE4m3;
  const cuuint64_t dims[4] = {cuuint64_t(kD), cuuint64_t(p.page_size), cuuint64_t(p.hkv), cuuint64_t(p.num_pages)};
  const cuuint64_t strides[3] = {cuuint64_t(so), cuuint64_t(sh), cuuint64_t(sb)};
  const cuuint32_t box[4] = {fp8 ? 128u : 64u, cuuint32_t(p.page_size), 1, 1};
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : kv == kKvF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                  : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return fn(map, type, 4, const_cast<void*>(ptr), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool stride_ok(int64_t s) { return s > 0 && s % 16 == 0 && s < (int64_t(1) << 40); }

}  // namespace

const char* hopper_prefill_sched_name(int sched) {
  switch (sched) {
    case 0: return "serial";
    case 1: return "overlap";
    case 2: return "pingpong";
    case 3: return "turns";
    default: return "unknown";
  }
}
PrefillChoice hopper_prefill_choice(const AttnParams& p) {
  auto no = [](const char* why) { return PrefillChoice{PrefillPath::mma_sync, why}; };
  const Route mode = kernel_routing().prefill_hopper;
  if (mode == Route::off) return no("wgmma kernel turned off (KVATTN_PREFILL_HOPPER=off)");
  if (mode == Route::automatic && !kDefaultOn)
    return no("wgmma kernel not selected by default (KVATTN_PREFILL_HOPPER=force selects it)");
  if (!hopper_code_loaded()) return no("no sm_90a code for this device (needs compute capability 9.0 and an sm_90a build)");
  if (p.head_dim != kD) return no("head_dim is not 128");
  const int kv = hp_kv(p.kv_t);
  if (kv < 0) return no("K/V cache is not bf16, f16 or fp8");
  if (kv == kKvBf16 && p.q_t != Elt::bf16) return no("bf16 K/V cache with a query that is not bf16");
  if (kv == kKvF16 && p.q_t != Elt::f16) return no("f16 K/V cache with a query that is not f16");
  if ((p.q_t != Elt::bf16 && p.q_t != Elt::f16) || !p.q_vec)
    return no("query is not bf16 / f16 with 16-byte aligned contiguous rows");
  if (p.out_t != p.q_t || !p.o_vec) return no("output is not of the query's type with 16-byte aligned contiguous rows");
  if (p.xqa != nullptr || p.mm != nullptr) return no("XQA / PrefixLM mask");
  if (p.page_size < 8 || p.page_size > kKeys || kKeys % p.page_size != 0)
    return no("page size is not a divisor of 128 of at least 8");
  if (p.num_pages <= 0 || p.num_pages >= (int64_t(1) << 31)) return no("page count out of the tensor map's range");
  if (reinterpret_cast<uintptr_t>(p.k) % 16 != 0 || reinterpret_cast<uintptr_t>(p.v) % 16 != 0)
    return no("K/V base not 16-byte aligned");
  if (!stride_ok(p.k_sb) || !stride_ok(p.k_so) || !stride_ok(p.k_sh) || !stride_ok(p.v_sb) || !stride_ok(p.v_so) ||
      !stride_ok(p.v_sh))
    return no("K/V strides not positive multiples of 16 bytes");
  CUtensorMap mk, mv;  // host-side encoding only: a call the driver would reject stays off this kernel
  if (!encode_cache_map(&mk, p.k, p, p.k_sb, p.k_so, p.k_sh) || !encode_cache_map(&mv, p.v, p, p.v_sb, p.v_so, p.v_sh))
    return no("the driver rejected the K/V tensor maps");
  switch (kv) {
    case kKvBf16: return PrefillChoice{PrefillPath::wgmma, "bf16, head_dim 128, no XQA / PrefixLM mask: wgmma kernel"};
    case kKvF16: return PrefillChoice{PrefillPath::wgmma, "f16, head_dim 128, no XQA / PrefixLM mask: wgmma kernel"};
    default:
      return PrefillChoice{PrefillPath::wgmma,
                           "fp8 K/V pages, head_dim 128, no XQA / PrefixLM mask: wgmma kernel (pages widened to f16)"};
  }
}

int hopper_prefill_grid(const AttnParams& p, int num_sms) {
  // units bound: every item is at most one 128-row tile (the plan's max_items for head_dim 128)
  const int64_t max_items = (p.num_tokens * p.group + kRows - 1) / kRows + p.batch;
  const int64_t units = max_items * p.hkv;
  int grid = static_cast<int>(std::min<int64_t>(num_sms, std::max<int64_t>(units, 1)));
  if (const int cap = kernel_routing().prefill_hopper_ctas; cap > 0) grid = std::min(grid, cap);  // tests only
  return grid;
}

int hopper_prefill_round_robin_ctas(const AttnParams& p, int num_sms) {
  const int kv = hp_kv(p.kv_t);
  if (kv < 0 || kv >= kKvE4m3) return 0;  // fp8 pages: units drawn from the plan's counter
  return hopper_prefill_grid(p, num_sms);
}

int launch_hopper_prefill(const AttnParams& p, int num_sms, const HopperPlanTables& plan) {
  CUtensorMap mk, mv;
  if (!encode_cache_map(&mk, p.k, p, p.k_sb, p.k_so, p.k_sh) || !encode_cache_map(&mv, p.v, p, p.v_sb, p.v_so, p.v_sh))
    return -1;
  const int kv = hp_kv(p.kv_t);
  if (kv < 0) return -1;
  const HopperSchedCall call{.fp8_pages = kv >= kKvE4m3,
                             .causal = p.causal,
                             .batch = p.batch,
                             .num_tokens = p.num_tokens,
                             .kv_keys = p.paged_form && p.kv_entries > 0 ? p.kv_entries * p.page_size : -1,
                             .window_left = p.window_left};
  const int sched = std::clamp(hopper_sched_for(kernel_routing().hopper_sched, call), 0, kNumSched - 1);
  using Kernel = void (*)(const AttnParams, const HopperPlanTables, const CUtensorMap, const CUtensorMap);
  struct Entry {
    Kernel kernel;
    int smem;
  };
  static const Entry kTable[kNumKv][kNumSched] = {
#define KVATTN_HP_ROW(KV)                                                                          \
  {{hp_prefill_kernel<0, KV>, HpLayout<KV>::kSmem}, {hp_prefill_kernel<1, KV>, HpLayout<KV>::kSmem}, \
   {hp_prefill_kernel<2, KV>, HpLayout<KV>::kSmem}, {hp_prefill_kernel<3, KV>, HpLayout<KV>::kSmem}}
      KVATTN_HP_ROW(kKvBf16), KVATTN_HP_ROW(kKvF16), KVATTN_HP_ROW(kKvE4m3), KVATTN_HP_ROW(kKvE5m2)};
#undef KVATTN_HP_ROW
  static std::atomic<uint32_t> attr_set[64] = {};  // per device: bit kv * 4 + sched = its shared-memory limit raised
  int dev = 0;
  cudaGetDevice(&dev);
  const Entry& e = kTable[kv][sched];
  const uint32_t bit = 1u << (kv * kNumSched + sched);
  if (!(attr_set[dev & 63].load() & bit)) {
    const cudaError_t err = cudaFuncSetAttribute(e.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, e.smem);
    if (err != cudaSuccess) return static_cast<int>(err);
    attr_set[dev & 63].fetch_or(bit);
  }
  e.kernel<<<hopper_prefill_grid(p, num_sms), kThreads, e.smem>>>(p, plan, mk, mv);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvattn::ops::cuda_impl::k
