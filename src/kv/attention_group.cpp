// AttentionGroup: manager-block <-> kernel-block mapping (see kv/attention_group.h).
#include "kvattn/kv/attention_group.h"

#include <fmt/format.h>

#include <limits>

#include "kvattn/core/error.h"

namespace kvattn {

namespace {
std::string backend_name(const AttentionGroup& g) { return g.backend ? g.backend->name : "the backend"; }
}  // namespace

int64_t AttentionGroup::blocks_per_kv_block() const {
  if (!kernel_block_size) return 1;
  KVATTN_CHECK(kv_cache_spec != nullptr, "AttentionGroup: kv_cache_spec is not set");
  return kv_cache_spec->block_size() / *kernel_block_size;
}

void AttentionGroup::configure_kernel_blocks(std::optional<int64_t> kernel_bs, int64_t num_ubatches,
                                             int64_t max_num_reqs, int64_t block_table_width) {
  KVATTN_CHECK(kv_cache_spec != nullptr, "AttentionGroup::configure_kernel_blocks: kv_cache_spec is not set");
  const int64_t bs = kv_cache_spec->block_size();
  if (kernel_bs && as_attention_spec(kv_cache_spec)) {
    KVATTN_CHECK(*kernel_bs > 0 && bs % *kernel_bs == 0,
                 "kernel block size {} does not divide the KV cache block size {}; choose a divisor", *kernel_bs,
                 bs);
    // A backend in a packed group may need smaller blocks than the group is split into.
    if (backend) {
      const KVCacheSpec* s = kv_cache_spec.get();
      kernel_bs = select_common_block_size(*kernel_bs, {backend}, {s});
    }
    if (*kernel_bs != bs) kernel_block_size = *kernel_bs;
  }
  if (!kernel_block_size) return;
  KVATTN_CHECK(num_ubatches > 0 && max_num_reqs > 0 && block_table_width > 0,
               "AttentionGroup::configure_kernel_blocks: num_ubatches ({}), max_num_reqs ({}) and "
               "block_table_width ({}) must be positive",
               num_ubatches, max_num_reqs, block_table_width);
  const int64_t ratio = blocks_per_kv_block();
  kernel_block_table = Tensor::zeros({num_ubatches, max_num_reqs, block_table_width * ratio}, DType::i32);
  std::vector<int32_t> offs(static_cast<size_t>(ratio));
  for (int64_t j = 0; j < ratio; ++j) offs[static_cast<size_t>(j)] = static_cast<int32_t>(j);
  kernel_block_offsets = Tensor::from_vector(offs);
}

Tensor AttentionGroup::map_to_kernel_block_table(const Tensor& block_table, int64_t ubatch_idx) {
  if (!kernel_block_size) return block_table;
  KVATTN_CHECK(kernel_block_table.defined() && kernel_block_offsets.defined(),
               "map_to_kernel_block_table: call configure_kernel_blocks first (kernel_block_table unset)");
  KVATTN_CHECK(block_table.dim() == 2 && block_table.dtype() == DType::i32,
               "map_to_kernel_block_table: block_table must be [num_reqs, max_blocks] int32, got {}",
               block_table.str());
  if (!block_table.device().is_cpu() || !kernel_block_table.device().is_cpu())
    throw Unsupported("map_to_kernel_block_table: only CPU block tables are supported so far (got " +
                      block_table.device().str() + "); the device kernel comes with the attention backend");
  const int64_t ratio = blocks_per_kv_block();
  const int64_t stride = kernel_block_stride ? kernel_block_stride : ratio;
  const int64_t rows = block_table.size(0), cols = block_table.size(1);
  KVATTN_CHECK(ubatch_idx >= 0 && ubatch_idx < kernel_block_table.size(0),
               "map_to_kernel_block_table: ubatch {} out of range (valid: 0..{})", ubatch_idx,
               kernel_block_table.size(0) - 1);
  KVATTN_CHECK(rows <= kernel_block_table.size(1) && cols * ratio <= kernel_block_table.size(2),
               "map_to_kernel_block_table: block table [{}, {}] x {} kernel blocks per block does not fit "
               "the persistent table [{}, {}]; configure a larger max_num_reqs / block_table_width",
               rows, cols, ratio, kernel_block_table.size(1), kernel_block_table.size(2));
  Tensor out = kernel_block_table.select(0, ubatch_idx).slice(0, 0, rows).slice(1, 0, cols * ratio);
  const int32_t* offs = kernel_block_offsets.data_ptr<int32_t>();
  const int32_t* bt = block_table.data_ptr<int32_t>();
  int32_t* o = out.data_ptr<int32_t>();
  const int64_t bs0 = block_table.stride(0), bs1 = block_table.stride(1);
  const int64_t os0 = out.stride(0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t b = bt[r * bs0 + c * bs1];
      for (int64_t j = 0; j < ratio; ++j) {
        const int64_t k = b * stride + offs[j];
        KVATTN_CHECK(k >= std::numeric_limits<int32_t>::min() && k <= std::numeric_limits<int32_t>::max(),
                     "map_to_kernel_block_table: block id {} maps to kernel block {} which overflows int32",
                     b, k);
        o[r * os0 + c * ratio + j] = static_cast<int32_t>(k);
      }
    }
  }
  return out;
}

