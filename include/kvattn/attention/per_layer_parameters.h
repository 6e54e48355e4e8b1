// kvattn/attention/per_layer_parameters.h — the per-layer hyperparameters a FlashInfer-style
// plan needs (window, soft cap, softmax scale, sinks), the group-wide head count, and backend
// capability lookups (vllm.v1.attention.backends.utils, vllm.v1.worker.gpu.attn_utils).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvattn/core/tensor.h"

namespace kvattn {

// What these helpers read from an attention layer (the full layer type comes later).
struct AttentionLayerInfo {
  std::string name;
  int64_t num_heads = 0;     // query heads on this TP rank
  int64_t num_kv_heads = 0;
  double sm_scale = 1.0;     // impl.scale
  std::optional<std::pair<int64_t, int64_t>> sliding_window;  // (left, right), e.g. (sw - 1, 0)
  std::optional<double> logits_soft_cap;
  bool has_sinks = false;
};

// Values that FlashInfer's non-trtllm paths need to be equal across all layers of a group.
struct PerLayerParameters {
  int64_t window_left = -1;  // sliding_window.first, or -1 for full attention
  std::optional<double> logits_soft_cap;
  double sm_scale = 1.0;
  bool has_sinks = false;
  // Filled by infer_global_hyperparameters; not part of equality.
  std::optional<bool> has_same_window_lefts;
  std::optional<bool> has_same_all_params;

  friend bool operator==(const PerLayerParameters& a, const PerLayerParameters& b) {
    return a.window_left == b.window_left && a.logits_soft_cap == b.logits_soft_cap &&
           a.sm_scale == b.sm_scale && a.has_sinks == b.has_sinks;
  }
};

// Ordered (layer name, parameters) pairs, in layer_names order.
using PerLayerParameterMap = std::vector<std::pair<std::string, PerLayerParameters>>;

// Parameters of every named layer.  A name not among `layers` is an InvalidArgument that lists
// the known names.
PerLayerParameterMap get_per_layer_parameters(std::span<const AttentionLayerInfo> layers,
                                              std::span<const std::string> layer_names);

// The first layer's parameters, with has_same_window_lefts / has_same_all_params set from a
// comparison against every layer.  An empty map is an InvalidArgument.
PerLayerParameters infer_global_hyperparameters(PerLayerParameterMap& per_layer_params);

// The num_heads shared by the named layers; nullopt when none of them is known.  Layers of one
// group that disagree are an InvalidArgument naming each layer's count.
std::optional<int64_t> get_num_attention_heads_from_layers(std::span<const AttentionLayerInfo> layers,
                                                           std::span<const std::string> layer_names);

// Base-2 log-sum-exp to natural log: lse * ln(2).
inline constexpr double kLn2 = 0.693147180559945309417232121458176568;
inline float log2_lse_to_ln(float lse) noexcept { return static_cast<float>(lse * kLn2); }
// Tensor form: a fresh float32 CPU tensor of the same shape.
Tensor log2_lse_to_ln(const Tensor& lse);

// Minimal backend traits for the capability lookups below.
struct AttentionBackendTraits {
  std::string name;
  // Whether the backend tolerates device query lengths that differ from the CPU copy (adaptive
  // speculative verification trims drafts on the device).
  bool supports_device_cpu_query_lens_mismatch = false;
};

// The first backend (over every KV-cache group's attention groups, in order) that needs the CPU
// query lengths to be exact, by name; nullopt when all of them tolerate a mismatch.
std::optional<std::string> get_query_lens_mismatch_unsupported_backend(
    std::span<const std::vector<AttentionBackendTraits>> attn_groups);

}  // namespace kvattn
