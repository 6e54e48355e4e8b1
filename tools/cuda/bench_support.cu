// tools/cuda/bench_support.cu — the ceilings and probes `kvattn bench-cuda` reports next to the
// ops (device copy bandwidth, the mma.sync bf16 rate, K/V gathers, the launch floor, the
// whole-page decode probe), plus event timing.  Part of the kvattn tool, not of the library.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/page_tile.cuh"
#include "ops/cuda/ptx.cuh"
#include "cuda/bench_support.h"
#include "cuda/timeline_csv.h"

namespace kvattn::tools::cuda_bench {
using namespace kvattn::ops::cuda_impl::k;
namespace {

__global__ void mma_peak_kernel(float* out, int iters) {
  uint32_t a[4], b[2];
  const uint32_t seed = threadIdx.x * 2654435761u + blockIdx.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = (seed ^ (i * 0x9e3779b9u)) & 0x3f803f80u;
  b[0] = (seed * 7u) & 0x3f803f80u;
  b[1] = (seed * 13u) & 0x3f803f80u;
  float c[8][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  if (s == 12345.f) out[0] = s;
}

// out = a + b over 16-byte vectors (32-bit lane adds), one vector per thread, a full grid of
// 256-thread CTAs: the memory pattern of merge_attn_states' vector kernel (two streams read with
// plain loads, one written with st.global.cs, same addresses) without its arithmetic or LSE loads.
__global__ void stream3_kernel(const uint4* a, const uint4* b, uint4* out, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const uint4 x = a[i], y = b[i];
  __stcs(out + i, make_uint4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w));
}

// This thread's share of 64-key tile t of (request req, KV head hk): 16-byte chunk c of rows
// r0, r0 + 8, ..., r0 + 56 of K (d[0..7]) and of V (d[8..15]); 16-key pages, request-major ids.
__device__ __forceinline__ void load_tile_rows(const char* k, const char* v, int64_t page_b, int64_t slot_b,
                                               int64_t head_b, const int32_t* indices, int tiles, int req, int hk,
                                               int t, int r0, int c, uint4 (&d)[16]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int key = t * 64 + r0 + 8 * i;
    const int64_t pg = indices[int64_t(req) * tiles * 4 + key / 16];
    const int64_t off = pg * page_b + int64_t(key % 16) * slot_b + int64_t(hk) * head_b + c * 16;
    d[i] = __ldcs(reinterpret_cast<const uint4*>(k + off));
    d[8 + i] = __ldcs(reinterpret_cast<const uint4*>(v + off));
  }
}

// Reads the K and V rows the decode kernel reads for uniform requests of `tiles` 64-key tiles
// (16-key pages, one KV head per unit, 256-byte rows), with nothing else: CTA = (request, chunk
// of 8 tiles, KV head) in the decode's unit order (the heads of a chunk adjacent); per tile each
// of the 128 threads loads 8 K and 8 V 16-byte chunks, two tiles unrolled (32 loads in flight).
// Small CTAs, so many are resident.  A simple kernel with a start and a tail of its own: a lower
// bound of the access pattern's read ceiling, not a proof of it.
__global__ void kv_gather_kernel(const char* k, const char* v, int64_t page_b, int64_t slot_b, int64_t head_b,
                                 const int32_t* indices, int tiles, int hkv, uint32_t* sink) {
  constexpr int kChunkTiles = 8;
  const int chunks = tiles / kChunkTiles;
  const int w = blockIdx.x;
  const int hk = w % hkv, item = w / hkv;
  const int req = item / chunks, chunk = item % chunks;
  const int tid = threadIdx.x, c = tid & 15, r0 = tid >> 4;  // chunk of a row, first of 8 rows
  uint32_t acc = 0;
  for (int t = chunk * kChunkTiles; t < (chunk + 1) * kChunkTiles; t += 2) {
    uint4 x[2][16];
#pragma unroll
    for (int u = 0; u < 2; ++u) load_tile_rows(k, v, page_b, slot_b, head_b, indices, tiles, req, hk, t + u, r0, c, x[u]);
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int i = 0; i < 16; ++i) acc ^= x[u][i].x ^ x[u][i].y ^ x[u][i].z ^ x[u][i].w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads
}

// The same loads, the grid resident and every CTA given one contiguous range of the call's
// tiles (units in the decode's order, tiles within a unit): equal bytes per CTA, no tail from
// unit sizes and no CTA starts after the first (what a stream-K schedule would read).
__global__ void kv_gather_ranges_kernel(const char* k, const char* v, int64_t page_b, int64_t slot_b, int64_t head_b,
                                        const int32_t* indices, int tiles, int hkv, int64_t total, uint32_t* sink) {
  const int64_t G = gridDim.x, c = blockIdx.x;
  const int64_t x0 = c * total / G, x1 = (c + 1) * total / G;
  const int tid = threadIdx.x, ch = tid & 15, r0 = tid >> 4;
  uint32_t acc = 0;
  for (int64_t x = x0; x < x1; x += 2) {
    uint4 d[2][16];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int64_t xx = min(x + u, x1 - 1);  // an odd range re-reads its last tile (cached)
      const int64_t unit = xx / tiles;
      const int t = static_cast<int>(xx - unit * tiles);
      const int req = static_cast<int>(unit / hkv), hk = static_cast<int>(unit % hkv);
      load_tile_rows(k, v, page_b, slot_b, head_b, indices, tiles, req, hk, t, r0, ch, d[u]);
    }
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int i = 0; i < 16; ++i) acc ^= d[u][i].x ^ d[u][i].y ^ d[u][i].z ^ d[u][i].w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// The same bytes read as whole pages: the grid resident, every CTA one contiguous range of the
// call's (request, page) pairs, each page's K rows of every KV head (16 slots x hkv x 256 bytes,
// contiguous in the NHD pool) and its V rows, 16 chunks of each per thread in flight.  What a
// decode that read each page once for all its KV heads would read, balanced as the ranges above.
__global__ void kv_gather_pages_kernel(const char* k, const char* v, int64_t page_b, const int32_t* indices,
                                       int64_t total, int page_chunks, uint32_t* sink) {
  const int64_t G = gridDim.x, c = blockIdx.x;
  const int64_t x0 = c * total / G, x1 = (c + 1) * total / G;
  uint32_t acc = 0;
  for (int64_t x = x0; x < x1; ++x) {
    const int64_t pg = indices[x];
    const uint4* kp = reinterpret_cast<const uint4*>(k + pg * page_b);
    const uint4* vp = reinterpret_cast<const uint4*>(v + pg * page_b);
    for (int i0 = threadIdx.x; i0 < page_chunks; i0 += 16 * blockDim.x) {
      uint4 d[32];
#pragma unroll
      for (int u = 0; u < 16; ++u) {
        const int i = min(i0 + u * static_cast<int>(blockDim.x), page_chunks - 1);
        d[u] = __ldcs(kp + i);
        d[16 + u] = __ldcs(vp + i);
      }
#pragma unroll
      for (int u = 0; u < 32; ++u) acc ^= d[u].x ^ d[u].y ^ d[u].z ^ d[u].w;
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// The pages gather's bytes moved by the bulk copy engine instead of register loads: one 256-thread
// CTA per SM, each an equal contiguous range of the call's (request, page) pairs, a 3-stage ring
// of whole pages in shared memory (K 32 KB + V 32 KB per stage, one cp.async.bulk each, L2
// evict-first, completing on the stage's mbarrier).  Thread 0 issues; every thread waits on the
// stage, reads one 16-byte word of it, and a block barrier frees it for the page three ahead.
// Measured on an H200: 1.1-1.5 % above the register-load
// gather, the highest read rate of any schedule tried over the decode's pages.  sm_90+ only.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define KVATTN_BULK_ONLY(...) __trap()
#else
#define KVATTN_BULK_ONLY(...) __VA_ARGS__
#endif
__device__ __forceinline__ void bench_mbar_init(uint32_t bar) {
  KVATTN_BULK_ONLY(asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n"
                                "fence.mbarrier_init.release.cluster;\n" ::"r"(bar)
                                : "memory"));
}
__device__ __forceinline__ void bench_mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  KVATTN_BULK_ONLY(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory"));
}
__device__ __forceinline__ void bench_mbar_wait(uint32_t bar, uint32_t parity) {
  KVATTN_BULK_ONLY(asm volatile(
      "{\n .reg .pred p;\n KVATTN_BW_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra KVATTN_BW_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory"));
}
__device__ __forceinline__ void bench_bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar, uint64_t pol) {
  KVATTN_BULK_ONLY(asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(pol)
      : "memory"));
}
#undef KVATTN_BULK_ONLY
constexpr int kBulkStages = 3, kBulkPage = 16 * 8 * 256;  // K (or V) of one page: 16 slots x 8 heads x 256 B
constexpr int kBulkSmem = kBulkStages * 2 * kBulkPage + 128 + 64;
// DYN (mode 4): the same copies, but pages taken in blocks of kBulkBlock from a call-wide claim
// counter (CTA c's first block is block c, later ones claimed as the issue pointer needs them), so
// a CTA on a faster SM reads more of them and every CTA runs until the pages run out: the
// schedule's tail without equal ranges' imbalance.  ctr[0] counts claims, ctr[1] finished CTAs;
// the last CTA to finish puts both back to 0 for the next launch.
constexpr int kBulkBlock = 4;
// tl (equal ranges only; nullptr: none): per CTA kGatherTl words — %globaltimer at entry, when the
// first page landed, at the loop's end and at exit, the SM, the pages of its range, then 16
// progress stamps (when the last page of each sixteenth of the range landed): the decode
// timeline's CSV row (--gather-timeline FILE)
constexpr int kGatherTl = 6 + 16;
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
template <bool DYN>
__global__ void __launch_bounds__(256, 1) kv_gather_bulk_kernel(const char* k, const char* v, int64_t page_b,
                                                                const int32_t* indices, int64_t total, uint32_t* sink,
                                                                int* ctr, uint64_t* tl) {
  extern __shared__ unsigned char smraw[];
  // DYN: the page each stage holds, -1 past the CTA's last (thread 0 writes a stage's entry after
  // the barrier of the iteration that consumed it; it is read three barriers later)
  __shared__ int64_t stage_x[kBulkStages];
  const uint32_t raw = smem_u32(smraw);
  const uint32_t base = (raw + 127u) & ~127u;
  const uint32_t bars = base + kBulkStages * 2 * kBulkPage;
  const unsigned char* gen = smraw + (base - raw);
  const int64_t G = gridDim.x, c = blockIdx.x;
  const int64_t x0 = DYN ? c * kBulkBlock : c * total / G, x1 = DYN ? total : (c + 1) * total / G;
  const int tid = threadIdx.x;
  const uint64_t pol = l2_evict_first_policy();
  uint64_t* tl_row = !DYN && tl != nullptr ? tl + c * kGatherTl : nullptr;
  if (tl_row != nullptr && tid == 0) {
    uint32_t smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    tl_row[0] = globaltimer_ns();
    tl_row[4] = smid;
    tl_row[5] = static_cast<uint64_t>(x1 - x0);
    for (int j = 6; j < kGatherTl; ++j) tl_row[j] = 0;
  }
  if (tid == 0)
    for (int s = 0; s < kBulkStages; ++s) bench_mbar_init(bars + 8 * s);
  int64_t next = x0, block_end = x0 + kBulkBlock;  // DYN, thread 0: the next page to issue
  auto next_page = [&]() -> int64_t {  // DYN: the next page of this CTA, -1 when none is left
    if (next >= block_end) {
      next = (atomicAdd(ctr, 1) + G) * kBulkBlock;
      block_end = next + kBulkBlock;
    }
    return next < total ? next++ : int64_t(-1);
  };
  auto issue = [&](int64_t x, int s) {
    if constexpr (DYN) stage_x[s] = x;
    if (x < 0) return;
    const int64_t pg = indices[x];
    const uint32_t bar = bars + 8 * s, dk = base + s * 2 * kBulkPage;
    bench_mbar_expect_tx(bar, 2 * kBulkPage);
    bench_bulk_copy(dk, k + pg * page_b, kBulkPage, bar, pol);
    bench_bulk_copy(dk + kBulkPage, v + pg * page_b, kBulkPage, bar, pol);
  };
  if (tid == 0)
    for (int s = 0; s < kBulkStages; ++s) {
      if constexpr (DYN) issue(x0 < total ? next_page() : -1, s);
      else if (x0 + s < x1) issue(x0 + s, s);
    }
  __syncthreads();
  uint32_t acc = 0;
  for (int64_t x = x0, i = 0;; ++x, ++i) {
    const int s = static_cast<int>(i % kBulkStages);
    if constexpr (DYN) {
      if (stage_x[s] < 0) break;
    } else if (x >= x1) {
      break;
    }
    bench_mbar_wait(bars + 8 * s, (i / kBulkStages) & 1);
    if (tl_row != nullptr && tid == 0) {
      const uint64_t now = globaltimer_ns();
      if (i == 0) tl_row[1] = now;
      tl_row[6 + i * 16 / (x1 - x0)] = now;
    }
    const uint4 d = *reinterpret_cast<const uint4*>(gen + s * 2 * kBulkPage + tid * 16);
    acc ^= d.x ^ d.y ^ d.z ^ d.w;
    __syncthreads();
    if (tid == 0) {
      if constexpr (DYN) issue(next_page(), s);
      else if (x + kBulkStages < x1) issue(x + kBulkStages, s);
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
  if (tl_row != nullptr && tid == 0) tl_row[2] = tl_row[3] = globaltimer_ns();
  if constexpr (DYN) {
    if (tid == 0 && atomicAdd(ctr + 1, 1) == G - 1) {
      ctr[0] = 0;
      ctr[1] = 0;
    }
  }
}

// ---- whole-page decode probe (bench only): the decode's math over the pages that the pages
// gather reads.  A resident grid of one 8-warp CTA per SM; CTA c takes an equal contiguous range
// of the call's (request, page) pairs; each page's K and V (32 KB each: 16 slots x 8 KV heads x
// 128 dims, bf16, NHD) are copied whole into a 3-stage ring (every thread 8 + 8 chunks), and warp
// w computes KV head w's 4 query heads (GQA 4) against them with mma.sync (rows 4..15 of the
// 16-row tile unused).  At each request boundary a warp finishes the request's rows:
//   FUSED = false: it writes its unnormalised partial (m, l, O) to `part`, per (CTA, request of its
//     range), and probe_merge_fast_kernel combines the pieces afterwards;
//   FUSED = true (one launch, end to end): a request inside the range is normalised and written to
//     `out` (bf16) at once; a split one (at most the range's first and last) writes its partial per
//     (request, KV head, piece); after its last page the warp fences once and counts each split
//     request on its (request, KV head) counter, and the warp that arrives last combines every
//     piece, writes `out` and puts the counter back to 0 (ready for the next call).
// Fixed shape: 32 query / 8 KV heads, D 128, page 16.
constexpr int kPbHeads = 8, kPbStages = 3, kPbMaxSeg = 4, kPbRow = 130;  // (m, l, O[128]) per head
constexpr int kPbMaxPieces = 8;  // FUSED: CTAs one request may span
constexpr int kPbPageBytes = 16 * kPbHeads * 128 * 2;  // K (or V) of one page
constexpr int kPbSmem = kPbStages * 2 * kPbPageBytes;
// Shared-memory offset of (slot, KV head, 16-byte chunk) in a staged page: rows of 256 bytes in
// page order, chunks XOR-swizzled by slot so ldmatrix's 8 rows of one head (2 KB apart) hit 8
// different bank groups.
__device__ __forceinline__ uint32_t pb_swz(int slot, int head, int chunk) { return page_tile::swz(slot, head, chunk); }
static_assert(page_tile::kHeads == kPbHeads, "the probe stages chunks of 8 KV heads");
// The CTA (of G, equal ranges of `total` pages: CTA c holds [c * total / G, (c + 1) * total / G))
// that holds page x.
__device__ __forceinline__ int64_t pb_cta_of(int64_t x, int64_t G, int64_t total) {
  return ((x + 1) * G + total - 1) / total - 1;
}

template <bool FUSED>
__global__ void __launch_bounds__(256, 1) page_decode_probe_kernel(const char* k, const char* v, int64_t page_b,
                                                                   const int32_t* indices,
                                                                   const __nv_bfloat16* q, int n, int64_t total,
                                                                   float scale_log2, float* part,
                                                                   __nv_bfloat16* out, int* counters) {
  extern __shared__ __align__(128) unsigned char sm[];
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int64_t G = gridDim.x, c = blockIdx.x;
  const int64_t x0 = c * total / G, x1 = (c + 1) * total / G;
  auto issue = [&](int64_t x, int st) {
    const int64_t pg = indices[x];
    const char* kp = k + pg * page_b;
    const char* vp = v + pg * page_b;
    const uint32_t sk = smem_u32(sm + st * 2 * kPbPageBytes), sv = sk + kPbPageBytes;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int ch = tid + 256 * i;  // chunk of the page; its row ch >> 4 = slot * 8 + head
      const uint32_t off = pb_swz(ch >> 7, (ch >> 4) & 7, ch & 15);
      cp_async16(sk + off, kp + ch * 16, 16);
      cp_async16(sv + off, vp + ch * 16, 16);
    }
  };
#pragma unroll
  for (int st = 0; st < kPbStages - 1; ++st) {
    if (x0 + st < x1) issue(x0 + st, st);
    cp_async_commit();
  }
  int64_t req = -1;
  int seg = -1;
  uint32_t qf[8][4];
  float o[16][4];
  float m_r = -INFINITY, l_r = 0.f;
  auto cta_of = [&](int64_t x) { return pb_cta_of(x, G, total); };
  // FUSED: piece `piece` of request r's (m, l, O) row for this lane's query head
  auto piece_slot = [&](int64_t r, int piece) {
    return part + (((r * kPbHeads + w) * kPbMaxPieces + piece) * 4 + (g & 3)) * kPbRow;
  };
  auto write_out = [&](int64_t r, float l) {  // rows g < 4: o / l as bf16
    const float inv = 1.f / l;
    __nv_bfloat16* dst = out + (r * 32 + 4 * w + g) * 128 + 2 * t4;
#pragma unroll
    for (int nn = 0; nn < 16; ++nn)
      *reinterpret_cast<__nv_bfloat162*>(dst + 8 * nn) = __floats2bfloat162_rn(o[nn][0] * inv, o[nn][1] * inv);
  };
  auto write_partial = [&](float* dst, float l) {  // rows g < 4: (m, l, O) unnormalised, f32
    if (t4 == 0) {
      dst[0] = m_r;
      dst[1] = l;
    }
#pragma unroll
    for (int nn = 0; nn < 16; ++nn) {
      dst[2 + 8 * nn + 2 * t4] = o[nn][0];
      dst[3 + 8 * nn + 2 * t4] = o[nn][1];
    }
  };
  // the split requests of this range (its first and its last at most), counted at the end: a
  // fence there, once, instead of one at each request boundary with pages in flight
  int64_t split0 = -1, split1 = -1;
  int n_split = 0;
  auto flush = [&]() {
    float l = l_r;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if constexpr (!FUSED) {
      if (g < 4 && seg < kPbMaxSeg) write_partial(part + ((c * kPbMaxSeg + seg) * 32 + 4 * w + g) * kPbRow, l);
      return;
    } else {
      const int64_t rb = req * n, re = rb + n;
      if (rb < x0 || re > x1) {  // split between CTAs: the partial now, the count and merge at the end
        if (g < 4) write_partial(piece_slot(req, static_cast<int>(c - cta_of(rb))), l);
        (n_split++ == 0 ? split0 : split1) = req;
        return;
      }
      if (g < 4) write_out(req, l);
    }
  };
  for (int64_t x = x0; x < x1; ++x) {
    const int it = static_cast<int>(x - x0);
    cp_async_wait<kPbStages - 2>();
    __syncthreads();  // page x landed (every thread's chunks); every warp is done with page x - 1
    if (x + kPbStages - 1 < x1) issue(x + kPbStages - 1, (it + kPbStages - 1) % kPbStages);
    cp_async_commit();
    const int64_t r = x / n;
    if (r != req) {  // a new request: write the last one's partial, load this one's Q rows
      if (req >= 0) flush();
      req = r;
      ++seg;
      const uint32_t* qrow = reinterpret_cast<const uint32_t*>(q + (r * 32 + 4 * w + (g & 3)) * 128);
#pragma unroll
      for (int s2 = 0; s2 < 8; ++s2) {
        qf[s2][0] = g < 4 ? qrow[8 * s2 + t4] : 0u;
        qf[s2][2] = g < 4 ? qrow[8 * s2 + 4 + t4] : 0u;
        qf[s2][1] = qf[s2][3] = 0u;
      }
#pragma unroll
      for (int nn = 0; nn < 16; ++nn) o[nn][0] = o[nn][1] = o[nn][2] = o[nn][3] = 0.f;
      m_r = -INFINITY;
      l_r = 0.f;
    }
    const unsigned char* tK = sm + (it % kPbStages) * 2 * kPbPageBytes;
    const unsigned char* tV = tK + kPbPageBytes;
    float sc[2][4];
    page_tile::scores<true>(sc, qf, tK, w, lane);
    float mx = fmaxf(fmaxf(sc[0][0], sc[0][1]), fmaxf(sc[1][0], sc[1][1])) * scale_log2;
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_r, mx);
    const float alpha = exp2f(m_r - m_new);
    m_r = m_new;
    float p[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) p[j][e] = exp2f(sc[j][e] * scale_log2 - m_new);
    l_r = l_r * alpha + p[0][0] + p[0][1] + p[1][0] + p[1][1];
#pragma unroll
    for (int nn = 0; nn < 16; ++nn) {
      o[nn][0] *= alpha;
      o[nn][1] *= alpha;
    }
    uint32_t a[4];
    a[0] = pack2<true>(p[0][0], p[0][1]);
    a[1] = 0u;
    a[2] = pack2<true>(p[1][0], p[1][1]);
    a[3] = 0u;
    page_tile::accumulate_pv<true>(o, a, tV, w, lane);
  }
  if (req >= 0) flush();
  if constexpr (FUSED) {
    if (n_split == 0) return;
    __threadfence();  // this warp's partials are visible before it counts them
    __syncwarp();
    for (int si = 0; si < n_split; ++si) {
      const int64_t r = si == 0 ? split0 : split1;
      const int64_t c_lo = cta_of(r * n);
      const int pieces = static_cast<int>(cta_of(r * n + n - 1) - c_lo + 1);
      int old = 0;
      if (lane == 0) old = atomicAdd(&counters[r * kPbHeads + w], 1);
      old = __shfl_sync(0xffffffffu, old, 0);
      if (old != pieces - 1) continue;  // another piece is still running: it merges r
      __threadfence();
      // every lane works: lanes g and g + 4 take row g & 3, dims [64 * (g >> 2), +64); all pieces'
      // (m, l) in one round of loads, then their O values with the pieces unrolled
      const int half = g >> 2;
      float mv[kPbMaxPieces], lv[kPbMaxPieces];
#pragma unroll
      for (int p2 = 0; p2 < kPbMaxPieces; ++p2) {
        mv[p2] = p2 < pieces ? __ldcg(piece_slot(r, p2)) : -INFINITY;
        lv[p2] = p2 < pieces ? __ldcg(piece_slot(r, p2) + 1) : 0.f;
      }
      float M = mv[0];
#pragma unroll
      for (int p2 = 1; p2 < kPbMaxPieces; ++p2) M = fmaxf(M, mv[p2]);
      float l = 0.f, acc[16];
#pragma unroll
      for (int e = 0; e < 16; ++e) acc[e] = 0.f;
#pragma unroll
      for (int p2 = 0; p2 < kPbMaxPieces; ++p2) {
        if (p2 >= pieces) break;
        const float f = exp2f(mv[p2] - M);
        l += lv[p2] * f;
        const float* src = piece_slot(r, p2) + 2 + 64 * half + 2 * t4;
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
          acc[2 * kk] += f * __ldcg(src + 8 * kk);
          acc[2 * kk + 1] += f * __ldcg(src + 8 * kk + 1);
        }
      }
      const float inv = 1.f / l;
      __nv_bfloat16* dst = out + (r * 32 + 4 * w + (g & 3)) * 128 + 64 * half + 2 * t4;
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
        *reinterpret_cast<__nv_bfloat162*>(dst + 8 * kk) = __floats2bfloat162_rn(acc[2 * kk] * inv, acc[2 * kk + 1] * inv);
      if (lane == 0) counters[r * kPbHeads + w] = 0;  // ready for the next call
    }
  }
}