Tensor AttentionGroup::map_kv_cache_to_kernel_blocks(const Tensor& kv_cache) {
  KVATTN_CHECK(kernel_block_size.has_value(),
               "map_kv_cache_to_kernel_blocks: the group has no kernel block size; nothing to map");
  KVATTN_CHECK(kv_cache_spec != nullptr, "map_kv_cache_to_kernel_blocks: kv_cache_spec is not set");
  KVATTN_CHECK(kv_cache.dim() == 4, "map_kv_cache_to_kernel_blocks: expected a [B, H, N, C] view, got {}",
               kv_cache.str());
  const KVCacheSpec& spec = *kv_cache_spec;
  const int64_t kernel_rows = spec.get_num_kernel_states(*kernel_block_size);
  if (kv_cache.size(-2) == kernel_rows) return kv_cache;
  // Token and pooled caches are written through manager-block slot mappings; only compressed
  // caches (written from their block table) can be viewed in kernel blocks.
  const Fraction tps = spec.tokens_per_state();
  const bool compressed = tps.num > 0 && tps.num > tps.den;
  if (!compressed || kernel_rows <= 0 || kv_cache.size(1) != 1 ||
      kv_cache.stride(0) % (kernel_rows * kv_cache.stride(-2)) != 0 || kv_cache.size(-2) % kernel_rows != 0) {
    throw InvalidArgument(fmt::format(
        "{} needs {}-token kernel blocks, which packed {}-token KV cache blocks cannot be split into. "
        "Reduce --block-size to {} or use a layer-compact KV cache layout (e.g. LBNHC).",
        backend_name(*this), *kernel_block_size, spec.block_size(), *kernel_block_size));
  }
  // Kernel block j of block b is b * kernel_block_stride + j; the view spans the other layers'
  // pages between blocks without ever addressing them.
  const int64_t page_stride = kernel_rows * kv_cache.stride(-2);
  kernel_block_stride = kv_cache.stride(0) / page_stride;
  const int64_t num_pages = (kv_cache.size(0) - 1) * kernel_block_stride + kv_cache.size(-2) / kernel_rows;
  return kv_cache.as_strided({num_pages, kv_cache.size(1), kernel_rows, kv_cache.size(3)},
                             {page_stride, kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3)});
}

Tensor AttentionGroup::map_kv_cache_to_manager_blocks(const Tensor& kv_cache, int64_t num_blocks) const {
  KVATTN_CHECK(kernel_block_stride > 0,
               "map_kv_cache_to_manager_blocks: kernel_block_stride is not set; map the cache to kernel "
               "blocks first");
  KVATTN_CHECK(kv_cache_spec != nullptr, "map_kv_cache_to_manager_blocks: kv_cache_spec is not set");
  KVATTN_CHECK(kv_cache.dim() == 4, "map_kv_cache_to_manager_blocks: expected a [B, H, N, C] view, got {}",
               kv_cache.str());
  KVATTN_CHECK(num_blocks > 0, "map_kv_cache_to_manager_blocks: num_blocks {} must be positive", num_blocks);
  const int64_t rows = kv_cache_spec->get_num_kernel_states(kv_cache_spec->block_size());
  return kv_cache.as_strided({num_blocks, kv_cache.size(1), rows, kv_cache.size(3)},
                             {kv_cache.stride(0) * kernel_block_stride, kv_cache.stride(1), kv_cache.stride(2),
                              kv_cache.stride(3)});
}

KVCacheViews map_kv_caches_to_kernel_blocks(const KVCacheViews& kv_caches,
                                            const std::vector<AttentionGroup*>& attn_groups) {
  KVCacheViews mapped = kv_caches;
  for (AttentionGroup* g : attn_groups) {
    KVATTN_CHECK(g != nullptr, "map_kv_caches_to_kernel_blocks: null attention group");
    if (!g->kernel_block_size) continue;
    for (const auto& name : g->layer_names) {
      auto it = kv_caches.find(name);
      if (it != kv_caches.end()) mapped[name] = g->map_kv_cache_to_kernel_blocks(it->second);
    }
  }
  return mapped;
}

KVCacheViews map_kv_caches_to_kernel_blocks(const KVCacheViews& kv_caches,
                                            std::vector<AttentionGroup>& attn_groups) {
  std::vector<AttentionGroup*> ptrs;
  for (auto& g : attn_groups) ptrs.push_back(&g);
  return map_kv_caches_to_kernel_blocks(kv_caches, ptrs);
}

std::vector<std::vector<AttentionGroup>> one_backend_attention_groups(const KVCacheConfig& kv_cache_config,
                                                                      const BlockSizeBackend& backend) {
  const auto& kv_groups = kv_cache_config.kv_cache_groups;
  std::vector<std::vector<AttentionGroup>> groups(kv_groups.size());
  for (size_t gid = 0; gid < kv_groups.size(); ++gid) {
    AttentionGroup g;
    g.backend = &backend;
    g.layer_names = kv_groups[gid].layer_names;
    g.kv_cache_spec = kv_groups[gid].kv_cache_spec;
    g.kv_cache_group_id = static_cast<int64_t>(gid);
    groups[gid].push_back(std::move(g));
  }
  return groups;
}

}  // namespace kvattn
