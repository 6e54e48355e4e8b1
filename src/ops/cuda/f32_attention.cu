// src/ops/cuda/f32_attention.cu — paged attention over float32 K/V caches: SIMT, f32 math.
//
// The tensor-core kernels (paged_attention.cu, prefill_kernel.cu, ...) take 16-bit / fp8 K and V
// operands; a model that computes in float32 keeps float32 caches, and rounding them to 16 bits
// would cost the accuracy it runs in float32 for.  This kernel reads the f32 rows as they are and
// keeps every sum in f32.
//
// Work split: one warp per (query token, query head) row, head fastest, 4 warps per CTA (so the
// query heads of one GQA group mostly share a CTA and re-read the same K/V rows from L1/L2).
// Lane l holds head dims l, l + 32, ... (NPL = ceil(head_dim / 32) of them, rounded up to a power
// of two), so every K / V row load is 32 consecutive floats per step: coalesced.  The keys of the
// row's visible range [lo, hi) go in blocks of 32: lane i resolves key (block + i)'s page id,
// visibility (the full rule of paged_attention.h: causal, window, PrefixLM range, XQA mask) and
// K / V byte offsets once; the block is then consumed 4 keys at a time (offsets by shuffle, all 8
// row loads issued before the dot products, one 5-step butterfly per key), with an online
// softmax (running max m, running sum l, accumulator rescaled when m grows; each 32-key block
// sums into its own l / accumulator first, added to the row's at the block's end).  Chunks with no
// visible key are skipped; an invisible key inside a chunk re-reads a visible key's rows (valid
// memory) and gets weight 0, so no load depends on a branch.  The sink term joins at the end, as
// in the reference.  Rows of no request (>= qo_indptr[batch]) are not touched; a row that sees
// no key writes 0 and LSE -inf (or the sink's LSE).  Page ids outside [0, num_pages) (device
// index tensors are not range-checked by the host) skip their keys: never read.
//
// Cost, per row with L visible keys and head dim D: 4·D·L FLOPs (Q·K 2·D·L, P·V 2·D·L) plus ~6·L
// for the softmax (scale, cap, max, exp, sum) and 5 shuffles per key; 8·D·L bytes of K and V rows
// loaded (f32).  The rows of a GQA group (one token, adjacent heads, mostly one CTA) and the query
// rows of one request load the same K/V rows, which L1/L2 serve: HBM reads between one copy of
// each request's K/V per KV head and hq/hkv times the loads above.  About 0.5 FLOP per byte
// loaded: bound by load latency and L1/L2 bandwidth, not by arithmetic.  E.g. decode of 64
// requests x 4096 keys, 32 query / 8 KV heads, D 128: 8.6 GB loaded by the warps, 2.1 GB of it
// distinct (what the tensor-core paths read once, in half the bytes for bf16).  A correctness path
// for float32 models, not a fast path (not tuned, not timed).
#include "ops/cuda/f32_attention.h"

#include <atomic>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/routing.h"
#include "ops/cuda/softmax.cuh"

namespace kvattn::ops::cuda_impl::k {
namespace {

constexpr int kWarps = 4;   // warps (rows) per CTA
constexpr int kChunk = 4;   // keys per inner step
constexpr unsigned kFull = 0xffffffffu;

// The query row's place in its request and its PrefixLM range.
struct Row {
  int64_t tok, qpos, kv_len, q_len;
  int64_t mm_s, mm_e;  // -1: none
};

// detail::RowMask::visible (src/ops/common.h) for key j.
__device__ __forceinline__ bool visible(const AttnParams& p, const Row& R, int64_t j) {
  if (j < 0 || j >= R.kv_len) return false;
  if (p.window_left >= 0 && j < R.qpos - p.window_left) return false;
  if (p.xqa != nullptr && j >= R.kv_len - R.q_len) {
    const int64_t kk = j - (R.kv_len - R.q_len);
    const uint32_t w = static_cast<uint32_t>(p.xqa[R.tok * p.xqa_s0 + (kk >> 5) * p.xqa_s1]);
    return ((w >> (kk & 31)) & 1u) != 0;
  }
  if (!p.causal || j <= R.qpos) return true;
  return R.mm_s >= 0 && j >= R.mm_s && j <= R.mm_e;
}

__device__ __forceinline__ int64_t shfl64(int64_t x, int src) {
  return static_cast<int64_t>(__shfl_sync(kFull, static_cast<long long>(x), src));
}

template <int NPL>
__global__ void __launch_bounds__(kWarps * 32) f32_attn_kernel(const AttnParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= p.num_tokens * p.hq) return;  // warp-uniform
  const int64_t tok = row / p.hq;
  const int head = static_cast<int>(row - tok * p.hq);
  const int D = p.head_dim;