// The merge of FUSED = false's partials, as a second launch would run it (timed in mode 2,
// untimed in mode 0): block (request, query head), thread = dim; the request's pieces are the CTAs
// whose ranges meet it (pb_cta_of), every piece's (m, l, O[d]) loaded at once; f32 output.
__global__ void probe_merge_fast_kernel(const float* part, int n, int64_t total, int G, float* out) {
  const int64_t r = blockIdx.x;
  const int head = blockIdx.y, d = threadIdx.x;
  const int64_t c_lo = pb_cta_of(r * n, G, total);
  const int pieces = static_cast<int>(pb_cta_of(r * n + n - 1, G, total) - c_lo + 1);
  float mv[kPbMaxPieces], lv[kPbMaxPieces], ov[kPbMaxPieces];
#pragma unroll
  for (int p = 0; p < kPbMaxPieces; ++p) {
    const int64_t c = c_lo + p;
    const float* src = part + ((c * kPbMaxSeg + (r - (c * total / G) / n)) * 32 + head) * kPbRow;
    const bool ok = p < pieces;
    mv[p] = ok ? src[0] : -INFINITY;
    lv[p] = ok ? src[1] : 0.f;
    ov[p] = ok ? src[2 + d] : 0.f;
  }
  float M = mv[0];
#pragma unroll
  for (int p = 1; p < kPbMaxPieces; ++p) M = fmaxf(M, mv[p]);
  float L = 0.f, acc = 0.f;
#pragma unroll
  for (int p = 0; p < kPbMaxPieces; ++p) {
    const float f = exp2f(mv[p] - M);  // 0 past the pieces
    L += lv[p] * f;
    acc += ov[p] * f;
  }
  out[(r * 32 + head) * 128 + d] = acc / L;
}

