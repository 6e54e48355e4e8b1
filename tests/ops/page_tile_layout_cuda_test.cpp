// The index math of the whole-page decode's chunk products (src/ops/cuda/page_tile_layout.h, used
// by page_tile.cuh and page_decode.cu's to_rows) on the CPU, no GPU needed: a model of ldmatrix
// (x4, plain and .trans), mma.m16n8k16 (f32 accumulators) and movmatrix.trans runs the same
// lane -> row-address functions the kernels use over a chunk laid out by swz(), and the results
// are compared with plain products of the same random values.  Also: swz() places every
// (slot, head, piece) once inside the chunk, and every ldmatrix the products issue is free of
// shared-memory bank conflicts.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "ops/cuda/page_tile_layout.h"

namespace kvattn::ops::testing {
namespace {

namespace pt = cuda_impl::k::page_tile;

constexpr int kDim = 128;
constexpr int kPieces = kDim / 8;  // 16-byte pieces of a 256-byte row
constexpr uint32_t kChunkBytes = pt::kSlots * pt::kHeads * kDim * 2;

using Pair = std::array<double, 2>;  // one 32-bit register: two 16-bit values (low, high)
using Reg = std::array<Pair, 32>;    // that register in every lane
using Acc = std::array<std::array<double, 4>, 32>;  // an f32 C fragment in every lane
using Addr = std::array<uint32_t, 32>;

int lane_g(int lane) { return lane >> 2; }
int lane_t(int lane) { return lane & 3; }

// A staged chunk: the value of each 16-bit element, by byte offset / 2, placed by swz().
struct Chunk {
  std::vector<double> mem = std::vector<double>(kChunkBytes / 2, std::numeric_limits<double>::quiet_NaN());
  std::vector<double> vals = std::vector<double>(kChunkBytes / 2);  // [slot][head][dim]
  explicit Chunk(std::mt19937& rng) {
    std::uniform_real_distribution<double> u(-1, 1);
    for (int s = 0; s < pt::kSlots; ++s)
      for (int h = 0; h < pt::kHeads; ++h)
        for (int d = 0; d < kDim; ++d) {
          vals[static_cast<size_t>((s * pt::kHeads + h) * kDim + d)] = u(rng);
          mem[(pt::swz(s, h, d / 8) + (d % 8) * 2) / 2] = ref(s, h, d);
        }
  }
  double ref(int slot, int head, int d) const { return vals[static_cast<size_t>((slot * pt::kHeads + head) * kDim + d)]; }
};

// ldmatrix.x4 (.trans): matrix i is the 8 rows of 8 values at the addresses of lanes 8i .. 8i + 7;
// lane l receives (row l / 4, cols 2 (l % 4), +1) of matrix i — of its transpose with .trans.
std::array<Reg, 4> ldsm_x4(const Chunk& c, const Addr& addr, bool trans) {
  std::array<Reg, 4> r{};
  for (int i = 0; i < 4; ++i) {
    double m[8][8];
    for (int row = 0; row < 8; ++row) {
      const uint32_t a = addr[8 * i + row];
      EXPECT_EQ(a % 16, 0u) << "ldmatrix row address not 16-byte aligned";
      EXPECT_LE(a + 16, kChunkBytes) << "ldmatrix row outside the chunk";
      for (int e = 0; e < 8; ++e) m[row][e] = a + 16 <= kChunkBytes ? c.mem[a / 2 + e] : std::nan("");
    }
    for (int l = 0; l < 32; ++l) {
      const int g = lane_g(l), t = lane_t(l);
      r[i][l] = trans ? Pair{m[2 * t][g], m[2 * t + 1][g]} : Pair{m[g][2 * t], m[g][2 * t + 1]};
    }
  }
  return r;
}

// The 8 rows of each matrix in 8 different 16-byte bank groups: no bank conflict.
void expect_conflict_free(const Addr& addr, const char* what) {
  for (int i = 0; i < 4; ++i) {
    std::set<uint32_t> groups;
    for (int row = 0; row < 8; ++row) groups.insert((addr[8 * i + row] / 16) % 8);
    EXPECT_EQ(groups.size(), 8u) << what << ": matrix " << i << " has a bank conflict";
  }
}

// c += A B, m16n8k16: A from a[0..3], B from b0, b1 (fragment layouts in page_tile_layout.h).
void mma(std::array<double, 4>* c, const std::array<Reg, 4>& a, const Reg& b0, const Reg& b1) {
  double A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = lane_g(l), t = lane_t(l);
    for (int e = 0; e < 2; ++e) {
      A[g][2 * t + e] = a[0][l][e];
      A[g + 8][2 * t + e] = a[1][l][e];
      A[g][2 * t + 8 + e] = a[2][l][e];
      A[g + 8][2 * t + 8 + e] = a[3][l][e];
      B[2 * t + e][g] = b0[l][e];
      B[2 * t + 8 + e][g] = b1[l][e];
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = lane_g(l), t = lane_t(l);
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
      for (int k = 0; k < 16; ++k) c[l][e] += A[row][k] * B[k][col];
    }
  }
}
void mma(Acc& c, const std::array<Reg, 4>& a, const Reg& b0, const Reg& b1) { mma(c.data(), a, b0, b1); }

// movmatrix.m8n8.trans: lane l holds (row l / 4, cols 2 (l % 4), +1) of M before, of M^T after.
Reg movmatrix_t(const Reg& x) {
  double m[8][8];
  for (int l = 0; l < 32; ++l)
    for (int e = 0; e < 2; ++e) m[lane_g(l)][2 * lane_t(l) + e] = x[l][e];
  Reg r{};
  for (int l = 0; l < 32; ++l) r[l] = Pair{m[2 * lane_t(l)][lane_g(l)], m[2 * lane_t(l) + 1][lane_g(l)]};
  return r;
}

// The query fragments as the kernel loads them: qf[ks][0] = row g, dims 16 ks + 2 t4 (+1);
// [1] = row g + 8; [2] = dims + 8; [3] = both.
std::array<std::array<Reg, 4>, 8> query_fragments(const std::vector<std::array<double, kDim>>& q) {
  std::array<std::array<Reg, 4>, 8> qf{};
  auto at = [&](int row, int d) { return row < static_cast<int>(q.size()) ? q[row][d] : 0.0; };
  for (int ks = 0; ks < 8; ++ks)
    for (int l = 0; l < 32; ++l) {
      const int g = lane_g(l), d = 16 * ks + 2 * lane_t(l);
      qf[ks][0][l] = Pair{at(g, d), at(g, d + 1)};
      qf[ks][1][l] = Pair{at(g + 8, d), at(g + 8, d + 1)};
      qf[ks][2][l] = Pair{at(g, d + 8), at(g, d + 9)};
      qf[ks][3][l] = Pair{at(g + 8, d + 8), at(g + 8, d + 9)};
    }
  return qf;
}

std::vector<std::array<double, kDim>> random_rows(std::mt19937& rng, int n) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<std::array<double, kDim>> q(static_cast<size_t>(n));
  for (auto& r : q)
    for (double& x : r) x = u(rng);
  return q;
}

