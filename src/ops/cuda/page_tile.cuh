// src/ops/cuda/page_tile.cuh — the math on one staged 16-slot chunk of H KV heads (K and V rows of
// 256 bytes, D 128, 16-bit; H = 8, or 4 where a CTA stages half of each chunk's heads), shared by
// the whole-page decode path (page_decode.cu) and the bench probe it grew from (bench_support.cu):
// S = Q K^T for one KV head's 16-row tile and O += P V, and the transposed forms for tiles of
// <= 8 rows.  Device code only; force-inlined.
#pragma once

#include <cstdint>

#include "ops/cuda/page_tile_layout.h"
#include "ops/cuda/ptx.cuh"

namespace kvattn::ops::cuda_impl::k::page_tile {

// The chunk's layout (swz) and every lane's ldmatrix row address: page_tile_layout.h.

// sc = Q K^T for KV head w over the chunk's 16 keys (two n8 tiles), raw dot products; qf holds
// the tile's A fragments for the 8 k-steps of D 128.
template <bool BF16, int H = kHeads>
__device__ __forceinline__ void scores(float (&sc)[2][4], const uint32_t (&qf)[8][4], const unsigned char* tK, int w,
                                       int lane) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
    const int krow = scores_key(lane, j);
#pragma unroll
    for (int ks = 0; ks < 8; ks += 2) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4(smem_u32(tK + swz<H>(krow, w, scores_piece(lane, ks))), b0, b1, b2, b3);
      mma16816<BF16>(sc[j], qf[ks], b0, b1);
      mma16816<BF16>(sc[j], qf[ks + 1], b2, b3);
    }
  }
}

// o += P V for KV head w: a holds P (16 rows x 16 keys) as one A fragment.
template <bool BF16, int H = kHeads>
__device__ __forceinline__ void accumulate_pv(float (&o)[16][4], const uint32_t (&a)[4], const unsigned char* tV, int w,
                                              int lane) {
  const int vrow = pv_key(lane);
#pragma unroll
  for (int nn = 0; nn < 16; nn += 2) {
    uint32_t b0, b1, b2, b3;
    ldsm_x4_t(smem_u32(tV + swz<H>(vrow, w, pv_piece(lane, nn))), b0, b1, b2, b3);
    mma16816<BF16>(o[nn], a, b0, b1);
    mma16816<BF16>(o[nn + 1], a, b2, b3);
  }
}

// ---- the transposed product, for tiles of at most 8 query rows (one token at GQA <= 8): the
// chunk's 16 keys are the mma's M rows and the query rows its N columns, so one m16n8 tile per
// k-step instead of two (half the mma of scores() + accumulate_pv(), where 8 or more of the 16
// tile rows would be padding).  Fragments (g = lane / 4, t4 = lane % 4):
//   st (S^T, 16 keys x 8 rows): st[0], st[1] = key g, rows 2 t4 and 2 t4 + 1; st[2], st[3] = key g + 8
//   ot[mt] (O^T, dims 16 mt .. 16 mt + 15 x 8 rows): [0], [1] = dim 16 mt + g, rows 2 t4, 2 t4 + 1;
//   [2], [3] = dim 16 mt + g + 8

// The transpose of an 8 x 8 matrix of 16-bit pairs held as one mma fragment register per lane.
__device__ __forceinline__ uint32_t movmatrix_t(uint32_t a) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
  return d;
}

// st = K Q^T for KV head w: the K rows are the A operand (ldmatrix, 16 keys x 16 dims per
// k-step), qf's row-g registers (qf[ks][0], qf[ks][2]) the B operand; two accumulator chains
// (even and odd k-steps) halve the dependent mma chain.
template <bool BF16, int H = kHeads>
__device__ __forceinline__ void scores_t(float (&st)[4], const uint32_t (&qf)[8][4], const unsigned char* tK, int w,
                                         int lane) {
  float c0[4] = {0.f, 0.f, 0.f, 0.f}, c1[4] = {0.f, 0.f, 0.f, 0.f};
  const int key = scores_t_key(lane);
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    uint32_t a[4];
    ldsm_x4(smem_u32(tK + swz<H>(key, w, scores_t_piece(lane, ks))), a);
    mma16816<BF16>((ks & 1) ? c1 : c0, a, qf[ks][0], qf[ks][2]);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) st[e] = c0[e] + c1[e];
}

// ot += V^T P^T for KV head w: pt holds P (st's layout, exponentiated) packed as 16-bit pairs,
// pt[0] = keys g, pt[1] = keys g + 8 (rows 2 t4, 2 t4 + 1); movmatrix turns them into the B
// operand (keys 2 t4, 2 t4 + 1 (+ 8) of row g); V^T comes from ldmatrix.trans of the V rows.
template <bool BF16, int H = kHeads>
__device__ __forceinline__ void accumulate_pv_t(float (&ot)[8][4], const uint32_t (&pt)[2], const unsigned char* tV,
                                                int w, int lane) {
  const uint32_t b0 = movmatrix_t(pt[0]), b1 = movmatrix_t(pt[1]);
  const int key = pv_t_key(lane);
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) {
    uint32_t a[4];
    ldsm_x4_t(smem_u32(tV + swz<H>(key, w, pv_t_piece(lane, mt))), a);
    mma16816<BF16>(ot[mt], a, b0, b1);
  }
}

}  // namespace kvattn::ops::cuda_impl::k::page_tile
