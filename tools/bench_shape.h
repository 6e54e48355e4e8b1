// tools/bench_shape.h — the attention shape the CUDA benchmarks measure (`bench-cuda`,
// `bench-dcp`): Llama-3-8B's, 32 query heads over 8 KV heads of head dim 128, 16-token pages.
#pragma once

#include <cstdint>

namespace kvattn::tools {
inline constexpr int64_t kHq = 32, kHkv = 8, kD = 128, kPage = 16;
}  // namespace kvattn::tools
