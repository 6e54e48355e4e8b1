// kvattn/ops/bench.h — the kernel-timing harness of `kvattn bench` (and of anyone timing an op).
//
// time_kernel runs `run` `warmup` times, then repeatedly until both `min_iters` runs and
// `min_seconds` have passed (capped at max_iters), calling `sync` after each run (for CUDA,
// cuda::synchronize) and reports the median, minimum and mean wall time per call.
#pragma once

#include <cstdint>
#include <functional>

namespace kvattn::ops::bench {

struct TimingStats {
  double median_s = 0, min_s = 0, mean_s = 0;
  double cpu_mean_s = 0;  // process CPU time per call (all threads): shows contention when
                          // it is far below threads * wall time
  int iters = 0;
};

TimingStats time_kernel(const std::function<void()>& run, const std::function<void()>& sync = {},
                        int warmup = 1, int min_iters = 5, double min_seconds = 0.5, int max_iters = 1000);

// Host memory-copy bandwidth with `threads` threads copying disjoint slices of a `bytes`
// buffer: (bytes read + bytes written) / median time, in bytes per second — the same
// definition as a device-to-device copy figure.
double measure_cpu_copy_bandwidth(int64_t bytes, int threads);

// Visible (query, key) pairs of a causal request with query length q over kv length k
// (the query is the last q tokens): q (k - q) + q (q + 1) / 2.
inline double causal_pairs(int64_t q, int64_t k) {
  return static_cast<double>(q) * static_cast<double>(k - q) + static_cast<double>(q) * (q + 1) / 2.0;
}
// Attention FLOPs: 4 * head_dim * num_qo_heads * pairs (QK^T and PV, multiply-add = 2).
inline double attention_flops(double pairs, int64_t head_dim, int64_t num_qo_heads) {
  return 4.0 * static_cast<double>(head_dim) * static_cast<double>(num_qo_heads) * pairs;
}

}  // namespace kvattn::ops::bench
