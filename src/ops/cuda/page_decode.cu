// src/ops/cuda/page_decode.cu — whole-page decode: each 16-slot chunk of a page is read once for
// all 8 KV heads, and the call's chunks are cut into one equal contiguous range per CTA.
//
// Two launches per call (one when a kept plan is reused):
//   page_plan_kernel (one CTA): per request its query rows, KV length, page-list base and its
//     chunks' place in the call's flattened chunk space (an exclusive prefix sum), the first
//     request of every CTA's range, the list of requests that have rows but no chunk (no key, or
//     more rows than the partial slots hold), and the split counters set to 0;
//   page_decode_kernel (two 4-warp CTAs per range, one per half of the 8 KV heads, G ranges =
//     one per SM, so two CTAs per SM): the CTAs of range c take chunks [c T / G, (c + 1) T / G)
//     of the T in the call.  In each CTA, thread 0 walks the requests four chunks ahead of the
//     math and leaves each chunk's request and key offset in a ring of Meta records, its page id
//     copied in by cp.async (it lands two barriers before the chunk's copies read it); every
//     thread copies 8 + 8 16-byte pieces of its half of each chunk's K and V into a 3-stage ring
//     (cp.async, L2 evict-first: every chunk is read once per call), one __syncthreads per chunk;
//     the two CTAs of an SM run their pipelines and barriers independently, so one's barrier
//     wait and math latency overlap the other's; warp w of half hh runs KV head
//     4 hh + w's query rows (query length x GQA group <= 16, one m16n8k16 row tile)
//     through S = QK^T, the online softmax and O += PV with mma.sync (a tile of <= 8 rows as
//     the transposed S^T = K Q^T, O^T += V^T P^T: half the mma).  A request that lies
//     inside the range is normalised and written when its last chunk is done.  One cut by
//     range boundaries (at most the range's first and last) is computed in pieces, one per
//     range, counted on a (request, KV head) counter: its last piece (at a range's start) leaves
//     its unnormalised (m, l, O) in a partial slot and counts itself as soon as it is done; a
//     piece running to its range's end that finds every other piece counted folds their slots
//     into its registers and writes the rows, else it leaves its slot and counts, and the last
//     to count merges them all.  A request of more than page_sched::kGroup pieces merges in two
//     levels (groups of 8 consecutive pieces, each merged by its last piece into the slot of its
//     first, then the groups by the last group), so no one CTA reads every piece's partial.
//     Whoever merges puts its counter back to 0 (CUDA-graph safe; nothing is left for the next
//     call).
// See src/ops/DESIGN.md "Whole-page decode".
#include "ops/cuda/page_decode.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/routing.h"
#include "ops/cuda/softmax.cuh"
#include "ops/cuda/page_decode_schedule.h"
#include "ops/cuda/page_tile.cuh"
#include "ops/cuda/ptx.cuh"


