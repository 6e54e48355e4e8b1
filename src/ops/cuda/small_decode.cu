// src/ops/cuda/small_decode.cu — the small-call decode path on thread-block clusters (sm_90+).
//
// Why: a 1 x 1024 decode call moves 4 MB; its time is the latency chain of one piece of work, not
// bandwidth.  attn_kernel's small form (attn_kernel<..., SMALL = true>, paged_attention.cu) spent
// ~15 CTA barriers and ~6 dependent global round trips per piece: a per-CTA plan of the whole
// call, a row table, Q staged through shared memory, an offset table, four epilogue passes, and a
// merge through global memory (partial stores, __threadfence, an arrival counter, a second load
// round trip).  Here:
//   * grid (pieces P, batch * hkv): CTA (piece, unit) knows its request and KV head from its
//     index — no plan; every thread loads its request's five index words itself, while the CTA
//     copies the first 2 KB of the page index into shared memory (the page-id window), so the
//     page ids cost no second dependent round trip (one round trip before the K/V loads);
//   * W = 4 or 8 warps per CTA: 8 (at most 8 pieces) wherever one 8-warp CTA per SM holds every
//     unit's cluster, so each warp walks half as many tiles; else 4 (two CTAs per SM);
//   * the P pieces of a unit are one thread-block cluster: each CTA combines its W warps into
//     one partial (m, l, O) in its own shared memory, one cluster barrier, then every CTA combines
//     a slice of the unit's outputs by reading the P partials over distributed shared memory
//     (ld.shared::cluster) and stores them — no global workspace, no counters, nothing to reset
//     between launches (CUDA-graph safe by construction);
//   * each warp streams its own 16-key slice of every 64-key tile (kStages deep, all of a short
//     piece in flight at once), so the main loop has warp barriers only; Q goes straight from
//     global memory into the mma fragments;
//   * a call this small waits on each warp's instruction stream (one or two warps per scheduler),
//     so the serial path is kept short: one page id per slice when pages hold whole slices (else
//     one per key row, passed by shuffles), K/V addresses as per-lane offsets plus a step, masks
//     only on slices that cross a bound, no O rescale on a warp's first tile, only valid rows
//     written and loaded, (m, l) in the partial row's padding (one DSMEM load with O), and the
//     SIMPLE instantiation without the per-key page walk and tanh (half the SASS fetched).
// Chain per piece: launch -> (index words || page-id window) -> tile 0's K/V, Q, the other stages
// issued -> mma / softmax -> one shared-memory pass -> cluster barrier -> DSMEM loads -> store ->
// cluster barrier (exit, relaxed arrive).
//
// Covers: bf16 / f16 caches with a query of the same type in 16-byte rows, head dims 64 and 128,
// any page size and layout (strides), both page-table forms, causal or not, multi-token rows
// (rows of a unit above 16 are walked in 16-row tiles), sliding window, soft cap, sinks, LSE
// output.  Everything else (fp8, D 256, PrefixLM / XQA masks, other query types, pre-sm_90
// devices) stays on attn_kernel<..., SMALL>; see cluster_decode_pieces().
#include "ops/cuda/small_decode.h"
#include "ops/cuda/ptx.cuh"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/routing.h"
#include "ops/cuda/softmax.cuh"
#include "ops/cuda/swizzle.cuh"

// Before sm_90 the cluster kernel's body is compiled out (the host never picks it there), so its
// tile constants go unreferenced in that pass.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#pragma nv_diag_suppress 177
#endif

