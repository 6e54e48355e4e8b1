// src/ops/cuda/attention_kernel.cuh — attn_kernel: the KV element types, the tile configurations (Cfg), the
// small-call merge and the persistent attention kernel of the decode, prefill, small and
// stream-K forms (paged_attention.cu's step 2).  Device code for paged_attention.cu, in its
// anonymous namespace.
#pragma once

#include "ops/cuda/attention_plan.cuh"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/softmax.cuh"
#include "ops/cuda/swizzle.cuh"

namespace kvattn::ops::cuda_impl::k {
namespace {

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
// fp8 fast variant of the decode config (D <= 128; the default, decode option kOptFp8Fast;
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

// Stream-K walk (thread 0): the CTA's next piece of its range, (unit, tiles [tb, te)), into
// s_sk and the unit's id into s_work (0x7fffffff: the range is done), then the range advances.
__device__ __forceinline__ void sk_next_piece(SkShared<true>& s_sk, int& s_work) {
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

// Work decode of the persistent kernel: the CTA's next unit (from the work counter, or the
// stream-K walk) as its item (request, row tile, split), KV head and request.  false when the
// CTA has no more work (the launch's last draw has put the counter back to 0).
template <bool SK, typename TlUnit>
__device__ __forceinline__ bool claim_unit(const AttnParams& p, const Plan& plan, SkShared<SK>& s_sk, int& s_work,
                                           int tid, int total, uint64_t* tl, TlUnit& tl_unit, Item& it, int& hk,
                                           ReqInfo& ri) {
  if constexpr (SK) {
    if (tid == 0) sk_next_piece(s_sk, s_work);  // next piece of the range, then advance
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
    return false;
  }
  if (tl != nullptr) {
    if (uint64_t* r = tl_unit()) r[0] = gtimer();
  }
  it = plan.items[w / p.hkv];
  hk = w % p.hkv;
  ri = plan.req[it.req];
  // SK: the piece's slot and its unit's piece count stay in shared memory (s_sk.slot /
  // s_sk.pieces, read in the epilogue: not held in registers across the tile loop)
  return true;
}

// Plan of the small-call path, computed by every CTA (no plan kernel): warp 0, one lane per
// request (batch <= kSmallMaxBatch, checked by the host).  Same split rule as plan_kernel
// (units of ~1/8 of a CTA's share, at least 8 tiles, one-tile units for tiny calls), with
// the split bound and the fewest tiles per piece applied per request.  rows / tile: query rows
// and keys per tile of the kernel's configuration.
__device__ __forceinline__ void small_plan(const AttnParams& p, const Plan& plan, SmallShared<true>& s_sm, int rows,
                                           int tile) {
  const int lane = threadIdx.x & 31, r = lane;
  int64_t qs = 0, qe = 0, kv = 0, pb = 0;
  if (r < p.batch) {
    const RequestBounds rb = load_request_bounds(p, r);
    qs = rb.q_begin; qe = rb.q_end; kv = rb.kv_len; pb = rb.page_base;
  }
  const int ql = static_cast<int>(qe - qs);
  const int rt = (ql * p.group + rows - 1) / rows;
  const int kvt = static_cast<int>((kv + tile - 1) / tile);
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
  s_sm.chunk[r] = chunk_tiles * tile;
  s_sm.pinc[r] = pi;
  s_sm.uex[r] = uex;
  if (lane == 31) s_sm.npieces = pi;
}

// Stream-K start (thread 0): the CTA's range and the unit of its first position into s_sk
// (read after the first barrier).
__device__ __forceinline__ void sk_start(const Plan& plan, SkShared<true>& s_sk) {
  const int64_t C = sk_hdr(plan)[0], G = sk_hdr(plan)[1];
  const int64_t c = blockIdx.x;
  s_sk.t = c < G ? sk::range_begin(c, C, G) : 0;
  s_sk.end = c < G ? sk::range_begin(c + 1, C, G) : 0;
  s_sk.u = c < G ? reinterpret_cast<const int32_t*>(sk_hdr(plan)[3])[c] : 0;
  s_sk.units = reinterpret_cast<const SkUnit*>(sk_hdr(plan)[2]);
}

// Key range of a work unit: keys [kstart, kend) of its split (stream-K: of its piece's tiles),
// n_tiles tiles from key tile0; qpos_first / qpos_last are the positions of its first and last
// query rows (the causal and window bounds).
template <typename KV, int D, int WM, int WN, bool SK>
__device__ __forceinline__ void unit_keys(const AttnParams& p, const ReqInfo& ri, const Item& it,
                                          const SkShared<SK>& s_sk, int chunk, int rows_r, int row0, int& qpos_first,
                                          int& qpos_last, int& kstart, int& kend, int& tile0, int& n_tiles) {
  using C = Cfg<KV, D, WM, WN>;
  constexpr int kTile = C::kTile;
  const int last_row = min(rows_r, row0 + C::kRows) - 1;
  qpos_first = ri.kv_len - ri.q_len + row0 / p.group;
  qpos_last = ri.kv_len - ri.q_len + last_row / p.group;
  int hi = ri.kv_len;
  if (p.causal && p.xqa == nullptr && p.mm == nullptr) hi = min(hi, qpos_last + 1);
  int lo = 0;
  if (p.window_left >= 0) lo = max(0, qpos_first - static_cast<int>(p.window_left));
  if constexpr (SK) {  // tiles [tb, te) of the unit, counted from the tile holding lo
    const int ubase = (lo / kTile) * kTile;
    kstart = max(lo, ubase + s_sk.tb * kTile);
    kend = min(hi, ubase + s_sk.te * kTile);
  } else {
    kstart = max(lo, it.split * chunk);
    kend = min(hi, (it.split + 1) * chunk);
  }
  tile0 = (kstart / kTile) * kTile;
  n_tiles = kend > kstart ? (kend - tile0 + kTile - 1) / kTile : 0;
}

// Rows of a work unit: this thread's two rows (g and g + 8 of the warp's 16: token, head, query
// position, PrefixLM span) and, by the first kRows threads, the unit's (token, head) per row in
// s_rtok / s_rhead (no divisions in the Q and output loops; token -1: no row).
template <typename KV, int D, int WM, int WN>
__device__ __forceinline__ void unit_rows(const AttnParams& p, const ReqInfo& ri, int row0, int rows_r, int hk, int wm,
                                          int g, int tid, RowInfo (&rinfo)[2], int* s_rtok, int* s_rhead) {
  using C = Cfg<KV, D, WM, WN>;
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
  if (tid < C::kRows) {
    const int rr = row0 + tid;
    s_rtok[tid] = rr < rows_r ? ri.q_start + rr / p.group : -1;
    s_rhead[tid] = hk * p.group + (rr < rows_r ? rr % p.group : 0);
  }
}

// Work decode of the small-call path: the CTA's piece (blockIdx.x, below s_sm.npieces) as its item
// (request, split, row tile), KV head, request and keys per piece.
__device__ __forceinline__ void small_piece(const AttnParams& p, const SmallShared<true>& s_sm, int piece, int lane,
                                            Item& it, int& hk, ReqInfo& ri, int& chunk) {
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

// S = Q K^T for this warp's kNT keys of the tile at tK (fp8 keys widened to f16 in registers;
// kf: the ldmatrix registers of four k-steps of fp8 keys).
template <typename KV, int D, int WM, int WN>
__device__ __forceinline__ void qk_tile(const unsigned char* tK, const uint32_t (&qf)[D / 16][4], int wn, int lane,
                                        float (&s)[Cfg<KV, D, WM, WN>::kNT / 8][4], uint32_t (&kf)[4]) {
  using C = Cfg<KV, D, WM, WN>;
  using TR = KVTraits<KV>;
  constexpr bool kFast = kFastKV<KV>;
  constexpr int kNT = C::kNT, kCPR = C::kCPR;
  constexpr int kKSteps = D / 16;
  constexpr int kNTilesS = kNT / 8;
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
        mma16816<TR::kBf16>(s[j], qf[ks], b0, b1);
        mma16816<TR::kBf16>(s[j], qf[ks + 1], b2, b3);
      }
    } else {
      if constexpr (kKSteps >= 4) {
#pragma unroll
        for (int ks = 0; ks < kKSteps; ks += 4) {
          ldsm_x4(smem_u32(tK + swz<kCPR>(krow, ks + (lane >> 3))), kf[0], kf[1], kf[2], kf[3]);
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            uint32_t b0, b1;
            if constexpr (kFast) {
              fp8x4_to_f16x2x2<TR::kE4m3>(kf[u], b0, b1);
            } else {
              b0 = fp8x2_to_f16x2<TR::kE4m3>(kf[u], 0x1404u);
              b1 = fp8x2_to_f16x2<TR::kE4m3>(kf[u], 0x3424u);
            }
            mma16816<false>(s[j], qf[ks + u], b0, b1);
          }
        }
      }
    }
  }
}