namespace kvattn::ops::cuda_impl::k {
namespace {

constexpr int kHeads = 8;     // KV heads of a call the path takes
constexpr int kCtaHeads = 4;  // KV heads a CTA computes = its warps: half of each chunk
constexpr int kSplit = kHeads / kCtaHeads;  // CTAs per range (one per head half) = CTAs per SM
constexpr int kThreads = 32 * kCtaHeads;
constexpr int kDim = 128;     // head_dim
constexpr int kSlots = 16;    // slots per chunk: one 16-key mma tile
constexpr int kStages = 3;    // chunks in flight per CTA
constexpr int kChunkBytes = kSlots * kCtaHeads * kDim * 2;  // K (or V) of a CTA's half chunk, 16-bit: 16 KB
// Meta ring: while chunk x is computed, the copies of x + 2 read their Meta and thread 0 writes
// x + 4's (its page id lands by cp.async with the copies of x + 2, two barriers before x + 4's copies)
constexpr int kMetaSlots = 8;
constexpr int kMetaAhead = 4;
// A partial row (f32): m, l, two unused words, O[128] (O 16-byte aligned: every row starts at a
// multiple of 16 bytes, the merge reads O in 16-byte pieces)
constexpr int kRowO = 4;
constexpr int kRow = kRowO + kDim;
constexpr int kMergeBatch = 4;  // pieces of a cut request whose partial rows the merge loads at once
constexpr int kMergeRows = 4;   // rows of a (request, KV head) the merge folds together
constexpr int kPlanThreads = 1024;

// A request as the plan kernel leaves it (32 bytes).
struct PReq {
  int64_t page_base;  // kv_indices form: the request's first entry in kv_indices
  int64_t cstart;     // its first chunk in the call's chunk space
  int32_t chunks, q_start, q_len, kv_len;
};
// Header of the plan: chunks in the call, requests on the empty list, CTAs with a range.
struct Hdr {
  int64_t total;
  int32_t empties, ctas;
};
// One staged chunk, written by thread 0 ahead of its copy (48 bytes).
struct alignas(16) Meta {
  uint32_t page_lo, page_hi;  // the page-id word as the index tensor holds it (cp.async; hi: int64 only)
  int64_t cstart;  // the request's first chunk
  int32_t req, jc;  // request, chunk within the request
  int32_t q_start, q_len, kv_len, chunks;
  int32_t slot0, valid;  // first slot of the chunk in its page; slots < kv_len in it
};
// The page id of a Meta, or -1 outside [0, num_pages) (read as zeros, as attn_kernel does).
__device__ __forceinline__ int64_t meta_page(const Meta& m, bool is64, int64_t num_pages) {
  const int64_t pg = is64 ? static_cast<int64_t>((uint64_t(m.page_hi) << 32) | m.page_lo)
                          : int64_t(static_cast<int32_t>(m.page_lo));
  return (pg < 0 || pg >= num_pages) ? int64_t(-1) : pg;
}
constexpr int kSmem = kStages * 2 * kChunkBytes + kMetaSlots * static_cast<int>(sizeof(Meta));

struct PagePlan {
  Hdr* hdr;
  PReq* req;            // [batch]
  int32_t* first_req;   // [grid] first request of each CTA's range
  int32_t* empties;     // [batch] requests with rows and no chunk
  int32_t* counters;    // [batch * 8][cstride] arrivals per (request, KV head): the request's, then
                        // one per group of pieces (page_sched::kGroup); 0 between launches
  int cstride;          // counters per (request, KV head): page_sched::counters_per_unit(grid)
  float* part;          // [grid][2][8][rows][kRow] partial slots of the cut requests
  int rows;             // rows per (slot, KV head): max_q_len x group
};

struct PageWs {
  int64_t hdr, req, first_req, empties, counters, plan_total;  // plan region offsets
  int64_t scratch_total;  // the scratch region is the partial slots alone
};
PageWs page_ws(int64_t batch, int grid, int rows) {
  auto al = [](int64_t x) { return (x + 255) / 256 * 256; };
  PageWs w{};
  int64_t off = 0;
  w.hdr = off; off += 256;
  w.req = off; off += al(batch * int64_t(sizeof(PReq)) + 16);
  w.first_req = off; off += al(int64_t(grid) * 4 + 16);
  w.empties = off; off += al(batch * 4 + 16);
  w.counters = off; off += al(batch * kHeads * page_sched::counters_per_unit(grid) * 4 + 16);
  w.plan_total = off;
  w.scratch_total = al(int64_t(grid) * 2 * kHeads * rows * kRow * 4);
  return w;
}

using page_sched::cta_of;
using page_sched::range_begin;

using page_tile::swz;
static_assert(kHeads % kCtaHeads == 0, "head halves");

__global__ void __launch_bounds__(kPlanThreads) page_plan_kernel(AttnParams p, PagePlan pl, int grid) {
  __shared__ int64_t s_warp[32];
  __shared__ int64_t s_carry;
  __shared__ int32_t s_empties;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int nwarps = kPlanThreads / 32;
  if (tid == 0) {
    s_carry = 0;
    s_empties = 0;
  }
  for (int64_t i = tid; i < int64_t(p.batch) * kHeads * pl.cstride; i += kPlanThreads) pl.counters[i] = 0;
  __syncthreads();
  for (int base = 0; base < p.batch; base += kPlanThreads) {
    const int r = base + tid;
    int64_t chunks = 0;
    PReq q{};
    if (r < p.batch) {
      const RequestBounds rb = load_request_bounds(p, r);
      q.page_base = rb.page_base;
      q.q_start = static_cast<int32_t>(rb.q_begin);
      q.q_len = static_cast<int32_t>(rb.q_end - rb.q_begin);
      q.kv_len = static_cast<int32_t>(rb.kv_len);
      const bool fits = int64_t(q.q_len) * p.group <= pl.rows;
      chunks = q.q_len > 0 && fits ? (rb.kv_len + kSlots - 1) / kSlots : 0;
      if (q.q_len > 0 && chunks == 0) pl.empties[atomicAdd(&s_empties, 1)] = r;
    }
    int64_t x = chunks;  // inclusive scan over the block
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    if (lane == 31) s_warp[warp] = x;
    __syncthreads();
    if (warp == 0) {
      int64_t wv = s_warp[lane];
      for (int o = 1; o < 32; o <<= 1) {
        const int64_t y = __shfl_up_sync(0xffffffffu, wv, o);
        if (lane >= o) wv += y;
      }
      s_warp[lane] = wv;
    }
    __syncthreads();
    if (r < p.batch) {
      q.cstart = s_carry + (warp > 0 ? s_warp[warp - 1] : 0) + x - chunks;
      q.chunks = static_cast<int32_t>(chunks);
      pl.req[r] = q;
    }
    __syncthreads();
    if (tid == 0) s_carry += s_warp[nwarps - 1];
    __syncthreads();
  }
  const int64_t T = s_carry;
  const int64_t G = T < grid ? T : grid;  // every CTA's range holds at least one chunk
  // the first request of each range: the request holding the range's first chunk
  for (int r = tid; r < p.batch; r += kPlanThreads) {
    const PReq q = pl.req[r];  // this block's own stores, ordered by the barriers above
    if (q.chunks == 0) continue;
    // the ranges starting inside the request: from the first starting at or after its first chunk
    // to the one holding its last chunk (no division per range: a long request spans many)
    const int64_t c_end = cta_of(q.cstart + q.chunks - 1, G, T) + 1;
    for (int64_t c = page_sched::first_cta_starting_in(q.cstart, G, T); c < c_end; ++c) pl.first_req[c] = r;
  }
  if (tid == 0) *pl.hdr = Hdr{T, s_empties, static_cast<int32_t>(G)};
}

// One online-softmax step of a row whose maximum over the chunk's keys is mx: the running max m
// moves to max(m, mx), alpha is the factor the row's running sum and output are rescaled by, and
// the result is what the chunk's scores are taken from (0 while the row has no visible key yet:
// m stays -inf and every p is 0).
__device__ __forceinline__ float online_max_step(float& m, float mx, float& alpha) {
  const float m_new = fmaxf(m, mx);
  const float m_use = m_new == -INFINITY ? 0.f : m_new;
  alpha = exp2f(m - m_use);
  m = m_new;
  return m_use;
}

// Output rows of a request with no chunk: zeros and LSE -inf when it has no key; NaN when it has
// more query rows than the caller's max_query_len promised (the partial slots cannot hold them).
__device__ void write_empty_request(const AttnParams& p, const PagePlan& pl, int r) {
  const PReq q = pl.req[r];
  const bool broken = int64_t(q.q_len) * p.group > pl.rows;
  const float val = broken ? __int_as_float(0x7fc00000) : 0.f;
  const int64_t per_tok = int64_t(p.hq) * kDim;
  const int64_t n = int64_t(q.q_len) * per_tok;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t t = i / per_tok, rem = i - t * per_tok;
    const int64_t h = rem / kDim, d = rem - h * kDim;
    store_elt(p.out, (q.q_start + t) * p.o_st + h * p.o_sh + d * p.o_sd, p.out_t, val);
  }
  if (p.lse != nullptr)
    for (int64_t i = threadIdx.x; i < int64_t(q.q_len) * p.hq; i += blockDim.x) {
      const int64_t t = i / p.hq, h = i - t * p.hq;
      p.lse[(q.q_start + t) * p.lse_st + h * p.lse_sh] = broken ? val : -INFINITY;
    }
}

// Timeline of one launch (debugging aid): a TL = true instantiation writes one row of kTl words
// per CTA (%globaltimer stamps and counters).  The library launches only TL = false, which
// carries no stamping code; a debugging build that instantiates TL = true reads the rows back.
enum TlWord : int {
  kTlEntry,   // %globaltimer at kernel entry (thread 0)
  kTlFirst,   // the first chunk has landed (thread 0, after the loop's first barrier)
  kTlLoop,    // the chunk loop is done (thread 0)
  kTlExit,    // the last warp is done (the latest of every warp's exit stamp)
  kTlSm,      // not a time: the SM the CTA ran on
  kTlChunks,  // not a time: chunks in the CTA's range (0: a CTA past the ranges)
  kTlWork0,   // SM cycles warp 0 spent per loop between its barrier and the next wait (summed)
  kTlWork1,   // the same for warp 1 (no cursor work: the math alone)
  kTlCyc1,    // SM cycles of warp 1's whole loop
  kTlIssue1,  // the part of kTlWork1 from the barrier to the chunk copies' commit (Meta, copies issued)
  kTlMerge0,  // %globaltimer when thread 0 starts merging a cut request (after its count), 0: none
  kTlMerge1,  // ... when it is done (with its group, or with the whole request)
  kTlPieces,  // not a time: pieces of the request it merged
  kTlLoopMax,  // the last warp's loop end (each warp's lane 0, atomicMax)
  kTlPostMax,  // the last warp done with the range's last request (written, merged or left)
  kTlRegMerge, // not a time: 1 when thread 0's warp merged the last request into its registers
  kTlProg0,   // kTlProgN words: word k = when the last chunk of the k-th sixteenth of the range landed
  kTl = kTlProg0 + 16
};
constexpr int kTlProgN = kTl - kTlProg0;
__device__ __forceinline__ uint64_t tl_now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

// This CTA's timeline row with its entry stamps (thread 0), or nullptr (TL = false).
template <bool TL>
__device__ __forceinline__ uint64_t* tl_enter(uint64_t* tl) {
  uint64_t* tl_row = nullptr;
  if constexpr (TL) {
    tl_row = tl + int64_t(blockIdx.x) * kTl;
    if (threadIdx.x == 0) {
      uint32_t smid;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
      tl_row[kTlEntry] = tl_now();
      tl_row[kTlSm] = smid;
      tl_row[kTlChunks] = 0;
      tl_row[kTlExit] = 0;
      tl_row[kTlMerge0] = tl_row[kTlMerge1] = tl_row[kTlPieces] = 0;
      tl_row[kTlLoopMax] = tl_row[kTlPostMax] = tl_row[kTlRegMerge] = 0;
      for (int k = 0; k < kTlProgN; ++k) tl_row[kTlProg0 + k] = 0;
    }
  } else {
    (void)tl;
  }
  return tl_row;
}
// every warp's lane 0 at its exit: the CTA's exit is the latest
template <bool TL>
__device__ __forceinline__ void tl_leave(uint64_t* tl_row) {
  if constexpr (TL) {
    if ((threadIdx.x & 31) == 0) atomicMax(reinterpret_cast<unsigned long long*>(tl_row + kTlExit), tl_now());
  } else {
    (void)tl_row;
  }
}

// Where a warp stands: its lane (mma coordinates g = lane / 4, t4 = lane % 4), its warp w of the
// CTA and KV head kvh, and its CTA's range c of the call's G ranges over T chunks.
struct WarpPos {
  int lane, g, t4, w, kvh;
  int64_t c, G, T;
};
// Row i of partial slot `which` of CTA cta, KV head kvh.
__device__ __forceinline__ float* part_row(const PagePlan& pl, int kvh, int64_t cta, int which, int i) {
  return pl.part + (((cta * 2 + which) * kHeads + kvh) * pl.rows + i) * kRow;
}
// counter k of (request r, KV head kvh): 0 the request's, 1 + g group g's
__device__ __forceinline__ int32_t* unit_counter(const PagePlan& pl, int kvh, int64_t r, int k) {
  return &pl.counters[(r * kHeads + kvh) * pl.cstride + k];
}
// Row i of KV head kvh's 16-row tile: token t of the request, query head `head`.
__device__ __forceinline__ void row_token(const AttnParams& p, int kvh, int i, int& t, int& head) {
  t = i / p.group;
  head = kvh * p.group + (i - t * p.group);
}

// Thread 0's request cursor (request cur_r, its plan record cur): the Meta of chunk x (x
// increasing, x < x1) and the element offset of its page id in the index tensor.
__device__ __forceinline__ int64_t cursor_meta(const AttnParams& p, const PagePlan& pl, const int& cpp, int& cur_r, PReq& cur,
                                               int64_t x, Meta& m) {
  while (x >= cur.cstart + cur.chunks) cur = pl.req[++cur_r];  // requests without chunks are skipped
  const int32_t jc = static_cast<int32_t>(x - cur.cstart);
  const int32_t blk = p.page_shift >= 4 ? jc >> (p.page_shift - 4) : jc / cpp;
  m.cstart = cur.cstart;
  m.req = cur_r;
  m.jc = jc;
  m.q_start = cur.q_start;
  m.q_len = cur.q_len;
  m.kv_len = cur.kv_len;
  m.chunks = cur.chunks;
  m.slot0 = (jc - blk * cpp) * kSlots;
  m.valid = min(kSlots, cur.kv_len - jc * kSlots);
  return page_elem(p, cur.page_base, cur_r, blk);  // strides applied
}
// Thread 0, before the loop: the Meta of the range's first kMetaAhead chunks (`cursor`: the
// kernel's cursor_meta) and their page ids, loaded here (later ones come by cp.async in the
// loop): every offset first, then all the loads, so that they are in flight together (one round
// trip, not one per chunk: a load may not pass a shared-memory store the compiler cannot tell
// apart from it).
template <class Cursor>
__device__ __forceinline__ void first_metas(Cursor& cursor, const Idx& pidx, int64_t x0, int64_t x1, Meta* meta) {
  int64_t e[kMetaAhead];
#pragma unroll
  for (int i = 0; i < kMetaAhead; ++i) e[i] = x0 + i < x1 ? cursor(x0 + i, meta[i]) : int64_t(-1);
  uint64_t v[kMetaAhead];
#pragma unroll
  for (int i = 0; i < kMetaAhead; ++i)
    v[i] = e[i] < 0 ? 0 : pidx.is64 ? static_cast<const uint64_t*>(pidx.ptr)[e[i]]
                                    : uint64_t(static_cast<const uint32_t*>(pidx.ptr)[e[i]]);
#pragma unroll
  for (int i = 0; i < kMetaAhead; ++i) {
    meta[i].page_lo = static_cast<uint32_t>(v[i]);
    meta[i].page_hi = static_cast<uint32_t>(v[i] >> 32);
  }
}

// A thread's copies: 1024 16-byte pieces of K and of V per half chunk, 8 + 8 per thread.  Piece
// ch of a half chunk is (slot, head of the half, 16-byte piece) in the order the cache stores
// them (slot-major for NHD, head-major for HND), so consecutive threads read consecutive bytes.
// The byte offsets from the chunk's slot 0 (goff: the same for K and V, the route requires equal
// slot / head strides), the shared-memory offsets (soff) and the slots are fixed per thread.
__device__ __forceinline__ void copy_offsets(const AttnParams& p, int hh, int tid, uint32_t (&goff)[8], uint32_t (&soff)[8],
                                             int (&slot_of)[8]) {
  const bool head_major = p.k_sh > p.k_so;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int ch = tid + kThreads * i, piece = ch & 15;
    const int slot = head_major ? (ch >> 4) & 15 : ch / (16 * kCtaHeads);
    const int head = head_major ? ch >> 8 : (ch >> 4) % kCtaHeads;  // within the half
    goff[i] = static_cast<uint32_t>(slot * p.k_so + (hh * kCtaHeads + head) * p.k_sh + piece * 16);
    soff[i] = swz<kCtaHeads>(slot, head, piece);
    slot_of[i] = slot;
  }
}
// This thread's pieces of chunk m's K and V (caches at kbase / vbase) into stage st of the ring
// at sm, L2 evict-first (every chunk is read once per call).
__device__ __forceinline__ void issue_chunk(const AttnParams& p, const Idx& pidx, const char* const& kbase,
                                            const char* const& vbase, unsigned char* sm, const uint32_t (&goff)[8],
                                            const uint32_t (&soff)[8], const int (&slot_of)[8], const uint64_t& evict_first,
                                            const Meta& m, int st) {
  const int64_t pg = meta_page(m, pidx.is64, p.num_pages);
  const int valid = pg < 0 ? 0 : m.valid;
  const int64_t pgc = pg < 0 ? 0 : pg;
  const char* kp = kbase + pgc * p.k_sb + int64_t(m.slot0) * p.k_so;
  const char* vp = vbase + pgc * p.v_sb + int64_t(m.slot0) * p.v_so;
  const uint32_t sk = smem_u32(sm + st * 2 * kChunkBytes), sv = sk + kChunkBytes;
  if (valid == kSlots) {  // a whole chunk (all but a request's last)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      cp_async16_policy(sk + soff[i], kp + goff[i], 16, evict_first);
      cp_async16_policy(sv + soff[i], vp + goff[i], 16, evict_first);
    }
  } else {  // slots at or past kv_len zero-filled (their V must not be NaN: P is 0 there)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const bool ok = slot_of[i] < valid;
      cp_async16_policy(sk + soff[i], ok ? kp + goff[i] : kp, ok ? 16 : 0, evict_first);
      cp_async16_policy(sv + soff[i], ok ? vp + goff[i] : vp, ok ? 16 : 0, evict_first);
    }
  }
}