  // ---- the token's request: the last r with qo_indptr[r] <= tok ----
  int lo = 0, hi = p.batch + 1;  // first index with qo_indptr > tok
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (load_idx(p.qo_indptr, mid) <= tok) lo = mid + 1;
    else hi = mid;
  }
  const int r = lo - 1;
  if (r < 0 || r >= p.batch) return;  // a row of no request: untouched
  const RequestBounds b = load_request_bounds(p, r);
  if (tok < b.q_begin || tok >= b.q_end) return;
  Row R;
  R.tok = tok;
  R.kv_len = b.kv_len;
  R.q_len = b.q_end - b.q_begin;
  R.qpos = R.kv_len - R.q_len + (tok - b.q_begin);
  R.mm_s = R.mm_e = -1;
  if (p.mm != nullptr) {
    const int64_t s = p.mm[tok * p.mm_s0], e = p.mm[tok * p.mm_s0 + p.mm_s1];
    if (s >= 0 && e >= s) { R.mm_s = s; R.mm_e = e; }
  }
  // keys outside [jlo, jhi) are never visible (detail::RowMask::lo / hi)
  const int64_t jlo = p.window_left >= 0 ? max(int64_t(0), R.qpos - p.window_left) : int64_t(0);
  int64_t jhi = R.kv_len;
  if (p.xqa == nullptr && p.causal) {
    int64_t h = R.qpos + 1;
    if (R.mm_s >= 0 && R.mm_e + 1 > h) h = R.mm_e + 1;
    jhi = max(int64_t(0), min(h, R.kv_len));
  }

  // ---- the query row in registers ----
  float q[NPL], acc[NPL];
#pragma unroll
  for (int i = 0; i < NPL; ++i) {
    const int d = lane + 32 * i;
    q[i] = d < D ? load_elt(p.q, tok * p.q_st + int64_t(head) * p.q_sh + int64_t(d) * p.q_sd, p.q_t) : 0.f;
    acc[i] = 0.f;
  }
  const int kh = head / p.group;
  const char* kbase = static_cast<const char*>(p.k) + int64_t(kh) * p.k_sh;
  const char* vbase = static_cast<const char*>(p.v) + int64_t(kh) * p.v_sh;
  const Idx& pages = page_index(p);
  // m: running max of the scores so far.  l, acc: the sums of the finished 32-key blocks,
  // relative to m; lb, ab: the current block's, added at its end (two-level sums keep the
  // rounding error of long rows near that of 32 + L / 32 additions instead of L)
  float m = -INFINITY, l = 0.f;

  for (int64_t j0 = jlo; j0 < jhi; j0 += 32) {
    float lb = 0.f, ab[NPL];
#pragma unroll
    for (int i = 0; i < NPL; ++i) ab[i] = 0.f;
    const float m_prev = m;
    // lane i: key j0 + i's visibility and row offsets
    const int64_t j = j0 + lane;
    bool vis = j < jhi && visible(p, R, j);
    int64_t koff = 0, voff = 0;
    if (vis) {
      const int64_t blk = j / p.page_size, slot = j - blk * p.page_size;
      // device-resident index tensors are not range-checked by the host: a page-list entry past
      // kv_indices or a page id outside [0, num_pages) makes the key skipped, never read
      if (p.paged_form && (b.page_base + blk < 0 || b.page_base + blk >= p.kv_entries)) {
        vis = false;
      } else {
        const int64_t e = page_elem(p, b.page_base, r, static_cast<int>(blk));
        const int64_t page = pages.is64 ? static_cast<const int64_t*>(pages.ptr)[e]
                                        : int64_t(static_cast<const int32_t*>(pages.ptr)[e]);
        vis = page >= 0 && page < p.num_pages;
        koff = vis ? page * p.k_sb + slot * p.k_so : 0;
        voff = vis ? page * p.v_sb + slot * p.v_so : 0;
      }
    }
    const unsigned mask = __ballot_sync(kFull, vis);
    for (int c = 0; c < 32; c += kChunk) {
      const unsigned cm = (mask >> c) & ((1u << kChunk) - 1u);
      if (cm == 0) continue;  // warp-uniform
      const int first = c + __ffs(cm) - 1;
      const int64_t k0 = shfl64(koff, first), v0 = shfl64(voff, first);
      int64_t ko[kChunk], vo[kChunk];
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        const bool on = (cm >> u) & 1u;
        const int64_t a = shfl64(koff, c + u), bv = shfl64(voff, c + u);
        ko[u] = on ? a : k0;
        vo[u] = on ? bv : v0;
      }
      float kr[kChunk][NPL];
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        const float* kp = reinterpret_cast<const float*>(kbase + ko[u]);
#pragma unroll
        for (int i = 0; i < NPL; ++i) {
          const int d = lane + 32 * i;
          kr[u][i] = (NPL * 32 == D || d < D) ? kp[d] : 0.f;
        }
      }
      float s[kChunk];
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        float x = 0.f;
#pragma unroll
        for (int i = 0; i < NPL; ++i) x = fmaf(q[i], kr[u][i], x);
        s[u] = x;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
        for (int u = 0; u < kChunk; ++u) s[u] += __shfl_xor_sync(kFull, s[u], o);
      }
      float cmax = -INFINITY;
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        float x = s[u] * p.sm_scale;
        if (p.soft_cap > 0.f) x = p.soft_cap * tanhf(x / p.soft_cap);
        s[u] = ((cm >> u) & 1u) ? x : -INFINITY;
        cmax = fmaxf(cmax, s[u]);
      }
      const float mn = fmaxf(m, cmax);
      const float corr = expf(m - mn);  // 0 while m is -inf
      m = mn;
      lb *= corr;
      float w[kChunk];
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        w[u] = ((cm >> u) & 1u) ? expf(s[u] - mn) : 0.f;
        lb += w[u];
      }