// A plain two-pass reference of the same attention: block (request, query head), f32.
__global__ void probe_reference_kernel(const char* k, const char* v, int64_t page_b, const int32_t* indices,
                                       const __nv_bfloat16* q, int n, float scale, float* out) {
  extern __shared__ float sc[];  // n * 16 scores
  __shared__ float qs[128], red[128];
  const int r = blockIdx.x, head = blockIdx.y, t = threadIdx.x, hk = head / 4;
  qs[t] = __bfloat162float(q[(int64_t(r) * 32 + head) * 128 + t]);
  __syncthreads();
  const int keys = n * 16;
  float mx = -INFINITY;
  for (int j = t; j < keys; j += 128) {
    const int64_t pg = indices[int64_t(r) * n + j / 16];
    const __nv_bfloat16* kr = reinterpret_cast<const __nv_bfloat16*>(k + pg * page_b + (j % 16) * 2048 + hk * 256);
    float dot = 0.f;
    for (int d = 0; d < 128; ++d) dot += qs[d] * __bfloat162float(kr[d]);
    sc[j] = dot * scale;
    mx = fmaxf(mx, sc[j]);
  }
  red[t] = mx;
  __syncthreads();
  for (int s2 = 64; s2 > 0; s2 >>= 1) {
    if (t < s2) red[t] = fmaxf(red[t], red[t + s2]);
    __syncthreads();
  }
  const float M = red[0];
  __syncthreads();
  float sum = 0.f;
  for (int j = t; j < keys; j += 128) {
    sc[j] = __expf(sc[j] - M);
    sum += sc[j];
  }
  red[t] = sum;
  __syncthreads();
  for (int s2 = 64; s2 > 0; s2 >>= 1) {
    if (t < s2) red[t] += red[t + s2];
    __syncthreads();
  }
  const float L = red[0];
  float acc = 0.f;
  for (int j = 0; j < keys; ++j) {
    const int64_t pg = indices[int64_t(r) * n + j / 16];
    const __nv_bfloat16* vr = reinterpret_cast<const __nv_bfloat16*>(v + pg * page_b + (j % 16) * 2048 + hk * 256);
    acc += sc[j] * __bfloat162float(vr[t]);
  }
  out[(int64_t(r) * 32 + head) * 128 + t] = acc / L;
}

