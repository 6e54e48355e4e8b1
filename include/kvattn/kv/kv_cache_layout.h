// kvattn/kv/kv_cache_layout.h — the physical order of the KV cache's five logical axes.
//
// The KV cache of one KVCacheTensor is a 5-D byte grid with logical axes [L, B, H, N, C]:
//   L = layer (within one KVCacheTensor), B = block/page id, H = head slot (spec.num_heads()),
//   N = states per block (spec.num_states(); = block_size for plain attention),
//   C = content bytes per (head slot, state) (K and V concatenated for plain attention).
// A KVCacheLayout names the physical order of those axes, outermost first (vLLM's
// vllm/v1/kv_cache_layout.py).  Every layer is viewed as a logical [B, H, N, C] tensor whose
// strides follow the layout; `layer_view_order` permutes that view into physical order.
//
// The layout is resolved once for the whole model (resolve_kv_cache_layout) from what every
// worker's backends support, recorded in CacheConfig::kv_cache_layout, and then final.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvattn {

class KVCacheSpec;  // kvattn/kv/kv_cache_spec.h
using KVCacheSpecPtr = std::shared_ptr<const KVCacheSpec>;

// Logical axis ids of the [L, B, H, N, C] grid.
inline constexpr int kDimL = 0;
inline constexpr int kDimB = 1;
inline constexpr int kDimH = 2;
inline constexpr int kDimN = 3;
inline constexpr int kDimC = 4;

// Declaration order is the enum order vLLM iterates in (used as the merge tie-break).
enum class KVCacheLayout : uint8_t {
  LBHNC,  // [L, B, H, N, C] identity            == legacy "HND"
  LBNHC,  // [L, B, N, H, C]                     == legacy "NHD"
  LHBNC,  // [L, H, B, N, C]  head-major outside the block; no FlashInfer form
  BLHNC,  // [B, L, H, N, C]  block-outermost, HND inside
  BLNHC,  // [B, L, N, H, C]  block-outermost, NHD inside
  BHLNC,  // [B, H, L, N, C]  block-outermost, layers interleaved per head
};

inline constexpr std::array<KVCacheLayout, 6> kAllKVCacheLayouts = {
    KVCacheLayout::LBHNC, KVCacheLayout::LBNHC, KVCacheLayout::LHBNC,
    KVCacheLayout::BLHNC, KVCacheLayout::BLNHC, KVCacheLayout::BHLNC};

// Preference used when no backend declares a set: LBNHC (NHD) first, as vLLM's default.
inline constexpr std::array<KVCacheLayout, 6> kDefaultLayoutPreference = {
    KVCacheLayout::LBNHC, KVCacheLayout::LBHNC, KVCacheLayout::BLNHC,
    KVCacheLayout::BLHNC, KVCacheLayout::BHLNC, KVCacheLayout::LHBNC};

using LayoutList = std::vector<KVCacheLayout>;

// stride_order()[i] = logical axis stored at physical position i (outermost first);
// vLLM's `layout.value` / `layout.stride_order`.
std::array<int, 5> stride_order(KVCacheLayout layout) noexcept;
// Physical order of the per-layer [B, H, N, C] view (stride_order without L, each id - 1):
// `view.permute(layer_view_order(layout))` gives the physical-order tensor (LBNHC -> [B,N,H,C]).
std::array<int, 4> layer_view_order(KVCacheLayout layout) noexcept;
// L outermost: each layer's bytes form one region.
bool is_layer_compact(KVCacheLayout layout) noexcept;
// The last three physical axes are (H, N, C): a block's interior is HND-contiguous.
bool is_block_contiguous(KVCacheLayout layout) noexcept;
// The two outermost physical axes are {L, B}: each (layer, block) page is one dense byte run.
bool is_block_compact(KVCacheLayout layout) noexcept;
// B outermost: all layers' pages of one block are adjacent.
bool is_block_outermost(KVCacheLayout layout) noexcept;

// "LBHNC", ... (vLLM's `layout.name`).
const char* layout_name(KVCacheLayout layout) noexcept;
// Names of `layouts` formatted as a Python list: "['LBNHC', 'LBHNC']".
std::string format_layout_names(const LayoutList& layouts);
std::vector<std::string> layout_names(const LayoutList& layouts);

// vLLM's `_layout_from_name`: accepts the six names and the legacy aliases NHD (-> LBNHC) and
// HND (-> LBHNC).  Throws InvalidArgument naming the bad value and listing the valid layouts.
KVCacheLayout layout_from_name(std::string_view name);
// A layout option as the CLI and Python take it: "auto" -> nullopt (resolve automatically), else
// layout_from_name(name).
std::optional<KVCacheLayout> parse_layout_option(std::string_view name);

