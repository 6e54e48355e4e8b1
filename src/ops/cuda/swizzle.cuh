// src/ops/cuda/swizzle.cuh — the shared-memory swizzle of the K / V / Q tiles that ldmatrix reads
// (paged_attention.cu's attn_kernel, prefill_kernel.cu, small_decode.cu).  Device code only,
// force-inlined: sharing it changes no kernel's code.
#pragma once

namespace kvattn::ops::cuda_impl::k {

// Swizzled byte offset of (row, 16-byte chunk) in a tile of CPR chunks per row: the 8 rows one
// ldmatrix reads at a fixed logical chunk land in 8 different bank groups (CPR >= 8; narrower
// rows XOR fewer bits, as many as a 128-byte line holds rows).
template <int CPR>
__device__ __forceinline__ int swz(int row, int chunk) {
  int x;
  if constexpr (CPR >= 8) x = row & 7;
  else if constexpr (CPR == 4) x = (row >> 1) & 3;
  else if constexpr (CPR == 2) x = (row >> 2) & 1;
  else x = 0;
  return row * (CPR * 16) + ((chunk ^ x) * 16);
}

}  // namespace kvattn::ops::cuda_impl::k