__global__ void probe_fill_q_kernel(__nv_bfloat16* q, int64_t count) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u + 12345u;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  q[i] = __float2bfloat16(static_cast<float>(h & 0xffff) / 32768.f - 1.f);  // uniform(-1, 1)
}

}  // namespace

double measure_stream3_tbps(int64_t bytes) {
  const int sets = 4;
  std::vector<void*> buf(3 * sets, nullptr);
  for (auto& b : buf) {
    if (cudaMalloc(&b, bytes) != cudaSuccess) {
      for (auto& f : buf) cudaFree(f);
      (void)cudaGetLastError();
      return 0;
    }
    cudaMemset(b, 1, bytes);
  }
  struct Ctx { std::vector<void*>* buf; int64_t n; int sets; } ctx{&buf, bytes / 16, sets};
  const double us = time_median_us(
      [](void* c, int i) {
        auto* x = static_cast<Ctx*>(c);
        const int s = i % x->sets;
        void** b = x->buf->data() + 3 * s;
        const int64_t blocks = (x->n + 255) / 256;
        stream3_kernel<<<static_cast<unsigned>(blocks), 256>>>(static_cast<const uint4*>(b[0]),
                                                               static_cast<const uint4*>(b[1]), static_cast<uint4*>(b[2]),
                                                               x->n);
      },
      &ctx, 4, 20);
  for (auto& b : buf) cudaFree(b);
  return 3.0 * bytes / (us * 1e-6) / 1e12;
}