namespace kvattn::ops::cuda_impl::k {
namespace {

// Warps per CTA, W: 4 (96 KB for D 128, 2 CTAs / SM) or 8 (192 KB, 1 CTA / SM; a piece's tiles
// are twice as wide, so each warp walks half as many of them — for calls whose clusters all fit
// with one CTA per SM, where a warp's serial instruction stream sets the time).
constexpr int kRows = 16;    // query rows (token, head of the group) per row tile
constexpr int kSlice = 16;   // keys per warp per tile
constexpr int kStages = 3;   // tiles in flight per warp
constexpr int kMaxPieces = 16;  // cluster size bound (16 needs the non-portable attribute)
constexpr int kWinBytes = 2048; // page-id window in shared memory: 512 int32 or 256 int64 entries

template <int D, int W>
struct SCfg {
  static constexpr int kRowBytes = D * 2;
  static constexpr int kCPR = kRowBytes / 16;               // 16-byte chunks per key row
  static constexpr int kSliceBytes = kSlice * kRowBytes;     // K (or V) of one warp, one stage
  static constexpr int kWarpBytes = kStages * 2 * kSliceBytes;
  static constexpr int kPipeBytes = W * kWarpBytes;
  static constexpr int kPitch = D + 4;                       // f32 row pitch of the partials
  static constexpr int kEpiBytes = W * kRows * kPitch * 4;
  static constexpr int kSmem = kPipeBytes > kEpiBytes ? kPipeBytes : kEpiBytes;
  static constexpr int kChunks = kSlice * kCPR / 32;         // chunks per lane per K (or V) slice
  static constexpr int kRowStep = 32 / kCPR;                 // key rows between a lane's chunks
  static_assert(32 % kCPR == 0 && (kSlice * kCPR) % 32 == 0, "lanes must cover whole rows");
};

// K / V slices of a warp are swizzled as swizzle.cuh's swz (row, 16-byte chunk).

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KVATTN_CLUSTER_KERNEL 1
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// All threads of all CTAs of the cluster; release / acquire order the shared-memory writes
// before the barrier with the (remote) reads after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The exit barrier: it only keeps each CTA's shared memory alive until the peers' DSMEM loads of
// it are done, and every such load's value is consumed (shuffled, stored) before the arrive, so the
// arrive needs no release — which compiled to MEMBAR.ALL.GPU + ERRBAR behind the output stores.
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}
__device__ __forceinline__ uint32_t map_rank(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ float2 ld_cluster_f2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0,%1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float4 ld_cluster_f4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0,%1,%2,%3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
#endif

// Timeline of one launch (debugging aid): thread 0 of every CTA of a TL = true instantiation
// writes %globaltimer at these points of its last row tile to tl[cta * kTlStamps + point].  The
// library launches only TL = false, which carries no stamping code.
enum TlPoint : int {
  kTlEntry,       // kernel entry
  kTlBounds,      // the request's index words have arrived (the stamp waits for kv_len)
  kTlPages,       // this lane's first page id has arrived (waits for it)
  kTlIssued,      // the first tiles' cp.async issued (index words and page ids have arrived)
  kTlTile0,       // warp 0's first tile landed
  kTlLoop,        // every warp's tile loop done (barrier)
  kTlPartial,     // this CTA's partial combined in shared memory (before the cluster barrier)
  kTlSync,        // after the cluster barrier
  kTlRemote,      // the first pass's DSMEM loads have arrived (waits for them)
  kTlCombined,    // the first pass's group combine (shuffles) done (waits for its sum)
  kTlStored,      // this CTA's slice of the outputs combined over DSMEM and stored
  kTlExit,        // after the final cluster barrier
  kTlSm,          // not a time: the SM the CTA ran on
  kTlClk0,        // not a time: clock64 at entry
  kTlClk1,        // not a time: clock64 at exit (with the two timer stamps: the SM clock)
  kTlStamps
};
// This CTA's row of stamps.
__device__ __forceinline__ uint64_t* tl_row(uint64_t* tl) {
  return tl + (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * kTlStamps;
}
template <bool TL>
__device__ __forceinline__ void tl_stamp(uint64_t* tl, int point) {
  if constexpr (TL) {
    if (threadIdx.x == 0) {
      uint64_t t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
      tl_row(tl)[point] = t;
    }
  } else {
    (void)tl;
    (void)point;
  }
}
// The same stamp taken only once `dep` is available (the asm reads it), so it times the arrival
// of a load rather than its issue.
template <bool TL>
__device__ __forceinline__ void tl_stamp_after(uint64_t* tl, int point, uint32_t dep) {
  if constexpr (TL) {
    if (threadIdx.x == 0) {
      uint64_t t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "r"(dep) : "memory");
      tl_row(tl)[point] = t;
    }
  } else {
    (void)tl;
    (void)point;
    (void)dep;
  }
}

#ifdef KVATTN_CLUSTER_KERNEL
// ---- the cluster kernel's phases (sm_90+).  They take most of the kernel's variables by
// reference, scalars too: copies of some (the slice's first key, the piece's end) changed the
// compiler's code for the kernel (scripts/dev/sass_diff.sh tells).

// Thread tid's share of the page-id window: entries [0, win_n) of the page index (pix: all of
// kv_indices, or the first columns of request r's block-table row) into s_win by cp.async.
template <int W>
__device__ __forceinline__ void copy_page_window(const AttnParams& p, const Idx& pix, const int& r, const int& win_n,
                                                 const int& tid, unsigned char (&s_win)[kWinBytes]) {
  const int esh = pix.is64 ? 3 : 2;
  for (int i = tid; i < win_n; i += 32 * W) {
    const int64_t e = p.paged_form ? int64_t(i) * pix.s0 : int64_t(r) * pix.s0 + int64_t(i) * pix.s1;
    cp_async_idx(smem_u32(s_win + (i << esh)), static_cast<const char*>(pix.ptr) + (e << esh), pix.is64);
  }
}

// Page id of key `first + tile * kTile + lane` (lanes 0..15), -1 when outside the piece (its
// n_tiles tiles, keys below kend) or out of range; with one_page every lane holds the page id of
// the slice's first key.  Entries inside the page-id window (s_win, win_n entries) are read from
// shared memory, the others from the page index.
template <int kTile>
__device__ __forceinline__ int64_t slice_page(const AttnParams& p, const Idx& pix, const unsigned char (&s_win)[kWinBytes],
                                              const int& win_n, const int64_t& pbase, const int& r, const int& first,
                                              const int& kend, const int& n_tiles, const bool& one_page, const int& lane,
                                              int tile) {
  const int j = first + tile * kTile + (one_page ? 0 : lane);
  if ((!one_page && lane >= kSlice) || tile >= n_tiles || j >= kend) return -1;
  const int blk = p.page_shift >= 0 ? (j >> p.page_shift) : (j / p.page_size);
  const int64_t w = p.paged_form ? pbase + blk : int64_t(blk);  // entry of the window
  int64_t pg;
  if (w >= 0 && w < win_n)
    pg = pix.is64 ? reinterpret_cast<const int64_t*>(s_win)[w] : int64_t(reinterpret_cast<const int32_t*>(s_win)[w]);
  else
    pg = p.paged_form ? load_idx(p.kv_indices, pbase + blk) : load_idx2(p.block_table, r, blk);
  return (pg < 0 || pg >= p.num_pages) ? int64_t(-1) : pg;
}
// This lane's cp.async of tile `tile`'s K and V slice into its stage of the warp's ring (wbuf),
// from the slice's page pg_lane (slice_page's): with one_page a fixed offset (k_lane / v_lane) plus
// i * step from the slice's page row, else (!SIMPLE) one page id per key row, passed by shuffles;
// rows past the piece zero-filled; L2 evict-first when the call reads K/V once.
template <int D, int W, bool SIMPLE>
__device__ __forceinline__ void issue_slice(const AttnParams& p, unsigned char* const& wbuf, const unsigned char* const& kb,
                                            const unsigned char* const& vb, const int64_t& k_lane, const int64_t& v_lane,
                                            const int64_t& k_step, const int64_t& v_step, const int& my_row0,
                                            const int& my_chunk, const int& hk, const int& first, const int& kend,
                                            const bool& one_page, int tile, int64_t pg_lane) {
  using C = SCfg<D, W>;
  constexpr int kTile = W * kSlice, kCPR = C::kCPR;
  const int st = tile % kStages;
  const uint32_t sk = smem_u32(wbuf + st * 2 * C::kSliceBytes);
  const uint32_t sv = sk + C::kSliceBytes;
  const uint64_t ef = l2_evict_first_policy();
  const bool ef_on = kv_read_once(p);  // K/V evict-first only then
  if (one_page) {
    const int key0 = first + tile * kTile;
    const int slot0 = p.page_shift >= 0 ? (key0 & (p.page_size - 1)) : (key0 % p.page_size);
    const bool okp = pg_lane >= 0;
    const unsigned char* ka = kb + (okp ? pg_lane * p.k_sb + int64_t(slot0) * p.k_so + k_lane : 0);
    const unsigned char* va = vb + (okp ? pg_lane * p.v_sb + int64_t(slot0) * p.v_so + v_lane : 0);
    const int nvalid = okp ? kend - key0 : 0;  // rows of this slice inside the piece
#pragma unroll
    for (int i = 0; i < C::kChunks; ++i) {
      const int row = my_row0 + i * C::kRowStep;
      const bool ok = row < nvalid;
      const int off = swz<kCPR>(row, my_chunk);
      cp_async16_policy_if(sk + off, ok ? ka + i * k_step : kb, ok ? 16 : 0, ef, ef_on);
      cp_async16_policy_if(sv + off, ok ? va + i * v_step : vb, ok ? 16 : 0, ef, ef_on);
    }
    return;
  }
  if constexpr (!SIMPLE) {  // pages of fewer than 16 keys: one page id per key row
#pragma unroll
    for (int i = 0; i < C::kChunks; ++i) {
      const int row = my_row0 + i * C::kRowStep;
      const int64_t pg = __shfl_sync(0xffffffffu, pg_lane, row);
      const int j = first + tile * kTile + row;
      const int slot = p.page_shift >= 0 ? (j & (p.page_size - 1)) : (j % p.page_size);
      const int off = swz<kCPR>(row, my_chunk);
      const bool ok = pg >= 0;
      const int64_t ko = pg * p.k_sb + int64_t(slot) * p.k_so + int64_t(hk) * p.k_sh + my_chunk * 16;
      const int64_t vo = pg * p.v_sb + int64_t(slot) * p.v_so + int64_t(hk) * p.v_sh + my_chunk * 16;
      cp_async16_policy_if(sk + off, ok ? kb + ko : kb, ok ? 16 : 0, ef, ef_on);
      cp_async16_policy_if(sv + off, ok ? vb + vo : vb, ok ? 16 : 0, ef, ef_on);
    }
  }
}
// Query rows g + 8 h of the row tile from row0 (rvalid[h]: the row exists) straight into the A
// fragments: h 0 fills a0 / a2 (row g: dims 16 s + 2 t4, + 8), h 1 fills a1 / a3 (row g + 8).
template <int D, class GDiv, class GMod>
__device__ __forceinline__ void load_q_rows(const AttnParams& p, const int& q_start, const int& hk, const int& row0,
                                            const int& g, const int& t4, const int (&rvalid)[2], GDiv& gdiv, GMod& gmod,
                                            uint32_t (&qf)[D / 16][4], int h) {
  const int rr = row0 + g + 8 * h;
  const int tq = rvalid[h] ? gdiv(rr) : 0;
  const int head = hk * p.group + (rvalid[h] ? gmod(rr) : 0);
  const uint16_t* qrow = static_cast<const uint16_t*>(p.q) + int64_t(q_start + tq) * p.q_st + int64_t(head) * p.q_sh;
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    qf[s][h] = rvalid[h] ? *reinterpret_cast<const uint32_t*>(qrow + 16 * s + 2 * t4) : 0u;
    qf[s][h + 2] = rvalid[h] ? *reinterpret_cast<const uint32_t*>(qrow + 16 * s + 8 + 2 * t4) : 0u;
  }
}

// S = Q K^T of the warp's 16-row tile and 16-key slice (tK: the slice's K rows, swizzled).
template <bool BF16, int D>
__device__ __forceinline__ void slice_scores(float (&s)[2][4], const uint32_t (&qf)[D / 16][4], const unsigned char* tK,
                                             int lane) {
  constexpr int kKSteps = D / 16, kCPR = SCfg<D, 4>::kCPR;
#pragma unroll
  for (int j = 0; j < 2; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int krow = 8 * j + (lane & 7);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ks += 2) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4(smem_u32(tK + swz<kCPR>(krow, 2 * ks + (lane >> 3))), b0, b1, b2, b3);
      mma16816<BF16>(s[j], qf[ks], b0, b1);
      mma16816<BF16>(s[j], qf[ks + 1], b2, b3);
    }
  }
}
// The slice's scores in log2 units, soft-capped (tanh) when softcap.
__device__ __forceinline__ void scale_scores(float (&s)[2][4], const AttnParams& p, bool softcap, float scale_lin,
                                             float scale_log2) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = s[j][e];
      s[j][e] = softcap ? p.soft_cap * tanhf(x * scale_lin / p.soft_cap) * kLog2e : x * scale_log2;
    }
  }
}
// The same with the keys key0 + 8 j + 2 t4 + (0, 1) a row does not see -inf: past the piece
// (kend), after the row's position rqpos (causal), before its window, and every key of a row past
// the unit's (rvalid 0).
__device__ __forceinline__ void scale_and_mask(float (&s)[2][4], const AttnParams& p, bool softcap, float scale_lin,
                                               float scale_log2, const int& key0, const int& kend, const int (&rvalid)[2],
                                               const int (&rqpos)[2], const int& t4) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = s[j][e];
      if (softcap) x = p.soft_cap * tanhf(x * scale_lin / p.soft_cap) * kLog2e;
      else x *= scale_log2;
      const int h = e >> 1;
      const int key = key0 + 8 * j + 2 * t4 + (e & 1);
      bool vis = rvalid[h] && key < kend;
      if (p.causal && key > rqpos[h]) vis = false;
      if (p.window_left >= 0 && int64_t(key) < int64_t(rqpos[h]) - p.window_left) vis = false;
      s[j][e] = vis ? x : -INFINITY;
    }
  }
}
// Online softmax of rows g and g + 8 over the slice's scores (log2 units): the running max m_r
// and sum l_r move on, s becomes P; alpha: the factor O is rescaled by.
__device__ __forceinline__ void online_softmax(float (&s)[2][4], float (&m_r)[2], float (&l_r)[2], float (&alpha)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_r[h], mx);
    const float m_use = (m_new == -INFINITY) ? 0.f : m_new;
    alpha[h] = exp2f(m_r[h] - m_use);
    m_r[h] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      s[j][2 * h] = exp2f(s[j][2 * h] - m_use);
      s[j][2 * h + 1] = exp2f(s[j][2 * h + 1] - m_use);
      sum += s[j][2 * h] + s[j][2 * h + 1];
    }
    l_r[h] = l_r[h] * alpha[h] + sum;
  }
}
// O rescaled by alpha: row g (o[.][0..1]) and row g + 8 (o[.][2..3]).
template <int D>
__device__ __forceinline__ void rescale_o(float (&o)[D / 8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    o[n][0] *= alpha[0];
    o[n][1] *= alpha[0];
    o[n][2] *= alpha[1];
    o[n][3] *= alpha[1];
  }
}
// O += P V over the slice (tV: its V rows, swizzled; P from the score accumulators in registers).
template <bool BF16, int D>
__device__ __forceinline__ void accumulate_pv(float (&o)[D / 8][4], const float (&s)[2][4], const unsigned char* tV,
                                              int lane) {
  constexpr int kCPR = SCfg<D, 4>::kCPR;
  uint32_t a[4];
  a[0] = pack2<BF16>(s[0][0], s[0][1]);
  a[1] = pack2<BF16>(s[0][2], s[0][3]);
  a[2] = pack2<BF16>(s[1][0], s[1][1]);
  a[3] = pack2<BF16>(s[1][2], s[1][3]);
  const int vrow = (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int n = 0; n < D / 8; n += 2) {
    uint32_t b0, b1, b2, b3;
    ldsm_x4_t(smem_u32(tV + swz<kCPR>(vrow, n + (lane >> 4))), b0, b1, b2, b3);
    mma16816<BF16>(o[n], a, b0, b1);
    mma16816<BF16>(o[n + 1], a, b2, b3);
  }
}

