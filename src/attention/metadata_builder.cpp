// src/attention/metadata_builder.cpp — AttentionMetadataBuilder base, AttentionImpl base,
// AttentionLayer and LayerRegistry.
#include "kvattn/attention/metadata_builder.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "kvattn/attention/attention_impl.h"
#include "kvattn/attention/communicator.h"
#include "kvattn/core/error.h"

namespace kvattn {

AttentionMetadataBuilder::AttentionMetadataBuilder(std::shared_ptr<const AttentionSpec> kv_cache_spec,
                                                   std::vector<std::string> layer_names, const BackendConfig& config)
    : kv_cache_spec_(std::move(kv_cache_spec)), layer_names_(std::move(layer_names)), config_(config) {
  KVATTN_CHECK(kv_cache_spec_ != nullptr, "AttentionMetadataBuilder: kv_cache_spec must not be null");
  config_.validate();
}

void AttentionMetadataBuilder::init_reorder_batch_threshold(std::optional<int64_t> threshold,
                                                            bool supports_spec_as_decode,
                                                            bool supports_dcp_with_varlen) {
  reorder_batch_threshold_ = threshold;
  if (threshold && supports_spec_as_decode && config_.num_speculative_tokens)
    reorder_batch_threshold_ = std::max(*threshold, max_decode_query_len(config_));
  if (config_.decode_context_parallel_size > 1 && !supports_dcp_with_varlen) reorder_batch_threshold_ = 1;
}

// ---------------------------------------------------------------------------------------
AttentionLayer AttentionLayer::make(std::string name, std::shared_ptr<AttentionImpl> impl, Device device) {
  AttentionLayer l;
  l.name = std::move(name);
  l.impl = std::move(impl);
  auto one = [&] {
    Tensor t = Tensor::from_vector<float>({1.0f});
    return device.is_cpu() ? t : t.to(device);
  };
  l.q_scale = one();
  l.k_scale = one();
  l.v_scale = one();
  return l;
}

void AttentionLayer::set_scales(double q, double k, double v) {
  KVATTN_CHECK(q > 0 && k > 0 && v > 0, "AttentionLayer '{}': scales must be positive, got q={} k={} v={}", name, q,
               k, v);
  q_scale_float = q;
  k_scale_float = k;
  v_scale_float = v;
  const Device dev = q_scale.defined() ? q_scale.device() : Device::cpu();
  auto make = [&](double x) {
    Tensor t = Tensor::from_vector<float>({static_cast<float>(x)});
    return dev.is_cpu() ? t : t.to(dev);
  };
  q_scale = make(q);
  k_scale = make(k);
  v_scale = make(v);
}

void LayerRegistry::add(AttentionLayer* layer) {
  KVATTN_CHECK(layer != nullptr, "LayerRegistry::add: null layer");
  KVATTN_CHECK(!layers_.contains(layer->name), "LayerRegistry: duplicate layer name '{}'", layer->name);
  layers_.emplace(layer->name, layer);
}

const AttentionLayer* LayerRegistry::find(std::string_view name) const {
  auto it = layers_.find(name);
  return it == layers_.end() ? nullptr : it->second;
}

const AttentionLayer& LayerRegistry::get(std::string_view name) const {
  const AttentionLayer* l = find(name);
  KVATTN_CHECK(l != nullptr, "LayerRegistry: no attention layer named '{}'; known layers: [{}]", name,
               fmt::join(names(), ", "));
  return *l;
}

std::vector<std::string> LayerRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [n, _] : layers_) out.push_back(n);
  return out;
}

void AttentionImpl::set_dcp_group(DcpCommunicator* group) {
  dcp_group_ = group;
  dcp_world_size_ = group ? group->world_size() : 1;
  dcp_rank_ = group ? group->rank() : 0;
}

}  // namespace kvattn