double measure_kv_gather_tbps(const void* k, const void* v, int64_t page_b, int64_t slot_b, int64_t head_b,
                              const int32_t* indices, int batch, int tiles, int hkv, int mode) {
  if (tiles % 8 != 0 || batch <= 0) return 0;
  if (mode == 3 || mode == 4) {  // whole pages by the bulk copy engine (kv_gather_bulk_kernel): 32 KB K / V pages only
    int major = 0, sms = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    // bench-cuda --gather-ctas N (measurement only): at most N CTAs
    if (settings().gather_ctas > 0) sms = std::min(sms, settings().gather_ctas);
    const auto kern = mode == 4 ? kv_gather_bulk_kernel<true> : kv_gather_bulk_kernel<false>;
    if (major < 9 || hkv != 8 || slot_b != 8 * 256 || head_b != 256 ||
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kBulkSmem) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    uint32_t* sink = nullptr;
    cudaMalloc(&sink, 16);
    cudaMemset(sink, 0, 16);  // sink[1..2]: mode 4's claim and finish counters
    struct Ctx {
      const char *k, *v;
      int64_t page_b, total;
      const int32_t* indices;
      int grid;
      uint32_t* sink;
      void (*kern)(const char*, const char*, int64_t, const int32_t*, int64_t, uint32_t*, int*, uint64_t*);
    } ctx{static_cast<const char*>(k), static_cast<const char*>(v), page_b, int64_t(batch) * tiles * 4, indices, sms, sink, kern};
    const double us = time_median_us(
        [](void* c, int) {
          auto* x = static_cast<Ctx*>(c);
          x->kern<<<x->grid, 256, kBulkSmem>>>(x->k, x->v, x->page_b, x->indices, x->total, x->sink,
                                               reinterpret_cast<int*>(x->sink + 1), nullptr);
        },
        &ctx, 4, 20);
    // bench-cuda --gather-timeline FILE (diagnostic, equal ranges): three more launches back to back
    // with stamps, appended as CSV rows (timeline_csv.h; a chunk is a page)
    if (const char* path = settings().gather_timeline.empty() ? nullptr : settings().gather_timeline.c_str();
        path != nullptr && mode == 3) {
      const int launches = 3;
      uint64_t* tl = nullptr;
      if (cudaMalloc(&tl, sizeof(uint64_t) * kGatherTl * sms * launches) == cudaSuccess) {
        for (int l = 0; l < launches; ++l)
          kern<<<sms, 256, kBulkSmem>>>(ctx.k, ctx.v, page_b, indices, ctx.total, sink, reinterpret_cast<int*>(sink + 1),
                                        tl + int64_t(l) * kGatherTl * sms);
        std::vector<uint64_t> h(static_cast<size_t>(kGatherTl) * sms * launches);
        if (cudaMemcpy(h.data(), tl, h.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost) == cudaSuccess)
          if (FILE* f = std::fopen(path, "a")) {
            for (int l = 0; l < launches; ++l) {
              const uint64_t* rows = h.data() + int64_t(l) * kGatherTl * sms;
              uint64_t t0 = ~uint64_t(0);
              for (int b = 0; b < sms; ++b) t0 = std::min(t0, rows[int64_t(b) * kGatherTl]);
              for (int b = 0; b < sms; ++b) {
                const uint64_t* r = rows + int64_t(b) * kGatherTl;
                append_timeline_row(f, l, b, r[4], r[5], r[0], r[1], r[2], r[3], r + 6, kGatherTl - 6, t0);
              }
            }
            std::fclose(f);
          }
        cudaFree(tl);
      }
      (void)cudaGetLastError();
    }
    cudaFree(sink);
    return cudaGetLastError() == cudaSuccess ? double(batch) * tiles * 64 * hkv * 256 * 2 / (us * 1e-6) / 1e12 : 0;
  }
  const bool ranges = mode != 0;
  uint32_t* sink = nullptr;
  cudaMalloc(&sink, 16);
  int grid = 0;  // ranges: every CTA resident at once
  if (ranges) {
    int sms = 0, per = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    if (mode == 2)
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kv_gather_pages_kernel, 128, 0);
    else
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kv_gather_ranges_kernel, 128, 0);
    grid = std::max(sms * per, 1);
  }
  struct Ctx {
    const char *k, *v;
    int64_t page_b, slot_b, head_b;
    const int32_t* indices;
    int batch, tiles, hkv, grid, mode;
    uint32_t* sink;
  } ctx{static_cast<const char*>(k), static_cast<const char*>(v), page_b, slot_b, head_b, indices, batch, tiles, hkv,
        grid, mode, sink};
  const double us = time_median_us(
      [](void* c, int) {
        auto* x = static_cast<Ctx*>(c);
        if (x->mode == 2) {
          // 16-byte chunks of one page's K: 16 slots of slot_b bytes (every head)
          const int page_chunks = static_cast<int>(x->slot_b);
          kv_gather_pages_kernel<<<x->grid, 128>>>(x->k, x->v, x->page_b, x->indices, int64_t(x->batch) * x->tiles * 4,
                                                   page_chunks, x->sink);
          return;
        }
        if (x->grid > 0) {
          const int64_t total = int64_t(x->batch) * x->hkv * x->tiles;
          kv_gather_ranges_kernel<<<x->grid, 128>>>(x->k, x->v, x->page_b, x->slot_b, x->head_b, x->indices, x->tiles,
                                                    x->hkv, total, x->sink);
          return;
        }
        const unsigned blocks = static_cast<unsigned>(x->batch * (x->tiles / 8) * x->hkv);
        kv_gather_kernel<<<blocks, 128>>>(x->k, x->v, x->page_b, x->slot_b, x->head_b, x->indices, x->tiles, x->hkv,
                                          x->sink);
      },
      &ctx, 4, 20);
  cudaFree(sink);
  return double(batch) * tiles * 64 * hkv * 256 * 2 / (us * 1e-6) / 1e12;
}

