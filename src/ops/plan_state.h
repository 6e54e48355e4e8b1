// src/ops/plan_state.h — what a PagedAttentionPlan holds (internal; kvattn/ops/paged_attention.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "kvattn/core/buffer.h"
#include "kvattn/ops/paged_attention.h"

namespace kvattn::ops {

// One kept plan: the device buffer with the plan tables and the plan inputs they were made from.
// Owned by the PagedAttentionPlan handles (shared_ptr); only the CUDA dispatch reads or writes
// key / buf, under `mu`, while it enqueues a call.
struct PagedAttentionPlan::State {
  std::mutex mu;
  std::atomic<bool> valid{false};    // buf holds the plan of `key` (cleared by invalidate())
  std::vector<int64_t> key;          // the plan inputs of the kept plan (cuda/dispatch.cpp plan_key)
  std::shared_ptr<Buffer> buf;       // the plan region; grown, never shrunk
  std::atomic<int64_t> plans{0}, reuses{0};
};

}  // namespace kvattn::ops