constexpr double kTol = 1e-12;

// swz<H> places every (slot, head, piece) of an H-head chunk once, 16-byte aligned, inside its
// 256-byte row and inside the chunk.
template <int H>
void expect_swizzle_places_every_piece_once() {
  constexpr uint32_t kBytes = pt::kSlots * H * kDim * 2;
  std::set<uint32_t> seen;
  for (int s = 0; s < pt::kSlots; ++s)
    for (int h = 0; h < H; ++h)
      for (int p = 0; p < kPieces; ++p) {
        const uint32_t a = pt::swz<H>(s, h, p);
        EXPECT_EQ(a % 16, 0u);
        EXPECT_LT(a, kBytes);
        EXPECT_EQ(a / 256, static_cast<uint32_t>(s * H + h)) << "H " << H << ": a piece left its 256-byte row";
        seen.insert(a);
      }
  EXPECT_EQ(seen.size(), static_cast<size_t>(pt::kSlots * H * kPieces)) << "H " << H;
}

// Every ldmatrix of the four products, for every head w of an H-head chunk, hits 8 bank groups.
template <int H>
void expect_every_ldmatrix_conflict_free() {
  for (int w = 0; w < H; ++w) {
    Addr a{};
    for (int j = 0; j < 2; ++j)
      for (int ks = 0; ks < 8; ks += 2) {
        for (int l = 0; l < 32; ++l) a[l] = pt::swz<H>(pt::scores_key(l, j), w, pt::scores_piece(l, ks));
        expect_conflict_free(a, H == 4 ? "scores, 4 heads" : "scores");
      }
    for (int nn = 0; nn < 16; nn += 2) {
      for (int l = 0; l < 32; ++l) a[l] = pt::swz<H>(pt::pv_key(l), w, pt::pv_piece(l, nn));
      expect_conflict_free(a, H == 4 ? "accumulate_pv, 4 heads" : "accumulate_pv");
    }
    for (int ks = 0; ks < 8; ++ks) {
      for (int l = 0; l < 32; ++l) a[l] = pt::swz<H>(pt::scores_t_key(l), w, pt::scores_t_piece(l, ks));
      expect_conflict_free(a, H == 4 ? "scores_t, 4 heads" : "scores_t");
    }
    for (int mt = 0; mt < 8; ++mt) {
      for (int l = 0; l < 32; ++l) a[l] = pt::swz<H>(pt::pv_t_key(l), w, pt::pv_t_piece(l, mt));
      expect_conflict_free(a, H == 4 ? "accumulate_pv_t, 4 heads" : "accumulate_pv_t");
    }
  }
}