double measure_page_decode_probe_tbps(const void* k, const void* v, int64_t page_b, const int32_t* indices, int batch,
                                      int pages_per_request, int mode, double* max_err) {
  const bool fused = mode == 1;
  *max_err = -1;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int G = std::max(sms, 1);
  const int n = pages_per_request;
  const int64_t total = int64_t(batch) * n;
  if (batch <= 0 || n <= 0 || total < G || int64_t(n) * 16 * 4 > 96 * 1024) return 0;
  const int64_t per = total / G;  // pages per CTA (or one more)
  if ((per + 1 + n - 1) / n + 1 > kPbMaxSeg || n / std::max<int64_t>(per, 1) + 2 > kPbMaxPieces) return 0;
  __nv_bfloat16 *q = nullptr, *out16 = nullptr;
  float *part = nullptr, *out = nullptr, *ref = nullptr;
  int* counters = nullptr;
  const int64_t qn = int64_t(batch) * 32 * 128;
  const int64_t part_floats = fused ? int64_t(batch) * kPbHeads * kPbMaxPieces * 4 * kPbRow
                                    : int64_t(G) * kPbMaxSeg * 32 * kPbRow;
  cudaMalloc(&q, qn * 2);
  cudaMalloc(&out16, qn * 2);
  cudaMalloc(&part, sizeof(float) * part_floats);
  cudaMalloc(&out, sizeof(float) * qn);
  cudaMalloc(&ref, sizeof(float) * qn);
  cudaMalloc(&counters, sizeof(int) * batch * kPbHeads);
  cudaMemset(counters, 0, sizeof(int) * batch * kPbHeads);
  auto kern = fused ? page_decode_probe_kernel<true> : page_decode_probe_kernel<false>;
  const bool two = mode == 2;
  cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kPbSmem);
  cudaFuncSetAttribute(probe_reference_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024);
  probe_fill_q_kernel<<<static_cast<unsigned>((qn + 255) / 256), 256>>>(q, qn);
  const float scale = 1.f / std::sqrt(128.f);
  struct Ctx {
    void (*kern)(const char*, const char*, int64_t, const int32_t*, const __nv_bfloat16*, int, int64_t, float, float*,
                 __nv_bfloat16*, int*);
    const char *k, *v;
    int64_t page_b;
    const int32_t* indices;
    const __nv_bfloat16* q;
    int n, G;
    int64_t total;
    float scale_log2;
    float* part;
    __nv_bfloat16* out;
    int* counters;
    bool two;
    float* out32;
    int batch;
  } ctx{kern, static_cast<const char*>(k), static_cast<const char*>(v), page_b, indices, q, n, G, total,
        scale * 1.4426950408889634f, part, out16, counters, two, out, batch};
  const double us = time_median_us(
      [](void* cv, int) {
        auto* x = static_cast<Ctx*>(cv);
        x->kern<<<x->G, 256, kPbSmem>>>(x->k, x->v, x->page_b, x->indices, x->q, x->n, x->total, x->scale_log2,
                                        x->part, x->out, x->counters);
        if (x->two)
          probe_merge_fast_kernel<<<dim3(static_cast<unsigned>(x->batch), 32), 128>>>(x->part, x->n, x->total, x->G,
                                                                                      x->out32);
      },
      &ctx, 4, 20);
  if (mode == 0) probe_merge_fast_kernel<<<dim3(static_cast<unsigned>(batch), 32), 128>>>(part, n, total, G, out);
  probe_reference_kernel<<<dim3(static_cast<unsigned>(batch), 32), 128, static_cast<size_t>(n) * 16 * 4>>>(
      static_cast<const char*>(k), static_cast<const char*>(v), page_b, indices, q, n, scale, ref);
  std::vector<float> ho(static_cast<size_t>(qn)), hr(static_cast<size_t>(qn));
  std::vector<__nv_bfloat16> h16(fused ? static_cast<size_t>(qn) : 0);
  bool ok = cudaDeviceSynchronize() == cudaSuccess &&
            cudaMemcpy(hr.data(), ref, sizeof(float) * qn, cudaMemcpyDeviceToHost) == cudaSuccess;
  if (ok && fused) {
    ok = cudaMemcpy(h16.data(), out16, 2 * qn, cudaMemcpyDeviceToHost) == cudaSuccess;
    for (int64_t i = 0; ok && i < qn; ++i) ho[static_cast<size_t>(i)] = __bfloat162float(h16[static_cast<size_t>(i)]);
  } else if (ok) {
    ok = cudaMemcpy(ho.data(), out, sizeof(float) * qn, cudaMemcpyDeviceToHost) == cudaSuccess;
  }
  if (ok) {
    double e = 0;
    for (size_t i = 0; i < ho.size(); ++i) {
      const double d = std::fabs(double(ho[i]) - double(hr[i]));
      e = std::isfinite(d) ? std::max(e, d) : 1e30;
    }
    *max_err = e;
  }
  (void)cudaGetLastError();
  cudaFree(q);
  cudaFree(out16);
  cudaFree(part);
  cudaFree(out);
  cudaFree(ref);
  cudaFree(counters);
  return ok ? double(total) * 2 * kPbPageBytes / (us * 1e-6) / 1e12 : 0;
}

