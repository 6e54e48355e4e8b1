// src/ops/cuda/attention_merge.cuh — the split merge of attn_kernel's general path: the partial (O, LSE) of a
// split request's pieces combined with the sink term into out and LSE (paged_attention.cu's
// step 3; counter and stream-K forms).  Device code for paged_attention.cu, in its anonymous
// namespace.
#pragma once

#include "ops/cuda/attention_kernel.cuh"

namespace kvattn::ops::cuda_impl::k {
namespace {

// Combine the splits of split requests: one warp per (token, qo head); lane s holds split
// s's LSE (and s + 32, ...).  Two dependent round trips: the token's split count, then every
// LSE and (for <= kMergeRegSplits splits, D <= 128) every partial O vector at once — lane l
// holds dims 4l..4l+3 of each split (walking the dims in 4 serial rounds after the LSEs took
// ~10-13 us for 128 x 4096 in the decode timeline).
constexpr int kMergeRegSplits = 8;
// SK (stream-K decode): plan.tok_splits is the per-(token, qo head) piece-count map.
template <bool SK = false>
__device__ __forceinline__ void merge_splits_body(const AttnParams& p, const Plan& plan, float kv_out_factor) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= p.num_tokens * p.hq) return;
  const int64_t tok = row / p.hq;
  const int head = static_cast<int>(row % p.hq);
  const int ns = plan.tok_splits[SK ? row : tok];  // stream-K: the (token, qo head) map
  if (ns <= 1) return;
  const int64_t stride = p.num_tokens * p.hq;  // between splits
  const int64_t base = tok * p.hq + head;
  const bool in_regs = ns <= kMergeRegSplits && p.head_dim <= 128;
  const int d4 = 4 * lane;
  float4 v[kMergeRegSplits];
  if (in_regs && d4 < p.head_dim) {
#pragma unroll
    for (int s = 0; s < kMergeRegSplits; ++s)
      if (s < ns) v[s] = __ldcg(reinterpret_cast<const float4*>(plan.part_o + (s * stride + base) * p.head_dim + d4));
  }
  constexpr int kMaxPerLane = 4;  // up to 128 splits
  float ls[kMaxPerLane];
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int s = lane + 32 * k;
    ls[k] = s < ns ? plan.part_lse[s * stride + base] : -INFINITY;
  }
  float M = -INFINITY;
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) M = fmaxf(M, ls[k]);
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  float s2 = -INFINITY;
  if (p.sinks != nullptr) s2 = p.sinks[int64_t(head) * p.sinks_s] * kLog2e;
  const float Mf = fmaxf(M, s2);
  const float Mu = (Mf == -INFINITY) ? 0.f : Mf;
  __shared__ float s_w[8][128];  // blockDim 256 = 8 warps, up to 128 splits
  float* sw = s_w[(threadIdx.x >> 5) & 7];
  float denom = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const float w = exp2f(ls[k] - Mu);
    if (lane + 32 * k < 128) sw[lane + 32 * k] = w;
    denom += w;
  }
  __syncwarp();
  for (int o = 16; o > 0; o >>= 1) denom += __shfl_xor_sync(0xffffffffu, denom, o);
  if (p.sinks != nullptr) denom += exp2f(s2 - Mu);
  const float lse2 = denom > 0.f ? Mu + log2f(denom) : -INFINITY;
  const float inv = (denom > 0.f && M != -INFINITY) ? p.v_scale * kv_out_factor / denom : 0.f;
  const int64_t ob = tok * p.o_st + int64_t(head) * p.o_sh;
  if (in_regs) {
    if (d4 < p.head_dim) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int s = 0; s < kMergeRegSplits; ++s) {
        if (s < ns) {
          const float w = sw[s];
          acc.x += w * v[s].x; acc.y += w * v[s].y; acc.z += w * v[s].z; acc.w += w * v[s].w;
        }
      }
      store_elt(p.out, ob + int64_t(d4) * p.o_sd, p.out_t, acc.x * inv);
      store_elt(p.out, ob + int64_t(d4 + 1) * p.o_sd, p.out_t, acc.y * inv);
      store_elt(p.out, ob + int64_t(d4 + 2) * p.o_sd, p.out_t, acc.z * inv);
      store_elt(p.out, ob + int64_t(d4 + 3) * p.o_sd, p.out_t, acc.w * inv);
    }
  } else {
    // many splits or D 256: dims in rounds of 32 (every split wrote its partial, zeros when
    // empty, so the loads are unconditional and independent)
    for (int d0 = 0; d0 < p.head_dim; d0 += 32) {
      const int d = d0 + lane;
      float acc = 0.f;
#pragma unroll 8
      for (int s = 0; s < ns; ++s) acc += sw[s] * plan.part_o[(s * stride + base) * p.head_dim + d];
      store_elt(p.out, ob + int64_t(d) * p.o_sd, p.out_t, acc * inv);
    }
  }
  if (lane == 0 && p.lse != nullptr)
    p.lse[tok * p.lse_st + int64_t(head) * p.lse_sh] = p.lse_natural ? lse2 * kLn2 : lse2;
}
__global__ void merge_splits_kernel(AttnParams p, Plan plan, float kv_out_factor) {
  if (p.kv_t == Elt::e4m3) kv_out_factor = kE4m3Factor;  // same factor as the attention kernel
  if (plan.tl != nullptr && threadIdx.x == 0) atomicMin(reinterpret_cast<unsigned long long*>(plan.tl + 2), gtimer());
  merge_splits_body(p, plan, kv_out_factor);
  if (plan.tl != nullptr) {
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned long long*>(plan.tl + 3), gtimer());
  }
}
__global__ void merge_streamk_kernel(AttnParams p, Plan plan, float kv_out_factor) {
  if (p.kv_t == Elt::e4m3) kv_out_factor = kE4m3Factor;
  merge_splits_body<true>(p, plan, kv_out_factor);
}

}  // namespace
}  // namespace kvattn::ops::cuda_impl::k
