// src/ops/cuda/merge_ops.cu — merge_attn_states and mask_empty_context_lse.
#include "ops/cuda/cuda_common.cuh"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>

namespace kvattn::ops::cuda_impl::k {
namespace {

struct MergeW {
  float wp, ws, lse;
};

__device__ __forceinline__ MergeW merge_weights(const MergeParams& p, int64_t t, int64_t h) {
  MergeW w;
  float pl = p.prefix_lse[h * p.pl_sh + t * p.pl_st];
  float sl = p.suffix_lse[h * p.sl_sh + t * p.sl_st];
  const bool merge = p.prefill_tokens_with_context < 0 || t < p.prefill_tokens_with_context;
  if (!merge) {
    w.wp = 0.f; w.ws = 1.f; w.lse = sl;
    return w;
  }
  if (isinf(pl)) pl = -INFINITY;  // +inf: FA2's empty-sequence LSE
  if (isinf(sl)) sl = -INFINITY;
  const float m = fmaxf(pl, sl);
  if (m == -INFINITY) {
    w.wp = 1.f; w.ws = 0.f; w.lse = -INFINITY;
    return w;
  }
  const float ep = __expf(pl - m), es = __expf(sl - m);
  const float inv = 1.f / (ep + es);
  w.wp = ep * inv;
  w.ws = es * inv;
  w.lse = __logf(ep + es) + m;
  return w;
}

// merge_weights from LSEs already loaded (v2, which issues the LSE loads before the data
// loads); merge = false for tokens past prefill_tokens_with_context (the suffix alone).  The
// same arithmetic as merge_weights (kept separate so the default kernels' code is unchanged).
__device__ __forceinline__ MergeW merge_weights_of(bool merge, float pl, float sl) {
  MergeW w;
  if (!merge) {
    w.wp = 0.f; w.ws = 1.f; w.lse = sl;
    return w;
  }
  if (isinf(pl)) pl = -INFINITY;
  if (isinf(sl)) sl = -INFINITY;
  const float m = fmaxf(pl, sl);
  if (m == -INFINITY) {
    w.wp = 1.f; w.ws = 0.f; w.lse = -INFINITY;
    return w;
  }
  const float ep = __expf(pl - m), es = __expf(sl - m);
  const float inv = 1.f / (ep + es);
  w.wp = ep * inv;
  w.ws = es * inv;
  w.lse = __logf(ep + es) + m;
  return w;
}

__device__ __forceinline__ float merge_one(float po, float so, const MergeW& w) {
  if (w.ws == 0.f) return po * w.wp;
  if (w.wp == 0.f) return so * w.ws;
  return w.wp * po + w.ws * so;
}

// merge_one without branches (v2): the same three results (the general one contracted as the
// compiler contracts merge_one's: fma(wp, po, ws * so)), picked by two selects, so the v2
// kernels give the same bits; per-element branches made ptxas spill with 2 vectors per thread.
__device__ __forceinline__ float merge_one_sel(float po, float so, const MergeW& w) {
  const float a = po * w.wp, b = so * w.ws, c = __fmaf_rn(w.wp, po, b);
  return w.ws == 0.f ? a : (w.wp == 0.f ? b : c);
}

// The 8 elements of one 16-byte prefix / suffix vector pair merged into one 16-byte output vector.
template <bool BF16>
__device__ __forceinline__ uint4 merge8(const uint4& pv, const uint4& sv, const MergeW& w) {
  const uint16_t* pe = reinterpret_cast<const uint16_t*>(&pv);
  const uint16_t* se = reinterpret_cast<const uint16_t*>(&sv);
  uint4 ov;
  uint32_t* ow = reinterpret_cast<uint32_t*>(&ov);
#pragma unroll
  for (int e = 0; e < 8; e += 2) {
    const float p0 = BF16 ? bf16_bits_to_f32(pe[e]) : f16_bits_to_f32(pe[e]);
    const float p1 = BF16 ? bf16_bits_to_f32(pe[e + 1]) : f16_bits_to_f32(pe[e + 1]);
    const float s0 = BF16 ? bf16_bits_to_f32(se[e]) : f16_bits_to_f32(se[e]);
    const float s1 = BF16 ? bf16_bits_to_f32(se[e + 1]) : f16_bits_to_f32(se[e + 1]);
    const float o0 = merge_one(p0, s0, w), o1 = merge_one(p1, s1, w);
    // hardware round-to-nearest-even pack (same bits as kvattn's software conversion)
    if constexpr (BF16) {
      __nv_bfloat162 h = __floats2bfloat162_rn(o0, o1);
      ow[e / 2] = *reinterpret_cast<uint32_t*>(&h);
    } else {
      __half2 h = __floats2half2_rn(o0, o1);
      ow[e / 2] = *reinterpret_cast<uint32_t*>(&h);
    }
  }
  return ov;
}

// v2's merge8: the same bits from the packed words (bf16: the 16-bit pattern shifted into the
// high half, as bf16_bits_to_f32; f16: the hardware conversion, exact like the software one),
// merge_one_sel, so no value is split into 16-bit registers and no branch is taken per element.
template <bool BF16>
__device__ __forceinline__ float2 unpack2(uint32_t x) {
  if constexpr (BF16) {
    return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
  } else {
    __half2 h;
    *reinterpret_cast<uint32_t*>(&h) = x;
    return __half22float2(h);
  }
}

template <bool BF16>
__device__ __forceinline__ uint32_t merge2w(uint32_t pw, uint32_t sw, const MergeW& w) {
  const float2 pf = unpack2<BF16>(pw), sf = unpack2<BF16>(sw);
  const float o0 = merge_one_sel(pf.x, sf.x, w), o1 = merge_one_sel(pf.y, sf.y, w);
  if constexpr (BF16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(o0, o1);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __half2 h = __floats2half2_rn(o0, o1);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

template <bool BF16>
__device__ __forceinline__ uint4 merge8w(const uint4& pv, const uint4& sv, const MergeW& w) {
  return make_uint4(merge2w<BF16>(pv.x, sv.x, w), merge2w<BF16>(pv.y, sv.y, w), merge2w<BF16>(pv.z, sv.z, w),
                    merge2w<BF16>(pv.w, sv.w, w));
}

// 16-byte evict-first load (ld.global.cs, as __ldcs) when pred, zeros otherwise, without a branch.
__device__ __forceinline__ uint4 ldcs16_if(const void* q, bool pred) {
  uint4 v;
  asm(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %5, 0;\n\t"
      "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
      "@p ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(q), "r"(static_cast<int>(pred)));
  return v;
}

// 16-bit in and out, head dims contiguous: one thread per 8 elements (16-byte loads).
template <bool BF16>
__global__ void merge_vec16(MergeParams p) {
  const int64_t vpr = p.head_dim / 8;  // vectors per (t, h)
  const int64_t total = p.num_tokens * p.num_heads * vpr;
  const bool small = total < (int64_t(1) << 31);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t t, h, d;
    if (small) {  // 32-bit index math
      const uint32_t i32 = static_cast<uint32_t>(i), v = static_cast<uint32_t>(vpr);
      const uint32_t row = i32 / v, H = static_cast<uint32_t>(p.num_heads);
      const uint32_t t32 = row / H;
      t = t32; h = row - t32 * H; d = int64_t(i32 - row * v) * 8;
    } else {
      const int64_t row = i / vpr;
      d = (i - row * vpr) * 8;
      t = row / p.num_heads;
      h = row - t * p.num_heads;
    }
    // data loads first (independent of the LSEs, so both are in flight together); the
    // prefix is skipped only where it is known unused (tokens past the context ones)
    const uint16_t* pp = static_cast<const uint16_t*>(p.prefix) + t * p.p_st + h * p.p_sh + d;
    const uint16_t* sp = static_cast<const uint16_t*>(p.suffix) + t * p.s_st + h * p.s_sh + d;
    const bool need_prefix = p.prefill_tokens_with_context < 0 || t < p.prefill_tokens_with_context;
    uint4 pv = make_uint4(0, 0, 0, 0);
    if (need_prefix) pv = __ldcs(reinterpret_cast<const uint4*>(pp));
    const uint4 sv = __ldcs(reinterpret_cast<const uint4*>(sp));
    const MergeW w = merge_weights(p, t, h);
    const uint4 ov = merge8<BF16>(pv, sv, w);
    __stcs(reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + t * p.o_st + h * p.o_sh + d), ov);
    if (p.out_lse != nullptr && d == 0) p.out_lse[h * p.ol_sh + t * p.ol_st] = w.lse;
  }
}

// v2 (KVATTN_MERGE_V2 = 1/2/3; see launch_merge_attn_states): the same function on the same
// 16-bit dim-contiguous rows, laid out for more bytes in flight per SM at full occupancy.
// blockDim = (tpr, ry): tpr = head_dim / (8 VPT) threads per (token, head) row, ry rows per CTA.
// A thread owns VPT vectors of one row, tpr * 8 elements apart, so each load instruction of a
// warp still covers whole rows contiguously; the two LSE loads and then all 2 VPT data loads are
// issued before any arithmetic, and the LSE weights are computed once per VPT vectors.  One piece
// of one row per thread, no loop (a full grid: sessions 3/5 measured persistent / grid-stride
// variants slower).  Row indices
// are 32-bit (the launcher requires num_tokens * num_heads < 2^31); MINB keeps the registers
// at the budget of MINB CTAs of 256 threads per SM (8: 32 registers, all 2048 threads).
template <bool BF16, int VPT, int MINB>
__global__ void __launch_bounds__(256, MINB) merge_rows16(const __grid_constant__ MergeParams p) {
  const uint32_t rows = static_cast<uint32_t>(p.num_tokens * p.num_heads);
  const uint32_t row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  const uint32_t H = static_cast<uint32_t>(p.num_heads);
  const uint32_t t = row / H, h = row - t * H;
  const uint32_t d = threadIdx.x * 8, dstep = blockDim.x * 8;
  // 32-bit element offsets, one for prefix, suffix and out and one for the three LSEs (the
  // launcher requires equal strides and offsets < 2^31), so few registers are live while the
  // data is in flight (0 B spill at MINB 8); the prefix is loaded only where it is used
  const bool with_prefix = p.prefill_tokens_with_context < 0 || int64_t(t) < p.prefill_tokens_with_context;
  const uint32_t lo = h * static_cast<uint32_t>(p.sl_sh) + t * static_cast<uint32_t>(p.sl_st);
  const uint32_t off = t * static_cast<uint32_t>(p.s_st) + h * static_cast<uint32_t>(p.s_sh) + d;
  const uint16_t* pp = static_cast<const uint16_t*>(p.prefix) + off;
  const uint16_t* sp = static_cast<const uint16_t*>(p.suffix) + off;
  const float pl = p.prefix_lse[lo], sl = p.suffix_lse[lo];
  uint4 pv[VPT], sv[VPT];
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    pv[j] = ldcs16_if(pp + j * dstep, with_prefix);
    sv[j] = __ldcs(reinterpret_cast<const uint4*>(sp + j * dstep));
  }
  const MergeW w = merge_weights_of(with_prefix, pl, sl);
  if (p.out_lse != nullptr && threadIdx.x == 0) p.out_lse[lo] = w.lse;
  uint16_t* op = static_cast<uint16_t*>(p.out) + off;
#pragma unroll
  for (int j = 0; j < VPT; ++j) __stcs(reinterpret_cast<uint4*>(op + j * dstep), merge8w<BF16>(pv[j], sv[j], w));
}

__global__ void merge_generic(MergeParams p) {
  const int64_t total = p.num_tokens * p.num_heads * p.head_dim;
  const bool fp8 = p.out_t == Elt::e4m3 || p.out_t == Elt::e5m2;
  const float oscale = (fp8 && p.output_scale != nullptr) ? *p.output_scale : 1.f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / p.head_dim, d = i - row * p.head_dim;
    const int64_t t = row / p.num_heads, h = row - t * p.num_heads;
    const MergeW w = merge_weights(p, t, h);
    const float po = w.wp != 0.f ? load_elt(p.prefix, t * p.p_st + h * p.p_sh + d * p.p_sd, p.in_t) : 0.f;
    const float so = w.ws != 0.f ? load_elt(p.suffix, t * p.s_st + h * p.s_sh + d * p.s_sd, p.in_t) : 0.f;
    float o = merge_one(po, so, w);
    if (fp8) o /= oscale;
    store_elt(p.out, t * p.o_st + h * p.o_sh + d * p.o_sd, p.out_t, o);
    if (p.out_lse != nullptr && d == 0) p.out_lse[h * p.ol_sh + t * p.ol_st] = w.lse;
  }
}

__global__ void mask_empty_kernel(float* lse, int64_t l_sh, int64_t l_st, int64_t H, Idx qsl, Idx csl) {
  const int64_t r = blockIdx.x;
  if (load_idx(csl, r) != load_idx(csl, r + 1)) return;
  const int64_t b = load_idx(qsl, r), e = load_idx(qsl, r + 1);
  const int64_t n = (e - b) * H;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t h = i / (e - b), t = b + i % (e - b);
    lse[h * l_sh + t * l_st] = -INFINITY;
  }
}