namespace {
// Holds the GPU for about `ns` nanoseconds (one thread): a call enqueued behind it starts from a
// running stream, so the host's submission time is not in the call's event interval.
__global__ void hold_kernel(uint32_t ns) {
  const uint64_t t0 = globaltimer_ns();
  while (globaltimer_ns() - t0 < ns) __nanosleep(1000);
}

}  // namespace

double time_median_us(void (*fn)(void*, int), void* ctx, int warmup, int iters) {
  // --iters N (diagnostic): N timed calls instead of the caller's count, e.g. a loop long enough to
  // sample the clocks and power with nvidia-smi while it runs
  if (settings().iters > 0) iters = settings().iters;
  for (int i = 0; i < warmup; ++i) fn(ctx, i);
  cudaDeviceSynchronize();
  // --spaced-us N (diagnostic): every timed call on a device left idle for N us first,
  // enqueued behind a 300 us hold kernel; the median of those calls' event intervals against the
  // back-to-back loop's tells whether a call is slower when it follows calls of its own (clocks,
  // power, the previous call's tail) rather than idle time
  const int spaced_us = settings().spaced_us;
  if (spaced_us > 0) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    std::vector<float> t(static_cast<size_t>(iters));
    for (int i = 0; i < iters; ++i) {
      cudaDeviceSynchronize();
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spaced_us);
      while (std::chrono::steady_clock::now() < until) {
      }
      hold_kernel<<<1, 1>>>(300000);
      cudaEventRecord(a);
      fn(ctx, warmup + i);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      cudaEventElapsedTime(&t[static_cast<size_t>(i)], a, b);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2] * 1000.0;
  }
  // --loop-mean (diagnostic): the mean over one event pair around all the calls, with no event
  // between them — tells what the per-call events add to a kernel's interval
  if (settings().loop_mean) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a);
    for (int i = 0; i < iters; ++i) fn(ctx, warmup + i);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms * 1000.0 / iters;
  }
  std::vector<cudaEvent_t> ev(static_cast<size_t>(iters) + 1);
  for (auto& e : ev) cudaEventCreate(&e);
  cudaEventRecord(ev[0]);
  for (int i = 0; i < iters; ++i) {
    fn(ctx, warmup + i);
    cudaEventRecord(ev[static_cast<size_t>(i) + 1]);
  }
  cudaEventSynchronize(ev.back());
  std::vector<float> t(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]);
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2] * 1000.0;
}