// denom and acc summed over each group of PP lanes (xor shuffles).
__device__ __forceinline__ void group_sum(float& denom, float4& acc, const int& PP) {
  for (int off = PP >> 1; off > 0; off >>= 1) {
    denom += __shfl_xor_sync(0xffffffffu, denom, off, PP);
    acc.x += __shfl_xor_sync(0xffffffffu, acc.x, off, PP);
    acc.y += __shfl_xor_sync(0xffffffffu, acc.y, off, PP);
    acc.z += __shfl_xor_sync(0xffffffffu, acc.z, off, PP);
    acc.w += __shfl_xor_sync(0xffffffffu, acc.w, off, PP);
  }
}
// One output item: dims 4 c .. 4 c + 3 of (token tok, head `head`) from its group's max M
// (Mu: the max with the sink s2, 0 for -inf), denom (the sink added here) and acc; at c = 0 the
// row's LSE too.
__device__ __forceinline__ void store_item(const AttnParams& p, const int64_t& tok, const int& head, const int& c,
                                           const float& M, const float& Mu, const float& s2, float& denom,
                                           const float4& acc) {
  if (p.sinks != nullptr) denom += exp2f(s2 - Mu);
  const float sc = (denom > 0.f && M != -INFINITY) ? p.v_scale / denom : 0.f;
  store_out4(p, tok, head, 4 * c, acc.x * sc, acc.y * sc, acc.z * sc, acc.w * sc);
  if (c == 0 && p.lse != nullptr) {
    const float lse2 = denom > 0.f ? Mu + log2f(denom) : -INFINITY;
    p.lse[tok * p.lse_st + int64_t(head) * p.lse_sh] = p.lse_natural ? lse2 * kLn2 : lse2;
  }
}
#endif

