// kvattn/kv/worker_utils.h — the worker-side KV cache helpers of vLLM's
// vllm.v1.worker.utils (KV sharing, binding caches in layer order, the memory request) and
// the legacy mixed-layout helpers of vllm.v1.worker.gpu.attn_utils.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvattn/core/tensor.h"
#include "kvattn/kv/allocate.h"
#include "kvattn/kv/attention_group.h"
#include "kvattn/kv/kv_cache_config.h"

namespace kvattn {

// vLLM's add_kv_sharing_layers_to_kv_cache_groups.  shared_kv_cache_layers: (layer, target)
// pairs in order — `layer` attends with the KV cache of `target` and allocates none.  Each
// layer is appended to the group holding its target (so attention metadata reaches it) and
// added to runner_only_attn_layers when given.  InvalidArgument when a target is in no group
// or a sharing layer is already in a group.
void add_kv_sharing_layers_to_kv_cache_groups(
    const std::vector<std::pair<std::string, std::string>>& shared_kv_cache_layers,
    std::vector<KVCacheGroupSpec>& kv_cache_groups, std::set<std::string>* runner_only_attn_layers = nullptr);

// vLLM's extract_layer_index: the integer components of a dotted name ("model.layers.12.
// self_attn.attn" -> 12).  With num_attn_module > 1 and "attn" in the name, up to two integers
// i, j give i * num_attn_module + j.  InvalidArgument when the name has no integer, more than
// allowed, or one too large.
int64_t extract_layer_index(std::string_view layer_name, int64_t num_attn_module = 1);

// vLLM's bind_kv_cache.  kv_caches: (layer name, manager view) in allocation order (Python dict
// order).  Appends the views to runner_kv_caches (which must be empty) ordered by layer index;
// names sharing an index (encoder-decoder cross/self attention, a draft model's layer i next
// to the target's layer i) keep their kv_caches order.  Then binds every layer:
// forward_context[name] = (layer_kv_caches or kv_caches)[name], an empty layer_kv_caches
// counting as absent (Python `or`).  forward_context holds the model's attention layers by
// name (a name it lacks is InvalidArgument).  InvalidArgument for duplicate names and names
// without a layer index; nothing is bound when any check fails.
void bind_kv_cache(const std::vector<std::pair<std::string, Tensor>>& kv_caches, KVCacheViews& forward_context,
                   std::vector<Tensor>& runner_kv_caches, int64_t num_attn_module = 1,
                   const KVCacheViews* layer_kv_caches = nullptr);
// Same, for allocate_kv_cache's name-ordered map.
void bind_kv_cache(const KVCacheViews& kv_caches, KVCacheViews& forward_context,
                   std::vector<Tensor>& runner_kv_caches, int64_t num_attn_module = 1,
                   const KVCacheViews* layer_kv_caches = nullptr);

// Device memory as seen at startup (vLLM's MemorySnapshot, the fields request_memory reads).
struct MemorySnapshot {
  int64_t total_memory = 0;  // bytes
  int64_t free_memory = 0;   // bytes
  std::string device = "cuda:0";
};

// vLLM's request_memory: requested = ceil(total_memory * gpu_memory_utilization).  Without
// external weights, returns it when free memory covers it.  With external_weight_memory > 0
// (weights held by another process), returns requested - external, which must be positive and
// covered by free memory.  Otherwise InvalidArgument with the GiB figures and what to change.
// gpu_memory_utilization must be in (0, 1].
int64_t request_memory(const MemorySnapshot& init_snapshot, double gpu_memory_utilization,
                       int64_t external_weight_memory = 0);

// ---------------------------------------------------------------------------------------
// Legacy path (vllm.v1.worker.gpu.attn_utils, seed 001; vllm-facts §0/§2.7).  Before the
// layout refactor, backends declared a cache shape with the block dimension first
// ((B, 2, ...), block dim 0) or K/V first ((2, B, ...), ROCm, block dim 1), and KVCacheTensor
// had `shared_by` (here: KVCacheTensor::layers) with block_stride 0 for K/V-first storage.
// The layout-era allocator never produces block_stride 0, so these only matter for caches
// built the old way.

// The old AttentionBackend.get_kv_cache_block_dim(kernel_block_size, ...) of a group's backend:
// 0 = blocks first, 1 = K/V first.
using KVCacheBlockDimFn = std::function<int64_t(const AttentionGroup& group, int64_t kernel_block_size)>;

// KV-first attention layers that share a KVCacheTensor with a Mamba layer: they must lay out
// blocks page by page like Mamba does, else block ids of the two groups overlap.  Empty when
// kv_cache_config is null.
std::set<std::string> kv_first_layers_sharing_pool_with_mamba(const std::vector<AttentionGroup>& attn_groups,
                                                              const std::vector<int64_t>& kernel_block_sizes,
                                                              const KVCacheBlockDimFn& get_kv_cache_block_dim,
                                                              const KVCacheConfig* kv_cache_config);

// Blocks-first view [B, 2, ...] over storage that is physically K/V first [2, B, half page]:
// restrides it so block b's K half is at b * half and its V half at B * half + b * half
// (vllm-facts §2.7, inferred).  Requires dim(1) == 2 and a dense [2, rest] block.
Tensor restride_blocks_first_kv_cache_to_kv_first_storage(const Tensor& kv_cache);

// When one K/V-first tensor (block_stride == 0) is shared by blocks-first (dim 0) and K/V-first
// (dim 1) layers, restrides the blocks-first views in kv_caches to the K/V-first storage —
// except for tensors holding a page-aligned layer (kv_first_layers_sharing_pool_with_mamba).
void align_mixed_attention_kv_cache_views(const std::vector<AttentionGroup>& attn_groups, KVCacheViews& kv_caches,
                                          const std::vector<int64_t>& kernel_block_sizes,
                                          const KVCacheBlockDimFn& get_kv_cache_block_dim,
                                          const KVCacheConfig& kv_cache_config,
                                          const std::set<std::string>& page_aligned_layers);

}  // namespace kvattn