// The warp's next request, r = mt.req (chunk Meta mt): its place (req, first chunk cstart,
// chunks, query rows [qs, qs + ql)), its query rows into the A fragments qf, each row's visible
// keys (lim, and lim_min: chunks starting at or past it need the mask), the running max / sum /
// output reset — in the transposed layout (lim_t, m_t, l_t, ot) for a tile of at most 8 rows
// (NR = 1).  Row i of the 16-row tile is token i / group, query head kvh * group + i % group of
// the request; the lane holds rows g and (NR = 2) g + 8.
template <int NR>
__device__ __forceinline__ void start_request(const AttnParams& p, const WarpPos& wp, const Meta& mt, int64_t r, int64_t& req,
                                              int64_t& cstart, int& chunks, int& qs, int& ql, int& lim_min, int (&lim)[NR],
                                              uint32_t (&qf)[8][4], float (&m_r)[NR], float (&l_r)[NR], int (&lim_t)[2],
                                              float (&m_t)[2], float (&l_t)[2], float (&ot)[8][4], float (&o)[16][4]) {
  req = r;
  cstart = mt.cstart;
  chunks = mt.chunks;
  qs = mt.q_start;
  ql = mt.q_len;
  const int kv_len = mt.kv_len;
  const int rows_used = ql * p.group;
  lim_min = p.causal ? kv_len - ql + 1 : kv_len;
#pragma unroll
  for (int rr = 0; rr < NR; ++rr) {
    const int i = wp.g + 8 * rr;
    int t, head;
    row_token(p, wp.kvh, i, t, head);
    lim[rr] = p.causal ? min(kv_len - ql + 1 + t, kv_len) : kv_len;
    const bool ok = i < rows_used;
    const uint32_t* qrow =
        reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(p.q) + (qs + t) * p.q_st + int64_t(head) * p.q_sh);
#pragma unroll
    for (int s2 = 0; s2 < 8; ++s2) {
      qf[s2][rr] = ok ? qrow[8 * s2 + wp.t4] : 0u;
      qf[s2][rr + 2] = ok ? qrow[8 * s2 + 4 + wp.t4] : 0u;
    }
    m_r[rr] = -INFINITY;
    l_r[rr] = 0.f;
  }
  if constexpr (NR == 1) {  // the transposed product reads qf[.][0] and qf[.][2] (row g) only
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      int t, head;
      row_token(p, wp.kvh, 2 * wp.t4 + j, t, head);
      lim_t[j] = p.causal ? min(kv_len - ql + 1 + t, kv_len) : kv_len;
      m_t[j] = -INFINITY;
      l_t[j] = 0.f;
    }
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) ot[mb][0] = ot[mb][1] = ot[mb][2] = ot[mb][3] = 0.f;
  } else {
#pragma unroll
    for (int nn = 0; nn < 16; ++nn) o[nn][0] = o[nn][1] = o[nn][2] = o[nn][3] = 0.f;
  }
}