// One CTA = piece blockIdx.x (cluster rank) of unit blockIdx.y = request * hkv + KV head.
// SIMPLE: the call's pages hold whole 16-key slices and it has no soft cap (the host decides,
// simple_call()): the per-key page walk and tanh are compiled out, which halves the code a
// launch fetches (60 vs 120 KB of SASS for bf16 D 128; measured 1 x 1024 11.8-11.9 vs 12.2 us).
template <bool BF16, int D, bool SIMPLE, int W, bool TL = false>
__global__ void __launch_bounds__(32 * W) cluster_decode_kernel(const __grid_constant__ AttnParams p, uint64_t* tl,
                                                                 int win_n) {
#ifdef KVATTN_CLUSTER_KERNEL
  using C = SCfg<D, W>;
  constexpr int kWarps = W, kThreads = 32 * W;
  constexpr int kTile = W * kSlice;  // keys per tile: one 16-key slice per warp
  constexpr int kKSteps = D / 16;
  constexpr int kNTilesO = D / 8;
  constexpr int kCPR = C::kCPR;
  constexpr int kC4 = D / 4;  // float4 columns of an output row
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float s_wm[kWarps][kRows], s_wl[kWarps][kRows];  // per-warp row max / sum

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int P = static_cast<int>(gridDim.x);
  const uint32_t rank = cluster_rank();
  const int r = static_cast<int>(blockIdx.y) / p.hkv;
  const int hk = static_cast<int>(blockIdx.y) - r * p.hkv;
  tl_stamp<TL>(tl, kTlEntry);
  if constexpr (TL) {
    if (tid == 0) {
      uint32_t sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      tl_row(tl)[kTlSm] = sm;
      tl_row(tl)[kTlClk0] = clock64();
    }
  }

  // ---- the page-id window: the first win_n entries of the page index (all of kv_indices, or the
  // first columns of this request's block-table row; win_n <= kWinBytes / entry size, chosen on
  // the host) are copied into shared memory while the index words load, so the page ids are read
  // from shared memory, not fetched by a second global round trip after kv_indptr ----
  __shared__ __align__(16) unsigned char s_win[kWinBytes];
  const Idx& pix = page_index(p);
  copy_page_window<W>(p, pix, r, win_n, tid, s_win);
  cp_async_commit();

  // ---- the request's index words: every thread loads them (same addresses: one round trip) ----
  const RequestBounds rb = load_request_bounds(p, r);
  if (win_n > 0) {  // uniform over the grid
    cp_async_wait_mem<0>();
    __syncthreads();  // every thread's window entries have landed
  }
  const int64_t pbase = rb.page_base;
  const int q_start = static_cast<int>(rb.q_begin), q_len = static_cast<int>(rb.q_end - rb.q_begin);
  const int kv_len = static_cast<int>(rb.kv_len);
  const int rows_r = q_len * p.group;
  tl_stamp_after<TL>(tl, kTlBounds, static_cast<uint32_t>(kv_len));

  const float scale_log2 = p.sm_scale * kLog2e;
  const float scale_lin = p.sm_scale;
  const bool softcap = !SIMPLE && p.soft_cap > 0.f;

  unsigned char* wbuf = smem + warp * C::kWarpBytes;  // this warp's stages: [K slice | V slice] x kStages
  const int my_chunk = lane % kCPR, my_row0 = lane / kCPR;
  const unsigned char* kb = static_cast<const unsigned char*>(p.k);
  const unsigned char* vb = static_cast<const unsigned char*>(p.v);
  // Instructions on each warp's serial path are what a small call waits for (1 x 1024: one or two
  // warps per scheduler, ~7 cycles per instruction; ncu counted 2019 instructions per warp before
  // the measures below, 1638 after): when pages hold whole 16-key slices (every slice starts at a
  // multiple of 16) one page id serves a slice and this lane's chunks sit at a fixed offset plus
  // i * step from the slice's page row; the general walk (one page id per key) is kept for pages
  // of fewer than 16 keys.
  const bool one_page = SIMPLE || p.page_size % kSlice == 0;
  const int64_t k_lane = int64_t(hk) * p.k_sh + int64_t(my_row0) * p.k_so + my_chunk * 16;
  const int64_t v_lane = int64_t(hk) * p.v_sh + int64_t(my_row0) * p.v_so + my_chunk * 16;
  const int64_t k_step = int64_t(C::kRowStep) * p.k_so, v_step = int64_t(C::kRowStep) * p.v_so;
  // group divisions (row -> query token, head of the group) as shifts for power-of-two groups
  const int gshift = (p.group & (p.group - 1)) == 0 ? __ffs(p.group) - 1 : -1;
  auto gdiv = [&](int rr) { return gshift >= 0 ? rr >> gshift : rr / p.group; };
  auto gmod = [&](int rr) { return gshift >= 0 ? rr & (p.group - 1) : rr % p.group; };

  for (int row0 = 0; row0 < rows_r; row0 += kRows) {
    // ---- key range of this row tile, cut into P pieces of a multiple of 16 keys ----
    const int last_row = min(rows_r, row0 + kRows) - 1;
    const int qpos_first = kv_len - q_len + gdiv(row0);
    const int qpos_last = kv_len - q_len + gdiv(last_row);
    int hi = kv_len;
    if (p.causal) hi = min(hi, qpos_last + 1);
    int lo = 0;
    if (p.window_left >= 0) lo = static_cast<int>(max(int64_t(0), int64_t(qpos_first) - p.window_left));
    lo &= ~(kSlice - 1);
    const int span = max(hi - lo, 0);
    const int chunk = ((span + P - 1) / P + kSlice - 1) & ~(kSlice - 1);
    const int kstart = lo + static_cast<int>(rank) * chunk;
    const int kend = min(hi, kstart + chunk);
    // tiles of this warp: slice start kstart + tile * 64 + warp * 16 below kend
    const int first = kstart + warp * kSlice;
    const int n_tiles = kend > first ? (kend - first + kTile - 1) / kTile : 0;

    // a tile's page ids (slice_page) and its K/V copies (issue_slice)
    auto load_page = [&](int tile) -> int64_t {
      return slice_page<kTile>(p, pix, s_win, win_n, pbase, r, first, kend, n_tiles, one_page, lane, tile);
    };
    auto issue = [&](int tile, int64_t pg_lane) {
      issue_slice<D, W, SIMPLE>(p, wbuf, kb, vb, k_lane, v_lane, k_step, v_step, my_row0, my_chunk, hk, first, kend,
                                one_page, tile, pg_lane);
    };

    // ---- page ids of the first kStages + 1 tiles, their K/V issued, then Q ----
    int64_t pgs[kStages];
#pragma unroll
    for (int t = 0; t < kStages; ++t) pgs[t] = load_page(t);
    int64_t pg_pref = load_page(kStages);
    tl_stamp_after<TL>(tl, kTlPages, static_cast<uint32_t>(pgs[0]));

    // the first tile's K/V, then Q, then the other stages: Q is not needed before the first tile
    // lands (ncu: its ~130 instructions per warp delayed every K/V request when they came
    // first), and behind all kStages tiles its loads would queue after 3x as many requests
    if (n_tiles > 0) issue(0, pgs[0]);
    cp_async_commit();
    asm volatile("" ::: "memory");  // the Q loads stay below the first issue

    int rvalid[2], rqpos[2];
    uint32_t qf[kKSteps][4];
    const bool upper = row0 + 8 < rows_r;  // rows g + 8 exist (warp-uniform)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = row0 + g + 8 * h;
      rvalid[h] = rr < rows_r;
      rqpos[h] = kv_len - q_len + (rvalid[h] ? gdiv(rr) : 0);
    }
    load_q_rows<D>(p, q_start, hk, row0, g, t4, rvalid, gdiv, gmod, qf, 0);  // row g, then g + 8
    if (upper) {
      load_q_rows<D>(p, q_start, hk, row0, g, t4, rvalid, gdiv, gmod, qf, 1);
    } else {  // a 1-token tile of <= 8 heads: no loads for the upper half
#pragma unroll
      for (int s = 0; s < kKSteps; ++s) qf[s][1] = qf[s][3] = 0u;
    }
    asm volatile("" ::: "memory");  // ... and above the other stages' issue
#pragma unroll
    for (int t = 1; t < kStages; ++t) {
      if (t < n_tiles) issue(t, pgs[t]);
      cp_async_commit();
    }
    tl_stamp<TL>(tl, kTlIssued);

    float o[kNTilesO][4];
#pragma unroll
    for (int n = 0; n < kNTilesO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};

    for (int tile = 0; tile < n_tiles; ++tile) {
      cp_async_wait_mem<kStages - 1>();
      __syncwarp();  // every lane's chunks of this stage have landed
      if constexpr (TL) {
        if (tile == 0) tl_stamp<TL>(tl, kTlTile0);
      }
      const int st = tile % kStages;
      const unsigned char* tK = wbuf + st * 2 * C::kSliceBytes;
      const unsigned char* tV = tK + C::kSliceBytes;
      const int key0 = first + tile * kTile;

      // ---- S = Q K^T (16 rows x 16 keys) ----
      float s[2][4];
      slice_scores<BF16, D>(s, qf, tK, lane);
      // ---- scale, soft cap, mask (piece range, causal, window) ----
      // a slice inside the piece, at or before every row's position and inside every row's
      // window needs no mask (rows past the tile's end are never stored)
      const bool no_mask = key0 + kSlice <= kend && (!p.causal || key0 + kSlice - 1 <= qpos_first) &&
                           (p.window_left < 0 || int64_t(key0) >= int64_t(qpos_last) - p.window_left);
      if (no_mask) {
        scale_scores(s, p, softcap, scale_lin, scale_log2);
      } else {
        scale_and_mask(s, p, softcap, scale_lin, scale_log2, key0, kend, rvalid, rqpos, t4);
      }
      // ---- online softmax (rows g and g + 8) ----
      float alpha[2];
      online_softmax(s, m_r, l_r, alpha);
      if (tile > 0) rescale_o<D>(o, alpha);  // o is still zero before the first tile
      // ---- O += P V ----
      accumulate_pv<BF16, D>(o, s, tV, lane);
      __syncwarp();  // every lane is done reading this stage before it is refilled
      const int nt = tile + kStages;
      if (nt < n_tiles) issue(nt, pg_pref);
      cp_async_commit();
      pg_pref = load_page(nt + 1);
    }
    cp_async_wait_mem<0>();
    __syncthreads();  // every warp is done with the pipeline: the partials alias it
    tl_stamp<TL>(tl, kTlLoop);

    // ---- this CTA's partial: the W warps combined, unnormalised, base-2 max ----
    float* sO = reinterpret_cast<float*>(smem);  // [kWarps][kRows][kPitch]; warp 0's slot ends as the CTA's
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_r[h] = quad_sum(l_r[h]);
    }
    {
      float* myO = sO + warp * kRows * C::kPitch;
      // only the rows the combine reads (a 1-token GQA-4 unit has 4 of 16)
      const int vrows = min(kRows, rows_r - row0);
      if (g < vrows) {
#pragma unroll
        for (int n = 0; n < kNTilesO; ++n)
          *reinterpret_cast<float2*>(myO + g * C::kPitch + 8 * n + 2 * t4) = make_float2(o[n][0], o[n][1]);
      }
      if (g + 8 < vrows) {
#pragma unroll
        for (int n = 0; n < kNTilesO; ++n)
          *reinterpret_cast<float2*>(myO + (g + 8) * C::kPitch + 8 * n + 2 * t4) = make_float2(o[n][2], o[n][3]);
      }
      if (t4 == 0) {
        s_wm[warp][g] = m_r[0];
        s_wm[warp][g + 8] = m_r[1];
        s_wl[warp][g] = l_r[0];
        s_wl[warp][g + 8] = l_r[1];
      }
    }
    __syncthreads();
    const int nrows = min(kRows, rows_r - row0);
    for (int item = tid; item < nrows * kC4; item += kThreads) {
      const int row = item / kC4, c = item - row * kC4;
      float mw[kWarps];
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) { mw[w] = s_wm[w][row]; M = fmaxf(M, mw[w]); }
      const float Mu = (M == -INFINITY) ? 0.f : M;
      float L = 0.f;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(mw[w] - Mu);
        L += s_wl[w][row] * f;
        const float4 x = *reinterpret_cast<const float4*>(sO + (w * kRows + row) * C::kPitch + 4 * c);
        acc.x += f * x.x;
        acc.y += f * x.y;
        acc.z += f * x.z;
        acc.w += f * x.w;
      }
      *reinterpret_cast<float4*>(sO + row * C::kPitch + 4 * c) = acc;  // only this thread touches (row, c)
      // the row's (max, sum) in its padding columns: one 8-byte DSMEM load with the row's O
      // (measured: 3 -> 2 remote loads per lane took 1 x 1024 from 12.5-12.8 to 11.7-11.9 us)
      if (c == 0) *reinterpret_cast<float2*>(sO + row * C::kPitch + D) = make_float2(M, L);
    }
    tl_stamp<TL>(tl, kTlPartial);
    cluster_sync();  // every CTA's partial is complete and visible to the cluster
    tl_stamp<TL>(tl, kTlSync);

    // ---- the unit's outputs over DSMEM: item (row, 4 dims) = rank + P * k goes to a group of
    // PP lanes (P rounded up to a power of two); lane j of the group loads piece j's (m, l, O),
    // so every remote load of a pass is in flight at once (one DSMEM round trip: one load per
    // lane instead of 3P serial ones per thread, which cost ~6 us at P = 16), then the group
    // combines by xor shuffles and its lane 0 writes the item.  The pass loop is uniform over
    // the CTA so every lane of a warp reaches every shuffle.
    int PP = 1;
    while (PP < P) PP <<= 1;
    const int groups = kThreads / PP;
    const int jp = lane & (PP - 1);  // the piece this lane reads
    const int n_items = nrows * kC4;
    const int my_items = n_items > static_cast<int>(rank) ? (n_items - static_cast<int>(rank) + P - 1) / P : 0;
    const uint32_t a_o = smem_u32(sO);
    for (int k0 = 0; k0 < my_items; k0 += groups) {
      const int k = k0 + tid / PP;
      const bool have = k < my_items;
      const int item = static_cast<int>(rank) + P * (have ? k : 0);
      const int row = item / kC4, c = item - row * kC4;
      float2 ml = make_float2(-INFINITY, 0.f);
      float4 oj = make_float4(0.f, 0.f, 0.f, 0.f);
      if (have && jp < P) {
        ml = ld_cluster_f2(map_rank(a_o + (row * C::kPitch + D) * 4, jp));
        oj = ld_cluster_f4(map_rank(a_o + (row * C::kPitch + 4 * c) * 4, jp));
      }
      const float mj = ml.x, lj = ml.y;
      if (k0 == 0) tl_stamp_after<TL>(tl, kTlRemote, __float_as_uint(oj.x) ^ __float_as_uint(mj));
      float M = mj;
      for (int off = PP >> 1; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off, PP));
      const int rr = row0 + row;
      const int64_t tok = q_start + gdiv(rr);
      const int head = hk * p.group + gmod(rr);
      float s2 = -INFINITY;
      if (p.sinks != nullptr) s2 = p.sinks[int64_t(head) * p.sinks_s] * kLog2e;
      const float Mf = fmaxf(M, s2);
      const float Mu = (Mf == -INFINITY) ? 0.f : Mf;
      const float f = exp2f(mj - Mu);  // 0 for lanes without a piece (mj = -inf)
      float denom = lj * f;
      float4 acc = make_float4(f * oj.x, f * oj.y, f * oj.z, f * oj.w);
      group_sum(denom, acc, PP);
      if (k0 == 0) tl_stamp_after<TL>(tl, kTlCombined, __float_as_uint(acc.x) ^ __float_as_uint(denom));
      if (have && jp == 0) store_item(p, tok, head, c, M, Mu, s2, denom, acc);
    }
    tl_stamp<TL>(tl, kTlStored);
    // no CTA may leave (or overwrite its partial in the next row tile) while another reads it
    cluster_sync_relaxed();
    tl_stamp<TL>(tl, kTlExit);
    if constexpr (TL) {
      if (tid == 0) tl_row(tl)[kTlClk1] = clock64();
    }
  }