TEST(PageTileLayout, SwizzlePlacesEveryPieceOnceInsideTheChunk) { expect_swizzle_places_every_piece_once<pt::kHeads>(); }

// A CTA that stages half of each chunk (4 heads, page_decode.cu) uses swz<4>: the same
// placement and bank-conflict freedom over its 16 KB.
TEST(PageTileLayout, HalfChunksOfFourHeads) {
  expect_swizzle_places_every_piece_once<4>();
  expect_every_ldmatrix_conflict_free<4>();
}

TEST(PageTileLayout, EveryLdmatrixIsConflictFree) { expect_every_ldmatrix_conflict_free<pt::kHeads>(); }

// scores() and accumulate_pv(): 16 query rows as the mma's M rows.
TEST(PageTileLayout, RowTilesComputeQKAndPV) {
  std::mt19937 rng(7);
  const Chunk k(rng), v(rng);
  const auto q = random_rows(rng, 16);
  const auto qf = query_fragments(q);
  for (int w : {0, 3, 7}) {
    // S = Q K^T over the chunk's 16 keys: sc[j] is the n8 tile of keys 8 j .. 8 j + 7
    Acc sc[2] = {};
    for (int j = 0; j < 2; ++j)
      for (int ks = 0; ks < 8; ks += 2) {
        Addr a{};
        for (int l = 0; l < 32; ++l) a[l] = pt::swz(pt::scores_key(l, j), w, pt::scores_piece(l, ks));
        const auto b = ldsm_x4(k, a, false);
        mma(sc[j], qf[ks], b[0], b[1]);
        mma(sc[j], qf[ks + 1], b[2], b[3]);
      }
    for (int l = 0; l < 32; ++l)
      for (int j = 0; j < 2; ++j)
        for (int e = 0; e < 4; ++e) {
          const int row = lane_g(l) + 8 * (e >> 1), key = 8 * j + 2 * lane_t(l) + (e & 1);
          double ref = 0;
          for (int d = 0; d < kDim; ++d) ref += q[row][d] * k.ref(key, w, d);
          EXPECT_NEAR(sc[j][l][e], ref, kTol) << "head " << w << " row " << row << " key " << key;
        }
    // O = P V with P (16 rows x 16 keys) as one A fragment
    std::uniform_real_distribution<double> u(0, 1);
    double p[16][16];
    for (auto& r : p)
      for (double& x : r) x = u(rng);
    std::array<Reg, 4> pa{};
    for (int l = 0; l < 32; ++l) {
      const int g = lane_g(l), t = lane_t(l);
      pa[0][l] = Pair{p[g][2 * t], p[g][2 * t + 1]};
      pa[1][l] = Pair{p[g + 8][2 * t], p[g + 8][2 * t + 1]};
      pa[2][l] = Pair{p[g][2 * t + 8], p[g][2 * t + 9]};
      pa[3][l] = Pair{p[g + 8][2 * t + 8], p[g + 8][2 * t + 9]};
    }
    std::array<Acc, 16> o{};
    for (int nn = 0; nn < 16; nn += 2) {
      Addr a{};
      for (int l = 0; l < 32; ++l) a[l] = pt::swz(pt::pv_key(l), w, pt::pv_piece(l, nn));
      const auto b = ldsm_x4(v, a, true);
      mma(o[nn], pa, b[0], b[1]);
      mma(o[nn + 1], pa, b[2], b[3]);
    }
    for (int l = 0; l < 32; ++l)
      for (int nn = 0; nn < 16; ++nn)
        for (int e = 0; e < 4; ++e) {
          const int row = lane_g(l) + 8 * (e >> 1), d = 8 * nn + 2 * lane_t(l) + (e & 1);
          double ref = 0;
          for (int key = 0; key < 16; ++key) ref += p[row][key] * v.ref(key, w, d);
          EXPECT_NEAR(o[nn][l][e], ref, kTol) << "head " << w << " row " << row << " dim " << d;
        }
  }
}

