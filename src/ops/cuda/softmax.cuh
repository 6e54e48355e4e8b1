// src/ops/cuda/softmax.cuh — what every attention kernel's online softmax shares: the base-2
// constants (scores are scaled by log2(e) once, so the softmax runs on exp2, and LSE converts back
// to the natural log by ln 2), the MUFU exp2, a row's sum over its quad of lanes and the attention
// sink folded into a finished row.
// Device code only, force-inlined: sharing it changes no kernel's code.
#pragma once

namespace kvattn::ops::cuda_impl::k {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// 2^x by MUFU.EX2 with flush to zero (relative error ~2^-22; -inf -> +0).  Results below 2^-126
// are flushed: every softmax result is a probability P stored in 16 bits (f16's smallest
// subnormal is 2^-24) or a rescale factor, so a flushed 2^-126 changes nothing that is stored.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The sum of x over the 4 lanes of a quad (lanes 4g .. 4g + 3), which hold the columns of one
// accumulator row in the mma.sync / wgmma fragment layouts: a row's softmax sum, every lane.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// A row's attention sink folded into its finished softmax (base 2): from the row's running max M
// (Mu: the max its accumulator was scaled by, 0 for an empty row) and sum L, with the sink's score
// s2 (log2 units), the new max Mf and sum Lf (for the LSE) and the output's scale; an empty row
// (M = -inf) writes zeros.  (The Hopper prefill kernel keeps its own copy of these lines: called
// there, the helper changes its machine code, which a GPU run would have to measure.)
__device__ __forceinline__ float fold_sink(float M, float Mu, float L, float s2, float& Mf, float& Lf) {
  Mf = fmaxf(M, s2);
  Lf = L * exp2f(M - Mf) + exp2f(s2 - Mf);
  float scale_o = Lf > 0.f ? exp2f(Mu - Mf) / Lf : 0.f;
  if (M == -INFINITY) scale_o = 0.f;
  return scale_o;
}

}  // namespace kvattn::ops::cuda_impl::k
