// kvattn/attention/attention_group_builders.h — the builder half of vLLM's AttentionGroup
// (seed 003): create_metadata_builders, build_metadata, build_metadata_for_cudagraph_capture,
// build_metadata_for_drafting.
//
// The KV half (kernel block size, kernel_block_table per ubatch, map_to_kernel_block_table)
// is kv/'s AttentionGroup; this wrapper owns one, plus the backend and one metadata builder
// per micro-batch (ubatches never share persistent buffers).  Every build first maps the
// manager-block table to kernel blocks when the backend needs smaller blocks than the KV
// cache manager allocates.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvattn/attention/backend.h"
#include "kvattn/attention/metadata_builder.h"
#include "kvattn/kv/attention_group.h"

namespace kvattn {

// vLLM get_block_table_width: manager blocks a request of max_num_blocks needs, rounded up so
// that the row covers a multiple of token_alignment tokens, expressed in kernel blocks.
int64_t get_block_table_width(int64_t max_num_blocks, int64_t block_size,
                              std::optional<int64_t> kernel_block_size = std::nullopt, int64_t token_alignment = 128);

class AttentionGroupBuilders {
 public:
  AttentionGroupBuilders(AttentionBackendPtr backend, std::vector<std::string> layer_names,
                         KVCacheSpecPtr kv_cache_spec, int64_t kv_cache_group_id, const BackendConfig& config);
  AttentionGroupBuilders(const AttentionGroupBuilders&) = delete;
  AttentionGroupBuilders& operator=(const AttentionGroupBuilders&) = delete;

  const AttentionBackend& backend() const noexcept { return *backend_; }
  AttentionGroup& kv_group() noexcept { return group_; }
  const AttentionGroup& kv_group() const noexcept { return group_; }
  const std::vector<std::string>& layer_names() const noexcept { return group_.layer_names; }

  // kernel_block_size: the size prepare_kernel_block_sizes chose for the KV cache group (nullopt
  // = the manager's).  It is narrowed to one this backend accepts; when it differs from the
  // spec's block size the group maps block tables to kernel blocks (persistent table per
  // ubatch) and the builders see a spec with the kernel block size.
  void create_metadata_builders(std::optional<int64_t> kernel_block_size = std::nullopt,
                                int64_t num_metadata_builders = 1);

  const AttentionMetadata& build_metadata(const CommonAttentionMetadata& cm, int64_t ubatch_idx = 0,
                                          int64_t common_prefix_len = 0, bool fast_build = false);
  const AttentionMetadata& build_metadata_for_cudagraph_capture(const CommonAttentionMetadata& cm,
                                                                int64_t ubatch_idx = 0);
  const AttentionMetadata& build_metadata_for_drafting(const CommonAttentionMetadata& cm, int64_t draft_index);

  AttentionMetadataBuilder& get_metadata_builder(int64_t ubatch_id = 0);
  size_t num_metadata_builders() const noexcept { return builders_.size(); }
  // Block-table width in kernel blocks (0 before create_metadata_builders).
  int64_t block_table_width() const noexcept { return block_table_width_; }
  // The spec the builders were created with (kernel block size applied).
  const std::shared_ptr<const AttentionSpec>& builder_spec() const noexcept { return builder_spec_; }

  bool supports_draft_decode_metadata_update();
  void update_draft_decode_metadata(const AttentionMetadata& metadata);

 private:
  // cm with block_table_tensor mapped to kernel blocks (a copy of views; no allocation).
  CommonAttentionMetadata with_kernel_block_table(const CommonAttentionMetadata& cm, int64_t ubatch_idx);

  AttentionBackendPtr backend_;
  BackendConfig config_;
  std::unique_ptr<BlockSizeBackend> block_size_backend_;  // group_.backend points here
  AttentionGroup group_;
  std::shared_ptr<const AttentionSpec> builder_spec_;
  std::vector<std::unique_ptr<AttentionMetadataBuilder>> builders_;
  int64_t block_table_width_ = 0;
  int64_t manager_width_ = 0;
  // Device block tables: kv/'s mapping runs on the host, so a device table is staged through
  // host_manager_table_ and the mapped rows are copied into device_kernel_tables_[ubatch]
  // (persistent; CUDA graphs see fixed addresses).
  Tensor host_manager_table_;                // [max_num_seqs * manager_width] int32, host
  std::vector<Tensor> device_kernel_tables_;  // per ubatch [max_num_seqs * width] int32, device
};

}  // namespace kvattn
