// src/ops/cuda/merge_ops.cu — merge_attn_states and mask_empty_context_lse.
#include "ops/cuda/cuda_common.cuh"

#include <cmath>

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
    // prefix is skipped only where it is known unused (tokens past the context ones).  Plain
    // loads, not ld.global.cs: on the H200 the streaming hint (and L1::no_allocate alike) made
    // this kernel 5 % slower, 3.71 vs 3.90 TB/s at 8192 x 32 x 128 on an
    // H200); plain loads are also safe when out is the prefix or suffix (in place)
    const uint16_t* pp = static_cast<const uint16_t*>(p.prefix) + t * p.p_st + h * p.p_sh + d;
    const uint16_t* sp = static_cast<const uint16_t*>(p.suffix) + t * p.s_st + h * p.s_sh + d;
    const bool need_prefix = p.prefill_tokens_with_context < 0 || t < p.prefill_tokens_with_context;
    uint4 pv = make_uint4(0, 0, 0, 0);
    if (need_prefix) pv = *reinterpret_cast<const uint4*>(pp);
    const uint4 sv = *reinterpret_cast<const uint4*>(sp);
    const MergeW w = merge_weights(p, t, h);
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
    __stcs(reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + t * p.o_st + h * p.o_sh + d), ov);
    if (p.out_lse != nullptr && d == 0) p.out_lse[h * p.ol_sh + t * p.ol_st] = w.lse;
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

}  // namespace

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