int grid_for(int64_t total, int threads) {
  int64_t b = (total + threads - 1) / threads;
  if (b > 65535LL * 16) b = 65535LL * 16;
  return static_cast<int>(b < 1 ? 1 : b);
}

// merge_rows16's assumptions (on top of the 16-bit vector path's): the row splits into VPT-vector
// pieces of at most 256 threads; prefix, suffix and out share their token and head strides, the
// LSEs (and out LSE) theirs; all strides non-negative and every element offset < 2^31 (32-bit
// offsets); fewer than 2^31 rows.
bool rows16_fits(const MergeParams& p, int vpt) {
  const int64_t vpr = p.head_dim / 8, lim = int64_t(1) << 31;
  if (vpr % vpt != 0 || vpr / vpt > 256) return false;
  if (p.p_st != p.s_st || p.o_st != p.s_st || p.p_sh != p.s_sh || p.o_sh != p.s_sh) return false;
  if (p.pl_st != p.sl_st || p.pl_sh != p.sl_sh) return false;
  if (p.out_lse != nullptr && (p.ol_st != p.sl_st || p.ol_sh != p.sl_sh)) return false;
  if (p.s_st < 0 || p.s_sh < 0 || p.sl_st < 0 || p.sl_sh < 0) return false;
  const int64_t T = p.num_tokens, H = p.num_heads;
  if (T * H >= lim) return false;
  // the largest offsets (products checked against lim by division first: no overflow)
  auto fits = [&](int64_t st, int64_t sh, int64_t extra) {
    if (st != 0 && T - 1 > lim / st) return false;
    if (sh != 0 && H - 1 > lim / sh) return false;
    return (T - 1) * st + (H - 1) * sh + extra < lim;
  };
  return fits(p.s_st, p.s_sh, p.head_dim) && fits(p.sl_st, p.sl_sh, 1);
}

