// src/ops/cuda/knobs.h — host-side environment knobs of the CUDA kernels: each read once from
// its environment variable, cached in an atomic (-1 = not read yet), where the set_*() functions
// of the kernels' headers store overrides.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace kvattn::ops::cuda_impl::k {

// The knob's value: the cache, else parse(getenv(env)) (parse gets nullptr when unset), cached.
inline int knob(std::atomic<int>& cache, const char* env, int (*parse)(const char*)) {
  int v = cache.load(std::memory_order_relaxed);
  if (v < 0) {
    v = parse(std::getenv(env));
    cache.store(v, std::memory_order_relaxed);
  }
  return v;
}

inline bool is_zero(const char* e) { return e != nullptr && std::strcmp(e, "0") == 0; }

// A count: the variable's positive integer, else (unset, 0, negative, not a number) 0.
inline int positive_int(const char* e) {
  const int v = e != nullptr ? std::atoi(e) : 0;
  return v > 0 ? v : 0;
}

// The routing knobs' values: unset or anything else 0 (automatic), "off" 1, "force" 2.
inline int off_or_force(const char* e) {
  if (e == nullptr) return 0;
  return std::strcmp(e, "off") == 0 ? 1 : std::strcmp(e, "force") == 0 ? 2 : 0;
}

}  // namespace kvattn::ops::cuda_impl::k
