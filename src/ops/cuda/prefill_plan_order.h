// src/ops/cuda/prefill_plan_order.h — the arithmetic of the prefill plans' unit order, shared by
// the plan kernels (prefill_kernel.cu: pf_plan_kernel, pf_plan_l2_kernel) and the host tests
// (tests/ops/prefill_cuda_test.cpp checks on the CPU, with these same functions, that the wgmma
// plan's order is a permutation that leaves the round-robin CTAs evenly loaded).
//
// A unit's cost is its row tile's key tiles to visit + 1 (the unit's fixed work).  The wgmma
// plan (pf_plan_l2_kernel) sorts units by section (consecutive (request, KV head) groups whose
// K/V fit the L2 budget; the sections follow one another) and within a section by cost: the
// last section costliest first, the ones before it alternately cheapest and costliest first, so
// the list's costs never jump from one section into the next.  A section's keys are
// [first, first + range): range = its largest cost, at most its number of units (costs past it
// share the end key).  For kernels whose CTAs take units round-robin (unit w to CTA w % G), the
// sorted list is dealt in waves of G units, every other wave in reverse, so a CTA that took a
// wave's costliest unit takes the next wave's cheapest (where sections average a wave or
// more: deal_ctas).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KVATTN_PO_HD __host__ __device__ __forceinline__
#else
#define KVATTN_PO_HD inline
#endif

namespace kvattn::ops::cuda_impl::po {

// Cost of row tile t (cta_rows rows of (token, head in the GQA group) pairs) of a request of
// q_len query tokens after kv_len - q_len of context: the key tiles of key_tile keys it visits
// (causal: up to its last row's position; sliding window: from its first row's window start),
// + 1.
KVATTN_PO_HD int row_tile_cost(int q_len, int kv_len, int t, int cta_rows, int group, bool causal, int64_t window_left,
                               int key_tile) {
  const int rows = q_len * group;
  const int row0 = t * cta_rows;
  const int last = (rows < row0 + cta_rows ? rows : row0 + cta_rows) - 1;
  const int ctx = kv_len - q_len;
  const int qf = ctx + row0 / group, ql = ctx + last / group;
  int hi = kv_len;
  if (causal && ql + 1 < hi) hi = ql + 1;
  int lo = 0;
  if (window_left >= 0) {
    const int64_t w = int64_t(qf) - window_left;
    lo = w > 0 ? static_cast<int>(w) : 0;
  }
  const int t0 = (lo / key_tile) * key_tile;
  const int n = hi > lo ? (hi - t0 + key_tile - 1) / key_tile : 0;
  return n + 1;
}

// Sort key of a unit of cost `cost` (>= 1) in section s of num_sec, whose keys are
// [first, first + range) (range >= 1).
KVATTN_PO_HD int section_key(int first, int range, int cost, int s, int num_sec) {
  const int c = (cost - 1 < range - 1) ? cost - 1 : range - 1;
  const bool costliest_first = ((num_sec - 1 - s) & 1) == 0;
  return first + (costliest_first ? range - 1 - c : c);
}

// The CTAs the plan deals its list to in alternate directions: G where the sections average at
// least a wave of G units (their costs then run smoothly across waves, and dealing a wave
// backwards after one forwards evens the CTAs' sums), else 0: the list as sorted (sections
// shorter than a wave alternate cheapest and costliest first within a wave already, and
// reversing every other wave unbalanced them, e.g. mixed lengths in 1 MB sections 1.09x the mean
// load against 1.04x).
KVATTN_PO_HD int deal_ctas(int G, int U, int num_sec) {
  return G > 0 && int64_t(U) >= int64_t(G) * num_sec ? G : 0;
}

// The list position of the unit sorted to position pos (of U), dealt round-robin to G CTAs:
// waves of G, the odd ones reversed (the last wave may be short).  G <= 0: pos itself (units
// drawn in list order).
KVATTN_PO_HD int dealt_position(int pos, int G, int U) {
  if (G <= 0) return pos;
  const int w = pos / G, j = pos - w * G;
  if ((w & 1) == 0) return pos;
  const int n = U - w * G < G ? U - w * G : G;
  return w * G + (n - 1 - j);
}


// ---- the tail of a round-robin plan, shared stream-K style ----------------------------------------
// With U units dealt round-robin to G CTAs, W = U / G full waves give every CTA W units and the
// last m = U - W G units go to m CTAs, one each: where m units of nearly equal cost make a short
// last wave (8 x (q 512, kv 4096): 1,024 units of 29-32 key tiles on 132 CTAs, 7.76 per CTA),
// the CTAs with a last-wave unit finish a unit later than the rest.  The tail instead goes to
// Gt CTAs as contiguous ranges of its S key tiles (128 keys each, the units one after another
// in list order): CTA g gets tiles [tail_start(g), tail_start(g + 1)), so a unit may be cut into
// pieces on consecutive CTAs, whose partial results the last piece to finish merges.
// At most this many pieces per CTA (the plan table's capacity past the full waves), and a CTA's
// range is at least kTailMinTiles tiles where the plan chooses the split (a piece's fixed work:
// its query, its partial result written and read back, is about a key tile's).
constexpr int kTailMaxPieces = 8;
constexpr int kTailMinTiles = 4;
// Partial-result slots a tail split may use on G CTAs: a unit cut in k pieces has k - 1 range
// boundaries inside it, and there are at most G - 1 boundaries, so the pieces of cut units
// number at most 2 (G - 1).
KVATTN_PO_HD int tail_slots(int G) { return 2 * (G > 0 ? G : 0); }

// The CTAs the tail of m units (S key tiles, the costliest unit max_tiles of them) is shared by,
// on G CTAs after W full waves; 0 where the tail is left as whole units.  forced: share whenever
// there are two tiles to share, ranges of one tile or more (tests: every unit of a short call cut).
// Otherwise the tail is cut where that shortens the busiest CTA by kTailCutCost key tiles or
// more and by 1 % of a CTA's full-wave work (at most W max_tiles): a cut costs the CTAs about
// half that (H100, 8 x (q 512, kv 4096): the cut tail's partial results, merges and extra
// pieces added 2.5 % to the mean SM's active cycles, about 5 tiles, where the cut saved 8).
constexpr int kTailCutCost = 10;
KVATTN_PO_HD int tail_ctas(int G, int W, int m, int64_t S, int max_tiles, bool forced) {
  if (G < 2 || m <= 0 || S < 2) return 0;
  if (forced) return static_cast<int>(S < G ? S : G);
  const int64_t by_size = S / kTailMinTiles;
  const int gt = static_cast<int>(by_size < G ? by_size : G);
  if (gt < 2) return 0;
  const int64_t share = (S + gt - 1) / gt;  // the busiest tail range
  const int64_t gain = max_tiles - share;   // in key tiles
  if (gain < kTailCutCost || gain * 100 < int64_t(W) * max_tiles) return 0;
  return gt;
}
// First tile of tail CTA g's range (g in [0, Gt]; tail_start(Gt) = S); ranges are non-empty
// where Gt <= S.
KVATTN_PO_HD int64_t tail_start(int g, int Gt, int64_t S) { return int64_t(g) * S / Gt; }
// The tail CTA whose range holds tile x (0 <= x < S).
KVATTN_PO_HD int tail_owner(int64_t x, int Gt, int64_t S) { return static_cast<int>(((x + 1) * Gt + S - 1) / S - 1); }

}  // namespace kvattn::ops::cuda_impl::po
