// Internal integer helpers of the kv layer (not installed).
#pragma once

#include <cstdint>
#include <numeric>

#include "kvattn/core/error.h"

namespace kvattn::kvmath {

// ceil(a / b) for a >= 0, b > 0.
inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Smallest multiple of m (> 0) that is >= a (>= 0).
inline int64_t round_up(int64_t a, int64_t m) { return cdiv(a, m) * m; }
inline int64_t lcm(int64_t a, int64_t b) { return std::lcm(a, b); }

// a * b, throwing InvalidArgument when the product leaves int64 (sizes come from user input).
inline int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r))
    throw InvalidArgument(fmt::format("{}: {} * {} overflows 64-bit byte arithmetic; use smaller sizes", what, a, b));
  return r;
}

}  // namespace kvattn::kvmath