// One chunk (keys key0 .. key0 + 15 in tK / tV) through a tile of at most 8 rows as the
// transposed product: S^T = K Q^T (page_tile::scores_t), keys at or past a row's limit -inf when
// `masked`, the online softmax, O^T += V^T P^T.  The lane's rows are 2 t4 + j, its keys g and g + 8.
template <bool BF16>
__device__ __forceinline__ void chunk_transposed(const WarpPos& wp, const uint32_t (&qf)[8][4], const unsigned char* tK,
                                                 const unsigned char* tV, float scale_log2, int key0, bool masked,
                                                 const int (&lim_t)[2], float (&m_t)[2], float (&l_t)[2], float (&ot)[8][4]) {
  float st[4];
  page_tile::scores_t<BF16, kCtaHeads>(st, qf, tK, wp.w, wp.lane);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float sv = st[e] * scale_log2;
    if (masked && key0 + wp.g + 8 * (e >> 1) >= lim_t[e & 1]) sv = -INFINITY;
    st[e] = sv;
  }
  float alpha_t[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    float mx = fmaxf(st[j], st[2 + j]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float m_use = online_max_step(m_t[j], mx, alpha_t[j]);
    st[j] = exp2f(st[j] - m_use);
    st[2 + j] = exp2f(st[2 + j] - m_use);
    l_t[j] = l_t[j] * alpha_t[j] + st[j] + st[2 + j];
  }
#pragma unroll
  for (int mb = 0; mb < 8; ++mb) {
    ot[mb][0] *= alpha_t[0];
    ot[mb][1] *= alpha_t[1];
    ot[mb][2] *= alpha_t[0];
    ot[mb][3] *= alpha_t[1];
  }
  const uint32_t pt[2] = {pack2<BF16>(st[0], st[1]), pack2<BF16>(st[2], st[3])};
  page_tile::accumulate_pv_t<BF16, kCtaHeads>(ot, pt, tV, wp.w, wp.lane);
}
// One chunk through the 16-row tile: S = QK^T in log2 units with keys at or past a row's limit
// -inf when `masked` (the request's last chunk, and the causal diagonal of a multi-token row),
// the online softmax, O += PV.  The lane's rows are g and (NR = 2) g + 8.
template <bool BF16, int NR>
__device__ __forceinline__ void chunk_rows(const WarpPos& wp, const uint32_t (&qf)[8][4], const unsigned char* tK,
                                           const unsigned char* tV, float scale_log2, int key0, bool masked,
                                           const int (&lim)[NR], float (&m_r)[NR], float (&l_r)[NR], float (&o)[16][4]) {
  float sc[2][4];
  page_tile::scores<BF16, kCtaHeads>(sc, qf, tK, wp.w, wp.lane);
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int rr = e >> 1;
      float s = sc[j][e] * scale_log2;
      if (rr < NR && masked && key0 + 8 * j + 2 * wp.t4 + (e & 1) >= lim[rr]) s = -INFINITY;
      sc[j][e] = s;
    }
  float alpha[NR];
#pragma unroll
  for (int rr = 0; rr < NR; ++rr) {
    float mx = fmaxf(fmaxf(sc[0][2 * rr], sc[0][2 * rr + 1]), fmaxf(sc[1][2 * rr], sc[1][2 * rr + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_use = online_max_step(m_r[rr], mx, alpha[rr]);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      sc[j][2 * rr] = exp2f(sc[j][2 * rr] - m_use);
      sc[j][2 * rr + 1] = exp2f(sc[j][2 * rr + 1] - m_use);
    }
    l_r[rr] = l_r[rr] * alpha[rr] + sc[0][2 * rr] + sc[0][2 * rr + 1] + sc[1][2 * rr] + sc[1][2 * rr + 1];
  }
#pragma unroll
  for (int nn = 0; nn < 16; ++nn)
#pragma unroll
    for (int rr = 0; rr < NR; ++rr) {
      o[nn][2 * rr] *= alpha[rr];
      o[nn][2 * rr + 1] *= alpha[rr];
    }
  uint32_t a[4];
  a[0] = pack2<BF16>(sc[0][0], sc[0][1]);
  a[2] = pack2<BF16>(sc[1][0], sc[1][1]);
  a[1] = NR == 2 ? pack2<BF16>(sc[0][2], sc[0][3]) : 0u;
  a[3] = NR == 2 ? pack2<BF16>(sc[1][2], sc[1][3]) : 0u;
  page_tile::accumulate_pv<BF16, kCtaHeads>(o, a, tV, wp.w, wp.lane);
}

// l summed over the quad (each lane holds 4 of a row's 16 key columns)
template <int NR>
__device__ __forceinline__ void row_sums(const float (&l_r)[NR], float (&l)[NR]) {
#pragma unroll
  for (int rr = 0; rr < NR; ++rr) {
    l[rr] = l_r[rr];
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
  }
}
// The output rows and LSE of the request with query rows [qs, qs + ql) from (m_r, l, o).
template <bool BF16, int NR>
__device__ __forceinline__ void write_rows(const AttnParams& p, const WarpPos& wp, int qs, int ql, const float (&o)[16][4],
                                           const float (&m_r)[NR], const float (&l)[NR]) {
  const int rows_used = ql * p.group;
#pragma unroll
  for (int rr = 0; rr < NR; ++rr) {
    const int i = wp.g + 8 * rr;
    if (i >= rows_used) continue;
    int t, head;
    row_token(p, wp.kvh, i, t, head);
    const int64_t tok = qs + t;
    const float inv = l[rr] > 0.f ? p.v_scale / l[rr] : 0.f;
    uint16_t* dst = static_cast<uint16_t*>(p.out) + tok * p.o_st + int64_t(head) * p.o_sh + 2 * wp.t4;
#pragma unroll
    for (int nn = 0; nn < 16; ++nn)
      *reinterpret_cast<uint32_t*>(dst + 8 * nn) = pack2<BF16>(o[nn][2 * rr] * inv, o[nn][2 * rr + 1] * inv);
    if (p.lse != nullptr && wp.t4 == 0)
      p.lse[tok * p.lse_st + int64_t(head) * p.lse_sh] =
          l[rr] > 0.f ? (m_r[rr] + __log2f(l[rr])) * (p.lse_natural ? kLn2 : 1.f) : -INFINITY;
  }
}
// A tile of at most 8 rows: the transposed loop state (rows 2 t4, 2 t4 + 1 per lane) into the
// row-g layout: m_r[0] = row g's max; l_r[0] = row g's sum on the quad's first lane and 0 on the
// others (row_sums adds the quad); o[nn][c] = row g, dim 8 nn + 2 t4 + c, which lane
// 4 (2 t4 + c) + g / 2 holds as ot[nn / 2][2 (nn % 2) + g % 2] — two shuffles per value, the row
// parity picks one.
__device__ __forceinline__ void to_rows(const WarpPos& wp, const float (&m_t)[2], float (&l_t)[2], const float (&ot)[8][4],
                                        float (&m_r)[1], float (&l_r)[1], float (&o)[16][4]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l_t[j] += __shfl_xor_sync(0xffffffffu, l_t[j], 4);
    l_t[j] += __shfl_xor_sync(0xffffffffu, l_t[j], 8);
    l_t[j] += __shfl_xor_sync(0xffffffffu, l_t[j], 16);
  }
  const bool odd = wp.g & 1;
  const int src_q = page_tile::to_rows_stat_lane(wp.lane);  // holds row g's max and sum
  const float m0 = __shfl_sync(0xffffffffu, m_t[0], src_q), m1 = __shfl_sync(0xffffffffu, m_t[1], src_q);
  const float s0 = __shfl_sync(0xffffffffu, l_t[0], src_q), s1 = __shfl_sync(0xffffffffu, l_t[1], src_q);
  m_r[0] = odd ? m1 : m0;
  l_r[0] = wp.t4 == 0 ? (odd ? s1 : s0) : 0.f;
#pragma unroll
  for (int nn = 0; nn < 16; ++nn)
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int src = page_tile::to_rows_src_lane(wp.lane, cc);
      const float v0 = __shfl_sync(0xffffffffu, ot[nn / 2][page_tile::to_rows_src_reg(nn, 0)], src);
      const float v1 = __shfl_sync(0xffffffffu, ot[nn / 2][page_tile::to_rows_src_reg(nn, 1)], src);
      o[nn][cc] = odd ? v1 : v0;
    }
}

