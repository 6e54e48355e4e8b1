// src/ops/cuda/page_decode_schedule.h — the chunk-range arithmetic of the whole-page decode path
// (page_decode.cu): which CTA owns which chunks, where each CTA's range starts, and which partial
// slot a cut request's piece uses.  Plain C++ (host and device), so tests/ops/
// page_decode_schedule_test.cpp checks the same functions the kernels run, on the CPU.
// "CTA c" below is range c: page_decode.cu runs each range as two CTAs, one per half of the KV
// heads, whose counters and partial slots are per KV head and so never meet.
//
// The call's T chunks (16 slots of one page each, numbered request after request) are cut into G
// equal contiguous ranges, G = min(CTAs, T) so that no range is empty: CTA c owns
// [range_begin(c), range_begin(c + 1)).  A request whose chunks cross a range boundary is "cut";
// each CTA holding part of it keeps that piece's partial state in one of its two slots: slot 0
// when the request is the first of the CTA's range (it started at or before the range), slot 1
// when it is the last (it started inside the range and runs past its end).  A range holds at most
// one request of each kind, so two slots per CTA suffice.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KVATTN_PD_HD __host__ __device__ __forceinline__
#else
#define KVATTN_PD_HD inline
#endif

namespace kvattn::ops::cuda_impl::k::page_sched {

// First chunk of CTA c's range (c = G: one past the last chunk).
KVATTN_PD_HD int64_t range_begin(int64_t c, int64_t G, int64_t T) { return c * T / G; }

// The CTA whose range holds chunk x (0 <= x < T): the smallest c with x < range_begin(c + 1).
KVATTN_PD_HD int64_t cta_of(int64_t x, int64_t G, int64_t T) { return ((x + 1) * G + T - 1) / T - 1; }

// The first CTA whose range starts inside a request beginning at chunk cstart (the plan kernel
// writes the request as that CTA's first, and as the first of every later CTA whose range starts
// before the request's end).
KVATTN_PD_HD int64_t first_cta_starting_in(int64_t cstart, int64_t G, int64_t T) {
  int64_t c = cta_of(cstart, G, T);
  if (range_begin(c, G, T) < cstart) ++c;
  return c;
}

// Slot of a cut request's piece, seen from the CTA holding it (range starting at x0): 0 when the
// request began at or before x0 (the range's first request), else 1 (its last).  The merge finds
// the slot of each piece with piece_slot().
KVATTN_PD_HD int cut_slot(int64_t cstart, int64_t x0) { return cstart <= x0 ? 0 : 1; }

// Pieces of a request of `chunks` chunks (> 0) starting at chunk cstart: the CTAs its chunks span.
KVATTN_PD_HD int piece_count(int64_t cstart, int64_t chunks, int64_t G, int64_t T) {
  return static_cast<int>(cta_of(cstart + chunks - 1, G, T) - cta_of(cstart, G, T) + 1);
}

// Slot holding the piece of a cut request (starting at chunk cstart) that CTA c2 computed: only
// the request's first CTA, c_lo, can hold it as its range's last request.
KVATTN_PD_HD int piece_slot(int64_t cstart, int64_t c2, int64_t c_lo, int64_t G, int64_t T) {
  return c2 == c_lo ? cut_slot(cstart, range_begin(c2, G, T)) : 0;
}

// When the pieces of a cut request finish: its last piece (CTA cta_of(cstart + chunks - 1))
// lies at the start of its range and ends inside it, long before the range ends; every other
// piece runs to the end of its range.  So the kernel counts a piece that ends inside its range
// (end <= x1) as soon as it is done, and the piece that runs to the end of a range first looks
// whether every other piece has counted (then it merges them with its own state, still in
// registers, without writing it out).
KVATTN_PD_HD bool ends_inside(int64_t cstart, int64_t chunks, int64_t x1) { return cstart + chunks <= x1; }

// A request cut into more than kGroup pieces is merged in two levels, so that no single CTA reads
// every piece's partial rows: its pieces form groups of kGroup consecutive CTAs (the last group
// may be smaller); the last piece of a group to count merges the group into the partial slot of
// the group's first piece, then counts the group on the request's counter, and the last group to
// count merges the group partials.  Up to kGroup pieces, one level: the last piece merges them all.
constexpr int kGroup = 8;

// Groups of a request of `pieces` pieces: 1 (one level) up to kGroup pieces.
KVATTN_PD_HD int group_count(int pieces) { return pieces <= kGroup ? 1 : (pieces + kGroup - 1) / kGroup; }

// Pieces in group g of a request of `pieces` pieces (two levels).
KVATTN_PD_HD int group_size(int g, int pieces) {
  const int left = pieces - g * kGroup;
  return left < kGroup ? left : kGroup;
}

// Counters per (request, KV head) in a call of G ranges: the request's own, then one per group.
KVATTN_PD_HD int counters_per_unit(int64_t G) { return 1 + static_cast<int>((G + kGroup - 1) / kGroup); }

}  // namespace kvattn::ops::cuda_impl::k::page_sched

#undef KVATTN_PD_HD
