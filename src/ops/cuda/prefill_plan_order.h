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

}  // namespace kvattn::ops::cuda_impl::po