// Dynamic shared memory (unused by the kernel) that leaves room for at most `cap` CTAs per SM
// (4..7; anything else: none), for the occupancy A/B of the v2 kernels.
size_t smem_for_cap(int cap) {
  if (cap < 4 || cap > 7) return 0;
  int dev = 0, per_sm = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess)
    return 0;
  // (cap + 1) CTAs of s + 1 KB (the per-CTA reservation) exceed the SM's shared memory, cap fit
  const int64_t s = per_sm / (cap + 1) - 1024 + 1;
  return s > 0 && s <= 48 * 1024 ? static_cast<size_t>(s) : 0;
}

template <int VPT, int MINB>
void launch_rows16(const MergeParams& p, int cap) {
  const int64_t tpr = p.head_dim / (8 * VPT);
  const int64_t ry = std::max<int64_t>(1, 256 / tpr);
  const dim3 block(static_cast<unsigned>(tpr), static_cast<unsigned>(ry));
  const unsigned grid = static_cast<unsigned>((p.num_tokens * p.num_heads + ry - 1) / ry);
  const size_t smem = smem_for_cap(cap);
  if (p.in_t == Elt::bf16) merge_rows16<true, VPT, MINB><<<grid, block, smem>>>(p);
  else merge_rows16<false, VPT, MINB><<<grid, block, smem>>>(p);
}