// Counts this CTA's piece of request r (first chunk cstart, `chunks` chunks) on its first-level
// counter — the request's own, or, for a request of more than page_sched::kGroup pieces, its
// group's — and says whether it arrived last there (then it merges that level).  The warp's
// partial rows must be visible first (__threadfence).
__device__ __forceinline__ bool count_piece(const PagePlan& pl, const WarpPos& wp, int64_t r, int64_t cstart, int chunks) {
  const int pieces = page_sched::piece_count(cstart, chunks, wp.G, wp.T);
  int k = 0, need = pieces;
  if (pieces > page_sched::kGroup) {
    const int gi = static_cast<int>((wp.c - cta_of(cstart, wp.G, wp.T)) / page_sched::kGroup);
    k = 1 + gi;
    need = page_sched::group_size(gi, pieces);
  }
  int old = 0;
  if (wp.lane == 0) old = atomicAdd(unit_counter(pl, wp.kvh, r, k), 1);
  old = __shfl_sync(0xffffffffu, old, 0);
  return old == need - 1;
}
// The warp's request req (first chunk cstart, `chunks` chunks, query rows [qs, qs + ql)) is done
// in the range [x0, x1): written whole, or (cut by a range boundary) its partial state left in
// this CTA's slot.  A piece that ends inside the range is the request's last and counts itself
// now, so that the piece running to the end of an earlier range finds it counted
// (page_sched::ends_inside); the first of them to see every piece counted merges.  What is left
// to count or merge after the range goes to split_req[n_split++] (split_counted: counted early).
template <bool BF16, int NR>
__device__ __forceinline__ void flush_request(const AttnParams& p, const PagePlan& pl, const WarpPos& wp, const int64_t& x0,
                                              const int64_t& x1, const int64_t& req, const int64_t& cstart, const int& chunks,
                                              const int& qs, const int& ql, const float (&o)[16][4], const float (&m_r)[NR],
                                              const float (&l_r)[NR], int64_t (&split_req)[2], int& n_split,
                                              int& split_counted) {
  float l[NR];
  row_sums(l_r, l);
  const int64_t cend = cstart + chunks;
  if (cstart >= x0 && cend <= x1) {
    write_rows<BF16>(p, wp, qs, ql, o, m_r, l);
    return;
  }
  const int rows_used = ql * p.group;
  const int which = page_sched::cut_slot(cstart, x0);
#pragma unroll
  for (int rr = 0; rr < NR; ++rr) {
    const int i = wp.g + 8 * rr;
    if (i >= rows_used) continue;
    float* dst = part_row(pl, wp.kvh, wp.c, which, i);
    if (wp.t4 == 0) {
      dst[0] = m_r[rr];
      dst[1] = l[rr];
    }
#pragma unroll
    for (int nn = 0; nn < 16; ++nn)
      *reinterpret_cast<float2*>(dst + kRowO + 8 * nn + 2 * wp.t4) = make_float2(o[nn][2 * rr], o[nn][2 * rr + 1]);
  }
  const bool early = page_sched::ends_inside(cstart, chunks, x1);
  if (early) {
    __threadfence();  // this warp's partial rows are visible before it counts them
    __syncwarp();
    if (!count_piece(pl, wp, req, cstart, chunks)) return;  // a later piece merges
  }
  split_req[n_split] = req;
  if (early) split_counted |= 1 << n_split;  // counted and found last: only the merge is left
  ++n_split;
}
// The range's last request (req, as flush_request's) runs past the range.  When every other
// piece has already counted itself (one-level requests only), merge them into this warp's
// registers and write the rows (no partial written, no count: nobody else is waiting on the
// counter, which goes back to 0).  Else false.  pre_count: the request's counter read early, when
// pre_req is req.
template <bool BF16, int NR>
__device__ __forceinline__ bool merge_in_registers(const AttnParams& p, const PagePlan& pl, const WarpPos& wp,
                                                   const int64_t& cstart, const int& chunks, const int64_t& pre_req,
                                                   const int64_t& req, const int& pre_count, const int& ql, const int& qs,
                                                   float (&o)[16][4], float (&m_r)[NR], const float (&l_r)[NR],
                                                   const int& lane) {
  const int pieces = page_sched::piece_count(cstart, chunks, wp.G, wp.T);
  if (pieces > page_sched::kGroup) return false;  // merged in two levels (groups count, not pieces)
  if (pre_req == req) {  // read early: every lane's relaxed load, then a fence for the acquire
    if (pre_count != pieces - 1) return false;
    __threadfence();
  } else if (ld_acquire_gpu(unit_counter(pl, wp.kvh, req, 0)) != pieces - 1) {
    return false;  // every lane's own acquire orders its loads of the partials below
  }
  float l[NR];
  row_sums(l_r, l);
  const int rows_used = ql * p.group;
  const int64_t c_lo = cta_of(cstart, wp.G, wp.T);
#pragma unroll
  for (int rr = 0; rr < NR; ++rr) {
    const int i = wp.g + 8 * rr;
    if (i >= rows_used) continue;
    for (int64_t c2 = c_lo; c2 < c_lo + pieces; ++c2) {
      if (c2 == wp.c) continue;
      const float* src = part_row(pl, wp.kvh, c2, page_sched::piece_slot(cstart, c2, c_lo, wp.G, wp.T), i);
      const float pm = __ldcg(src), pls = __ldcg(src + 1);
      float2 v[16];
#pragma unroll
      for (int nn = 0; nn < 16; ++nn) v[nn] = __ldcg(reinterpret_cast<const float2*>(src + kRowO + 8 * nn + 2 * wp.t4));
      const float mn = fmaxf(m_r[rr], pm);
      const float mu = mn == -INFINITY ? 0.f : mn;
      const float fa = exp2f(m_r[rr] - mu), fb = exp2f(pm - mu);
      l[rr] = l[rr] * fa + pls * fb;
#pragma unroll
      for (int nn = 0; nn < 16; ++nn) {
        o[nn][2 * rr] = o[nn][2 * rr] * fa + v[nn].x * fb;
        o[nn][2 * rr + 1] = o[nn][2 * rr + 1] * fa + v[nn].y * fb;
      }
      m_r[rr] = mn;
    }
  }
  write_rows<BF16>(p, wp, qs, ql, o, m_r, l);
  __syncwarp();
  if (lane == 0) *unit_counter(pl, wp.kvh, req, 0) = 0;  // ready for the next call
  return true;
}