// FlashInfer's name for the block interior: "NHD" or "HND".  LHBNC has no FlashInfer form:
// throws Unsupported (vLLM asserts; FlashInfer never declares LHBNC).
const char* get_flashinfer_layout_string(KVCacheLayout layout);

// vLLM's `_merge_supported_layouts`.  `lists` must be non-empty.  If every list equals the
// first, returns the first unchanged.  Otherwise: the layouts in every list, in enum order,
// stable-sorted by how many lists put them first (descending; ties keep enum order).  Throws
// InvalidArgument ("No KV cache layout satisfies every supported set: ...") when the
// intersection is empty.
LayoutList merge_supported_layouts(const std::vector<LayoutList>& lists);

// The layouts every one of a worker's backends supports, most preferred first.  Each entry is
// one backend's `supported_kv_cache_layouts()`: nullopt = "any layout, no preference".  Backends
// that declare nothing do not vote; if none declares, kDefaultLayoutPreference is used.
LayoutList get_supported_kv_cache_layouts(
    const std::vector<std::optional<LayoutList>>& backend_declarations);

// The slice of vLLM's CacheConfig that holds the resolved layout.
struct CacheConfig {
  // The resolved layout; nullopt = not resolved yet.  Resolved once (resolve_kv_cache_layout)
  // and final afterwards; tests/tools may pre-set it.
  std::optional<KVCacheLayout> kv_cache_layout;

  // Throws InvalidArgument if unresolved; else *kv_cache_layout.
  KVCacheLayout get_resolved_kv_cache_layout() const;
};

// Adopt a layout resolved elsewhere.  Re-recording the same layout is fine; recording a different
// one throws InvalidArgument ("already resolved to X").  The name form accepts layout_from_name's
// names (aliases normalise: NHD -> LBNHC).
void record_kv_cache_layout(CacheConfig& cache_config, KVCacheLayout layout);
void record_kv_cache_layout(CacheConfig& cache_config, std::string_view layout_name);

// vLLM's resolve_kv_cache_layout (seed version), steps:
//  1. a layout already on cache_config wins outright;
//  2. supported_layouts (one list of names per worker, each non-empty) are parsed; workers
//     reporting exactly kDefaultLayoutPreference don't vote (unless all do);
//     candidates = merge_supported_layouts(voters);
//  3. specs with has_layer_views() (UniformTypeKVCacheSpecs are expanded per layer): more than
//     one distinct (num_heads, num_states, page_size_bytes) keeps only block-compact candidates;
//  4. attention specs that use the slot mapping with both sharded and replicated DCP storage and
//     more than one page size keep only block-outermost candidates;
//  5. `requested_layout` (VLLM_KV_CACHE_LAYOUT) must be a candidate, else InvalidArgument;
//     otherwise `connector_layout` is used when a candidate, else a warning and candidates[0];
//     otherwise candidates[0];
//  6. the result is recorded in cache_config and returned.
// All failures throw InvalidArgument with the supported sets in the message.
KVCacheLayout resolve_kv_cache_layout(CacheConfig& cache_config,
                                      const std::vector<std::vector<std::string>>& supported_layouts,
                                      const std::vector<KVCacheSpecPtr>& kv_cache_specs = {},
                                      const std::optional<std::string>& requested_layout = std::nullopt,
                                      const std::optional<std::string>& connector_layout = std::nullopt);
// The same over parsed layouts (what the planner and the engine call): every argument explicit,
// so a braced list of names always picks the form above.
KVCacheLayout resolve_kv_cache_layout(CacheConfig& cache_config, const std::vector<LayoutList>& supported_layouts,
                                      const std::vector<KVCacheSpecPtr>& kv_cache_specs,
                                      std::optional<KVCacheLayout> requested_layout,
                                      std::optional<KVCacheLayout> connector_layout);

// The valid values of VLLM_KV_CACHE_LAYOUT (envs.py choices, aliases included).
inline constexpr std::array<std::string_view, 8> kKVCacheLayoutEnvChoices = {
    "LBNHC", "LBHNC", "LHBNC", "NHD", "HND", "BLHNC", "BLNHC", "BHLNC"};

// Reads VLLM_KV_CACHE_LAYOUT: nullopt when unset or empty; InvalidArgument when not one of
// kKVCacheLayoutEnvChoices.
std::optional<std::string> kv_cache_layout_from_env();

// resolve_kv_cache_layout with requested_layout = kv_cache_layout_from_env().
KVCacheLayout resolve_kv_cache_layout_from_env(
    CacheConfig& cache_config, const std::vector<std::vector<std::string>>& supported_layouts,
    const std::vector<KVCacheSpecPtr>& kv_cache_specs = {},
    const std::optional<std::string>& connector_layout = std::nullopt);

}  // namespace kvattn
