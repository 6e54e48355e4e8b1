// Worker-side KV cache helpers (see kv/worker_utils.h).
#include "kvattn/kv/worker_utils.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "kvattn/core/error.h"
#include "kvattn/core/log.h"

namespace kvattn {

void add_kv_sharing_layers_to_kv_cache_groups(
    const std::vector<std::pair<std::string, std::string>>& shared_kv_cache_layers,
    std::vector<KVCacheGroupSpec>& kv_cache_groups, std::set<std::string>* runner_only_attn_layers) {
  if (shared_kv_cache_layers.empty()) return;
  std::map<std::string, size_t> group_of;  // layer -> group index
  for (size_t g = 0; g < kv_cache_groups.size(); ++g)
    for (const auto& name : kv_cache_groups[g].layer_names) group_of[name] = g;
  // Validate everything before changing anything.
  std::set<std::string> seen;
  for (const auto& [layer, target] : shared_kv_cache_layers) {
    KVATTN_CHECK(group_of.count(target),
                 "KV sharing: layer '{}' shares the KV cache of '{}', which is in no KV cache group; the "
                 "target must be a layer that allocates its own KV cache",
                 layer, target);
    KVATTN_CHECK(!group_of.count(layer) && seen.insert(layer).second,
                 "KV sharing: layer '{}' already has a KV cache group (or is listed twice); a sharing layer "
                 "allocates no KV cache of its own",
                 layer);
  }
  for (const auto& [layer, target] : shared_kv_cache_layers) {
    kv_cache_groups[group_of.at(target)].layer_names.push_back(layer);
    if (runner_only_attn_layers) runner_only_attn_layers->insert(layer);
  }
}

int64_t extract_layer_index(std::string_view layer_name, int64_t num_attn_module) {
  KVATTN_CHECK(num_attn_module >= 1, "extract_layer_index: num_attn_module must be >= 1, got {}", num_attn_module);
  std::vector<int64_t> ints;
  size_t start = 0;
  while (start <= layer_name.size()) {
    size_t end = layer_name.find('.', start);
    if (end == std::string_view::npos) end = layer_name.size();
    const std::string_view part = layer_name.substr(start, end - start);
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      KVATTN_CHECK(part.size() <= 9, "layer name '{}': index '{}' is too large", std::string(layer_name),
                   std::string(part));
      ints.push_back(std::stoll(std::string(part)));
    }
    start = end + 1;
  }
  const bool has_attn = layer_name.find("attn") != std::string_view::npos;
  if (num_attn_module == 1 || !has_attn) {
    KVATTN_CHECK(ints.size() == 1,
                 "layer name '{}' should contain exactly one integer (the layer index), found {}; name layers "
                 "like 'model.layers.12.self_attn.attn'",
                 std::string(layer_name), ints.size());
    return ints[0];
  }
  KVATTN_CHECK(!ints.empty() && ints.size() <= 2,
               "layer name '{}' should contain one or two integers (layer, attention module), found {}",
               std::string(layer_name), ints.size());
  return ints.size() == 2 ? ints[0] * num_attn_module + ints[1] : ints[0];
}

void bind_kv_cache(const std::vector<std::pair<std::string, Tensor>>& kv_caches, KVCacheViews& forward_context,
                   std::vector<Tensor>& runner_kv_caches, int64_t num_attn_module,
                   const KVCacheViews* layer_kv_caches) {
  KVATTN_CHECK(runner_kv_caches.empty(),
               "bind_kv_cache: the runner already holds {} KV caches; bind once into an empty list",
               runner_kv_caches.size());
  std::map<int64_t, std::vector<size_t>> index2pos;  // layer index -> positions in kv_caches
  std::set<std::string> names;
  for (size_t i = 0; i < kv_caches.size(); ++i) {
    const std::string& name = kv_caches[i].first;
    KVATTN_CHECK(names.insert(name).second, "bind_kv_cache: layer '{}' appears twice; each layer has one KV cache",
                 name);
    index2pos[extract_layer_index(name, num_attn_module)].push_back(i);
  }
  // Python's `layer_kv_caches or kv_caches`: an empty map counts as absent.
  if (layer_kv_caches && layer_kv_caches->empty()) layer_kv_caches = nullptr;
  // Check the binding targets before touching anything.
  auto bind_source = [&](const std::string& name) -> const Tensor& {
    if (layer_kv_caches) {
      auto it = layer_kv_caches->find(name);
      KVATTN_CHECK(it != layer_kv_caches->end(), "bind_kv_cache: layer_kv_caches has no view for layer '{}'",
                   name);
      return it->second;
    }
    for (const auto& [n, t] : kv_caches)
      if (n == name) return t;
    throw InternalError("bind_kv_cache: layer vanished: " + name);
  };
  std::vector<std::string> to_bind;
  if (layer_kv_caches) {
    for (const auto& [n, t] : *layer_kv_caches) to_bind.push_back(n);
  } else {
    for (const auto& [n, t] : kv_caches) to_bind.push_back(n);
  }
  for (const auto& name : to_bind)
    KVATTN_CHECK(forward_context.count(name),
                 "bind_kv_cache: no attention layer named '{}' in the forward context ({} layers); the KV "
                 "cache config and the model disagree on layer names",
                 name, forward_context.size());

  for (const auto& [index, positions] : index2pos)
    for (size_t p : positions) runner_kv_caches.push_back(kv_caches[p].second);
  for (const auto& name : to_bind) forward_context[name] = bind_source(name);
}

