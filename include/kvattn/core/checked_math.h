// kvattn/core/checked_math.h — overflow-checked integer arithmetic for sizes derived from input.
//
// Every shape product, element count, byte size and offset computed from a caller's values goes
// through these helpers: an overflow is an InvalidArgument that names the quantity and the
// operands, never a wrapped (and then under-allocated or out-of-bounds) value.  `what` names the
// quantity in the caller's terms ("element count of shape [4, 2]", "--batch * --kv-len").
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "kvattn/core/error.h"

namespace kvattn {

namespace detail {
[[noreturn]] void throw_overflow(std::string_view what, const char* op, int64_t a, int64_t b);
[[noreturn]] void throw_narrowing(std::string_view what, const std::string& value, const std::string& lo,
                                  const std::string& hi);
}  // namespace detail

// a * b, or InvalidArgument naming `what` and both operands when it does not fit an int64.
inline int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]]
    detail::throw_overflow(what, "*", a, b);
  return r;
}

// a + b, or InvalidArgument naming `what` and both operands when it does not fit an int64.
inline int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) [[unlikely]]
    detail::throw_overflow(what, "+", a, b);
  return r;
}

// a - b, checked as checked_add.
inline int64_t checked_sub(int64_t a, int64_t b, std::string_view what) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) [[unlikely]]
    detail::throw_overflow(what, "-", a, b);
  return r;
}

// The product of `v` (e.g. a shape's element count), checked at every step.
inline int64_t checked_product(std::span<const int64_t> v, std::string_view what) {
  int64_t p = 1;
  for (int64_t x : v) p = checked_mul(p, x, what);
  return p;
}

// v converted to To, or InvalidArgument naming `what`, the value and To's range when it does
// not fit (a full-width check before narrowing: 4294967298 never becomes 2).
template <typename To, typename From>
inline To checked_cast(From v, std::string_view what) {
  static_assert(std::is_integral_v<To> && std::is_integral_v<From>);
  bool fits;
  if constexpr (std::is_signed_v<From> == std::is_signed_v<To>) {
    fits = v >= std::numeric_limits<To>::min() && v <= std::numeric_limits<To>::max();
  } else if constexpr (std::is_signed_v<From>) {  // signed -> unsigned
    fits = v >= 0 && static_cast<std::make_unsigned_t<From>>(v) <= std::numeric_limits<To>::max();
  } else {  // unsigned -> signed
    fits = v <= static_cast<std::make_unsigned_t<To>>(std::numeric_limits<To>::max());
  }
  if (!fits) [[unlikely]]
    detail::throw_narrowing(what, fmt::format("{}", v), fmt::format("{}", std::numeric_limits<To>::min()),
                            fmt::format("{}", std::numeric_limits<To>::max()));
  return static_cast<To>(v);
}

}  // namespace kvattn
