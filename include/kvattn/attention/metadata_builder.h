// kvattn/attention/metadata_builder.h — the per-step planner interface (vLLM's
// AttentionMetadataBuilder, vllm-facts §4.4) and the base of the metadata it returns.
//
// Ownership: a builder owns persistent buffers sized at construction; build() fills them and
// returns a reference to builder-owned metadata that stays valid until the next build() on
// the same builder (vLLM's metadata likewise points into the builder's persistent buffers).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvattn/attention/backend.h"
#include "kvattn/batch/common_attention_metadata.h"

namespace kvattn {

class AttentionMetadata {
 public:
  virtual ~AttentionMetadata() = default;
  // Name of the backend that built it ("FLASHINFER", "REFERENCE"): impls check it before use.
  virtual const char* backend_name() const noexcept = 0;
};

class AttentionMetadataBuilder {
 public:
  AttentionMetadataBuilder(std::shared_ptr<const AttentionSpec> kv_cache_spec, std::vector<std::string> layer_names,
                           const BackendConfig& config);
  virtual ~AttentionMetadataBuilder() = default;

  const AttentionSpec& kv_cache_spec() const noexcept { return *kv_cache_spec_; }
  const std::vector<std::string>& layer_names() const noexcept { return layer_names_; }
  const BackendConfig& config() const noexcept { return config_; }

  // Query lengths <= this are decodes (pulled to the front by the reorder); nullopt = the
  // backend does not reorder.
  std::optional<int64_t> reorder_batch_threshold() const noexcept { return reorder_batch_threshold_; }
  virtual bool supports_update_block_table() const { return false; }
  bool supports_draft_decode_metadata_update() const noexcept { return supports_draft_decode_metadata_update_; }
  void set_kernel_block_size(int64_t k) { kernel_block_size_ = k; }
  std::optional<int64_t> kernel_block_size() const noexcept { return kernel_block_size_; }

  // common_prefix_len > 0 asks for cascade attention over that many shared tokens.
  virtual const AttentionMetadata& build(int64_t common_prefix_len, const CommonAttentionMetadata& cm,
                                         bool fast_build = false) = 0;
  virtual const AttentionMetadata& build_for_cudagraph_capture(const CommonAttentionMetadata& cm) {
    return build(0, cm);
  }
  virtual const AttentionMetadata& build_for_drafting(const CommonAttentionMetadata& cm, int64_t draft_index) {
    return build(0, cm, /*fast_build=*/true);
  }
  // Capture-safe in-place update for fused draft steps.
  virtual void update_draft_decode_metadata(const AttentionMetadata& metadata) {}

  // vLLM's use_cascade_attention hook (default: never).
  virtual bool use_cascade_attention(int64_t common_prefix_len, std::span<const int32_t> query_lens,
                                     int64_t num_query_heads, int64_t num_kv_heads, bool use_alibi,
                                     bool use_sliding_window, bool use_local_attention, int64_t num_sms,
                                     int64_t dcp_world_size) const {
    return false;
  }

 protected:
  // vLLM _init_reorder_batch_threshold: threshold, raised to 1 + (2 if parallel drafting else
  // 1) * num_spec when spec queries can run as decodes, forced back to 1 under DCP unless the
  // decode kernel handles DCP with variable query lengths.
  void init_reorder_batch_threshold(std::optional<int64_t> threshold = 1, bool supports_spec_as_decode = false,
                                    bool supports_dcp_with_varlen = false);

  std::shared_ptr<const AttentionSpec> kv_cache_spec_;
  std::vector<std::string> layer_names_;
  BackendConfig config_;
  std::optional<int64_t> reorder_batch_threshold_;
  std::optional<int64_t> kernel_block_size_;
  bool supports_draft_decode_metadata_update_ = false;
};

}  // namespace kvattn