void bind_kv_cache(const KVCacheViews& kv_caches, KVCacheViews& forward_context,
                   std::vector<Tensor>& runner_kv_caches, int64_t num_attn_module,
                   const KVCacheViews* layer_kv_caches) {
  std::vector<std::pair<std::string, Tensor>> ordered(kv_caches.begin(), kv_caches.end());
  bind_kv_cache(ordered, forward_context, runner_kv_caches, num_attn_module, layer_kv_caches);
}

namespace {
std::string gib(int64_t bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / (1 << 30)); }
}  // namespace

int64_t request_memory(const MemorySnapshot& s, double util, int64_t external_weight_memory) {
  KVATTN_CHECK(std::isfinite(util) && util > 0.0 && util <= 1.0,
               "gpu_memory_utilization {} is out of range; valid: a fraction in (0, 1], e.g. 0.9", util);
  KVATTN_CHECK(s.total_memory > 0 && s.free_memory >= 0 && s.free_memory <= s.total_memory,
               "memory snapshot of {} is inconsistent (free {} bytes, total {} bytes)", s.device, s.free_memory,
               s.total_memory);
  KVATTN_CHECK(external_weight_memory >= 0, "external_weight_memory {} must be >= 0", external_weight_memory);
  const auto requested = static_cast<int64_t>(std::ceil(static_cast<double>(s.total_memory) * util));
  if (external_weight_memory > 0) {
    const int64_t engine = requested - external_weight_memory;
    KVATTN_CHECK(engine > 0,
                 "Externally held weights on device {} ({}/{} GiB) exceed the desired GPU memory utilization "
                 "({}, {} GiB). Increase GPU memory utilization or reduce GPU memory used by other processes.",
                 s.device, gib(external_weight_memory), gib(s.total_memory), util, gib(requested));
    KVATTN_CHECK(s.free_memory >= engine,
                 "Free memory on device {} ({}/{} GiB) on startup is less than the engine's budget after "
                 "excluding external process's weights ({}, {} GiB). Decrease GPU memory utilization or "
                 "reduce GPU memory used by other processes.",
                 s.device, gib(s.free_memory), gib(s.total_memory), util, gib(engine));
    logger().info("Weights are held outside this process: of the {} GiB utilization budget, {} GiB is "
                  "externally held and {} GiB remains for the engine's own allocations.",
                  gib(requested), gib(external_weight_memory), gib(engine));
    return engine;
  }
  KVATTN_CHECK(s.free_memory >= requested,
               "Free memory on device {} ({}/{} GiB) on startup is less than desired GPU memory utilization "
               "({}, {} GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
               s.device, gib(s.free_memory), gib(s.total_memory), util, gib(requested));
  return requested;
}

// ---------------------------------------------------------------------------------------
// Legacy helpers