// Folds the partial rows of request q held by n pieces, CTAs c_first, c_first + step, ... (each
// in its piece slot; c_lo: the request's first CTA), for this warp's KV head, into the output
// rows (dst_cta < 0) or into the partial slot (dst_cta, dst_slot).  Lane j holds dims 4j .. 4j + 3
// of kMergeRows rows, so one 16-byte load per lane reads a partial row's whole O (512 contiguous
// bytes, every sector used once).  Sources are taken kMergeBatch at a time, all their loads
// issued before any is used, and folded in online: (M, L, acc) of each row rescaled to the
// running maximum.
template <bool BF16>
__device__ __forceinline__ void merge_slots(const AttnParams& p, const PagePlan& pl, const WarpPos& wp, const PReq& q,
                                            int64_t c_lo, int64_t c_first, int step, int n, int64_t dst_cta, int dst_slot) {
  const int lane = wp.lane;
  const int rows_used = q.q_len * p.group;
  const int slot_lo = page_sched::piece_slot(q.cstart, c_lo, c_lo, wp.G, wp.T);  // every other piece: slot 0
  for (int rg = 0; rg < rows_used; rg += kMergeRows) {
    float M[kMergeRows], L[kMergeRows], acc[kMergeRows][4];
#pragma unroll
    for (int k = 0; k < kMergeRows; ++k) {
      M[k] = -INFINITY;
      L[k] = 0.f;
      acc[k][0] = acc[k][1] = acc[k][2] = acc[k][3] = 0.f;
    }
    for (int s0 = 0; s0 < n; s0 += kMergeBatch) {
      float pm[kMergeBatch][kMergeRows], pls[kMergeBatch][kMergeRows];
      float4 v[kMergeBatch][kMergeRows];
#pragma unroll
      for (int b = 0; b < kMergeBatch; ++b) {
        const int64_t c2 = c_first + int64_t(min(s0 + b, n - 1)) * step;  // past the last: reloaded, unused
        const int slot = c2 == c_lo ? slot_lo : 0;
#pragma unroll
        for (int k = 0; k < kMergeRows; ++k) {
          const float* src = part_row(pl, wp.kvh, c2, slot, min(rg + k, rows_used - 1));
          pm[b][k] = __ldcg(src);
          pls[b][k] = __ldcg(src + 1);
          v[b][k] = __ldcg(reinterpret_cast<const float4*>(src + kRowO) + lane);
        }
      }
#pragma unroll
      for (int k = 0; k < kMergeRows; ++k) {
        float mb = M[k];
#pragma unroll
        for (int b = 0; b < kMergeBatch; ++b)
          if (s0 + b < n) mb = fmaxf(mb, pm[b][k]);
        const float m_use = mb == -INFINITY ? 0.f : mb;
        const float fo = exp2f(M[k] - m_use);  // 0 while nothing is folded in (M = -inf)
        L[k] *= fo;
        acc[k][0] *= fo;
        acc[k][1] *= fo;
        acc[k][2] *= fo;
        acc[k][3] *= fo;
#pragma unroll
        for (int b = 0; b < kMergeBatch; ++b) {
          if (s0 + b >= n) continue;
          const float f = exp2f(pm[b][k] - m_use);
          L[k] += pls[b][k] * f;
          acc[k][0] += f * v[b][k].x;
          acc[k][1] += f * v[b][k].y;
          acc[k][2] += f * v[b][k].z;
          acc[k][3] += f * v[b][k].w;
        }
        M[k] = mb;
      }
    }
#pragma unroll
    for (int k = 0; k < kMergeRows; ++k) {
      const int i = rg + k;
      if (i >= rows_used) break;
      if (dst_cta >= 0) {  // a group's partial: unnormalised, as a piece leaves it
        float* dst = part_row(pl, wp.kvh, dst_cta, dst_slot, i);
        if (lane == 0) {
          dst[0] = M[k];
          dst[1] = L[k];
        }
        reinterpret_cast<float4*>(dst + kRowO)[lane] = make_float4(acc[k][0], acc[k][1], acc[k][2], acc[k][3]);
        continue;
      }
      int t, head;
      row_token(p, wp.kvh, i, t, head);
      const int64_t tok = q.q_start + t;
      const float inv = L[k] > 0.f ? p.v_scale / L[k] : 0.f;
      uint2* dst = reinterpret_cast<uint2*>(static_cast<uint16_t*>(p.out) + tok * p.o_st + int64_t(head) * p.o_sh) + lane;
      *dst = make_uint2(pack2<BF16>(acc[k][0] * inv, acc[k][1] * inv), pack2<BF16>(acc[k][2] * inv, acc[k][3] * inv));
      if (p.lse != nullptr && lane == 0)
        p.lse[tok * p.lse_st + int64_t(head) * p.lse_sh] =
            L[k] > 0.f ? (M[k] + __log2f(L[k])) * (p.lse_natural ? kLn2 : 1.f) : -INFINITY;
    }
  }
}

// The cut requests left after the chunk loop: count this piece (unless counted early); the last
// piece to arrive merges every piece from the partial slots (a request of more than
// page_sched::kGroup pieces: its group into the group's first slot, and the last group all groups).
template <bool BF16, bool TL>
__device__ __forceinline__ void merge_cut_requests(const AttnParams& p, const PagePlan& pl, const WarpPos& wp,
                                                   const int64_t (&split_req)[2], int split_counted, int n_split,
                                                   uint64_t* tl_row) {
  const int64_t G = wp.G, T = wp.T;
  __threadfence();  // this warp's partials are visible before it counts them
  __syncwarp();
  for (int si = 0; si < n_split; ++si) {
    const int64_t r = split_req[si];
    const PReq q = pl.req[r];
    const int64_t c_lo = cta_of(q.cstart, G, T);
    const int pieces = page_sched::piece_count(q.cstart, q.chunks, G, T);
    const bool two = pieces > page_sched::kGroup;
    const int gi = two ? static_cast<int>((wp.c - c_lo) / page_sched::kGroup) : 0;
    if (!(split_counted >> si & 1) && !count_piece(pl, wp, r, q.cstart, q.chunks)) continue;  // another piece merges
    __threadfence();  // every piece counted before this one: its partial rows are visible
    if constexpr (TL) {
      if (threadIdx.x == 0) {
        tl_row[kTlMerge0] = tl_now();
        tl_row[kTlPieces] = static_cast<uint64_t>(pieces);
      }
    }
    if (two) {  // this group into its first piece's slot, then count the group
      const int64_t c_first = c_lo + int64_t(gi) * page_sched::kGroup;
      merge_slots<BF16>(p, pl, wp, q, c_lo, c_first, 1, page_sched::group_size(gi, pieces), c_first,
                        page_sched::piece_slot(q.cstart, c_first, c_lo, G, T));
      if constexpr (TL) {
        if (threadIdx.x == 0) tl_row[kTlMerge1] = tl_now();
      }
      __syncwarp();
      if (wp.lane == 0) *unit_counter(pl, wp.kvh, r, 1 + gi) = 0;  // ready for the next call
      __threadfence();  // the group's partial rows are visible before it counts
      __syncwarp();
      int old = 0;
      if (wp.lane == 0) old = atomicAdd(unit_counter(pl, wp.kvh, r, 0), 1);
      old = __shfl_sync(0xffffffffu, old, 0);
      if (old != page_sched::group_count(pieces) - 1) continue;  // another group merges
      __threadfence();
      merge_slots<BF16>(p, pl, wp, q, c_lo, c_lo, page_sched::kGroup, page_sched::group_count(pieces), -1, 0);
    } else {
      merge_slots<BF16>(p, pl, wp, q, c_lo, c_lo, 1, pieces, -1, 0);
    }
    if constexpr (TL) {
      if (threadIdx.x == 0) tl_row[kTlMerge1] = tl_now();
    } else {
      (void)tl_row;
    }
    __syncwarp();
    if (wp.lane == 0) *unit_counter(pl, wp.kvh, r, 0) = 0;  // ready for the next call
  }
}

