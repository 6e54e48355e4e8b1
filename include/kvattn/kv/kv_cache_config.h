// kvattn/kv/kv_cache_config.h — the KV cache memory plan (vLLM's KVCacheTensor /
// KVCacheGroupSpec / KVCacheConfig and the planner of vllm/v1/core/kv_cache_utils.py).
//
// All KVCacheTensors share ONE backing allocation of `size` bytes.  Layer layers[l]'s page for
// block b starts at   offset + l * layer_stride + b * block_stride   bytes into it.
// Cache groups overlay each other from byte 0 (a block id belongs to one group at a time), so
// tensors of different groups may address the same bytes; tensors of one group never do.
//   block-outer: group0 | blk0 [A|B|pad] | blk1 [A|B|pad] | ...   group1 | blk0 [C|D] | ...
//   layer-outer: group0 | A[blk0|blk1|..] | B[blk0|..] |          group1 | C[...] | D[...] |
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvattn/core/error.h"
#include "kvattn/kv/kv_cache_layout.h"
#include "kvattn/kv/kv_cache_spec.h"

namespace kvattn {

struct KVCacheTensor {
  int64_t size = 0;                 // bytes of the (single, shared) backing allocation
  std::vector<std::string> layers;  // layer names in L order (vLLM's old `shared_by`)
  int64_t layer_stride = 0;         // bytes between layers[l] and layers[l+1], same block
  int64_t block_stride = 0;         // bytes between block b and b+1, same layer
  int64_t offset = 0;               // byte offset of layers[0]'s block 0
};

struct KVCacheGroupSpec {
  std::vector<std::string> layer_names;
  KVCacheSpecPtr kv_cache_spec;  // a UniformTypeKVCacheSpecs when per-layer specs differ
  bool is_eagle_group = false;
  bool enable_kv_transfer = true;
};

struct KVCacheConfig {
  int64_t num_blocks = 0;  // manager blocks, block 0 is the null block
  std::vector<KVCacheTensor> kv_cache_tensors;
  std::vector<KVCacheGroupSpec> kv_cache_groups;
  std::optional<int64_t> prefix_cache_retention_interval = std::nullopt;
  std::optional<KVCacheLayout> kv_cache_layout = std::nullopt;  // the resolved layout adopted by all workers

