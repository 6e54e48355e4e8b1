// src/ops/cuda/page_tile_layout.h — the index math of page_tile.cuh's m16n8k16 products over one
// staged chunk (16 slots x 8 KV heads x 128 dims, 16-bit, 256-byte rows): where each (slot, head,
// 16-byte piece) sits in shared memory, which row address each lane gives ldmatrix, and where
// to_rows() (page_decode.cu) finds each value of the transposed tiles.  Plain C++ (host and
// device), so tests/ops/page_tile_layout_cuda_test.cpp checks the same functions the kernels run
// against a model of ldmatrix / mma / movmatrix on the CPU.
//
// Fragments of mma.m16n8k16 (g = lane / 4, t4 = lane % 4): A (16 x 16) a0 = (row g, cols 2 t4,
// 2 t4 + 1), a1 = row g + 8, a2 = cols + 8, a3 = both; B (16 x 8) b0 = (rows 2 t4, 2 t4 + 1, col g),
// b1 = rows + 8; C (16 x 8) c0, c1 = (row g, cols 2 t4, 2 t4 + 1), c2, c3 = row g + 8.  ldmatrix x4
// loads matrix i from the 8 row addresses of lanes 8 i .. 8 i + 7 into register i.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KVATTN_PT_HD __host__ __device__ __forceinline__
#else
#define KVATTN_PT_HD inline
#endif

namespace kvattn::ops::cuda_impl::k::page_tile {

constexpr int kHeads = 8;  // KV heads per staged chunk (the default H below)
constexpr int kSlots = 16;  // slots (keys) per staged chunk

// Shared-memory offset of (slot, KV head, 16-byte piece) in a staged chunk of H heads: 256-byte
// rows in (slot, head) order, pieces XOR-swizzled by slot so ldmatrix's 8 rows of one head
// (H x 256 bytes apart, a multiple of the 128-byte bank period) fall in 8 different bank groups.
template <int H = kHeads>
KVATTN_PT_HD constexpr uint32_t swz(int slot, int head, int piece) {
  return static_cast<uint32_t>(((slot * H + head) << 8) + ((piece ^ (slot & 7)) << 4));
}

// ---- the row tiles (up to 16 query rows as the mma's M rows) ----
// scores(): B operand = K^T of keys 8 j .. 8 j + 7; one ldmatrix x4 covers the two k-steps ks,
// ks + 1 (pieces 2 ks .. 2 ks + 3)
KVATTN_PT_HD constexpr int scores_key(int lane, int j) { return 8 * j + (lane & 7); }
KVATTN_PT_HD constexpr int scores_piece(int lane, int ks) { return 2 * ks + (lane >> 3); }
// accumulate_pv(): B operand = V of the 16 keys (ldmatrix .trans), dims of n-tiles nn, nn + 1
KVATTN_PT_HD constexpr int pv_key(int lane) { return (lane & 7) + ((lane >> 3) & 1) * 8; }
KVATTN_PT_HD constexpr int pv_piece(int lane, int nn) { return nn + (lane >> 4); }

// ---- the transposed tiles (at most 8 query rows as the mma's N columns) ----
// scores_t(): A operand = K of the 16 keys, dims of k-step ks (matrices: keys 0-7 | 8-15 x dims
// 0-7 | 8-15 of the step)
KVATTN_PT_HD constexpr int scores_t_key(int lane) { return (lane & 7) + ((lane >> 3) & 1) * 8; }
KVATTN_PT_HD constexpr int scores_t_piece(int lane, int ks) { return 2 * ks + (lane >> 4); }
// accumulate_pv_t(): A operand = V^T of m-tile mt (ldmatrix .trans; matrices: keys 0-7 | 8-15 x
// dims 0-7 | 8-15 of the tile, in the order a0 .. a3 needs)
KVATTN_PT_HD constexpr int pv_t_key(int lane) { return (lane & 7) + (lane >> 4) * 8; }
KVATTN_PT_HD constexpr int pv_t_piece(int lane, int mt) { return 2 * mt + ((lane >> 3) & 1); }
// to_rows(): the lane whose O^T fragment holds (row g, dim 8 nn + 2 t4 + cc) of this lane's row
// layout, and which of its ot[nn / 2][.] registers: the source sends both parities' registers and
// this lane keeps the one of its row's parity (g % 2).
KVATTN_PT_HD constexpr int to_rows_src_lane(int lane, int cc) { return 4 * (2 * (lane & 3) + cc) + (lane >> 3); }
KVATTN_PT_HD constexpr int to_rows_src_reg(int nn, int parity) { return 2 * (nn % 2) + parity; }
// ... and the lane holding row g's running max and sum (rows 2 t4 + j: t4 = g / 2, j = g % 2)
KVATTN_PT_HD constexpr int to_rows_stat_lane(int lane) { return lane >> 3; }

}  // namespace kvattn::ops::cuda_impl::k::page_tile

#undef KVATTN_PT_HD
