// src/ops/cuda/softmax.cuh — what every attention kernel's online softmax shares: the base-2
// constants (scores are scaled by log2(e) once, so the softmax runs on exp2, and LSE converts back
// to the natural log by ln 2) and the MUFU exp2.  Device code only, force-inlined: sharing it
// changes no kernel's code.
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

}  // namespace kvattn::ops::cuda_impl::k