  // (inferred) blocks `tensor` holds: num_blocks for every ordinary tensor.
  int64_t num_blocks_of(const KVCacheTensor& tensor) const;
  // Index of the group holding `layer_name`; nullopt when none.
  std::optional<size_t> group_index_of(std::string_view layer_name) const;
  // The layer's own spec (unwrapping UniformTypeKVCacheSpecs); InvalidArgument when unknown.
  KVCacheSpecPtr layer_spec(std::string_view layer_name) const;
  bool has_mamba_layers() const;
  // More than one (dtype, kv_quant_mode) among the attention layers.
  bool has_mixed_precision_kv_cache() const;
  bool needs_kv_cache_zeroing() const { return has_mamba_layers() || has_mixed_precision_kv_cache(); }
};

// ---------------------------------------------------------------------------------------
// Geometry helpers (§2.3).

// (B, H, N, C) of one layer's view, C in BYTES: B = num_blocks * (block_size / kernel),
// N = states of a kernel block.  kernel_block_size (default block_size) must divide block_size.
std::array<int64_t, 4> compute_layer_kv_cache_shape_bytes(
    const KVCacheSpec& spec, int64_t num_blocks, std::optional<int64_t> kernel_block_size = std::nullopt);

using LayoutStrides = std::array<int64_t, 5>;                // bytes, logical [L, B, H, N, C]
using FixedStrides = std::array<std::optional<int64_t>, 5>;  // bytes, logical [L, B, H, N, C]

// Byte strides of the [L, B, H, N, C] grid for `layout`, packing from the innermost physical axis
// outwards.  A fixed stride replaces the computed one and propagates outward (LHBNC with a fixed
// B stride s: H = s * B, L = H-stride * H).  With a padded page (spec.page_size_padded()), the
// stride of the innermost page-grid axis (L or B, whichever is inner) is rounded up to the padded
// page; padded pages cannot be split into kernel blocks (Unsupported), and layouts that put H between
// L and B cannot pad (Unsupported).  A fixed stride of 0 counts as unset (vLLM's `fixed or cur`).
LayoutStrides compute_layout_strides(const KVCacheSpec& spec, int64_t num_blocks, int64_t num_layers,
                                     KVCacheLayout layout,
                                     std::optional<int64_t> kernel_block_size = std::nullopt,
                                     const FixedStrides& fixed_strides = {});

// ---------------------------------------------------------------------------------------
// The planner (§2.2).

// One model layer that needs KV cache, in model order.
struct LayerKVCacheSpec {
  std::string layer_name;
  KVCacheSpecPtr spec;
};

// Groups layers like vLLM's hybrid allocator: all specs equal -> one group; same type and block
// size -> one group with a UniformTypeKVCacheSpecs; otherwise layers with equal specs are
// gathered (first-appearance order) and each gathering is cut into groups of `group_size`
// layers, group_size = the smallest gathering's layer count (kvattn simplification of vLLM's
// choice).  Encoder-only layers are grouped like any other.  InvalidArgument on empty input,
// duplicate names or null specs.
std::vector<KVCacheGroupSpec> get_kv_cache_groups(const std::vector<LayerKVCacheSpec>& layers);

// vLLM's _validate_kv_cache_config: more than one distinct per-layer page size needs a
// block-compact layout, and not a layer-compact one when there are several groups.
void validate_kv_cache_config(KVCacheLayout layout, const std::vector<KVCacheGroupSpec>& groups);

// Bytes one manager block costs across the backing allocation: layer-outer = max over groups of
// sum of round_up(page, alignment); block-outer = round_up(max over groups of sum of pages,
// lcm of the alignments).
int64_t get_kv_cache_bytes_per_block(const std::vector<KVCacheGroupSpec>& groups, KVCacheLayout layout);

// Lays out `groups` for exactly `num_blocks` blocks (vLLM's get_kv_cache_config_from_groups with
// the block count decided): one KVCacheTensor per (group, distinct per-layer spec), groups
// aliasing from byte 0.  Validates first (validate_kv_cache_config).
KVCacheConfig materialize_kv_cache_config(const std::vector<KVCacheGroupSpec>& groups,
                                          KVCacheLayout layout, int64_t num_blocks);

struct KVCachePlanOptions {
  KVCacheLimits limits{};                          // max_model_len etc.
  std::optional<int64_t> num_gpu_blocks_override = std::nullopt;  // replaces the block count that fits
};

// Bytes the pool needs so that one request of limits.max_model_len tokens fits: (1 null block +
// for each group, the blocks one request holds in it) * bytes per block.
int64_t kv_cache_memory_needed(const std::vector<KVCacheGroupSpec>& groups, KVCacheLayout layout,
                               const KVCacheLimits& limits);

// Largest max_model_len (<= limits.max_model_len) whose kv_cache_memory_needed fits in
// available_memory; 0 when none.
int64_t estimate_max_model_len(const std::vector<KVCacheGroupSpec>& groups, KVCacheLayout layout,
                               const KVCacheLimits& limits, int64_t available_memory);

// The whole plan: groups, validation, num_blocks = available_memory / bytes_per_block (or the
// override), then materialise.  Fails (as a value) when not even one max-length request fits:
// the message gives the memory needed and available, the estimated max model length and what
// to change (raise the memory budget or lower max_model_len).  Invalid inputs (bad layout for the
// model, bad specs) throw InvalidArgument.
Result<KVCacheConfig> get_kv_cache_config(const std::vector<LayerKVCacheSpec>& layers,
                                          KVCacheLayout layout, int64_t available_memory,
                                          const KVCachePlanOptions& options);

// Same, for groups already formed.
Result<KVCacheConfig> get_kv_cache_config_from_groups(const std::vector<KVCacheGroupSpec>& groups,
                                                      KVCacheLayout layout, int64_t available_memory,
                                                      const KVCachePlanOptions& options);

}  // namespace kvattn