#else
  (void)p;  // sm_80 builds: never launched (cluster_decode_pieces returns 0 before sm_90)
  (void)tl;
#endif
}

// ---------------------------------------------------------------------------------------------
// Host side.
template <bool BF16, int D, int W>
struct KernInfo {
  // per device: attributes set, CTAs per SM, clusters of each size that fit at once (-1 unknown)
  std::mutex mu;
  bool ready[64] = {};
  int per_sm[64] = {};
  int max_clusters[64][kMaxPieces + 1] = {};
};

template <bool BF16, int D, int W>
KernInfo<BF16, D, W>& kern_info() {
  static KernInfo<BF16, D, W> k;
  return k;
}


// Attributes and the occupancy figures of one instantiation on device `dev` (once).
template <bool BF16, int D, int W>
int prepare(int dev) {
  auto& ki = kern_info<BF16, D, W>();
  std::lock_guard<std::mutex> lock(ki.mu);
  const int d = dev & 63;
  if (ki.ready[d]) return 0;
  auto kern = cluster_decode_kernel<BF16, D, false, W>;  // the general kernel's figures bound both
  constexpr int smem = SCfg<D, W>::kSmem;
  cudaError_t e = cudaSuccess;
  for (auto k : {kern, cluster_decode_kernel<BF16, D, true, W>}) {
    if (e == cudaSuccess) e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  }
  if (e != cudaSuccess) return static_cast<int>(e);
  int n = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, 32 * W, smem);
  if (e != cudaSuccess) return static_cast<int>(e);
  ki.per_sm[d] = n;
  for (int P = 1; P <= kMaxPieces; ++P) {
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t cfg = cluster_config(dim3(static_cast<unsigned>(P), 1, 1), P, smem, 32 * W, at);
    int c = 0;
    if (cudaOccupancyMaxActiveClusters(&c, kern, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      c = 0;
    }
    ki.max_clusters[d][P] = c;
  }
  ki.ready[d] = true;
  return 0;
}

