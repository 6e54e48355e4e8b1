// kvattn/kv/allocate.h — one backing allocation for the whole KV cache, viewed per layer as a
// logical [B, H, N, C] tensor (vLLM's allocate_kv_cache / create_kv_cache_views).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kvattn/core/device.h"
#include "kvattn/core/tensor.h"
#include "kvattn/kv/kv_cache_config.h"

namespace kvattn {

// Ordered by layer name; every tensor shares the same Buffer (tensor.storage()).
using KVCacheViews = std::map<std::string, Tensor, std::less<>>;

// Views `raw` (a 1-D u8 tensor over the backing allocation) as one [B, H, N, C] tensor per layer
// of `kv_cache_tensor`, in its layer order.  B = num_blocks * ratio (ratio = block_size /
// kernel_block_size), N = states of a kernel block, C = content elements.  Element dtype =
// spec.view_dtype() (C and every stride divided by its size), u8 when the spec has none.
// Strides come from compute_layout_strides with the tensor's layer_stride and block_stride
// fixed.  Splitting a manager block into kernel blocks needs dense unpadded pages (block stride
// == page), else InvalidArgument telling to reduce the block size or pick a layer-compact layout.
std::vector<Tensor> create_kv_cache_views(const Tensor& raw, const KVCacheSpec& spec, int64_t num_blocks,
                                          KVCacheLayout layout, const KVCacheTensor& kv_cache_tensor,
                                          std::optional<int64_t> kernel_block_size = std::nullopt);

// Allocates ONE zero-filled buffer of the tensors' common `size` on `device` (CPU, or CUDA when
// built with CUDA) and returns layer name -> view.  Layers whose spec has no layer views (Mamba)
// get the raw 1-D u8 tensor over the whole buffer.  kernel_block_sizes[g] (if given and g is in
// range) is the kernel block size of group g.  InvalidArgument when the tensors' sizes differ,
// a tensor's layer is in no group, or a view would leave the buffer.  Empty config -> empty map.
KVCacheViews allocate_kv_cache(const KVCacheConfig& kv_cache_config, Device device, KVCacheLayout layout,
                               const std::optional<std::vector<int64_t>>& kernel_block_sizes = std::nullopt);

}  // namespace kvattn
