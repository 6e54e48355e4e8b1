// kvattn/batch/fast_div.h — division by a block size fixed for a whole step.
//
// Per-request loops divide positions and lengths by the block size; a 64-bit division costs
// tens of cycles, more than the rest of the loop body.  Block sizes are almost always powers of
// two, so BlockDiv turns the division into a shift and the remainder into a mask, and falls back
// to division otherwise.  Operands must be >= 0.
#pragma once

#include <bit>
#include <cstdint>

namespace kvattn {

// The two forms as separate types, so a loop instantiated for each carries no per-element branch
// (BlockDiv::visit).
struct ShiftDiv {
  int64_t d;
  int shift;
  int64_t div(int64_t x) const noexcept { return x >> shift; }
  int64_t mod(int64_t x) const noexcept { return x & (d - 1); }
  int64_t cdiv(int64_t x) const noexcept { return (x + d - 1) >> shift; }
};
struct PlainDiv {
  int64_t d;
  int64_t div(int64_t x) const noexcept { return x / d; }
  int64_t mod(int64_t x) const noexcept { return x % d; }
  int64_t cdiv(int64_t x) const noexcept { return (x + d - 1) / d; }
};

class BlockDiv {
 public:
  explicit BlockDiv(int64_t divisor) noexcept
      : d_(divisor > 0 ? divisor : 1),
        pow2_(std::has_single_bit(static_cast<uint64_t>(d_))),
        shift_(std::countr_zero(static_cast<uint64_t>(d_))) {}

  int64_t divisor() const noexcept { return d_; }
  int64_t div(int64_t x) const noexcept { return pow2_ ? (x >> shift_) : x / d_; }
  int64_t mod(int64_t x) const noexcept { return pow2_ ? (x & (d_ - 1)) : x % d_; }
  int64_t cdiv(int64_t x) const noexcept { return div(x + d_ - 1); }
  bool pow2() const noexcept { return pow2_; }
  ShiftDiv shift_form() const noexcept { return ShiftDiv{d_, shift_}; }  // only when pow2()
  PlainDiv plain_form() const noexcept { return PlainDiv{d_}; }
  // Calls f(ShiftDiv) or f(PlainDiv): hoists the power-of-two test out of a hot loop.
  template <typename F>
  decltype(auto) visit(F&& f) const {
    return pow2_ ? f(shift_form()) : f(plain_form());
  }

 private:
  int64_t d_;
  bool pow2_;
  int shift_;
};

}  // namespace kvattn
