// src/ops/cuda/page_tile.cuh — the math on one staged 16-slot chunk of 8 KV heads (K and V rows of
// 256 bytes, D 128, 16-bit), shared by the whole-page decode path (page_decode.cu) and the bench
// probe it grew from (bench_support.cu): the chunk's shared-memory layout, S = Q K^T for one KV
// head's 16-row tile, and O += P V.  Device code only; force-inlined (sharing changes no kernel's
// code: the PTX of both files is unchanged by the move).
#pragma once

#include <cstdint>

#include "ops/cuda/ptx.cuh"

namespace kvattn::ops::cuda_impl::k::page_tile {

constexpr int kHeads = 8;  // KV heads per staged chunk

// Shared-memory offset of (slot, KV head, 16-byte piece) in a staged chunk: 256-byte rows in
// (slot, head) order, pieces XOR-swizzled by slot so ldmatrix's 8 rows of one head (2 KB apart)
// fall in 8 different bank groups.
__device__ __forceinline__ uint32_t swz(int slot, int head, int piece) {
  return static_cast<uint32_t>(((slot * kHeads + head) << 8) + ((piece ^ (slot & 7)) << 4));
}

// sc = Q K^T for KV head w over the chunk's 16 keys (two n8 tiles), raw dot products; qf holds
// the tile's A fragments for the 8 k-steps of D 128.
template <bool BF16>
__device__ __forceinline__ void scores(float (&sc)[2][4], const uint32_t (&qf)[8][4], const unsigned char* tK, int w,
                                       int lane) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
    const int krow = 8 * j + (lane & 7);
#pragma unroll
    for (int ks = 0; ks < 8; ks += 2) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4(smem_u32(tK + swz(krow, w, 2 * ks + (lane >> 3))), b0, b1, b2, b3);
      mma16816<BF16>(sc[j], qf[ks], b0, b1);
      mma16816<BF16>(sc[j], qf[ks + 1], b2, b3);
    }
  }
}

// o += P V for KV head w: a holds P (16 rows x 16 keys) as one A fragment.
template <bool BF16>
__device__ __forceinline__ void accumulate_pv(float (&o)[16][4], const uint32_t (&a)[4], const unsigned char* tV, int w,
                                              int lane) {
  const int vrow = (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int nn = 0; nn < 16; nn += 2) {
    uint32_t b0, b1, b2, b3;
    ldsm_x4_t(smem_u32(tV + swz(vrow, w, nn + (lane >> 4))), b0, b1, b2, b3);
    mma16816<BF16>(o[nn], a, b0, b1);
    mma16816<BF16>(o[nn + 1], a, b2, b3);
  }
}

}  // namespace kvattn::ops::cuda_impl::k::page_tile
