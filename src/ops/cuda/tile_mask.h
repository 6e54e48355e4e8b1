// src/ops/cuda/tile_mask.h — the wgmma prefill's mask of a key tile for one query row, as the
// range of visible columns (hopper_prefill.cu applies it; tests/ops/tile_mask_test.cpp checks
// it on the CPU against the key-by-key rule).
//
// A query at position q sees key k when k < kv_len, and (causal) k <= q, and (sliding window,
// window_left >= 0) k >= q - window_left.  For a thread whose columns start at key col0 (the
// tile's first key + the thread's column pair), the visible keys are the offsets [lo, hi) from
// col0; both are clamped into [-1, tile_keys], so they fit an int and every offset of the tile
// (0 .. tile_keys - 1) compares the same as against the unclamped limits.  lo is meaningful only
// with a window.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__CUDACC__)
#define KVATTN_TM_HD __host__ __device__ __forceinline__
#else
#define KVATTN_TM_HD inline
#endif

namespace kvattn::ops::cuda_impl::tm {

struct ColumnLimits {
  int lo, hi;  // visible offsets from col0: [lo, hi) (lo: the window's; hi: kv_len's and the diagonal's)
};

KVATTN_TM_HD int clamp_offset(int64_t x, int tile_keys) {
#if !defined(__CUDACC__)
  using std::max;
  using std::min;
#endif
  return static_cast<int>(min(max(x, int64_t(-1)), int64_t(tile_keys)));
}

KVATTN_TM_HD ColumnLimits column_limits(int64_t q, int64_t kv_len, bool causal, int64_t window_left, int64_t col0,
                                        int tile_keys) {
#if !defined(__CUDACC__)
  using std::min;
#endif
  const int64_t end = causal ? min(kv_len, q + 1) : kv_len;
  ColumnLimits lim;
  lim.hi = clamp_offset(end - col0, tile_keys);
  lim.lo = clamp_offset(q - window_left - col0, tile_keys);
  return lim;
}

}  // namespace kvattn::ops::cuda_impl::tm