template <bool BF16, int D, int W>
int pieces_for(const AttnParams& p, int num_sms) {
  int dev = 0;
  cudaGetDevice(&dev);
  if (prepare<BF16, D, W>(dev) != 0) {
    (void)cudaGetLastError();
    return 0;
  }
  auto& ki = kern_info<BF16, D, W>();
  const int d = dev & 63;
  const int64_t units = int64_t(p.batch) * p.hkv;
  const int64_t slots = int64_t(num_sms) * std::max(ki.per_sm[d], 1);
  // the most pieces per unit with every unit's cluster resident at once (one wave)
  for (int P = std::clamp(kernel_routing().small_cluster_max, 1, kMaxPieces); P >= 1; --P)
    if (units * P <= slots && ki.max_clusters[d][P] >= units) return P;
  return 0;
}

// Entries of the page index the kernel stages in shared memory (its win_n): every row of
// kv_indices (paged form; kv_entries, known on the host) or the first columns of each request's
// block-table row, up to kWinBytes (entries past the window are loaded from global memory after
// the index words, as all of them are with KernelRouting::small_page_window off).
int page_window(const AttnParams& p) {
  if (!kernel_routing().small_page_window) return 0;
  const int64_t cap = kWinBytes / ((p.paged_form ? p.kv_indices : p.block_table).is64 ? 8 : 4);
  return static_cast<int>(std::clamp<int64_t>(p.paged_form ? p.kv_entries : p.max_blocks, 0, cap));
}