template <bool BF16, bool R16, bool TL>
__global__ void __launch_bounds__(kThreads, kSplit) page_decode_kernel(const AttnParams p, const PagePlan pl, uint64_t* tl) {
  extern __shared__ __align__(128) unsigned char sm[];
  uint64_t* tl_row = tl_enter<TL>(tl);
  auto tl_exit = [&]() { tl_leave<TL>(tl_row); };
  Meta* meta = reinterpret_cast<Meta*>(sm + kStages * 2 * kChunkBytes);
  // CTA (c, hh) = blockIdx kSplit c + hh takes range c's chunks, KV heads hh kCtaHeads ..
  // hh kCtaHeads + kCtaHeads - 1 of them (warp w: KV head kvh).  Two CTAs fit per SM (any two:
  // nothing ties a range's CTAs to one SM); each runs its own pipeline and barriers.
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int hh = static_cast<int>(blockIdx.x % kSplit), kvh = hh * kCtaHeads + w;
  const int64_t c = blockIdx.x / kSplit;
  const Hdr hdr = *pl.hdr;
  // loaded with the header (a CTA past the ranges reads an unused entry of the array and drops it)
  const int32_t first_req = tid == 0 ? __ldg(pl.first_req + c) : 0;
  for (int e = blockIdx.x; e < hdr.empties; e += gridDim.x) write_empty_request(p, pl, __ldg(pl.empties + e));
  const int64_t G = hdr.ctas, T = hdr.total;
  if (c >= G) {
    tl_exit();
    return;
  }
  const int64_t x0 = range_begin(c, G, T), x1 = range_begin(c + 1, G, T);
  const WarpPos wp{lane, g, t4, w, kvh, c, G, T};
  const char* kbase = static_cast<const char*>(p.k);
  const char* vbase = static_cast<const char*>(p.v);
  const int cpp = p.page_size / kSlots;  // chunks per page
  const Idx& pidx = page_index(p);

  // The phases that share the kernel's variables (cursor, issue, flush, merge_into_registers) are
  // called through lambdas that capture them by reference and pass them on in the order given:
  // the compiler's register assignment, and so the machine code, depends on which variables the
  // lambdas capture and in which order (scripts/dev/sass_diff.sh tells whether a change keeps it).

  // ---- thread 0's request cursor; the copies' fixed offsets; the first chunks' Meta and copies
  int cur_r = first_req;
  PReq cur{};
  if (tid == 0) cur = pl.req[cur_r];
  auto cursor = [&](int64_t x, Meta& m) -> int64_t { return cursor_meta(p, pl, cpp, cur_r, cur, x, m); };
  const char* pidx_bytes = static_cast<const char*>(pidx.ptr);
  const int pidx_esz = pidx.is64 ? 8 : 4;
  uint32_t goff[8], soff[8];
  int slot_of[8];
  copy_offsets(p, hh, tid, goff, soff, slot_of);
  const uint64_t evict_first = l2_evict_first_policy();  // K and V are read once per call
  auto issue = [&](const Meta& m, int st) { issue_chunk(p, pidx, kbase, vbase, sm, goff, soff, slot_of, evict_first, m, st); };
  if (tid == 0) first_metas(cursor, pidx, x0, x1, meta);
  __syncthreads();
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (x0 + st < x1) issue(meta[st], st);
    cp_async_commit();
  }

  // ---- this warp's rows (start_request): lane holds rows g and (R16) g + 8
  constexpr int NR = R16 ? 2 : 1;
  const float scale_log2 = p.sm_scale * kLog2e;
  uint32_t qf[8][4];
  float o[16][4];
  float m_r[NR], l_r[NR];
  int lim[NR];      // keys [0, lim) visible to the row
  // Tiles of at most 8 rows (!R16) run the transposed product in the chunk loop
  // (page_tile::scores_t): this lane holds rows 2 t4 and 2 t4 + 1 there — their running max,
  // sums over its keys, visible keys, and O^T — and to_rows() moves them into m_r / l_r / o's
  // row-g layout when the request is done (what flush, write_rows and the merges read).
  float m_t[2] = {-INFINITY, -INFINITY}, l_t[2] = {0.f, 0.f}, ot[8][4];
  int lim_t[2];
  int lim_min = 0;  // chunks starting at or past it need the mask
  int64_t req = -1, r_cstart = 0;
  int r_chunks = 0, r_qs = 0, r_ql = 0;
  // cut requests of this range still to count or merge after it: at most its first and last
  int64_t split_req[2] = {-1, -1};
  int split_counted = 0;  // bit si: entry si was counted early (and found last)
  int n_split = 0;
  auto flush = [&]() {
    flush_request<BF16>(p, pl, wp, x0, x1, req, r_cstart, r_chunks, r_qs, r_ql, o, m_r, l_r, split_req, n_split, split_counted);
  };
  // The counter of the request the range ends in, read two chunks before the end (pre_req: the
  // request it belongs to), so that a failed check costs no round trip after the loop.
  int64_t pre_req = -1;
  int pre_count = 0;
  const int64_t pre_x = x1 - 2 > x0 ? x1 - 2 : x0;
  auto merge_into_registers = [&]() -> bool {
    return merge_in_registers<BF16>(p, pl, wp, r_cstart, r_chunks, pre_req, req, pre_count, r_ql, r_qs, o, m_r, l_r, lane);
  };
  [[maybe_unused]] uint64_t tl_work = 0, tl_issue = 0, tl_loop0 = 0, tl_t = 0;
  if constexpr (TL) tl_loop0 = clock64();
  for (int64_t x = x0; x < x1; ++x) {
    const int it = static_cast<int>(x - x0);
    if constexpr (TL) {
      if (x > x0) tl_work += clock64() - tl_t;
    }
    cp_async_wait<kStages - 2>();
    __syncthreads();  // chunk x landed (every thread's pieces); every warp is done with chunk x - 1
    if constexpr (TL) {
      tl_t = clock64();
      if (tid == 0 && x == x0) {
        tl_row[kTlFirst] = tl_now();
        tl_row[kTlChunks] = static_cast<uint64_t>(x1 - x0);
      }
      if (tid == 0) tl_row[kTlProg0 + it * kTlProgN / (x1 - x0)] = tl_now();
    }
    if (tid == 0 && x + kMetaAhead < x1) {  // x + 4's Meta; its page id joins this commit group
      Meta& m = meta[(it + kMetaAhead) % kMetaSlots];
      const int64_t e = cursor(x + kMetaAhead, m);
      if (!pidx.is64) m.page_hi = 0;  // (an int64 word is written whole by the copy)
      cp_async_idx(smem_u32(&m.page_lo), pidx_bytes + e * pidx_esz, pidx.is64);
    }
    if (x + kStages - 1 < x1) issue(meta[(it + kStages - 1) % kMetaSlots], (it + kStages - 1) % kStages);
    cp_async_commit();
    if constexpr (TL) tl_issue += clock64() - tl_t;
    const Meta& mt = meta[it % kMetaSlots];
    const int64_t r = mt.req;
    if (r != req) {  // a new request: finish the last one, load this one's query rows
      if (req >= 0) {
        if constexpr (!R16) to_rows(wp, m_t, l_t, ot, m_r, l_r, o);
        flush();
      }
      start_request(p, wp, mt, r, req, r_cstart, r_chunks, r_qs, r_ql, lim_min, lim, qf, m_r, l_r, lim_t, m_t, l_t, ot, o);
    }
    if (x == pre_x && r_cstart + r_chunks > x1) {
      pre_req = req;
      pre_count = ld_relaxed_gpu(unit_counter(pl, kvh, req, 0));
    }
    const int key0 = mt.jc * kSlots;
    const unsigned char* tK = sm + (it % kStages) * 2 * kChunkBytes;
    const unsigned char* tV = tK + kChunkBytes;
    const bool masked = key0 + kSlots > lim_min;
    if constexpr (!R16) {
      chunk_transposed<BF16>(wp, qf, tK, tV, scale_log2, key0, masked, lim_t, m_t, l_t, ot);
    } else {
      chunk_rows<BF16>(wp, qf, tK, tV, scale_log2, key0, masked, lim, m_r, l_r, o);
    }
  }
  if constexpr (TL) {
    const uint64_t now = clock64();
    tl_work += now - tl_t;
    if (tid == 0) {
      tl_row[kTlLoop] = tl_now();
      tl_row[kTlWork0] = tl_work;
    }
    if (tid == 32) {
      tl_row[kTlIssue1] = tl_issue;
      tl_row[kTlWork1] = tl_work;
      tl_row[kTlCyc1] = now - tl_loop0;
    }
  }
  if constexpr (TL) {
    if (lane == 0) atomicMax(reinterpret_cast<unsigned long long*>(tl_row + kTlLoopMax), tl_now());
  }
  if (req >= 0) {
    if constexpr (!R16) to_rows(wp, m_t, l_t, ot, m_r, l_r, o);
    const bool merged = r_cstart + r_chunks > x1 && merge_into_registers();
    if (!merged) flush();
    if constexpr (TL) {
      if (tid == 0 && merged) tl_row[kTlRegMerge] = 1;
    }
  }
  if constexpr (TL) {
    if (lane == 0) atomicMax(reinterpret_cast<unsigned long long*>(tl_row + kTlPostMax), tl_now());
  }
  if (n_split == 0) {
    tl_exit();
    return;
  }
  merge_cut_requests<BF16, TL>(p, pl, wp, split_req, split_counted, n_split, tl_row);
  tl_exit();
}

