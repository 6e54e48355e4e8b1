// tests/support/sizes.h — byte sizes for tests that state memory budgets.
#pragma once

#include <cstdint>

namespace kvattn::test {
inline constexpr int64_t kMiB = int64_t{1} << 20;
inline constexpr int64_t kGiB = int64_t{1} << 30;
}  // namespace kvattn::test
