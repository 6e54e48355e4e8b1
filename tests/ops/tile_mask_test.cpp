// The wgmma prefill's tile mask (src/ops/cuda/tile_mask.h): the visible columns of a key tile as
// one range per query row must show exactly the keys the key-by-key rule shows, for every
// column offset of the tile, clamping included.  Host arithmetic, so checked on every build.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "ops/cuda/tile_mask.h"

namespace kvattn::ops::cuda_impl::tm {
namespace {

constexpr int kTileKeys = 128;

// The rule the kernel applied key by key before (and the CPU reference applies): key < kv_len,
// causal: key <= q, window: key >= q - window_left.
bool visible(int64_t key, int64_t q, int64_t kv_len, bool causal, int64_t window_left) {
  if (key >= kv_len) return false;
  if (causal && key > q) return false;
  if (window_left >= 0 && key < q - window_left) return false;
  return true;
}

// Every offset of the tile from col0, compared; returns the number of mismatches (0 expected).
int mismatches(int64_t q, int64_t kv_len, bool causal, int64_t window_left, int64_t col0) {
  const ColumnLimits lim = column_limits(q, kv_len, causal, window_left, col0, kTileKeys);
  EXPECT_GE(lim.lo, -1);
  EXPECT_LE(lim.lo, kTileKeys);
  EXPECT_GE(lim.hi, -1);
  EXPECT_LE(lim.hi, kTileKeys);
  int bad = 0;
  for (int off = 0; off < kTileKeys; ++off) {
    const bool by_range = off < lim.hi && (window_left < 0 || off >= lim.lo);
    if (by_range != visible(col0 + off, q, kv_len, causal, window_left)) ++bad;
  }
  return bad;
}

TEST(TileMask, RangeMatchesTheKeyRuleOnEveryColumn) {
  const std::vector<int64_t> kv_lens = {1, 2, 17, 127, 128, 129, 200, 255, 256, 257, 1000};
  const std::vector<int64_t> windows = {-1, 0, 1, 15, 127, 128, 129, 300, int64_t(1) << 40};
  int64_t cases = 0, bad = 0;
  for (const bool causal : {true, false})
    for (const int64_t kv_len : kv_lens)
      for (const int64_t window : windows)
        for (int64_t kt0 = 0; kt0 <= 1024; kt0 += kTileKeys)
          for (int t4 = 0; t4 < 4; ++t4)
            for (int64_t q = -2; q < kv_len + 3; ++q) {
              bad += mismatches(q, kv_len, causal, window, kt0 + 2 * t4);
              ++cases;
            }
  EXPECT_EQ(bad, 0) << "of " << cases << " rows";
  EXPECT_GT(cases, 100000);
}

TEST(TileMask, FarOffsetsClampWithoutOverflow) {
  // positions and windows far from the tile (int32 positions, int64 windows): the limits clamp
  // to -1 / 128 and still agree with the key rule
  std::mt19937_64 rng(3801);
  int64_t bad = 0;
  for (int i = 0; i < 20000; ++i) {
    const int64_t kv_len = 1 + static_cast<int64_t>(rng() % (int64_t(1) << 31));
    const int64_t q = static_cast<int64_t>(rng() % uint64_t(kv_len + 256)) - 128;
    const int64_t window = (rng() % 4 == 0) ? -1 : static_cast<int64_t>(rng() % (int64_t(1) << 33));
    const int64_t col0 = static_cast<int64_t>(rng() % uint64_t(kv_len + 512)) / 2 * 2;
    bad += mismatches(q, kv_len, rng() % 2 == 0, window, col0);
    // the tile holding the diagonal (q inside the tile) and the one holding kv_len's end
    bad += mismatches(q, kv_len, true, window, (q > 0 ? q : 0) / kTileKeys * kTileKeys);
    bad += mismatches(q, kv_len, false, window, (kv_len - 1) / kTileKeys * kTileKeys);
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace kvattn::ops::cuda_impl::tm
