// KVCacheConfig, layout geometry and the planner (see kv_cache_config.h).
#include "kvattn/kv/kv_cache_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "kv_math.h"

namespace kvattn {

using kvmath::cdiv;
using kvmath::checked_mul;
using kvmath::round_up;

// ---------------------------------------------------------------------------------------
// KVCacheConfig

int64_t KVCacheConfig::num_blocks_of(const KVCacheTensor&) const { return num_blocks; }

std::optional<size_t> KVCacheConfig::group_index_of(std::string_view layer_name) const {
  for (size_t g = 0; g < kv_cache_groups.size(); ++g)
    for (const auto& n : kv_cache_groups[g].layer_names)
      if (n == layer_name) return g;
  return std::nullopt;
}

KVCacheSpecPtr KVCacheConfig::layer_spec(std::string_view layer_name) const {
  auto g = group_index_of(layer_name);
  KVATTN_CHECK(g.has_value(), "layer '{}' is in no KV cache group of this config ({} groups)", layer_name,
               kv_cache_groups.size());
  const auto& spec = kv_cache_groups[*g].kv_cache_spec;
  KVATTN_CHECK(spec != nullptr, "KV cache group {} has no spec", *g);
  if (auto u = std::dynamic_pointer_cast<const UniformTypeKVCacheSpecs>(spec)) return u->spec_of(layer_name);
  return spec;
}

bool KVCacheConfig::has_mamba_layers() const {
  for (const auto& g : kv_cache_groups)
    if (g.kv_cache_spec)
      for (const auto& s : iter_layer_specs(g.kv_cache_spec))
        if (s->kind() == KVCacheSpecKind::Mamba) return true;
  return false;
}

bool KVCacheConfig::has_mixed_precision_kv_cache() const {
  std::set<std::pair<int, int>> seen;
  for (const auto& g : kv_cache_groups)
    if (g.kv_cache_spec)
      for (const auto& s : iter_layer_specs(g.kv_cache_spec))
        if (const AttentionSpec* a = as_attention_spec(s.get()))
          seen.emplace(static_cast<int>(a->dtype()), static_cast<int>(a->kv_quant_mode()));
  return seen.size() > 1;
}

// ---------------------------------------------------------------------------------------
// Geometry

std::array<int64_t, 4> compute_layer_kv_cache_shape_bytes(const KVCacheSpec& spec, int64_t num_blocks,
                                                          std::optional<int64_t> kernel_block_size) {
  KVATTN_CHECK(num_blocks >= 0, "num_blocks must be >= 0, got {}", num_blocks);
  const int64_t bs = kernel_block_size.value_or(spec.block_size());
  KVATTN_CHECK(bs > 0 && spec.block_size() % bs == 0,
               "kernel block size {} must be a positive divisor of the KV cache block size {}; pick a kernel block "
               "size that divides it",
               bs, spec.block_size());
  const Fraction t = spec.tokens_per_state();
  if (t.num > 0)
    KVATTN_CHECK(checked_mul(bs, t.den, "kernel block") % t.num == 0,
                 "kernel block size {} is not a whole number of states of {}/{} tokens; packed {}-token blocks "
                 "cannot be split into {}-token kernel blocks",
                 bs, t.num, t.den, spec.block_size(), bs);
  return {checked_mul(num_blocks, spec.block_size() / bs, "num kernel blocks"), spec.num_heads(),
          spec.get_num_kernel_states(bs), spec.state_content_size_bytes()};
}

LayoutStrides compute_layout_strides(const KVCacheSpec& spec, int64_t num_blocks, int64_t num_layers,
                                     KVCacheLayout layout, std::optional<int64_t> kernel_block_size,
                                     const FixedStrides& fixed_strides) {
  KVATTN_CHECK(num_layers >= 1, "compute_layout_strides: num_layers must be >= 1, got {}", num_layers);
  const auto sb = compute_layer_kv_cache_shape_bytes(spec, num_blocks, kernel_block_size);
  const std::array<int64_t, 5> shape = {num_layers, sb[0], sb[1], sb[2], sb[3]};
  const auto order = stride_order(layout);
  const auto padded = spec.page_size_padded();
  int page_grid_end = -1;
  if (padded.has_value()) {
    if (kernel_block_size.has_value() && *kernel_block_size != spec.block_size())
      throw Unsupported(fmt::format(
          "Padded KV pages do not support kernel block splitting (page_size_padded={}, block_size={}, kernel "
          "block size {}); use the manager block size as the kernel block size",
          *padded, spec.block_size(), *kernel_block_size));
    int pos_l = 0, pos_b = 0;
    for (int i = 0; i < 5; ++i) {
      if (order[static_cast<size_t>(i)] == kDimL) pos_l = i;
      if (order[static_cast<size_t>(i)] == kDimB) pos_b = i;
    }
    page_grid_end = std::max(pos_l, pos_b) + 1;
    int64_t grid = 1;
    for (int i = 0; i < page_grid_end; ++i) grid *= shape[static_cast<size_t>(order[static_cast<size_t>(i)])];
    if (grid != num_layers * num_blocks)
      throw Unsupported(fmt::format(
          "KV cache layout {} places head slots between layers and blocks, so a padded page ({} bytes) is not one "
          "byte run; padded pages need a block-compact layout (LBHNC, LBNHC, BLHNC, BLNHC)",
          layout_name(layout), *padded));
  }
  LayoutStrides strides{};
  int64_t cur = 1;
  for (int idx = 4; idx >= 0; --idx) {
    const int dim = order[static_cast<size_t>(idx)];
    if (padded.has_value() && idx == page_grid_end - 1) {
      cur = std::max(cur, *padded);
      KVATTN_ASSERT(cur % *padded == 0, "page tail {} is not a multiple of the padded page {}", cur, *padded);
    }
    const auto& f = fixed_strides[static_cast<size_t>(dim)];
    KVATTN_CHECK(!f.has_value() || *f >= 0, "fixed stride of axis {} must be >= 0, got {}", dim, f.value_or(0));
    strides[static_cast<size_t>(dim)] = (f.has_value() && *f != 0) ? *f : cur;
    cur = checked_mul(strides[static_cast<size_t>(dim)], shape[static_cast<size_t>(dim)], "layout stride");
  }
  return strides;
}

// ---------------------------------------------------------------------------------------
// Grouping

namespace {

// Per-layer specs of a group, in layer order.
std::vector<std::pair<std::string, KVCacheSpecPtr>> layer_specs_of(const KVCacheGroupSpec& g) {
  KVATTN_CHECK(g.kv_cache_spec != nullptr, "KV cache group has no spec");
  std::vector<std::pair<std::string, KVCacheSpecPtr>> out;
  auto u = std::dynamic_pointer_cast<const UniformTypeKVCacheSpecs>(g.kv_cache_spec);
  for (const auto& n : g.layer_names) out.emplace_back(n, u ? u->spec_of(n) : g.kv_cache_spec);
  return out;
}

// Blocks one request holds in a group (max over its layers).
int64_t blocks_per_request(const KVCacheGroupSpec& g, const KVCacheLimits& limits) {
  int64_t blocks = 0;
  for (const auto& [name, s] : layer_specs_of(g))
    blocks = std::max(blocks, cdiv(s->max_memory_usage_bytes(limits), s->page_size_bytes()));
  return blocks;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

std::vector<KVCacheGroupSpec> get_kv_cache_groups(const std::vector<LayerKVCacheSpec>& layers) {
  KVATTN_CHECK(!layers.empty(), "get_kv_cache_groups: the model has no layers that need KV cache");
  std::set<std::string_view> names;
  for (const auto& l : layers) {
    KVATTN_CHECK(l.spec != nullptr, "layer '{}' has no KV cache spec", l.layer_name);
    KVATTN_CHECK(l.spec->kind() != KVCacheSpecKind::UniformType,
                 "layer '{}' has a UniformTypeKVCacheSpecs; give each layer its own spec", l.layer_name);
    KVATTN_CHECK(names.insert(l.layer_name).second, "layer name '{}' appears twice; layer names must be unique",
                 l.layer_name);
  }
  const std::string first = layers.front().spec->repr();
  std::vector<std::string> all_names;
  for (const auto& l : layers) all_names.push_back(l.layer_name);
  if (std::all_of(layers.begin(), layers.end(), [&](const auto& l) { return l.spec->repr() == first; }))
    return {KVCacheGroupSpec{all_names, layers.front().spec}};

  std::vector<std::pair<std::string, KVCacheSpecPtr>> pairs;
  for (const auto& l : layers) pairs.emplace_back(l.layer_name, l.spec);
  if (auto u = UniformTypeKVCacheSpecs::from_specs(pairs)) return {KVCacheGroupSpec{all_names, u}};

  // Hybrid: gather equal specs (first-appearance order), cut into groups of group_size layers.
  std::vector<std::pair<KVCacheSpecPtr, std::vector<std::string>>> gathered;
  std::map<std::string, size_t> index;
  for (const auto& l : layers) {
    auto [it, inserted] = index.emplace(l.spec->repr(), gathered.size());
    if (inserted) gathered.push_back({l.spec, {}});
    gathered[it->second].second.push_back(l.layer_name);
  }
  size_t group_size = layers.size();
  for (const auto& g : gathered) group_size = std::min(group_size, g.second.size());
  std::vector<KVCacheGroupSpec> groups;
  for (const auto& [spec, lnames] : gathered)
    for (size_t i = 0; i < lnames.size(); i += group_size) {
      const size_t end = std::min(lnames.size(), i + group_size);
      groups.push_back(KVCacheGroupSpec{{lnames.begin() + static_cast<std::ptrdiff_t>(i),
                                         lnames.begin() + static_cast<std::ptrdiff_t>(end)},
                                        spec});
    }
  return groups;
}

void validate_kv_cache_config(KVCacheLayout layout, const std::vector<KVCacheGroupSpec>& groups) {
  std::set<int64_t> pages;
  for (const auto& g : groups)
    for (const auto& [name, s] : layer_specs_of(g)) pages.insert(s->page_size_bytes());
  if (pages.size() <= 1) return;
  const bool ok = is_block_compact(layout) && !(groups.size() > 1 && is_layer_compact(layout));
  if (!ok) {
    std::string list;
    for (int64_t p : pages) list += fmt::format("{}{}", list.empty() ? "" : ", ", p);
    throw InvalidArgument(fmt::format(
        "KV cache layout {} cannot express this model's mixed page sizes ({} bytes across {} cache groups); a "
        "backend should declare block-outermost supported layouts (e.g. BLHNC), or set "
        "VLLM_KV_CACHE_LAYOUT=BLHNC.",
        layout_name(layout), list, groups.size()));
  }
}

int64_t get_kv_cache_bytes_per_block(const std::vector<KVCacheGroupSpec>& groups, KVCacheLayout layout) {
  int64_t best = 0;
  int64_t align = 1;
  for (const auto& g : groups) {
    int64_t sum = 0;
    for (const auto& [name, s] : layer_specs_of(g)) {
      const int64_t a = s->get_block_stride_alignment();
      align = kvmath::lcm(align, a);
      sum += is_block_outermost(layout) ? s->page_size_bytes() : round_up(s->page_size_bytes(), a);
    }
    best = std::max(best, sum);
  }
  return is_block_outermost(layout) ? round_up(best, align) : best;
}

KVCacheConfig materialize_kv_cache_config(const std::vector<KVCacheGroupSpec>& groups, KVCacheLayout layout,
                                          int64_t num_blocks) {
  KVATTN_CHECK(num_blocks >= 0, "num_blocks must be >= 0, got {}", num_blocks);
  validate_kv_cache_config(layout, groups);
  const int64_t bytes_per_block = get_kv_cache_bytes_per_block(groups, layout);
  const std::optional<int64_t> interleaved =
      is_block_outermost(layout) ? std::optional<int64_t>(bytes_per_block) : std::nullopt;
  const int64_t size = checked_mul(bytes_per_block, num_blocks, "KV cache size");

  KVCacheConfig cfg;
  cfg.num_blocks = num_blocks;
  cfg.kv_cache_groups = groups;
  cfg.kv_cache_layout = layout;
  for (const auto& g : groups) {
    // Layers of the group with equal specs share one tensor (first-appearance order).
    std::vector<std::pair<KVCacheSpecPtr, std::vector<std::string>>> by_spec;
    std::map<std::string, size_t> index;
    for (const auto& [name, s] : layer_specs_of(g)) {
      auto [it, inserted] = index.emplace(s->repr(), by_spec.size());
      if (inserted) by_spec.push_back({s, {}});
      by_spec[it->second].second.push_back(name);
    }
    int64_t byte_offset = 0;
    for (const auto& [spec, names] : by_spec) {
      std::optional<int64_t> block_stride = interleaved;
      const int64_t page = spec->page_size_bytes();
      const int64_t padded_page = round_up(page, spec->get_block_stride_alignment());
      if (!block_stride.has_value() && padded_page != page) {
        KVATTN_CHECK(is_block_compact(layout),
                     "KV cache layout {} cannot align block strides to {} bytes (page {} bytes): it is not "
                     "block-compact; use LBNHC, LBHNC, BLHNC or BLNHC",
                     layout_name(layout), spec->get_block_stride_alignment(), page);
        block_stride = padded_page;
      }
      const auto n = static_cast<int64_t>(names.size());
      const auto st = compute_layout_strides(*spec, num_blocks, n, layout, std::nullopt,
                                             {std::nullopt, block_stride, std::nullopt, std::nullopt, std::nullopt});
      cfg.kv_cache_tensors.push_back(KVCacheTensor{size, names, st[kDimL], st[kDimB], byte_offset});
      byte_offset += n * (is_block_outermost(layout) ? page : st[kDimL]);
    }
  }
  return cfg;
}

int64_t kv_cache_memory_needed(const std::vector<KVCacheGroupSpec>& groups, KVCacheLayout layout,
                               const KVCacheLimits& limits) {
  int64_t blocks = 1;  // the null block
  for (const auto& g : groups) blocks += blocks_per_request(g, limits);
  return checked_mul(blocks, get_kv_cache_bytes_per_block(groups, layout), "KV cache memory needed");
}

int64_t estimate_max_model_len(const std::vector<KVCacheGroupSpec>& groups, KVCacheLayout layout,
                               const KVCacheLimits& limits, int64_t available_memory) {
  auto fits = [&](int64_t len) {
    KVCacheLimits l = limits;
    l.max_model_len = len;
    return kv_cache_memory_needed(groups, layout, l) <= available_memory;
  };
  if (!fits(0)) return 0;
  int64_t lo = 0, hi = limits.max_model_len;  // fits(lo) holds
  if (fits(hi)) return hi;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

Result<KVCacheConfig> get_kv_cache_config_from_groups(const std::vector<KVCacheGroupSpec>& groups,
                                                      KVCacheLayout layout, int64_t available_memory,
                                                      const KVCachePlanOptions& options) {
  KVATTN_CHECK(available_memory >= 0, "available KV cache memory must be >= 0 bytes, got {}", available_memory);
  if (groups.empty()) {
    KVCacheConfig cfg;
    cfg.kv_cache_layout = layout;
    return cfg;
  }
  validate_kv_cache_config(layout, groups);
  const int64_t bytes_per_block = get_kv_cache_bytes_per_block(groups, layout);
  KVATTN_ASSERT(bytes_per_block > 0, "a KV cache block of 0 bytes");
  int64_t num_blocks = available_memory / bytes_per_block;
  if (options.num_gpu_blocks_override.has_value()) {
    KVATTN_CHECK(*options.num_gpu_blocks_override > 0, "num_gpu_blocks_override must be positive, got {}",
                 *options.num_gpu_blocks_override);
    num_blocks = *options.num_gpu_blocks_override;
  }
  int64_t needed_blocks = 1;
  for (const auto& g : groups) needed_blocks += blocks_per_request(g, options.limits);
  if (num_blocks < needed_blocks) {
    const int64_t needed = checked_mul(needed_blocks, bytes_per_block, "KV cache memory needed");
    const int64_t have = checked_mul(num_blocks, bytes_per_block, "KV cache memory");
    const std::string source =
        options.num_gpu_blocks_override
            ? fmt::format("the {} blocks of num_gpu_blocks_override ({} bytes)", num_blocks, have)
            : fmt::format("the available KV cache memory ({} bytes, {:.2f} GiB)", available_memory,
                          static_cast<double>(available_memory) / kGiB);
    const int64_t est = estimate_max_model_len(groups, layout, options.limits,
                                               options.num_gpu_blocks_override ? have : available_memory);
    return Failure{ErrorKind::OutOfMemory,
                   fmt::format("To serve at least one request with the model's max seq len ({}), {} bytes ({:.2f} "
                               "GiB) of KV cache are needed ({} blocks of {} bytes, including the null block), which "
                               "is larger than {}. Based on the available memory, the estimated maximum model length "
                               "is {}. Try increasing the KV cache memory budget (gpu_memory_utilization) or "
                               "decreasing max_model_len.",
                               options.limits.max_model_len, needed, static_cast<double>(needed) / kGiB,
                               needed_blocks, bytes_per_block, source, est)};
  }
  return materialize_kv_cache_config(groups, layout, num_blocks);
}

Result<KVCacheConfig> get_kv_cache_config(const std::vector<LayerKVCacheSpec>& layers, KVCacheLayout layout,
                                          int64_t available_memory, const KVCachePlanOptions& options) {
  return get_kv_cache_config_from_groups(get_kv_cache_groups(layers), layout, available_memory, options);
}

}  // namespace kvattn