// scores_t(), accumulate_pv_t() and to_rows(): at most 8 query rows as the mma's N columns, then
// the O^T fragments moved into the row tiles' layout (what flush / write_rows / the merges read).
TEST(PageTileLayout, TransposedTilesComputeAndMoveBackToRows) {
  std::mt19937 rng(11);
  const Chunk k(rng), v(rng);
  for (int rows : {8, 4, 1}) {
    const auto q = random_rows(rng, rows);
    const auto qf = query_fragments(q);
    const int w = rows % pt::kHeads;
    // S^T = K Q^T: st[l][e] = (key g + 8 (e / 2), row 2 t4 + e % 2), two accumulator chains
    Acc c0{}, c1{};
    for (int ks = 0; ks < 8; ++ks) {
      Addr a{};
      for (int l = 0; l < 32; ++l) a[l] = pt::swz(pt::scores_t_key(l), w, pt::scores_t_piece(l, ks));
      mma((ks & 1) ? c1 : c0, ldsm_x4(k, a, false), qf[ks][0], qf[ks][2]);
    }
    for (int l = 0; l < 32; ++l)
      for (int e = 0; e < 4; ++e) {
        const int key = lane_g(l) + 8 * (e >> 1), row = 2 * lane_t(l) + (e & 1);
        double ref = 0;
        for (int d = 0; d < kDim && row < rows; ++d) ref += k.ref(key, w, d) * q[row][d];
        EXPECT_NEAR(c0[l][e] + c1[l][e], ref, kTol) << "rows " << rows << " key " << key << " row " << row;
      }
    // O^T += V^T P^T with P in st's layout, packed in pairs and turned by movmatrix
    std::uniform_real_distribution<double> u(0, 1);
    double p[16][8];  // [key][row]
    for (auto& r : p)
      for (double& x : r) x = u(rng);
    Reg pt0{}, pt1{};
    for (int l = 0; l < 32; ++l) {
      const int g = lane_g(l), t = lane_t(l);
      pt0[l] = Pair{p[g][2 * t], p[g][2 * t + 1]};
      pt1[l] = Pair{p[g + 8][2 * t], p[g + 8][2 * t + 1]};
    }
    const Reg b0 = movmatrix_t(pt0), b1 = movmatrix_t(pt1);
    std::array<Acc, 8> ot{};
    for (int mt = 0; mt < 8; ++mt) {
      Addr a{};
      for (int l = 0; l < 32; ++l) a[l] = pt::swz(pt::pv_t_key(l), w, pt::pv_t_piece(l, mt));
      mma(ot[mt], ldsm_x4(v, a, true), b0, b1);
    }
    auto o_ref = [&](int row, int d) {
      double s = 0;
      for (int key = 0; key < 16; ++key) s += p[key][row] * v.ref(key, w, d);
      return s;
    };
    for (int l = 0; l < 32; ++l)
      for (int mt = 0; mt < 8; ++mt)
        for (int e = 0; e < 4; ++e) {
          const int d = 16 * mt + lane_g(l) + 8 * (e >> 1), row = 2 * lane_t(l) + (e & 1);
          EXPECT_NEAR(ot[mt][l][e], o_ref(row, d), kTol) << "rows " << rows << " dim " << d << " row " << row;
        }
    // to_rows(): lane (g, t4) takes (row g, dim 8 nn + 2 t4 + cc) from its source lane's register
    // of g's parity; row g's max and sum from the lane holding rows 2 t4' + j with that row
    for (int l = 0; l < 32; ++l) {
      const int g = lane_g(l), t = lane_t(l);
      const int stat = pt::to_rows_stat_lane(l);
      EXPECT_EQ(2 * lane_t(stat) + (g & 1), g) << "lane " << l << " takes another row's max and sum";
      for (int nn = 0; nn < 16; ++nn)
        for (int cc = 0; cc < 2; ++cc) {
          const int src = pt::to_rows_src_lane(l, cc);
          ASSERT_GE(src, 0);
          ASSERT_LT(src, 32);
          const double got = ot[nn / 2][src][pt::to_rows_src_reg(nn, g & 1)];
          EXPECT_NEAR(got, o_ref(g, 8 * nn + 2 * t + cc), kTol) << "rows " << rows << " lane " << l << " nn " << nn;
        }
    }
  }
}

}  // namespace
}  // namespace kvattn::ops::testing