// Warps per CTA: 8 wherever one 8-warp CTA per SM holds every unit's cluster at once (see
// pieces_and_warps), else 4; KernelRouting::small_warps4: always 4.
bool four_warps() { return kernel_routing().small_warps4; }

// Whether P-piece clusters of the W-warp kernel hold every unit of the call at once.
template <bool BF16, int D, int W>
bool fits(const AttnParams& p, int P) {
  int dev = 0;
  cudaGetDevice(&dev);
  if (P < 1 || P > kMaxPieces || prepare<BF16, D, W>(dev) != 0) {
    (void)cudaGetLastError();
    return false;
  }
  return kern_info<BF16, D, W>().max_clusters[dev & 63][P] >= int64_t(p.batch) * p.hkv;
}

// Calls the SIMPLE instantiation covers.
bool simple_call(const AttnParams& p) { return p.page_size % kSlice == 0 && !(p.soft_cap > 0.f); }

template <bool BF16, int D, int W, bool TL>
auto kernel_for(bool simple) {
  return simple ? cluster_decode_kernel<BF16, D, true, W, TL> : cluster_decode_kernel<BF16, D, false, W, TL>;
}

template <bool BF16, int D, int W>
int launch_w(const AttnParams& p, int P) {
  int dev = 0;
  cudaGetDevice(&dev);
  if (int e = prepare<BF16, D, W>(dev)) return e;
  const bool simple = simple_call(p);
  cudaLaunchAttribute at;
  const cudaLaunchConfig_t cfg = cluster_config(dim3(static_cast<unsigned>(P), static_cast<unsigned>(p.batch * p.hkv), 1),
                                                P, SCfg<D, W>::kSmem, 32 * W, at);
  const int win_n = page_window(p);
  const cudaError_t e =
      cudaLaunchKernelEx(&cfg, kernel_for<BF16, D, W, false>(simple), p, static_cast<uint64_t*>(nullptr), win_n);
  if (e != cudaSuccess) return static_cast<int>(e);
  note_launch(KernelLaunch::small_cluster);
  if (W == 8) note_launch(KernelLaunch::small_cluster_8warps);
  return static_cast<int>(cudaGetLastError());
}

