#include "kvattn/attention/per_layer_parameters.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kvattn {
namespace {

const AttentionLayerInfo* find_layer(std::span<const AttentionLayerInfo> layers, const std::string& name) {
  for (const auto& l : layers)
    if (l.name == name) return &l;
  return nullptr;
}

std::string known_names(std::span<const AttentionLayerInfo> layers) {
  std::vector<std::string> names;
  for (const auto& l : layers) names.push_back(l.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

PerLayerParameterMap get_per_layer_parameters(std::span<const AttentionLayerInfo> layers,
                                              std::span<const std::string> layer_names) {
  PerLayerParameterMap out;
  out.reserve(layer_names.size());
  for (const auto& name : layer_names) {
    const auto* l = find_layer(layers, name);
    KVATTN_CHECK(l != nullptr, "get_per_layer_parameters: no attention layer named '{}'; known "
                 "layers: [{}]", name, known_names(layers));
    PerLayerParameters p;
    p.window_left = l->sliding_window ? l->sliding_window->first : -1;
    p.logits_soft_cap = l->logits_soft_cap;
    p.sm_scale = l->sm_scale;
    p.has_sinks = l->has_sinks;
    out.emplace_back(name, p);
  }
  return out;
}

PerLayerParameters infer_global_hyperparameters(PerLayerParameterMap& per_layer_params) {
  KVATTN_CHECK(!per_layer_params.empty(), "No attention layers found in the model "
               "(infer_global_hyperparameters got an empty parameter map).");
  PerLayerParameters& global = per_layer_params.front().second;
  bool same_window = true, same_all = true;
  for (const auto& [name, p] : per_layer_params) {
    same_window = same_window && p.window_left == global.window_left;
    same_all = same_all && p == global;
  }
  global.has_same_window_lefts = same_window;
  global.has_same_all_params = same_all;
  return global;
}

std::optional<int64_t> get_num_attention_heads_from_layers(std::span<const AttentionLayerInfo> layers,
                                                           std::span<const std::string> layer_names) {
  std::optional<int64_t> heads;
  std::vector<std::string> seen;
  bool mismatch = false;
  for (const auto& name : layer_names) {
    const auto* l = find_layer(layers, name);
    if (l == nullptr) continue;
    seen.push_back(fmt::format("{}={}", name, l->num_heads));
    if (!heads) heads = l->num_heads;
    else if (*heads != l->num_heads) mismatch = true;
  }
  KVATTN_CHECK(!mismatch, "All layers in one attention group must share num_heads; got [{}]. "
               "Put layers with different head counts in different attention groups.",
               fmt::join(seen, ", "));
  return heads;
}

Tensor log2_lse_to_ln(const Tensor& lse) {
  KVATTN_CHECK(lse.defined() && lse.dtype() == DType::f32 && lse.device().is_cpu(),
               "log2_lse_to_ln: lse must be a float32 CPU tensor, got {}",
               lse.defined() ? lse.str() : std::string("undefined"));
  Tensor out = lse.contiguous().clone();
  float* p = out.data_ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) p[i] = log2_lse_to_ln(p[i]);
  return out;
}

std::optional<std::string> get_query_lens_mismatch_unsupported_backend(
    std::span<const std::vector<AttentionBackendTraits>> attn_groups) {
  for (const auto& groups : attn_groups)
    for (const auto& backend : groups)
      if (!backend.supports_device_cpu_query_lens_mismatch) return backend.name;
  return std::nullopt;
}

}  // namespace kvattn
