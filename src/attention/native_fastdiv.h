// src/attention/native_fastdiv.h — division by a per-builder constant (page size, tile size) on
// the planning hot path: a shift when the divisor is a power of two (16/32/64-token pages), a
// plain division otherwise.
#pragma once

#include <bit>
#include <cstdint>

namespace kvattn::native_detail {

class FastDiv {
 public:
  explicit FastDiv(int64_t d = 1) : d_(d), shift_(d > 0 && std::has_single_bit(static_cast<uint64_t>(d)) ? std::countr_zero(static_cast<uint64_t>(d)) : -1) {}
  int64_t divisor() const noexcept { return d_; }
  // x >= 0
  int64_t div(int64_t x) const noexcept { return shift_ >= 0 ? (x >> shift_) : x / d_; }
  int64_t mod(int64_t x) const noexcept { return shift_ >= 0 ? (x & (d_ - 1)) : x % d_; }
  int64_t cdiv(int64_t x) const noexcept { return div(x + d_ - 1); }

 private:
  int64_t d_;
  int shift_;
};

}  // namespace kvattn::native_detail