int env_int(const char* name, int lo, int hi) {
  const char* e = std::getenv(name);
  return e != nullptr ? std::clamp(std::atoi(e), lo, hi) : 0;
}
int merge_v2_env() {
  static const int v = env_int("KVATTN_MERGE_V2", 0, 3);
  return v;
}
int merge_v2_ctas_env() {
  static const int v = env_int("KVATTN_MERGE_V2_CTAS", 0, 8);
  return v;
}

std::atomic<int> g_merge_v2{-1}, g_merge_v2_ctas{-1};  // the setters' overrides; -1 = the environment

}  // namespace

void set_merge_v2(int v) { g_merge_v2.store(v < 0 ? -1 : std::min(v, 3)); }

int merge_v2() {
  const int v = g_merge_v2.load();
  return v >= 0 ? v : merge_v2_env();
}

void set_merge_v2_ctas(int n) { g_merge_v2_ctas.store(n < 0 ? -1 : std::min(n, 8)); }

int merge_v2_ctas() {
  const int v = g_merge_v2_ctas.load();
  return v >= 0 ? v : merge_v2_ctas_env();
}

int launch_merge_attn_states(const MergeParams& p) {
  if (p.num_tokens == 0 || p.num_heads == 0 || p.head_dim == 0) return 0;
  const int threads = 256;
  const bool same16 = (p.in_t == Elt::bf16 || p.in_t == Elt::f16) && p.out_t == p.in_t;
  auto al = [](const void* q, int64_t a, int64_t b) {
    return (reinterpret_cast<uintptr_t>(q) & 15u) == 0 && (a * 2) % 16 == 0 && (b * 2) % 16 == 0;
  };
  const bool vec = same16 && p.head_dim % 8 == 0 && p.o_sd == 1 && p.p_sd == 1 && p.s_sd == 1 &&
                   al(p.out, p.o_st, p.o_sh) && al(p.prefix, p.p_st, p.p_sh) && al(p.suffix, p.s_st, p.s_sh);
  // v2 (default off): 1 = two vectors per thread, 2 = four, 3 = one (the v2 row layout only).
  // It needs what merge_rows16 assumes; anything else keeps the kernels below.
  const int v2 = merge_v2();
  const int vpt = v2 == 1 ? 2 : v2 == 2 ? 4 : 1;
  if (vec && v2 != 0 && rows16_fits(p, vpt)) {
    const int cap = merge_v2_ctas();
    if (vpt == 2) launch_rows16<2, 8>(p, cap);
    else if (vpt == 4) launch_rows16<4, 4>(p, cap);
    else launch_rows16<1, 8>(p, cap);
  } else if (vec) {
    const int grid = grid_for(p.num_tokens * p.num_heads * (p.head_dim / 8), threads);
    if (p.in_t == Elt::bf16) merge_vec16<true><<<grid, threads>>>(p);
    else merge_vec16<false><<<grid, threads>>>(p);
  } else {
    merge_generic<<<grid_for(p.num_tokens * p.num_heads * p.head_dim, threads), threads>>>(p);
  }
  return static_cast<int>(cudaGetLastError());
}

int launch_mask_empty_context_lse(float* lse, int64_t l_sh, int64_t l_st, int64_t num_heads, int64_t num_tokens,
                                  Idx qsl, Idx csl, int64_t num_reqs) {
  (void)num_tokens;
  if (num_reqs <= 0) return 0;
  mask_empty_kernel<<<static_cast<unsigned>(num_reqs), 256>>>(lse, l_sh, l_st, num_heads, qsl, csl);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvattn::ops::cuda_impl::k