// Pieces per unit for the batch's average length when the host knows it (kv_indptr form: the rows
// of kv_indices over the batch), else kMaxPieces.  Measured on the H200 (one request, bf16, D 128,
// 32 q / 8 KV heads; bench-cuda --only small), event time at 4 / 8 / 16 pieces:
// 1024 keys 12.7 / 11.1 / 11.7 us, 2048: 18.2 / 13.4 / 13.7, 4096: 28.4 / 18.4 / 16.8,
// 8192: 48.4 / 28.6 / 23.1 — about 256 keys per piece, and never fewer than 8 pieces.
int pieces_for_length(const AttnParams& p) {
  if (!p.paged_form || p.kv_entries <= 0 || p.batch <= 0) return kMaxPieces;
  const int64_t avg = p.kv_entries * p.page_size / p.batch;
  return static_cast<int>(std::clamp<int64_t>((avg + 255) / 256, 8, kMaxPieces));
}

// Pieces per unit (see cluster_decode_pieces); the launch then runs 8 warps when P-piece clusters
// of the 8-warp kernel hold the call (fits<.., 8>), else 4.
template <bool BF16, int D>
int pieces_and_warps(const AttnParams& p, int num_sms, bool force) {
  int p4 = pieces_for<BF16, D, 4>(p, num_sms);
  const int len = pieces_for_length(p);
  const bool four = four_warps();
  const int p8 = four ? 0 : std::min({pieces_for<BF16, D, 8>(p, num_sms), len, 8});
  if (!force) {
    // automatic routing: 4 warps with >= kClusterMinAutoPieces pieces per unit (16 x 4096 at 2
    // pieces on 4 warps ran 2.5 % slower than attn_kernel's small form), or 8 warps whose clusters fill
    // at least 3/4 of the SMs (KernelRouting::small_route8 off: the first rule only)
    const bool ok4 = p4 >= std::min(kClusterMinAutoPieces, kernel_routing().small_cluster_max);
    const bool ok8 = kernel_routing().small_route8 && p8 > 0 && int64_t(p.batch) * p.hkv * p8 * 4 >= int64_t(3) * num_sms;
    if (!ok4 && !ok8) return 0;
  }
  if (p4 == 0 && p8 == 0) return 0;
  p4 = std::min(p4, len);
  if (four) return p4;
  // 8 warps at <= 8 pieces wherever they fit: a piece's tiles are twice as wide, so each warp
  // walks half as many, and clusters of <= 8 combine cheaper than 16.  Measured (H200,
  // bench-cuda --only small, 4 warps -> this rule, alternated twice): 1 x 1024
  // 11.2-11.3 -> 10.9-11.0 us, 1 x 2048 13.7-14.6 -> 12.2-12.4, 1 x 4096 16.7 -> 14.7-14.9,
  // 1 x 8192 22.1-22.2 -> 19.2-19.3, 2 x 1024 12.8-12.9 -> 12.5, 4 x 1024 (8 pieces -> 3)
  // 15.8-16.0 -> 14.7-14.9 (8 x 1024 ran attn_kernel's small form in both: the routing below); 8 pieces beat the
  // 9-16 that fit one request of 4096 / 8192 keys (14.7 vs 15.2, 19.1 vs 19.4 us).
  return p8 > 0 ? p8 : p4;
}

template <bool BF16, int D>
int launch(const AttnParams& p, int P) {
  const bool eight = !four_warps() && fits<BF16, D, 8>(p, P);
  return eight ? launch_w<BF16, D, 8>(p, P) : launch_w<BF16, D, 4>(p, P);
}

}  // namespace

int device_cc_major() { return device_attribute<cudaDevAttrComputeCapabilityMajor>(); }

int cluster_decode_pieces(const AttnParams& p, int num_sms, bool force) {
  if (!kernel_routing().small_cluster) return 0;
  if (p.head_dim != 64 && p.head_dim != 128) return 0;
  if (p.kv_t != Elt::bf16 && p.kv_t != Elt::f16) return 0;
  if (p.q_t != p.kv_t || !p.q_vec) return 0;
  if (p.mm != nullptr || p.xqa != nullptr) return 0;
  if (p.batch <= 0 || int64_t(p.batch) * p.hkv > 65535) return 0;
  if (device_cc_major() < 9) return 0;
  const bool bf = p.kv_t == Elt::bf16;
  if (p.head_dim == 64) return bf ? pieces_and_warps<true, 64>(p, num_sms, force) : pieces_and_warps<false, 64>(p, num_sms, force);
  return bf ? pieces_and_warps<true, 128>(p, num_sms, force) : pieces_and_warps<false, 128>(p, num_sms, force);
}

int launch_cluster_decode(const AttnParams& p, int pieces) {
  const bool bf = p.kv_t == Elt::bf16;
  if (p.head_dim == 64) return bf ? launch<true, 64>(p, pieces) : launch<false, 64>(p, pieces);
  return bf ? launch<true, 128>(p, pieces) : launch<false, 128>(p, pieces);
}

}  // namespace kvattn::ops::cuda_impl::k
