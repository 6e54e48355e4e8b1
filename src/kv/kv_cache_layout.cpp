// KVCacheLayout properties, names, merge / resolve / record (see kv_cache_layout.h).
#include "kvattn/kv/kv_cache_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <tuple>

#include "kvattn/core/error.h"
#include "kvattn/core/log.h"
#include "kvattn/kv/kv_cache_spec.h"

namespace kvattn {

namespace {

struct LayoutInfo {
  KVCacheLayout layout;
  const char* name;
  std::array<int, 5> order;    // logical axis at each physical position, outermost first
  const char* flashinfer;      // nullptr: no FlashInfer form
};

constexpr std::array<LayoutInfo, 6> kLayoutInfo = {{
    {KVCacheLayout::LBHNC, "LBHNC", {kDimL, kDimB, kDimH, kDimN, kDimC}, "HND"},
    {KVCacheLayout::LBNHC, "LBNHC", {kDimL, kDimB, kDimN, kDimH, kDimC}, "NHD"},
    {KVCacheLayout::LHBNC, "LHBNC", {kDimL, kDimH, kDimB, kDimN, kDimC}, nullptr},
    {KVCacheLayout::BLHNC, "BLHNC", {kDimB, kDimL, kDimH, kDimN, kDimC}, "HND"},
    {KVCacheLayout::BLNHC, "BLNHC", {kDimB, kDimL, kDimN, kDimH, kDimC}, "NHD"},
    {KVCacheLayout::BHLNC, "BHLNC", {kDimB, kDimH, kDimL, kDimN, kDimC}, "HND"},
}};

const LayoutInfo& info(KVCacheLayout layout) noexcept {
  return kLayoutInfo[static_cast<size_t>(layout)];
}

std::string all_layout_names() {
  return format_layout_names(LayoutList(kAllKVCacheLayouts.begin(), kAllKVCacheLayouts.end()));
}

std::string format_supported_sets(const std::vector<std::vector<std::string>>& sets) {
  std::string out = "[";
  for (size_t i = 0; i < sets.size(); ++i) {
    if (i) out += ", ";
    out += "[";
    for (size_t j = 0; j < sets[i].size(); ++j) out += fmt::format("{}'{}'", j ? ", " : "", sets[i][j]);
    out += "]";
  }
  return out + "]";
}

}  // namespace

std::array<int, 5> stride_order(KVCacheLayout layout) noexcept { return info(layout).order; }

std::array<int, 4> layer_view_order(KVCacheLayout layout) noexcept {
  std::array<int, 4> out{};
  int k = 0;
  for (int d : info(layout).order)
    if (d != kDimL) out[static_cast<size_t>(k++)] = d - 1;
  return out;
}

bool is_layer_compact(KVCacheLayout layout) noexcept { return info(layout).order[0] == kDimL; }

bool is_block_contiguous(KVCacheLayout layout) noexcept {
  const auto& o = info(layout).order;
  return o[2] == kDimH && o[3] == kDimN && o[4] == kDimC;
}

bool is_block_compact(KVCacheLayout layout) noexcept {
  const auto& o = info(layout).order;
  return (o[0] == kDimL && o[1] == kDimB) || (o[0] == kDimB && o[1] == kDimL);
}

bool is_block_outermost(KVCacheLayout layout) noexcept { return info(layout).order[0] == kDimB; }

const char* layout_name(KVCacheLayout layout) noexcept { return info(layout).name; }

std::vector<std::string> layout_names(const LayoutList& layouts) {
  std::vector<std::string> out;
  out.reserve(layouts.size());
  for (auto l : layouts) out.emplace_back(layout_name(l));
  return out;
}

std::string format_layout_names(const LayoutList& layouts) {
  std::string out = "[";
  for (size_t i = 0; i < layouts.size(); ++i) out += fmt::format("{}'{}'", i ? ", " : "", layout_name(layouts[i]));
  return out + "]";
}

KVCacheLayout layout_from_name(std::string_view name) {
  std::string_view canonical = name;
  if (name == "NHD") canonical = "LBNHC";
  if (name == "HND") canonical = "LBHNC";
  for (const auto& li : kLayoutInfo)
    if (canonical == li.name) return li.layout;
  throw InvalidArgument(fmt::format(
      "Unknown KV cache layout '{}'. Valid layouts: {} (legacy aliases: 'NHD' = LBNHC, 'HND' = LBHNC); "
      "names are case-sensitive",
      name, all_layout_names()));
}

std::optional<KVCacheLayout> parse_layout_option(std::string_view name) {
  if (name == "auto") return std::nullopt;
  return layout_from_name(name);
}

const char* get_flashinfer_layout_string(KVCacheLayout layout) {
  const char* s = info(layout).flashinfer;
  if (s == nullptr)
    throw Unsupported(fmt::format(
        "KV cache layout {} has no FlashInfer equivalent (FlashInfer only reads NHD or HND block "
        "interiors: LBNHC, LBHNC, BLHNC, BLNHC, BHLNC); FlashInfer rejects it in "
        "supported_kv_cache_layouts, so resolve another layout",
        layout_name(layout)));
  return s;
}

LayoutList merge_supported_layouts(const std::vector<LayoutList>& lists) {
  KVATTN_CHECK(!lists.empty(), "merge_supported_layouts: no supported-layout lists were given; pass at least one");
  const LayoutList& first = lists.front();
  if (std::all_of(lists.begin() + 1, lists.end(), [&](const LayoutList& l) { return l == first; })) return first;

  std::array<int, 6> votes{};
  for (const auto& l : lists)
    if (!l.empty()) ++votes[static_cast<size_t>(l.front())];
  LayoutList candidates;
  for (auto layout : kAllKVCacheLayouts) {
    bool in_all = std::all_of(lists.begin(), lists.end(), [&](const LayoutList& l) {
      return std::find(l.begin(), l.end(), layout) != l.end();
    });
    if (in_all) candidates.push_back(layout);
  }
  std::stable_sort(candidates.begin(), candidates.end(), [&](KVCacheLayout a, KVCacheLayout b) {
    return votes[static_cast<size_t>(a)] > votes[static_cast<size_t>(b)];
  });
  if (candidates.empty()) {
    std::string sets = "[";
    for (size_t i = 0; i < lists.size(); ++i) sets += (i ? ", " : "") + format_layout_names(lists[i]);
    throw InvalidArgument(fmt::format(
        "No KV cache layout satisfies every supported set: {}. The backends in use cannot share one "
        "KV cache layout; select attention backends with a common layout",
        sets + "]"));
  }
  return candidates;
}

LayoutList get_supported_kv_cache_layouts(const std::vector<std::optional<LayoutList>>& backend_declarations) {
  std::vector<LayoutList> declared;
  for (const auto& d : backend_declarations)
    if (d.has_value()) declared.push_back(*d);
  if (declared.empty()) declared.emplace_back(kDefaultLayoutPreference.begin(), kDefaultLayoutPreference.end());
  return merge_supported_layouts(declared);
}

KVCacheLayout CacheConfig::get_resolved_kv_cache_layout() const {
  if (!kv_cache_layout.has_value())
    throw InvalidArgument(
        "KV cache layout has not been resolved yet; it is resolved once by the engine core "
        "(resolve_kv_cache_layout) unless explicitly set by the user (CacheConfig::kv_cache_layout "
        "or record_kv_cache_layout).");
  return *kv_cache_layout;
}

void record_kv_cache_layout(CacheConfig& cache_config, KVCacheLayout layout) {
  const auto& existing = cache_config.kv_cache_layout;
  if (existing.has_value() && *existing != layout)
    throw InvalidArgument(fmt::format(
        "KV cache layout is already resolved to {}; cannot change it to {}. The layout is final once "
        "resolved; use a fresh CacheConfig to pick another",
        layout_name(*existing), layout_name(layout)));
  cache_config.kv_cache_layout = layout;
}

void record_kv_cache_layout(CacheConfig& cache_config, std::string_view name) {
  record_kv_cache_layout(cache_config, layout_from_name(name));
}

KVCacheLayout resolve_kv_cache_layout(CacheConfig& cache_config,
                                      const std::vector<std::vector<std::string>>& supported_layouts,
                                      const std::vector<KVCacheSpecPtr>& kv_cache_specs,
                                      const std::optional<std::string>& requested_layout,
                                      const std::optional<std::string>& connector_layout) {
  // 1. A preset layout wins outright (before the names are read, as vLLM does).
  if (cache_config.kv_cache_layout.has_value()) return cache_config.get_resolved_kv_cache_layout();
  bool all_non_empty = std::all_of(supported_layouts.begin(), supported_layouts.end(),
                                   [](const auto& l) { return !l.empty(); });
  KVATTN_CHECK(!supported_layouts.empty() && all_non_empty,
               "No worker reported supported KV cache layouts (got {}); every worker must report the "
               "layouts of its backends (get_supported_kv_cache_layouts)",
               format_supported_sets(supported_layouts));
  std::vector<LayoutList> reported;
  for (const auto& names : supported_layouts) {
    LayoutList l;
    for (const auto& n : names) l.push_back(layout_from_name(n));
    reported.push_back(std::move(l));
  }
  auto parse = [](const std::optional<std::string>& n) {
    return n ? std::optional<KVCacheLayout>(layout_from_name(*n)) : std::nullopt;
  };
  return resolve_kv_cache_layout(cache_config, reported, kv_cache_specs, parse(requested_layout),
                                 parse(connector_layout));
}

KVCacheLayout resolve_kv_cache_layout(CacheConfig& cache_config, const std::vector<LayoutList>& reported,
                                      const std::vector<KVCacheSpecPtr>& kv_cache_specs,
                                      std::optional<KVCacheLayout> requested_layout,
                                      std::optional<KVCacheLayout> connector_layout) {
  // 1. A preset layout wins outright.
  if (cache_config.kv_cache_layout.has_value()) return cache_config.get_resolved_kv_cache_layout();

  // 2. Every worker reports a non-empty list.
  std::vector<std::vector<std::string>> supported_layouts;  // for messages
  for (const auto& l : reported) supported_layouts.push_back(layout_names(l));
  bool all_non_empty = std::all_of(reported.begin(), reported.end(), [](const auto& l) { return !l.empty(); });
  KVATTN_CHECK(!reported.empty() && all_non_empty,
               "No worker reported supported KV cache layouts (got {}); every worker must report the "
               "layouts of its backends (get_supported_kv_cache_layouts)",
               format_supported_sets(supported_layouts));
  const LayoutList default_pref(kDefaultLayoutPreference.begin(), kDefaultLayoutPreference.end());
  std::vector<LayoutList> voters;
  for (const auto& l : reported)
    if (l != default_pref) voters.push_back(l);
  LayoutList candidates = merge_supported_layouts(voters.empty() ? reported : voters);

  // 3. Mixed HNC shapes among view-backed specs need a block-compact layout.
  std::vector<KVCacheSpecPtr> specs;
  for (const auto& s : kv_cache_specs) {
    KVATTN_CHECK(s != nullptr, "resolve_kv_cache_layout: null KV cache spec");
    for (auto& ls : iter_layer_specs(s))
      if (ls->has_layer_views()) specs.push_back(ls);
  }
  std::set<std::tuple<int64_t, int64_t, int64_t>> hnc;
  for (const auto& s : specs) hnc.emplace(s->num_heads(), s->num_states(), s->page_size_bytes());
  if (hnc.size() > 1) {
    std::erase_if(candidates, [](KVCacheLayout l) { return !is_block_compact(l); });
    if (candidates.empty())
      throw InvalidArgument(fmt::format(
          "Specs with mixed HNC shapes need a block-compact layout (LBHNC, LBNHC, BLHNC or BLNHC), but "
          "none is in every supported set: {}.",
          format_supported_sets(supported_layouts)));
  }

  // 4. Sharded and replicated DCP storage with mixed page sizes need block-outermost layouts.
  std::set<bool> dcp_sharding;
  std::set<int64_t> page_sizes;
  for (const auto& s : specs) {
    if (const AttentionSpec* a = as_attention_spec(s.get()); a && a->uses_slot_mapping())
      dcp_sharding.insert(a->dcp_sharded());
    page_sizes.insert(s->page_size_bytes());
  }
  if (dcp_sharding.size() > 1 && page_sizes.size() > 1) {
    std::erase_if(candidates, [](KVCacheLayout l) { return !is_block_outermost(l); });
    if (candidates.empty())
      throw InvalidArgument(fmt::format(
          "DCP with a replicated draft and mixed KV page sizes requires a block-outer KV cache layout "
          "(BLHNC, BLNHC or BHLNC); supported sets: {}.",
          format_supported_sets(supported_layouts)));
  }

  // 5. Explicit request, then connector preference, then the first candidate.
  KVCacheLayout layout = candidates.front();
  auto contains = [&](KVCacheLayout l) { return std::find(candidates.begin(), candidates.end(), l) != candidates.end(); };
  if (requested_layout.has_value()) {
    layout = *requested_layout;
    if (!contains(layout))
      throw InvalidArgument(fmt::format(
          "VLLM_KV_CACHE_LAYOUT={} does not satisfy every supported set; valid layouts: {}. Unset it or "
          "pick one of those",
          layout_name(layout), format_layout_names(candidates)));
  } else if (connector_layout.has_value()) {
    layout = *connector_layout;
    if (!contains(layout)) {
      logger().warn("KV connector cache layout {} does not satisfy every supported set; valid layouts: {}. "
                    "Using {} instead.",
                    layout_name(layout), format_layout_names(candidates), layout_name(candidates.front()));
      layout = candidates.front();
    }
  }

  // 6. Record.
  logger().info("Using {} KV cache layout.", layout_name(layout));
  cache_config.kv_cache_layout = layout;
  return layout;
}

std::optional<std::string> kv_cache_layout_from_env() {
  const char* v = std::getenv("VLLM_KV_CACHE_LAYOUT");
  if (v == nullptr || *v == '\0') return std::nullopt;
  std::string_view s(v);
  for (auto c : kKVCacheLayoutEnvChoices)
    if (c == s) return std::string(s);
  std::string choices = "[";
  for (size_t i = 0; i < kKVCacheLayoutEnvChoices.size(); ++i)
    choices += fmt::format("{}'{}'", i ? ", " : "", kKVCacheLayoutEnvChoices[i]);
  throw InvalidArgument(fmt::format("Invalid value '{}' for VLLM_KV_CACHE_LAYOUT. Valid options: {}]. Unset it to "
                                    "let the backends choose",
                                    s, choices));
}

KVCacheLayout resolve_kv_cache_layout_from_env(CacheConfig& cache_config,
                                               const std::vector<std::vector<std::string>>& supported_layouts,
                                               const std::vector<KVCacheSpecPtr>& kv_cache_specs,
                                               const std::optional<std::string>& connector_layout) {
  return resolve_kv_cache_layout(cache_config, supported_layouts, kv_cache_specs, kv_cache_layout_from_env(),
                                 connector_layout);
}

}  // namespace kvattn
