// kvattn/ops/ops.h — every ops/ entry point, and the CPU thread-pool setting.
//
// Each entry point checks its arguments once (the same checks for every device) and then
// dispatches on the tensors' device: CPU -> ops/cpu (threaded, tiled), CUDA -> ops/cuda (or
// Unsupported in a build without CUDA).  All tensors of one call must be on one device.
#pragma once

#include "kvattn/ops/cascade.h"
#include "kvattn/ops/dcp_combine.h"
#include "kvattn/ops/merge_attn_states.h"
#include "kvattn/ops/page_utils.h"
#include "kvattn/ops/paged_attention.h"
#include "kvattn/ops/reshape_and_cache.h"
#include "kvattn/ops/zero_kv_blocks.h"

namespace kvattn::ops {

// Worker threads of the CPU ops (default: std::thread::hardware_concurrency()).  n >= 1.
void set_cpu_num_threads(int n);
int cpu_num_threads();

// True when this build has the CUDA implementations of the ops.
bool cuda_ops_available() noexcept;

}  // namespace kvattn::ops