// ---- host side ------------------------------------------------------------------------------
// grid: ranges; kSplit CTAs each (one per head half)
template <bool BF16, bool R16, bool TL>
int launch_kernel_tl(const AttnParams& p, const PagePlan& pl, int grid, uint64_t* tl) {
  constexpr auto kern = page_decode_kernel<BF16, R16, TL>;
  if (const int e = opt_in_dynamic_smem<kern>(kSmem)) return e;
  kern<<<grid * kSplit, kThreads, kSmem>>>(p, pl, tl);
  return static_cast<int>(cudaGetLastError());
}

template <bool BF16, bool R16>
int launch_kernel(const AttnParams& p, const PagePlan& pl, int grid) {
  return launch_kernel_tl<BF16, R16, false>(p, pl, grid, nullptr);
}

}  // namespace

const char* page_decode_unsupported(const AttnParams& p, int64_t max_q_len) {
  if (p.kv_t != Elt::bf16 && p.kv_t != Elt::f16) return "the cache is not bf16 / f16";
  if (p.q_t != p.kv_t || p.out_t != p.kv_t) return "the query or output type is not the cache's";
  if (!p.q_vec || !p.o_vec) return "query / output rows are not 16-byte aligned vectors";
  if (p.head_dim != kDim) return "head_dim is not 128";
  if (p.hkv != kHeads) return "the call does not have 8 KV heads";
  if (max_q_len < 1 || max_q_len * p.group > 16) return "max_query_len x GQA group is unknown or above 16";
  if (p.page_size % kSlots != 0) return "the page size is not a multiple of 16";
  if (p.k_so != p.v_so || p.k_sh != p.v_sh) return "K and V views differ in slot / head strides";
  if (15 * p.k_so + 7 * p.k_sh + 256 >= (int64_t(1) << 32)) return "a chunk spans more than 4 GB of the cache view";
  if (p.soft_cap > 0.f || p.window_left >= 0 || p.sinks != nullptr || p.mm != nullptr || p.xqa != nullptr)
    return "soft cap, sliding window, sinks, PrefixLM and XQA masks are not implemented on this path";
  // measured on sm_90 only (two 97 KB CTAs per SM); older devices keep attn_kernel's decode
  if (device_attribute<cudaDevAttrComputeCapabilityMajor>() < 9) return "the device is older than sm_90";
  if (device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>() < kSmem)
    return "the device has less shared memory per block than the path's 97 KB ring";
  return nullptr;
}

bool page_decode_batch_ok(const AttnParams& p, int num_sms) { return int64_t(p.batch) * 4 > num_sms; }

PageDecodeShape page_decode_shape(const AttnParams& p, int num_sms, int64_t max_q_len) {
  PageDecodeShape s;
  s.grid = num_sms > 0 ? num_sms : 1;
  // KernelRouting::page_ctas (measurement only): at most N CTAs, e.g. to read what one CTA streams
  // when DRAM is not the limit; 0: one per SM
  const int cap = kernel_routing().page_ctas;
  if (cap > 0 && cap < s.grid) s.grid = cap;
  s.rows = static_cast<int>(max_q_len * p.group);
  const PageWs w = page_ws(p.batch, s.grid, s.rows);
  s.plan_bytes = w.plan_total;
  s.scratch_bytes = w.scratch_total;
  return s;
}

int launch_page_decode(const AttnParams& p, const PageDecodeShape& s, void* plan_ws, void* scratch_ws, bool run_plan) {
  if (p.batch == 0 || p.num_tokens == 0) return 0;
  const PageWs w = page_ws(p.batch, s.grid, s.rows);
  char* base = static_cast<char*>(plan_ws);
  PagePlan pl;
  pl.hdr = reinterpret_cast<Hdr*>(base + w.hdr);
  pl.req = reinterpret_cast<PReq*>(base + w.req);
  pl.first_req = reinterpret_cast<int32_t*>(base + w.first_req);
  pl.empties = reinterpret_cast<int32_t*>(base + w.empties);
  pl.counters = reinterpret_cast<int32_t*>(base + w.counters);
  pl.part = static_cast<float*>(scratch_ws);
  pl.rows = s.rows;
  pl.cstride = page_sched::counters_per_unit(s.grid);
  if (run_plan) {
    page_plan_kernel<<<1, kPlanThreads>>>(p, pl, s.grid);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return static_cast<int>(e);
  }
  const bool bf16 = p.kv_t == Elt::bf16, r16 = s.rows > 8;
  const int e = bf16 ? (r16 ? launch_kernel<true, true>(p, pl, s.grid) : launch_kernel<true, false>(p, pl, s.grid))
                     : (r16 ? launch_kernel<false, true>(p, pl, s.grid) : launch_kernel<false, false>(p, pl, s.grid));
  if (e == 0) note_launch(KernelLaunch::page_decode);
  return e;
}

}  // namespace kvattn::ops::cuda_impl::k