// Online softmax of a tile for rows g and g + 8: the new running max (over the quad), the
// scores' exp2 against it into s, the running sums scaled by alpha (the old max against the
// new), O rescaled by alpha when some row's max moved (rare after the first tiles).
template <typename KV, int D, int WM, int WN>
__device__ __forceinline__ void softmax_tile(float (&s)[Cfg<KV, D, WM, WN>::kNT / 8][4], float (&m_r)[2],
                                             float (&l_r)[2], float (&alpha)[2], float (&o)[D / 8][4]) {
  using C = Cfg<KV, D, WM, WN>;
  constexpr bool kFast = kFastKV<KV>;
  constexpr int kNTilesS = C::kNT / 8;
  constexpr int kNTilesO = D / 8;
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
}

// O += P V for this warp's kNT keys of the tile at tV (P packed from the scores in registers;
// fp8 values are widened to f16, even and odd dims into separate O tiles).
template <typename KV, int D, int WM, int WN>
__device__ __forceinline__ void pv_tile(const unsigned char* tV, const float (&s)[Cfg<KV, D, WM, WN>::kNT / 8][4],
                                        int wn, int lane, float (&o)[D / 8][4]) {
  using C = Cfg<KV, D, WM, WN>;
  using TR = KVTraits<KV>;
  constexpr bool kFast = kFastKV<KV>;
  constexpr bool kBf16 = TR::kBf16;
  constexpr int kNT = C::kNT, kCPR = C::kCPR;
  constexpr int kNTilesO = D / 8;
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

// Epilogue, step 1: each warp's partial O, running max and row sums (reduced over the quad)
// into shared memory (sO, sM, sL; the pipeline buffers are free).
template <typename KV, int D, int WM, int WN>
__device__ __forceinline__ void epi_stage(unsigned char* smem, const float (&o)[D / 8][4], const float (&m_r)[2],
                                          float (&l_r)[2], int wn, int wm, int g, int t4) {
  using C = Cfg<KV, D, WM, WN>;
  using TR = KVTraits<KV>;
  constexpr int kNTilesO = D / 8;
  float* sO = reinterpret_cast<float*>(smem);
  float* sM = sO + WN * C::kRows * C::kEpiPitch;
  float* sL = sM + WN * C::kRows;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_r[h] = quad_sum(l_r[h]);
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
}

// Epilogue, step 2: per row, the WN warps' combined max and sum, each warp's factor (sF), the
// final O scale (sinks, v_scale) into sM and the LSE: written out (one piece) or into the
// partial LSEs of the piece's slot (several pieces).
template <typename KV, int D, int WM, int WN, typename SlotOf>
__device__ __forceinline__ void epi_row_scales(const AttnParams& p, const Plan& plan, unsigned char* smem,
                                               const ReqInfo& ri, int row0, int rows_r, int hk, bool split_run,
                                               SlotOf& slot_of, float kv_out_factor, int tid) {
  using C = Cfg<KV, D, WM, WN>;
  float* sO = reinterpret_cast<float*>(smem);
  float* sM = sO + WN * C::kRows * C::kEpiPitch;
  float* sL = sM + WN * C::kRows;
  float* sF = sL + WN * C::kRows;  // per (warp, row) factor
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
          scale_o = fold_sink(M, Mu, L, s2, Mf, Lf);
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
}

// Epilogue, step 3: a thread per (row, 8 dims) sums the WN warps' partial O with their factors
// into acc, scales it and stores it: to the output (16-bit rows as one 16-byte store, packed in
// ov), or, for a unit of several pieces, to the piece's partial O slot.
template <typename KV, int D, int WM, int WN, typename SlotOf>
__device__ __forceinline__ void epi_write(const AttnParams& p, const Plan& plan, unsigned char* smem,
                                          const int* s_rtok, const int* s_rhead, bool split_run, SlotOf& slot_of,
                                          int tid, float (&acc)[8], uint4& ov) {
  using C = Cfg<KV, D, WM, WN>;
  float* sO = reinterpret_cast<float*>(smem);
  float* sM = sO + WN * C::kRows * C::kEpiPitch;
  float* sL = sM + WN * C::kRows;
  float* sF = sL + WN * C::kRows;  // per (warp, row) factor
  // thread per (row, 8 dims): sum the WN warps' partial O, scale, store
  for (int idx = tid; idx < C::kRows * (D / 8); idx += C::kThreads) {
    const int row = idx / (D / 8), c = idx % (D / 8);
    const int tok = s_rtok[row];
    if (tok < 0) continue;
    const int head = s_rhead[row];
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
      uint32_t* w = reinterpret_cast<uint32_t*>(&ov);
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
      *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + int64_t(tok) * p.o_st + int64_t(head) * p.o_sh + c * 8) = ov;
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        store_elt(p.out, int64_t(tok) * p.o_st + int64_t(head) * p.o_sh + int64_t(c * 8 + k) * p.o_sd, p.out_t, acc[k]);
    }
  }
}

