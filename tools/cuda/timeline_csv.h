// tools/cuda/timeline_csv.h — one CSV row of a kernel timeline, as bench-cuda's stamped bulk-copy
// gather (--gather-timeline FILE) appends them for offline analysis: launch, CTA, SM,
// chunks of its range, then microseconds from t0 (the launch's first entry) of its entry, first
// chunk landed, loop end, exit and n progress stamps.  A stamp before t0 (never written) is -1, as
// are the loop stamps of a CTA with no chunks.  Host code only.
#pragma once

#include <cstdint>
#include <cstdio>

namespace kvattn::tools::cuda_bench {

// Microseconds from t0 to a %globaltimer stamp t; `none` for a stamp before t0 (never written).
inline double timeline_us(uint64_t t, uint64_t t0, double none) { return t >= t0 ? double(t - t0) * 1e-3 : none; }

inline void append_timeline_row(FILE* f, long long launch, int cta, uint64_t sm, uint64_t chunks, uint64_t entry,
                                uint64_t first, uint64_t loop, uint64_t exit, const uint64_t* prog, int n,
                                uint64_t t0) {
  auto us = [&](uint64_t t) { return timeline_us(t, t0, -1.0); };
  auto loop_us = [&](uint64_t t) { return chunks != 0 ? us(t) : -1.0; };
  std::fprintf(f, "%lld,%d,%llu,%llu,%.3f,%.3f,%.3f,%.3f", launch, cta, static_cast<unsigned long long>(sm),
               static_cast<unsigned long long>(chunks), us(entry), loop_us(first), loop_us(loop), us(exit));
  for (int k = 0; k < n; ++k) std::fprintf(f, ",%.3f", loop_us(prog[k]));
  std::fprintf(f, "\n");
}

}  // namespace kvattn::tools::cuda_bench
