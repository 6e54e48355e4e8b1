// src/ops/cuda/streamk_schedule.h — the arithmetic of the stream-K decode schedule
// (paged_attention.cu, decode option bit 16 / KVATTN_DECODE_STREAMK=1), shared by the plan
// kernel, the attention kernel's range walk and the host tests (tests/ops/decode_streamk_cuda_test.cpp
// checks the partition on the CPU with these same functions).
//
// Each unit (request, 16-row tile, KV head; unit w has len_w >= 1 key tiles) occupies
// lead + len_w positions of a flattened cost space: `lead` positions for the fixed cost of
// starting a piece (c0 tile-times: 3 for 64-key tiles, 2 for 128-key tiles, as plan_kernel's
// wave rule), then its tiles, so the ranges balance tiles plus piece starts (only a range's first
// piece can start inside a unit and pay an uncounted start).  C positions in all.  G CTAs take
// the contiguous ranges [begin(c), begin(c + 1)), begin(c) = floor(c C / G); position x belongs
// to CTA ((x + 1) G - 1) / C.  Ranges have >= min_tiles positions, min_tiles chosen so that no
// unit is cut into more than max_splits - 1 pieces (the partial slots).  Uniform lengths with
// units <= grid: lead 0 and every unit cut into the same number of equal pieces.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KVATTN_SK_HD __host__ __device__ __forceinline__
#else
#define KVATTN_SK_HD inline
#endif

namespace kvattn::ops::cuda_impl::sk {

constexpr int kMinTiles = 4;  // fewest tiles per CTA range (calls with T < grid * 4 use fewer CTAs)

// First position of CTA c's range.
KVATTN_SK_HD int64_t range_begin(int64_t c, int64_t C, int64_t G) { return c * C / G; }
// CTA holding position x (0 <= x < C).
KVATTN_SK_HD int64_t cta_of(int64_t x, int64_t C, int64_t G) { return ((x + 1) * G - 1) / C; }
// Piece-start cost in tile-times for a key tile of `tile` keys (bf16/f16 64, fp8 128).
KVATTN_SK_HD int32_t lead_for_tile(int tile) { return tile <= 64 ? 3 : 2; }
// Fewest positions per range so that a unit of max_len tiles has <= max_splits - 1 pieces: a unit
// of L tiles spans at most floor((L - 2) / m) + 2 ranges of >= m positions (max_splits >= 3; the
// ranges inside a unit's tiles hold only tiles).
KVATTN_SK_HD int64_t min_tiles(int64_t max_len, int64_t max_splits) {
  const int64_t d = max_splits > 2 ? max_splits - 2 : 1;
  const int64_t m = (max_len + d - 1) / d;
  return m > kMinTiles ? m : kMinTiles;
}

struct Schedule {
  int64_t C = 0;     // positions
  int64_t G = 0;     // CTAs with a range
  int32_t lead = 0;  // positions before each unit's tiles
};
// T = tiles of all `units` units, the longest max_len.
KVATTN_SK_HD Schedule schedule(int64_t T, int64_t units, int64_t max_len, int64_t max_splits, int64_t grid,
                               int32_t lead) {
  Schedule s;
  if (T <= 0 || units <= 0) return s;
  if (T == units * max_len && units <= grid) {
    // uniform, one wave: k equal pieces per unit, every CTA one piece (the counter path's
    // single wave; ranges start at unit boundaries)
    int64_t k = grid / units;
    if (k > max_len) k = max_len;
    if (k > max_splits - 1) k = max_splits - 1;
    if (k >= 1) {
      s.C = T;
      s.G = units * k;
      return s;
    }
  }
  s.lead = lead;
  s.C = T + int64_t(lead) * units;
  int64_t g = s.C / min_tiles(max_len, max_splits);
  if (g < 1) g = 1;
  s.G = g < grid ? g : grid;
  return s;
}
// Position of unit w's first tile: tiles of the units before it plus (w + 1) leads.
KVATTN_SK_HD int64_t unit_start(int64_t tiles_before, int64_t w, int32_t lead) {
  return tiles_before + (w + 1) * int64_t(lead);
}

// One step of a CTA's walk: the piece [tb, te) of the unit whose tiles sit at positions
// [start, start + len), for the range's next position t and its end.  te <= tb: no piece (the
// range ends in the unit's lead), the walk is done.  Otherwise the next t is start + te, and the
// walk moves to the next unit when te == len.
struct Piece {
  int32_t tb, te;
};
KVATTN_SK_HD Piece piece_at(int64_t t, int64_t end, int64_t start, int32_t len) {
  Piece pc;
  const int64_t b = t - start;
  pc.tb = static_cast<int32_t>(b > 0 ? b : 0);
  const int64_t e = end - start;
  pc.te = static_cast<int32_t>(e < len ? e : int64_t(len));
  return pc;
}

}  // namespace kvattn::ops::cuda_impl::sk