double measure_copy_tbps(int64_t bytes) {
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    cudaFree(a);
    (void)cudaGetLastError();
    return 0;
  }
  cudaMemset(a, 1, bytes);
  struct Ctx { void *a, *b; int64_t n; } ctx{a, b, bytes};
  const double us = time_median_us(
      [](void* c, int) {
        auto* x = static_cast<Ctx*>(c);
        cudaMemcpyAsync(x->b, x->a, x->n, cudaMemcpyDeviceToDevice);
      },
      &ctx, 2, 10);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (us * 1e-6) / 1e12;
}

double measure_mma_tflops() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* out = nullptr;
  cudaMalloc(&out, 16);
  const int iters = 4096, blocks = sms * 4, threads = 256;
  struct Ctx { float* out; int blocks, threads, iters; } ctx{out, blocks, threads, iters};
  const double us = time_median_us(
      [](void* c, int) {
        auto* x = static_cast<Ctx*>(c);
        mma_peak_kernel<<<x->blocks, x->threads>>>(x->out, x->iters);
      },
      &ctx, 2, 5);
  cudaFree(out);
  const double flops = double(blocks) * (threads / 32) * iters * 8 * (2.0 * 16 * 8 * 16);
  return flops / (us * 1e-6) / 1e12;
}

namespace {
__global__ void empty_kernel() {}

// Thread 0 of every CTA spins `ns` nanoseconds of %globaltimer, then the CTA exits.
__global__ void spin_kernel(uint64_t ns) {
  if (threadIdx.x == 0) {
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0)::"memory");
    do {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    } while (t - t0 < ns);
  }
  __syncthreads();
}

constexpr int kFloorThreads = 128;  // CTA size of the launch-floor kernels (empty, spin)

}  // namespace

Settings& settings() {
  static Settings s;
  return s;
}

double measure_empty_launch_us(int ctas, int cluster) {
  struct Ctx { int ctas, cluster; } ctx{ctas, std::max(cluster, 1)};
  if (ctx.cluster > 1) {
    if (cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
  }
  return time_median_us(
      [](void* c, int) {
        auto* x = static_cast<Ctx*>(c);
        if (x->cluster <= 1) {
          empty_kernel<<<x->ctas, kFloorThreads>>>();
          return;
        }
        cudaLaunchAttribute at;
        const cudaLaunchConfig_t cfg = cluster_config(
            dim3(static_cast<unsigned>(x->cluster), static_cast<unsigned>(x->ctas / x->cluster), 1), x->cluster, 0, kFloorThreads, at);
        (void)cudaLaunchKernelEx(&cfg, empty_kernel);
      },
      &ctx, 10, 60);
}

double measure_spin_launch_us(int ctas, int cluster, int smem_bytes, double spin_us) {
  struct Ctx { int ctas, cluster, smem; uint64_t ns; } ctx{ctas, std::max(cluster, 1), std::max(smem_bytes, 0),
                                                          static_cast<uint64_t>(spin_us * 1e3)};
  if (cudaFuncSetAttribute(spin_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess ||
      cudaFuncSetAttribute(spin_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ctx.smem) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return time_median_us(
      [](void* c, int) {
        auto* x = static_cast<Ctx*>(c);
        cudaLaunchAttribute at;
        cudaLaunchConfig_t cfg = cluster_config(
            dim3(static_cast<unsigned>(x->cluster), static_cast<unsigned>(x->ctas / x->cluster), 1), x->cluster,
            static_cast<size_t>(x->smem), kFloorThreads, at);
        if (x->cluster <= 1) cfg.numAttrs = 0;
        (void)cudaLaunchKernelEx(&cfg, spin_kernel, x->ns);
      },
      &ctx, 10, 60);
}

}  // namespace kvattn::tools::cuda_bench
