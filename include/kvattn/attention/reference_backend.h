// kvattn/attention/reference_backend.h — a dense reference backend for tests, and the dense
// attention oracle the end-to-end tests compare every backend against.
//
// REFERENCE gathers each request's keys and values out of the paged cache and runs plain dense
// attention in double precision, one request at a time.  It accepts almost every
// configuration (any head size and block size, f32/f16/bf16, fp8 KV, sinks, windows,
// non-causal) but no DCP, no cascade and no CUDA: it is an oracle, not a fast path.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvattn/attention/attention_impl.h"
#include "kvattn/attention/backend.h"
#include "kvattn/attention/metadata_builder.h"

namespace kvattn {

// Dense attention of one request.  Query row i sits at position kv_len - q_len + i; key j is
// visible when j <= that position (causal), j >= position - window_left (window_left >= 0).
// Scores s = q.k * sm_scale, then cap * tanh(s / cap) when soft_cap > 0; softmax over visible
// keys (+ exp(sink[h]) in the denominator when sinks are given).  A row that sees no key is 0.
struct DenseAttentionArgs {
  Tensor query;  // [q_len, num_qo_heads, head_dim] f32/f16/bf16 (CPU)
  Tensor key;    // [kv_len, num_kv_heads, head_dim] any float dtype (CPU)
  Tensor value;  // [kv_len, num_kv_heads, head_dim]
  double sm_scale = 1.0;
  bool causal = true;
  int64_t window_left = -1;
  double logits_soft_cap = 0.0;
  Tensor sinks;  // optional [num_qo_heads] (any float dtype)
};
// Returns [q_len, num_qo_heads, head_dim] f32.
Tensor dense_attention_reference(const DenseAttentionArgs& args);

class ReferenceBackend final : public AttentionBackend {
 public:
  std::string get_name() const override { return "REFERENCE"; }
  std::vector<DType> supported_dtypes() const override { return {DType::f32, DType::f16, DType::bf16}; }
  std::vector<KVCacheDType> supported_kv_cache_dtypes() const override {
    return {KVCacheDType::Auto, KVCacheDType::BFloat16, KVCacheDType::Float16,
            KVCacheDType::Fp8,  KVCacheDType::Fp8E4M3,  KVCacheDType::Fp8E5M2};
  }
  bool supports_compute_capability(const std::optional<DeviceCapability>& cap) const override { return !cap; }
  bool supports_sink(const BackendConfig&) const override { return true; }
  bool supports_sliding_window() const override { return true; }
  bool supports_non_causal() const override { return true; }
  bool supports_batch_invariance() const override { return true; }
  bool supports_dcp() const override { return false; }
  bool forward_includes_kv_cache_update() const override { return false; }
  std::unique_ptr<AttentionMetadataBuilder> make_builder(std::shared_ptr<const AttentionSpec> kv_cache_spec,
                                                         std::vector<std::string> layer_names,
                                                         const BackendConfig& config) const override;
  std::shared_ptr<AttentionImpl> make_impl(const AttentionImplParams& params,
                                           const BackendConfig& config) const override;
};

class ReferenceMetadata final : public AttentionMetadata {
 public:
  const char* backend_name() const noexcept override { return "REFERENCE"; }
  int64_t num_reqs = 0;
  int64_t num_actual_tokens = 0;
  bool causal = true;
  Tensor query_start_loc_cpu;  // [num_reqs + 1] int32 host
  Tensor seq_lens_cpu;         // [num_reqs] int32 host
  Tensor block_table;          // [num_reqs, max_blocks] int32 host
  Tensor slot_mapping;         // [num_actual_tokens] int64
};

class ReferenceMetadataBuilder final : public AttentionMetadataBuilder {
 public:
  ReferenceMetadataBuilder(std::shared_ptr<const AttentionSpec> kv_cache_spec, std::vector<std::string> layer_names,
                           const BackendConfig& config);
  // common_prefix_len > 0 (cascade) is Unsupported.
  const ReferenceMetadata& build(int64_t common_prefix_len, const CommonAttentionMetadata& cm,
                                 bool fast_build = false) override;

 private:
  ReferenceMetadata metadata_;
};

class ReferenceImpl final : public AttentionImpl {
 public:
  explicit ReferenceImpl(const AttentionImplParams& params);
  bool supports_dcp() const override { return false; }
  double scale() const override { return p_.scale; }
  int64_t window_left() const override { return p_.sliding_window ? *p_.sliding_window - 1 : -1; }
  std::optional<double> logits_soft_cap() const override { return p_.logits_soft_cap; }
  bool has_sinks() const override { return p_.sinks.defined(); }
  int64_t num_heads() const override { return p_.num_heads; }
  int64_t num_kv_heads() const override { return p_.num_kv_heads; }
  int64_t head_size() const override { return p_.head_size; }
  const std::optional<std::string>& kv_sharing_target_layer_name() const override {
    return p_.kv_sharing_target_layer_name;
  }
  Tensor forward(const AttentionLayer& layer, const Tensor& query, const Tensor& key, const Tensor& value,
                 const Tensor& kv_cache, const AttentionMetadata* metadata, const Tensor& output,
                 const Tensor& output_scale = Tensor(), const Tensor& output_block_scale = Tensor()) override;
  void do_kv_cache_update(const AttentionLayer& layer, const Tensor& key, const Tensor& value, const Tensor& kv_cache,
                          const Tensor& slot_mapping) override;

 private:
  AttentionImplParams p_;
};

}  // namespace kvattn
