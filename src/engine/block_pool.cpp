#include "kvattn/engine/block_pool.h"

#include <fmt/format.h>

#include "kvattn/core/error.h"

namespace kvattn::engine {

BlockPool::BlockPool(int32_t num_blocks) {
  KVATTN_CHECK(num_blocks >= 2, "a block pool needs at least 2 blocks (block 0 is the reserved null block), got "
               "{}; give the KV cache more memory or use a smaller block size", num_blocks);
  refcount_.assign(static_cast<size_t>(num_blocks), 0);
  for (int32_t b = 1; b < num_blocks; ++b) free_.push_back(b);
}

int32_t BlockPool::refcount(int32_t block) const {
  KVATTN_CHECK(block >= 0 && block < num_blocks(), "block id {} is outside the pool [0, {})", block, num_blocks());
  return refcount_[static_cast<size_t>(block)];
}

bool BlockPool::allocate(int32_t n, std::vector<int32_t>& out) {
  KVATTN_CHECK(n >= 0, "cannot allocate a negative number of blocks ({})", n);
  if (n > num_free()) return false;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = free_.front();
    free_.pop_front();
    refcount_[static_cast<size_t>(b)] = 1;
    out.push_back(b);
  }
  peak_used_ = std::max(peak_used_, num_used());
  return true;
}

void BlockPool::incref(int32_t block) {
  KVATTN_ASSERT(block > 0 && block < num_blocks() && refcount_[static_cast<size_t>(block)] > 0,
                "incref of block {} which is not in use", block);
  ++refcount_[static_cast<size_t>(block)];
}

void BlockPool::release(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    KVATTN_ASSERT(b > 0 && b < num_blocks(), "release of block {} outside [1, {})", b, num_blocks());
    int32_t& rc = refcount_[static_cast<size_t>(b)];
    KVATTN_ASSERT(rc > 0, "double free of block {}", b);
    if (--rc == 0) free_.push_back(b);
  }
}

void BlockPool::check_invariants() const {
  std::vector<int> seen(refcount_.size(), 0);
  for (int32_t b : free_) {
    KVATTN_ASSERT(b > 0 && b < num_blocks(), "free list holds block {} (null block or out of range)", b);
    KVATTN_ASSERT(++seen[static_cast<size_t>(b)] == 1, "block {} is on the free list twice", b);
    KVATTN_ASSERT(refcount_[static_cast<size_t>(b)] == 0, "free block {} has refcount {}", b,
                  refcount_[static_cast<size_t>(b)]);
  }
  KVATTN_ASSERT(refcount_[0] == 0, "the null block was handed out");
  for (int32_t b = 1; b < num_blocks(); ++b)
    KVATTN_ASSERT(seen[static_cast<size_t>(b)] == 1 || refcount_[static_cast<size_t>(b)] > 0,
                  "block {} is neither free nor referenced (leaked)", b);
}

}  // namespace kvattn::engine