std::set<std::string> kv_first_layers_sharing_pool_with_mamba(const std::vector<AttentionGroup>& attn_groups,
                                                              const std::vector<int64_t>& kernel_block_sizes,
                                                              const KVCacheBlockDimFn& get_kv_cache_block_dim,
                                                              const KVCacheConfig* kv_cache_config) {
  if (kv_cache_config == nullptr) return {};
  KVATTN_CHECK(static_cast<bool>(get_kv_cache_block_dim),
               "kv_first_layers_sharing_pool_with_mamba: get_kv_cache_block_dim is empty");
  std::set<std::string> kv_first, mamba;
  for (const AttentionGroup& g : attn_groups) {
    if (g.kv_cache_spec && g.kv_cache_spec->kind() == KVCacheSpecKind::Mamba) {
      mamba.insert(g.layer_names.begin(), g.layer_names.end());
      continue;
    }
    if (!as_attention_spec(g.kv_cache_spec)) continue;
    if (g.kv_cache_group_id < 0 || g.kv_cache_group_id >= static_cast<int64_t>(kernel_block_sizes.size()))
      continue;
    if (get_kv_cache_block_dim(g, kernel_block_sizes[static_cast<size_t>(g.kv_cache_group_id)]) != 0)
      kv_first.insert(g.layer_names.begin(), g.layer_names.end());
  }
  std::set<std::string> page_aligned;
  for (const KVCacheTensor& t : kv_cache_config->kv_cache_tensors) {
    const bool with_mamba = std::any_of(t.layers.begin(), t.layers.end(), [&](const auto& n) { return mamba.count(n); });
    if (!with_mamba) continue;
    for (const auto& n : t.layers)
      if (kv_first.count(n)) page_aligned.insert(n);
  }
  return page_aligned;
}

Tensor restride_blocks_first_kv_cache_to_kv_first_storage(const Tensor& kv) {
  KVATTN_CHECK(kv.dim() >= 2 && kv.size(1) == 2,
               "restride to K/V-first storage: expected a blocks-first view [B, 2, ...], got {}", kv.str());
  // The block's [2, rest] must be dense for "half a page" to be one stride.
  const int64_t half = kv.stride(1);
  int64_t rest = 1;
  for (int d = 2; d < kv.dim(); ++d) rest *= kv.size(d);
  KVATTN_CHECK(kv.stride(0) == 2 * half && half == rest && kv.slice(0, 0, 1).select(0, 0).select(0, 0).is_contiguous(),
               "restride to K/V-first storage: view {} is not a dense blocks-first cache", kv.str());
  Dims strides = kv.strides();
  strides[0] = half;
  strides[1] = kv.size(0) * half;
  return kv.as_strided(kv.shape(), strides);
}

void align_mixed_attention_kv_cache_views(const std::vector<AttentionGroup>& attn_groups, KVCacheViews& kv_caches,
                                          const std::vector<int64_t>& kernel_block_sizes,
                                          const KVCacheBlockDimFn& get_kv_cache_block_dim,
                                          const KVCacheConfig& kv_cache_config,
                                          const std::set<std::string>& page_aligned_layers) {
  KVATTN_CHECK(static_cast<bool>(get_kv_cache_block_dim),
               "align_mixed_attention_kv_cache_views: get_kv_cache_block_dim is empty");
  std::map<std::string, int64_t> block_dim_of;
  for (const AttentionGroup& g : attn_groups) {
    if (!as_attention_spec(g.kv_cache_spec)) continue;
    if (g.kv_cache_group_id < 0 || g.kv_cache_group_id >= static_cast<int64_t>(kernel_block_sizes.size()))
      continue;
    const int64_t dim = get_kv_cache_block_dim(g, kernel_block_sizes[static_cast<size_t>(g.kv_cache_group_id)]);
    for (const auto& n : g.layer_names)
      if (kv_caches.count(n)) block_dim_of[n] = dim;
  }
  for (const KVCacheTensor& t : kv_cache_config.kv_cache_tensors) {
    if (t.block_stride > 0) continue;
    // K/V-first views that already address blocks page by page must keep their layout.
    if (std::any_of(t.layers.begin(), t.layers.end(), [&](const auto& n) { return page_aligned_layers.count(n); }))
      continue;
    std::set<int64_t> dims;
    for (const auto& n : t.layers)
      if (auto it = block_dim_of.find(n); it != block_dim_of.end()) dims.insert(it->second);
    if (!dims.count(0) || !dims.count(1)) continue;
    for (const auto& n : t.layers) {
      auto it = block_dim_of.find(n);
      if (it != block_dim_of.end() && it->second == 0)
        kv_caches[n] = restride_blocks_first_kv_cache_to_kv_first_storage(kv_caches.at(n));
    }
  }
}

}  // namespace kvattn
