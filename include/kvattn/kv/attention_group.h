// kvattn/kv/attention_group.h — the KV-cache part of vLLM's `AttentionGroup`
// (vllm.v1.worker.utils): the layers of one KV cache group served by one backend, and the
// mapping between manager blocks (what the scheduler allocates) and kernel blocks (what the
// backend's kernels address).
//
// When a backend needs blocks smaller than the manager's (kernel_block_size set), kernel
// block j of manager block b is
//
//   b * kernel_block_stride + j          (j < ratio = spec.block_size / kernel_block_size)
//
// where kernel_block_stride is `ratio` for ordinary caches and larger for packed caches whose
// other layers' pages sit between a layer's blocks (set by map_kv_cache_to_kernel_blocks).
//
// Not here yet: create_metadata_builders / build_metadata and the builder list; they belong
// to the attention backend (a later issue).  `configure_kernel_blocks` is the KV part of
// create_metadata_builders: choosing the kernel block size and sizing the persistent table.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kvattn/core/device.h"
#include "kvattn/core/tensor.h"
#include "kvattn/kv/allocate.h"
#include "kvattn/kv/block_size.h"
#include "kvattn/kv/kv_cache_spec.h"

namespace kvattn {

struct AttentionGroup {
  const BlockSizeBackend* backend = nullptr;  // not owned; may be null for tests/tools
  std::vector<std::string> layer_names;
  KVCacheSpecPtr kv_cache_spec;
  int64_t kv_cache_group_id = 0;
  // Set when the backend's kernels need blocks smaller than spec.block_size (see above).
  std::optional<int64_t> kernel_block_size;
  // 0 = use ratio; > 0 once a packed cache was mapped.
  int64_t kernel_block_stride = 0;
  // Persistent per ubatch (CUDA graphs capture the mapped table):
  Tensor kernel_block_table;    // [num_ubatches, max_num_reqs, width * ratio] int32, CPU
  Tensor kernel_block_offsets;  // [ratio] int32, = 0..ratio-1

  // The KV part of vLLM's create_metadata_builders: for an attention spec, narrows
  // `kernel_block_size` to one the backend accepts (select_common_block_size), records it
  // when it differs from spec.block_size, and allocates kernel_block_table for
  // `num_ubatches` x `max_num_reqs` rows of `block_table_width` manager blocks.
  void configure_kernel_blocks(std::optional<int64_t> kernel_block_size, int64_t num_ubatches,
                               int64_t max_num_reqs, int64_t block_table_width);

  // Manager blocks per kernel block ratio (1 when no kernel block size is set).
  int64_t blocks_per_kv_block() const;

  // block_table [rows, cols] int32 of manager block ids -> a view of kernel_block_table
  // [rows, cols * ratio] with out[r, c*ratio + j] = block_table[r, c] * (stride or ratio) + j.
  // Returns block_table itself when no kernel block size is set.  InvalidArgument when the
  // table does not fit the persistent buffer or ids overflow int32.
  Tensor map_to_kernel_block_table(const Tensor& block_table, int64_t ubatch_idx = 0);

  // Views a packed layer cache [B, H, N, C] in manager blocks as kernel blocks and sets
  // kernel_block_stride.  Returns kv_cache unchanged when it is already kernel-granular
  // (N == kernel rows).  Only compressed caches (tokens_per_state > 1, H == 1, block stride a
  // multiple of the kernel page) can be mapped; otherwise InvalidArgument saying what to change.
  Tensor map_kv_cache_to_kernel_blocks(const Tensor& kv_cache);

  // The inverse view: a kernel-block view back in `num_blocks` manager blocks.  Requires
  // kernel_block_stride (InvalidArgument otherwise).
  Tensor map_kv_cache_to_manager_blocks(const Tensor& kv_cache, int64_t num_blocks) const;
};

// vLLM's `map_kv_caches_to_kernel_blocks`: the views to bind to layers.  A copy of kv_caches in
// which the layers of groups with a kernel block size are replaced by
// map_kv_cache_to_kernel_blocks; kv_caches (manager views) stay for KV connectors.
KVCacheViews map_kv_caches_to_kernel_blocks(const KVCacheViews& kv_caches,
                                            const std::vector<AttentionGroup*>& attn_groups);
KVCacheViews map_kv_caches_to_kernel_blocks(const KVCacheViews& kv_caches,
                                            std::vector<AttentionGroup>& attn_groups);

// The attention groups of a runner with one backend: per KV cache group gid, one group of all
// its layers on `backend` (what prepare_kernel_block_sizes takes as attn_groups).  `backend`
// must outlive the result.
std::vector<std::vector<AttentionGroup>> one_backend_attention_groups(const KVCacheConfig& kv_cache_config,
                                                                      const BlockSizeBackend& backend);

}  // namespace kvattn
