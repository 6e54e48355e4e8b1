// allocate_kv_cache / create_kv_cache_views (see allocate.h).
#include "kvattn/kv/allocate.h"

#include <fmt/format.h>

#include <set>

namespace kvattn {

std::vector<Tensor> create_kv_cache_views(const Tensor& raw, const KVCacheSpec& spec, int64_t num_blocks,
                                          KVCacheLayout layout, const KVCacheTensor& t,
                                          std::optional<int64_t> kernel_block_size) {
  KVATTN_CHECK(raw.defined() && raw.dim() == 1 && raw.dtype() == DType::u8 && raw.stride(0) == 1,
               "create_kv_cache_views: the backing tensor must be a contiguous 1-D uint8 tensor, got {}", raw.str());
  KVATTN_CHECK(!t.layers.empty(), "create_kv_cache_views: KVCacheTensor has no layers");
  KVATTN_CHECK(num_blocks > 0, "create_kv_cache_views: num_blocks must be positive, got {}", num_blocks);
  KVATTN_CHECK(t.offset >= 0 && t.layer_stride >= 0 && t.block_stride >= 0,
               "create_kv_cache_views: negative offset/stride in KVCacheTensor (offset={}, layer_stride={}, "
               "block_stride={})",
               t.offset, t.layer_stride, t.block_stride);
  const auto num_layers = static_cast<int64_t>(t.layers.size());
  const auto shape = compute_layer_kv_cache_shape_bytes(spec, num_blocks, kernel_block_size);
  const int64_t ratio = shape[0] / num_blocks;
  int64_t block_stride = t.block_stride;
  if (ratio > 1) {
    const auto one = compute_layer_kv_cache_shape_bytes(spec, 1);
    const int64_t dense = one[1] * one[2] * one[3];
    if (block_stride != dense)
      throw InvalidArgument(fmt::format(
          "The resolved KV cache layout ({}) does not store blocks as dense, unpadded pages (block stride {} != "
          "page {}), so a manager block cannot be split into {} kernel blocks of {} tokens. Reduce --block-size to "
          "{} or set VLLM_KV_CACHE_LAYOUT to a layer-compact layout (e.g. LBNHC).",
          layout_name(layout), block_stride, dense, ratio, *kernel_block_size, *kernel_block_size));
    KVATTN_ASSERT(block_stride % ratio == 0, "block stride {} not divisible by {}", block_stride, ratio);
    block_stride /= ratio;
  }
  const auto st = compute_layout_strides(spec, num_blocks, num_layers, layout, kernel_block_size,
                                         {t.layer_stride, block_stride, std::nullopt, std::nullopt, std::nullopt});
  const Tensor grid = raw.as_strided(Dims{num_layers, shape[0], shape[1], shape[2], shape[3]},
                                     Dims{st[0], st[1], st[2], st[3], st[4]}, raw.byte_offset() + t.offset);
  const auto dtype = spec.view_dtype();
  std::vector<Tensor> views;
  views.reserve(t.layers.size());
  for (int64_t l = 0; l < num_layers; ++l) {
    Tensor v = grid.select(0, l);
    views.push_back(dtype ? v.view_as(*dtype) : v);
  }
  return views;
}

KVCacheViews allocate_kv_cache(const KVCacheConfig& cfg, Device device, KVCacheLayout layout,
                               const std::optional<std::vector<int64_t>>& kernel_block_sizes) {
  KVCacheViews out;
  if (cfg.kv_cache_tensors.empty()) return out;
  std::set<int64_t> sizes;
  for (const auto& t : cfg.kv_cache_tensors) sizes.insert(t.size);
  if (sizes.size() != 1) {
    std::string list;
    for (int64_t s : sizes) list += fmt::format("{}{}", list.empty() ? "" : ", ", s);
    throw InvalidArgument(fmt::format(
        "KV cache tensors must share one backing allocation, but their sizes differ ({} bytes); build the config "
        "with materialize_kv_cache_config",
        list));
  }
  const int64_t size = *sizes.begin();
  KVATTN_CHECK(size >= 0, "KV cache size must be >= 0, got {}", size);
  const Tensor raw = Tensor::zeros(Dims{size}, DType::u8, device);

  for (const auto& t : cfg.kv_cache_tensors) {
    KVATTN_CHECK(!t.layers.empty(), "a KVCacheTensor has no layers");
    const auto& first = t.layers.front();
    const auto group = cfg.group_index_of(first);
    KVATTN_CHECK(group.has_value(), "layer '{}' of a KVCacheTensor is in no KV cache group; add it to a group",
                 first);
    const KVCacheSpecPtr spec = cfg.layer_spec(first);
    if (!spec->has_layer_views()) {
      for (const auto& n : t.layers) out.insert_or_assign(n, raw);
      continue;
    }
    std::optional<int64_t> kernel;
    if (kernel_block_sizes.has_value() && *group < kernel_block_sizes->size()) kernel = (*kernel_block_sizes)[*group];
    auto views = create_kv_cache_views(raw, *spec, cfg.num_blocks_of(t), layout, t, kernel);
    for (size_t i = 0; i < views.size(); ++i) out.insert_or_assign(t.layers[i], std::move(views[i]));
  }
  return out;
}

}  // namespace kvattn