#pragma unroll
      for (int i = 0; i < NPL; ++i) ab[i] *= corr;
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        const float* vp = reinterpret_cast<const float*>(vbase + vo[u]);
#pragma unroll
        for (int i = 0; i < NPL; ++i) {
          const int d = lane + 32 * i;
          if (NPL * 32 == D || d < D) ab[i] = fmaf(w[u], vp[d], ab[i]);
        }
      }
    }
    if (m != -INFINITY) {  // the block into the row's sums (warp-uniform)
      const float f = expf(m_prev - m);  // 0 while m_prev is -inf
      l = fmaf(l, f, lb);
#pragma unroll
      for (int i = 0; i < NPL; ++i) acc[i] = fmaf(acc[i], f, ab[i]);
    }
  }

  // ---- sink, normalisation, output and LSE ----
  if (p.sinks != nullptr) {
    const float sk = p.sinks[int64_t(head) * p.sinks_s];
    const float M = fmaxf(m, sk);
    if (M != -INFINITY) {
      const float f = m == -INFINITY ? 0.f : expf(m - M);
      l = l * f + expf(sk - M);
#pragma unroll
      for (int i = 0; i < NPL; ++i) acc[i] *= f;
      m = M;
    }
  }
  const float inv = l > 0.f ? p.v_scale / l : 0.f;
  const int64_t obase = tok * p.o_st + int64_t(head) * p.o_sh;
#pragma unroll
  for (int i = 0; i < NPL; ++i) {
    const int d = lane + 32 * i;
    if (d < D) store_elt(p.out, obase + int64_t(d) * p.o_sd, p.out_t, l > 0.f ? acc[i] * inv : 0.f);
  }
  if (p.lse != nullptr && lane == 0) {
    float lse = l > 0.f ? m + logf(l) : -INFINITY;  // natural log
    if (!p.lse_natural) lse *= kLog2e;
    p.lse[tok * p.lse_st + int64_t(head) * p.lse_sh] = lse;
  }
}

template <int NPL>
int launch_npl(const AttnParams& p) {
  const int64_t rows = p.num_tokens * p.hq;
  const int64_t grid = (rows + kWarps - 1) / kWarps;
  if (grid > 0x7fffffffLL) return static_cast<int>(cudaErrorInvalidConfiguration);
  f32_attn_kernel<NPL><<<static_cast<unsigned>(grid), kWarps * 32>>>(p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_f32_attention(const AttnParams& p) {
  if (p.kv_t != Elt::f32 || p.head_dim < 1 || p.head_dim > 512 || p.page_size < 1 || p.hkv < 1 || p.group < 1 ||
      p.hq != p.hkv * p.group)
    return static_cast<int>(cudaErrorInvalidValue);
  if (p.batch == 0 || p.num_tokens == 0 || p.hq == 0) return 0;
  const int npl = (p.head_dim + 31) / 32;
  const int e = npl <= 1   ? launch_npl<1>(p)
                : npl <= 2 ? launch_npl<2>(p)
                : npl <= 4 ? launch_npl<4>(p)
                : npl <= 8 ? launch_npl<8>(p)
                           : launch_npl<16>(p);
  if (e == 0) note_launch(KernelLaunch::f32);
  return e;
}

}  // namespace kvattn::ops::cuda_impl::k