// Small-call path, a split unit: the last piece of the unit to arrive merges its pieces
// (threadFenceReduction pattern): every thread's partial stores are made visible before thread 0
// counts the arrival; the counter is put back to 0 by the last arrival, so the next launch (or
// CUDA-graph replay) finds it at 0.
template <typename C, int D>
__device__ __forceinline__ void small_unit_merge(const AttnParams& p, const Plan& plan, const SmallShared<true>& s_sm,
                                                 int& s_work, const Item& it, int hk, const ReqInfo& ri, int row0,
                                                 int rows_r, const int* s_rtok, const int* s_rhead,
                                                 float kv_out_factor, unsigned char* smem, int tid) {
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

// Q fragments: this warp's mma A fragments from the staged rows (sQ aliases the pipeline
// buffers: barrier after).
template <typename KV, int D, int WM, int WN>
__device__ __forceinline__ void q_frags(const unsigned char* smem, int wm, int g, int t4, uint32_t (&qf)[D / 16][4]) {
  using TR = KVTraits<KV>;
  constexpr bool kBf16 = TR::kBf16;
  constexpr int kKSteps = D / 16;
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

// Loader: the cp.async copies of tile `tile`'s K and V rows into its pipeline stage, from the
// row offsets in the offset ring (a zero-fill row reads 0 bytes).
template <typename KV, int D, int WM, int WN, bool kAbsLoader>
__device__ __forceinline__ void issue_tile(const AttnParams& p, int tile, unsigned char* sK, unsigned char* sV,
                                           const int64_t* sOff, int my_row0, int my_chunk) {
  using C = Cfg<KV, D, WM, WN>;
  constexpr bool kFast = kFastKV<KV>;
  constexpr int kTile = C::kTile, kCPR = C::kCPR, kStages = C::kStages;
  [[maybe_unused]] constexpr uint64_t kZeroFill = uint64_t(1) << 63;
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
}

// Loader: the offset-ring entry of tile `tile`'s offset slot k from its page id pg (-1: the row
// is zero-filled): K / V row offsets, or absolute addresses (fp8 fast variant, kAbsLoader).
template <typename KV, int D, int WM, int WN, bool kAbsLoader>
__device__ __forceinline__ void store_tile_off(const AttnParams& p, int tile, int k, int64_t pg, int tile0, int tid,
                                               int hk, int64_t* sOff) {
  using C = Cfg<KV, D, WM, WN>;
  constexpr bool kFast = kFastKV<KV>;
  constexpr int kTile = C::kTile, kStages = C::kStages;
  [[maybe_unused]] constexpr uint64_t kZeroFill = uint64_t(1) << 63;
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
}

// Loader of a work unit's K / V tiles.  Row offsets (bytes from p.k / p.v) of each key row of a
// tile are computed once per tile by 2*kTile threads (K rows, then V rows) into a ring of kStages
// smem slots (sOff), from a page id fetched ahead (so its latency hides behind compute).  The
// copy threads then only read the offset: thread chunks are (row = tid / CPR + i * step, chunk =
// tid % CPR), a warp covering whole 16-byte-chunk rows (coalesced).
// The page-id word of tile `tile`'s offset slot k (index tid + k * kThreads over [K rows | V
// rows]; the fp8 fast variant: key row tid) is loaded ahead (load: nothing waits for it there)
// and turned into a checked page id by id() where it is used (-1: the row is zero-filled: a key
// outside the unit, or a page id outside [0, num_pages)).  In the tile loop the page ids come two
// iterations ahead through shared memory: a cp.async of the index word into this thread's slot of
// the ring sPg (copy: kept in flight across the barriers, which would wait for a load into a
// register: ncu put 10 % of the stall samples there), read back by the same thread once its copy
// group has been waited for (ring_id).  Slot of tile t: t % 3.
template <typename KV, int D, int WM, int WN>
struct UnitLoader {
  using C = Cfg<KV, D, WM, WN>;
  static constexpr bool kFast = kFastKV<KV>;
  static constexpr int kStages = C::kStages;
  // page ids per thread: the fast variant loads one per key row (thread = row) and derives both
  // the K and the V offset from it; the others one per offset slot (K rows, then V rows)
  static constexpr int kPgPer = kFast ? 1 : C::kOffPer;
  // Decode config without the fp8 fast variant (16-bit pages, and the previous fp8 kernel) when a
  // thread's rows share a swizzle (D <= 128): the offset ring holds each row's K and V addresses
  // side by side as in the fp8 fast variant (absolute, bit 63 = zero-fill), written by the row's
  // K and V threads, so issue() reads both with one 16-byte load and needs no per-chunk select
  static constexpr bool kAbsLoader = !kFast && WN > 1 && C::kRowStepPerChunk % 8 == 0;
  // The copy of tile t + kStages + 2's page ids, made at iteration t, must be complete at the top
  // of iteration t + 2, where the wait leaves the last kStages - 2 groups pending: with 2 stages
  // it joins the group committed at iteration t + 1, with 3 the one committed at iteration t.
  static_assert(kStages == 2 || kStages == 3, "page-id ring: 2 or 3 stages");
  static constexpr bool kPgCopyAfterCommit = kStages == 2;

  const AttnParams& p;
  int64_t pbase;  // the request's page table
  int32_t req;
  int tile0, n_tiles, kstart, kend;  // the unit's keys (unit_keys)
  int tid, hk;
  int my_chunk, my_row0;  // tid % kCPR, tid / kCPR: this thread's chunk and first row of a tile copy
  uint64_t* sPg;  // page-id ring: [3][kOffPer][kThreads] index words
  int64_t* sOff;  // offset ring: [kStages][2][kTile]
  unsigned char *sK, *sV;

  // Element offset (in page_index(p)) of the page-id word of tile `tile`'s offset slot k; false
  // when the slot holds no key of the unit.
  __device__ __forceinline__ bool slot_elem(int tile, int k, int64_t& elem) const {
    const int idx = tid + k * C::kThreads;
    const int which = kFast ? 0 : idx / C::kTile, row = kFast ? tid : idx % C::kTile;
    const int j = tile0 + tile * C::kTile + row;
    const int blk = p.page_shift >= 0 ? (j >> p.page_shift) : (j / p.page_size);
    elem = page_elem(p, pbase, req, blk);
    return which <= 1 && tile < n_tiles && j >= kstart && j < kend;
  }
  __device__ __forceinline__ IdxWord load(int tile, int k) const {
    int64_t elem;
    const bool valid = slot_elem(tile, k, elem);
    return load_idx_word(page_index(p), elem, valid);
  }
  __device__ __forceinline__ int64_t id(IdxWord w) const {
    const int64_t pg = idx_word_value(page_index(p), w);
    return (pg < 0 || pg >= p.num_pages) ? int64_t(-1) : pg;
  }
  __device__ __forceinline__ uint64_t* ring_slot(int tile, int k) const {
    return sPg + ((tile % 3) * C::kOffPer + k) * C::kThreads + tid;
  }
  __device__ __forceinline__ void copy(int tile, int k) const {
    uint64_t* dst = ring_slot(tile, k);
    int64_t elem;
    if (!slot_elem(tile, k, elem)) {
      *dst = ~uint64_t(0);  // reads as page -1 (its earlier copy, 3 tiles back, is complete)
      return;
    }
    const Idx& x = page_index(p);
    cp_async_idx(smem_u32(dst), static_cast<const char*>(x.ptr) + elem * (x.is64 ? 8 : 4), x.is64);
  }
  __device__ __forceinline__ int64_t ring_id(int tile, int k) const {
    const uint64_t v = *ring_slot(tile, k);
    return id(IdxWord{static_cast<uint32_t>(v), static_cast<uint32_t>(v >> 32)});
  }
  __device__ __forceinline__ void store_off(int tile, int k, int64_t pg) const {
    store_tile_off<KV, D, WM, WN, kAbsLoader>(p, tile, k, pg, tile0, tid, hk, sOff);
  }
  __device__ __forceinline__ void issue(int tile) const {
    issue_tile<KV, D, WM, WN, kAbsLoader>(p, tile, sK, sV, sOff, my_row0, my_chunk);
  }
  // The page-id words of tiles 0 .. kStages - 1.
  __device__ __forceinline__ void load_pages(IdxWord (&pgs)[kStages][C::kOffPer]) const {
#pragma unroll
    for (int t = 0; t < kStages; ++t)
#pragma unroll
      for (int k = 0; k < kPgPer; ++k) pgs[t][k] = load(t, k);
  }
  // Prologue of a unit with tiles: the offset-ring entries of tiles 0 .. kStages - 1 from their
  // page ids (loaded here when kLoad), the page-id copies of tiles kStages and kStages + 1 (in
  // the first copy group), then tiles 0 .. kStages - 2 issued, a copy group each.
  template <bool kLoad>
  __device__ __forceinline__ void prologue(IdxWord (&pgs)[kStages][C::kOffPer]) const {
    if constexpr (kLoad) load_pages(pgs);
#pragma unroll
    for (int t = 0; t < kStages; ++t)
#pragma unroll
      for (int k = 0; k < kPgPer; ++k) store_off(t, k, id(pgs[t][k]));
#pragma unroll
    for (int k = 0; k < kPgPer; ++k) {  // tiles kStages and kStages + 1: in the first group
      copy(kStages, k);
      copy(kStages + 1, k);
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < kStages - 1; ++t) {
      if (t < n_tiles) issue(t);
      cp_async_commit();
    }
  }
  // Step at the top of tile `tile` (after the barrier that frees its predecessor's stage): tile
  // + kStages - 1 issued as one copy group, the offset-ring entry of tile + kStages stored from
  // its page id (copied two iterations ago), the page ids of tile + kStages + 2 copied.
  __device__ __forceinline__ void step(int tile) const {
    if constexpr (!kPgCopyAfterCommit) {
#pragma unroll
      for (int k = 0; k < kPgPer; ++k) copy(tile + kStages + 2, k);
    }
    const int nt = tile + kStages - 1;
    if (nt < n_tiles) issue(nt);
    cp_async_commit();
#pragma unroll
    for (int k = 0; k < kPgPer; ++k) {
      store_off(tile + kStages, k, ring_id(tile + kStages, k));  // offset slot of `tile`, issued long ago
      if constexpr (kPgCopyAfterCommit) copy(tile + kStages + 2, k);
    }
  }
};

// The attention kernel: per work unit, its rows and keys, Q, the K / V tile pipeline with the
// online softmax, the epilogue.  Its phases are the force-inlined functions above; they take the
// kernel's register arrays by reference, per-tile scratch included (kf, alpha, acc / ov): an
// array declared inside a phase function changes the kernel's register allocation.
template <typename KV, int D, int WM, int WN, bool SMALL = false, bool SK = false>
__global__ void __launch_bounds__(Cfg<KV, D, WM, WN>::kThreads, Cfg<KV, D, WM, WN>::kMinBlocks)
    attn_kernel(AttnParams p, Plan plan, float kv_logit_factor, float kv_out_factor) {
  static_assert(!SK || (!SMALL && WN > 1), "stream-K is built for the general decode config");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  // the fp8 fast variant is built for sm_90 (the host never launches it below compute capability 9)
  if constexpr (kFastKV<KV>) return;
#endif
  using C = Cfg<KV, D, WM, WN>;
  using TR = KVTraits<KV>;
  constexpr bool kFast = kFastKV<KV>;
  static_assert(!kFast || (WN > 1 && D <= 128 && !SMALL && C::kThreads == C::kTile),
                "the fp8 fast variant is built for the decode config (one key row per thread)");
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
    if (warp == 0) small_plan(p, plan, s_sm, C::kRows, kTile);
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
    if (tid == 0) sk_start(plan, s_sk);
  }
  for (;;) {
    Item it;
    int hk, chunk;
    ReqInfo ri;
    if constexpr (!SMALL) {
      if (!claim_unit<SK>(p, plan, s_sk, s_work, tid, total, tl, tl_unit, it, hk, ri)) break;
      chunk = chunk0;
    } else {
      if (piece >= s_sm.npieces) break;
      small_piece(p, s_sm, piece, lane, it, hk, ri, chunk);
    }
    const int rows_r = ri.q_len * p.group;
    const int row0 = it.rtile * C::kRows;
    int qpos_first, qpos_last, kstart, kend, tile0, n_tiles;
    unit_keys<KV, D, WM, WN, SK>(p, ri, it, s_sk, chunk, rows_r, row0, qpos_first, qpos_last, kstart, kend, tile0,
                                 n_tiles);

    // page table of this request
    int64_t pbase;
    if constexpr (SMALL) pbase = s_sm.pbase[it.req];
    else pbase = plan.page_base[it.req];

    const UnitLoader<KV, D, WM, WN> loader{p, pbase, it.req, tile0, n_tiles, kstart, kend, tid, hk, tid % kCPR, tid / kCPR,
                                           sPg, sOff, sK, sV};
    // SMALL: the prologue's page ids are requested before Q (one round trip less per piece)
    IdxWord pgs[kStages][C::kOffPer];
    if constexpr (SMALL) {
      if (n_tiles > 0) loader.load_pages(pgs);
    }

    RowInfo rinfo[2];
    unit_rows<KV, D, WM, WN>(p, ri, row0, rows_r, hk, wm, g, tid, rinfo, s_rtok, s_rhead);
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
    q_frags<KV, D, WM, WN>(smem, wm, g, t4, qf);

    float o[kNTilesO][4];
#pragma unroll
    for (int n = 0; n < kNTilesO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};

    if (n_tiles > 0) loader.template prologue<!SMALL>(pgs);  // offsets of tiles 0..S-1, issue tiles 0..S-2

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
      loader.step(tile);
      const int st = tile % kStages;
      const unsigned char* tK = sK + st * C::kStageBytes;
      const unsigned char* tV = sV + st * C::kStageBytes;
      const int key0 = tile0 + tile * kTile + wn * kNT;  // first key of this warp's slice

      float s[kNTilesS][4];
      uint32_t kf[4];
      qk_tile<KV, D, WM, WN>(tK, qf, wn, lane, s, kf);
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
      float alpha[2];
      softmax_tile<KV, D, WM, WN>(s, m_r, l_r, alpha, o);
      pv_tile<KV, D, WM, WN>(tV, s, wn, lane, o);
    }
    cp_async_wait<0>();
    __syncthreads();  // pipeline smem is free
    if (!SMALL && tl != nullptr) {
      if (uint64_t* r = tl_unit()) r[2] = gtimer();
    }

    // ---- epilogue: combine the WN warps of each row, normalise, write ----
    epi_stage<KV, D, WM, WN>(smem, o, m_r, l_r, wn, wm, g, t4);
    __syncthreads();
    // partial slot of this piece / whether its unit has several pieces (SK: from shared memory)
    auto slot_of = [&]() -> int {
      if constexpr (SK) return s_sk.slot;
      else return it.split;
    };
    bool split_run;
    if constexpr (SK) split_run = s_sk.pieces > 1;
    else split_run = ri.splits > 1;
    epi_row_scales<KV, D, WM, WN>(p, plan, smem, ri, row0, rows_r, hk, split_run, slot_of, kv_out_factor, tid);
    __syncthreads();
    float acc[8];
    uint4 ov;
    epi_write<KV, D, WM, WN>(p, plan, smem, s_rtok, s_rhead, split_run, slot_of, tid, acc, ov);
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
        small_unit_merge<C, D>(p, plan, s_sm, s_work, it, hk, ri, row0, rows_r, s_rtok, s_rhead, kv_out_factor, smem,
                               tid);
      }
      break;  // one piece per CTA (the per-CTA plan keeps the pieces within the grid)
    }
  }
}

}  // namespace
}  // namespace kvattn::ops::cuda_impl::k
