// src/ops/cuda/merge_ops.cu — merge_attn_states and mask_empty_context_lse.
#include "ops/cuda/cuda_common.cuh"

#include <atomic>
#include <cmath>
#include <algorithm>
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

__device__ __forceinline__ float merge_one(float po, float so, const MergeW& w) {
  if (w.ws == 0.f) return po * w.wp;
  if (w.wp == 0.f) return so * w.ws;
  return w.wp * po + w.ws * so;
}

// 16-byte loads of the vector merge: LD 0 = ld.global.cs (evict-first), LD 1 = read-only path
// without L1 allocation and a 256-byte L2 prefetch (ld.global.nc.L1::no_allocate.L2::256B).
template <int LD>
__device__ __forceinline__ uint4 ld16(const void* q) {
  if constexpr (LD == 0) {
    return __ldcs(reinterpret_cast<const uint4*>(q));
  } else {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(q));
    return v;
  }
}

// 16-bit in and out, head dims contiguous: one thread per 8 elements (16-byte loads), U
// vectors per thread and loop step (all data loads of a step issued before the first use),
// grid-stride (the launcher picks a full grid or a persistent one).
template <bool BF16, int LD, int U>
__global__ void merge_vec16(MergeParams p) {
  const int64_t vpr = p.head_dim / 8;  // vectors per (t, h)
  const int64_t total = p.num_tokens * p.num_heads * vpr;
  const bool small = total < (int64_t(1) << 31);
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i0 < total; i0 += step * U) {
    int64_t t[U], h[U], d[U];
    uint4 pv[U], sv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = min(i0 + u * step, total - 1);  // duplicates of the last vector write the same bytes
      if (small) {  // 32-bit index math
        const uint32_t i32 = static_cast<uint32_t>(i), v = static_cast<uint32_t>(vpr);
        const uint32_t row = i32 / v, H = static_cast<uint32_t>(p.num_heads);
        const uint32_t t32 = row / H;
        t[u] = t32; h[u] = row - t32 * H; d[u] = int64_t(i32 - row * v) * 8;
      } else {
        const int64_t row = i / vpr;
        d[u] = (i - row * vpr) * 8;
        t[u] = row / p.num_heads;
        h[u] = row - t[u] * p.num_heads;
      }
      // data loads first (independent of the LSEs, so both are in flight together); the
      // prefix is skipped only where it is known unused (tokens past the context ones)
      const uint16_t* pp = static_cast<const uint16_t*>(p.prefix) + t[u] * p.p_st + h[u] * p.p_sh + d[u];
      const uint16_t* sp = static_cast<const uint16_t*>(p.suffix) + t[u] * p.s_st + h[u] * p.s_sh + d[u];
      const bool need_prefix = p.prefill_tokens_with_context < 0 || t[u] < p.prefill_tokens_with_context;
      pv[u] = make_uint4(0, 0, 0, 0);
      if (need_prefix) pv[u] = ld16<LD>(pp);
      sv[u] = ld16<LD>(sp);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u > 0 && i0 + u * step >= total) break;
      const MergeW w = merge_weights(p, t[u], h[u]);
      const uint16_t* pe = reinterpret_cast<const uint16_t*>(&pv[u]);
      const uint16_t* se = reinterpret_cast<const uint16_t*>(&sv[u]);
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
          __nv_bfloat162 hh = __floats2bfloat162_rn(o0, o1);
          ow[e / 2] = *reinterpret_cast<uint32_t*>(&hh);
        } else {
          __half2 hh = __floats2half2_rn(o0, o1);
          ow[e / 2] = *reinterpret_cast<uint32_t*>(&hh);
        }
      }
      __stcs(reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + t[u] * p.o_st + h[u] * p.o_sh + d[u]), ov);
      if (p.out_lse != nullptr && d[u] == 0) p.out_lse[h[u] * p.ol_sh + t[u] * p.ol_st] = w.lse;
    }
  }
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

// Vector-merge variants (see set_merge_variant in kernels.h).
std::atomic<int> g_merge_variant{-1};
int merge_variant_now() {
  int v = g_merge_variant.load(std::memory_order_relaxed);
  if (v >= 0) return v;
  v = 0;
  if (const char* e = std::getenv("KVATTN_MERGE_V")) v = std::atoi(e);
  if (v < 0 || v > 4) v = 0;
  g_merge_variant.store(v, std::memory_order_relaxed);
  return v;
}

int sm_count_now() {
  static int cache[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  int& c = cache[dev & 63];
  if (c == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
      (void)cudaGetLastError();
      n = 1;
    }
    c = n;
  }
  return c;
}

template <bool BF16>
void launch_vec16(const MergeParams& p, int variant) {
  const int threads = 256;
  const int64_t total = p.num_tokens * p.num_heads * (p.head_dim / 8);
  const int full = grid_for(total, threads);
  const int persistent = std::min(full, sm_count_now() * (2048 / threads));
  switch (variant) {
    case 1: merge_vec16<BF16, 1, 1><<<full, threads>>>(p); break;
    case 2: merge_vec16<BF16, 0, 1><<<persistent, threads>>>(p); break;
    case 3: merge_vec16<BF16, 1, 1><<<persistent, threads>>>(p); break;
    case 4: merge_vec16<BF16, 1, 2><<<persistent, threads>>>(p); break;
    default: merge_vec16<BF16, 0, 1><<<full, threads>>>(p); break;
  }
}

}  // namespace

void set_merge_variant(int v) { g_merge_variant.store(v >= 0 && v <= 4 ? v : 0, std::memory_order_relaxed); }
int merge_variant() { return merge_variant_now(); }

int launch_merge_attn_states(const MergeParams& p) {
  if (p.num_tokens == 0 || p.num_heads == 0 || p.head_dim == 0) return 0;
  const int threads = 256;
  const bool same16 = (p.in_t == Elt::bf16 || p.in_t == Elt::f16) && p.out_t == p.in_t;
  auto al = [](const void* q, int64_t a, int64_t b) {
    return (reinterpret_cast<uintptr_t>(q) & 15u) == 0 && (a * 2) % 16 == 0 && (b * 2) % 16 == 0;
  };
  const bool vec = same16 && p.head_dim % 8 == 0 && p.o_sd == 1 && p.p_sd == 1 && p.s_sd == 1 &&
                   al(p.out, p.o_st, p.o_sh) && al(p.prefix, p.p_st, p.p_sh) && al(p.suffix, p.s_st, p.s_sh);
  if (vec) {
    if (p.in_t == Elt::bf16) launch_vec16<true>(p, merge_variant_now());
    else launch_vec16<false>(p, merge_variant_now());
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
