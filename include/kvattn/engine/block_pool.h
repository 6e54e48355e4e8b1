// kvattn/engine/block_pool.h — the KV-cache block pool of the toy serving engine.
//
// Blocks are ids in [0, num_blocks).  Block 0 is the null block (vLLM's NULL_BLOCK_ID): it is
// never handed out, so block tables can pad with it.  Blocks are reference counted so that
// requests sharing a prompt prefix can share its full blocks; a block returns to the free list
// when its count drops to zero.  The free list is FIFO (the least recently freed block is
// reused first), as vLLM's.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

namespace kvattn::engine {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const noexcept { return static_cast<int32_t>(refcount_.size()); }
  // Blocks that can be handed out in total (all but the null block).
  int32_t capacity() const noexcept { return num_blocks() - 1; }
  int32_t num_free() const noexcept { return static_cast<int32_t>(free_.size()); }
  int32_t num_used() const noexcept { return capacity() - num_free(); }
  int32_t peak_used() const noexcept { return peak_used_; }
  int32_t refcount(int32_t block) const;

  // Appends `n` fresh blocks (refcount 1) to `out` and returns true, or takes nothing and
  // returns false when fewer than `n` are free ("does not fit" is a status, not an error).
  bool allocate(int32_t n, std::vector<int32_t>& out);
  // Adds a reference to a block that is in use.
  void incref(int32_t block);
  // Drops one reference from each block; blocks reaching zero return to the free list.
  void release(std::span<const int32_t> blocks);

  // Throws InternalError if an invariant is broken: the null block is never free nor
  // referenced, each block is either free (exactly once, refcount 0) or referenced.
  void check_invariants() const;

 private:
  std::vector<int32_t> refcount_;  // [num_blocks]
  std::deque<int32_t> free_;
  int32_t peak_used_ = 0;
};

}  // namespace kvattn::engine
