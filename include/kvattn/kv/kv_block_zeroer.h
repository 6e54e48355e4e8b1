// kvattn/kv/kv_block_zeroer.h — zeroing newly allocated KV cache blocks (vLLM's
// `vllm.v1.worker.utils.KVBlockZeroer`).
//
// The scheduler hands out block ids of the pool; before a block is reused by a group whose
// kernel reads stale bytes as data (Mamba state, mixed-precision pages overlaying each
// other), the worker zeroes it.  The zeroer is built once after the KV cache is allocated
// and bound: it turns every attention layer's `[B, H, N, C]` view into a table of
// *segments*.  A segment is one contiguous run of bytes per logical (manager) block:
//
//   words [block_id * block_stride, block_id * block_stride + page_size)  from  addr
//
// with `addr` an absolute byte address and the stride and size in 4-byte words (the kernel
// writes int32 zeros).  One segment exists per index of the dimensions that lie physically
// *outside* the block dimension (LHBNC: one per head group) and per kernel (virtual) block
// inside a manager block.  Overlaid layers that start at the same address keep one segment
// with the widest page.  Under BHLNC a segment's page spans the other layers' bytes of the
// same block tile, which is safe: a freshly allocated block owns its whole tile.
//
// Execution goes through `ops::zero_kv_blocks` (CPU reference or CUDA kernel by device).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvattn/core/device.h"
#include "kvattn/core/tensor.h"
#include "kvattn/kv/allocate.h"

namespace kvattn {

struct AttentionGroup;

// The segment table, host side.  All three vectors have one entry per segment.
struct KVZeroSegments {
  std::vector<int64_t> addrs;          // absolute byte address of the segment in block 0
  std::vector<int64_t> block_strides;  // distance between logical blocks, in 4-byte words
  std::vector<int64_t> page_sizes;     // words cleared per block, in 4-byte words

  size_t size() const noexcept { return addrs.size(); }
  bool empty() const noexcept { return addrs.empty(); }
};

// Builds a segment table layer by layer (the body of vLLM's KVBlockZeroer.__init__ for one
// layer).  `kv` is a layer's bound view with blocks at dim 0 — `[B, H, N, C]` in manager
// blocks, or `[num_blocks * ratio, H, N/ratio, C]` in kernel blocks (virtual splitting,
// ratio kernel blocks per manager block, back to back).  Validates everything it relies on
// and throws InvalidArgument naming the layer otherwise.
class KVZeroSegmentBuilder {
 public:
  explicit KVZeroSegmentBuilder(int64_t num_blocks);

  void add_layer(const std::string& layer_name, const Tensor& kv);

  const KVZeroSegments& segments() const noexcept { return segs_; }
  KVZeroSegments take() && { return std::move(segs_); }
  int64_t num_blocks() const noexcept { return num_blocks_; }

 private:
  int64_t num_blocks_;
  KVZeroSegments segs_;
  std::unordered_map<int64_t, size_t> seen_;  // segment address -> index in segs_
};

class KVBlockZeroer {
 public:
  // Precomputes the segment table (see the file comment).
  //   device                  the device whose caches are zeroed; layers on other devices
  //                           are skipped (as upstream does).
  //   attn_groups             every attention group of the model (only AttentionSpec groups
  //                           contribute; Mamba and other non-attention groups are skipped).
  //   kernel_block_sizes      per KV cache group (prepare_kernel_block_sizes); groups with an
  //                           id past its end are skipped.
  //   layer_kv_caches         the views bound to the layers (vLLM's forward context
  //                           `layer.kv_cache`), e.g. map_kv_caches_to_kernel_blocks' output.
  //                           A layer without an entry or with an undefined tensor is skipped.
  //   num_blocks              number of manager blocks in the pool.
  //   runner_only_attn_layers layers whose cache is not their own (KV sharing); skipped.
  KVBlockZeroer(Device device, std::span<const AttentionGroup> attn_groups,
                std::span<const int64_t> kernel_block_sizes,
                const KVCacheViews& layer_kv_caches, int64_t num_blocks,
                const std::set<std::string>* runner_only_attn_layers = nullptr);

  // Zeroes every segment of each listed manager block id.  Ids must lie in [0, num_blocks);
  // an empty list (or an empty table) does nothing.
  void zero_block_ids(std::span<const int64_t> block_ids);
  void zero_block_ids(std::span<const int32_t> block_ids);

  // Runs the zeroing path once (block 0) so first-use costs are paid before serving.
  void warmup(int64_t num_kv_blocks);

  const KVZeroSegments& segments() const noexcept { return segs_; }
  int64_t num_blocks() const noexcept { return num_blocks_; }
  Device device() const noexcept { return device_; }
  int64_t max_page_size_words() const noexcept { return max_page_words_; }

 private:
  void run(const Tensor& block_ids);

  Device device_;
  int64_t num_blocks_ = 0;
  int64_t max_page_words_ = 0;
  KVZeroSegments segs_;
  Tensor seg_addrs_;          // [S] int64 on device_, absolute byte addresses
  Tensor seg_block_strides_;  // [S] int64 on device_, 4-byte words
  Tensor seg_page_sizes_;     // [S] int64 on device_, 4-byte words
  Tensor ids_staging_;        // [num_blocks] int64 on device_ (CUDA only): persistent id buffer
};

}  // namespace kvattn
