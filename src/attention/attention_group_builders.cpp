// src/attention/attention_group_builders.cpp — the builder half of AttentionGroup.
#include "kvattn/attention/attention_group_builders.h"

#include <numeric>

#include "kvattn/core/error.h"

namespace kvattn {

int64_t get_block_table_width(int64_t max_num_blocks, int64_t block_size, std::optional<int64_t> kernel_block_size,
                              int64_t token_alignment) {
  const int64_t kernel = kernel_block_size.value_or(block_size);
  KVATTN_CHECK(block_size > 0 && kernel > 0 && block_size % kernel == 0 && max_num_blocks >= 0,
               "get_block_table_width: block_size {} must be a positive multiple of the kernel block size {}",
               block_size, kernel);
  if (token_alignment > 0) {
    const int64_t a = token_alignment / std::gcd(token_alignment, block_size);
    max_num_blocks = (max_num_blocks + a - 1) / a * a;
  }
  return max_num_blocks * block_size / kernel;
}

AttentionGroupBuilders::AttentionGroupBuilders(AttentionBackendPtr backend, std::vector<std::string> layer_names,
                                               KVCacheSpecPtr kv_cache_spec, int64_t kv_cache_group_id,
                                               const BackendConfig& config)
    : backend_(std::move(backend)), config_(config) {
  KVATTN_CHECK(backend_ != nullptr && kv_cache_spec != nullptr, "AttentionGroupBuilders: null backend or spec");
  block_size_backend_ = std::make_unique<BlockSizeBackend>(backend_->block_size_backend(config_));
  group_.backend = block_size_backend_.get();
  group_.layer_names = std::move(layer_names);
  group_.kv_cache_spec = std::move(kv_cache_spec);
  group_.kv_cache_group_id = kv_cache_group_id;
}

void AttentionGroupBuilders::create_metadata_builders(std::optional<int64_t> kernel_block_size,
                                                      int64_t num_metadata_builders) {
  KVATTN_CHECK(num_metadata_builders >= 1, "create_metadata_builders: num_metadata_builders must be >= 1, got {}",
               num_metadata_builders);
  auto spec = std::dynamic_pointer_cast<const AttentionSpec>(group_.kv_cache_spec);
  if (!spec) {
    // A Uniform group: the builder reads the first layer's spec (vLLM iterates per layer).
    const auto specs = iter_layer_specs(group_.kv_cache_spec);
    for (const auto& s : specs)
      if (auto a = std::dynamic_pointer_cast<const AttentionSpec>(s)) {
        spec = a;
        break;
      }
  }
  KVATTN_CHECK(spec != nullptr, "create_metadata_builders: KV cache group {} has no attention spec ({})",
               group_.kv_cache_group_id, group_.kv_cache_spec->repr());
  KVCacheLimits limits;
  limits.max_model_len = config_.max_model_len;
  limits.max_num_batched_tokens = config_.max_num_batched_tokens;
  limits.decode_context_parallel_size = config_.decode_context_parallel_size;
  const int64_t max_num_blocks = spec->max_num_blocks_per_req(limits, config_.max_model_len);
  const int64_t manager_width = get_block_table_width(max_num_blocks, spec->block_size());
  std::optional<int64_t> kernel = kernel_block_size;
  if (kernel_block_size) {
    // Narrows the size to one this backend accepts and sizes the persistent kernel tables.
    group_.configure_kernel_blocks(kernel_block_size, num_metadata_builders, config_.max_num_seqs, manager_width);
    kernel = group_.kernel_block_size.value_or(spec->block_size());
  }
  builder_spec_ = kernel && *kernel != spec->block_size()
                      ? std::dynamic_pointer_cast<const AttentionSpec>(spec->copy_with_new_block_size(*kernel))
                      : spec;
  block_table_width_ = manager_width * (spec->block_size() / kernel.value_or(spec->block_size()));
  manager_width_ = manager_width;
  host_manager_table_ = Tensor();
  device_kernel_tables_.clear();
  if (group_.kernel_block_size && !config_.platform.device.is_cpu()) {
    host_manager_table_ = Tensor::zeros({config_.max_num_seqs * manager_width}, DType::i32);
    for (int64_t i = 0; i < num_metadata_builders; ++i)
      device_kernel_tables_.push_back(
          Tensor::zeros({config_.max_num_seqs * block_table_width_}, DType::i32, config_.platform.device));
  }
  builders_.clear();
  for (int64_t i = 0; i < num_metadata_builders; ++i)
    builders_.push_back(backend_->make_builder(builder_spec_, group_.layer_names, config_));
}

AttentionMetadataBuilder& AttentionGroupBuilders::get_metadata_builder(int64_t ubatch_id) {
  KVATTN_CHECK(ubatch_id >= 0 && ubatch_id < static_cast<int64_t>(builders_.size()),
               "AttentionGroup: no metadata builder for ubatch {} ({} created; call create_metadata_builders with "
               "num_metadata_builders > {})",
               ubatch_id, builders_.size(), ubatch_id);
  return *builders_[static_cast<size_t>(ubatch_id)];
}

CommonAttentionMetadata AttentionGroupBuilders::with_kernel_block_table(const CommonAttentionMetadata& cm,
                                                                        int64_t ubatch_idx) {
  if (!group_.kernel_block_size) return cm;
  CommonAttentionMetadata out = cm;
  const Tensor& bt = cm.block_table_tensor;
  if (bt.device().is_cpu()) {
    out.block_table_tensor = group_.map_to_kernel_block_table(bt, ubatch_idx);
    return out;
  }
  // Device table: stage it on the host, map there, upload the mapped rows (persistent buffers).
  KVATTN_CHECK(host_manager_table_.defined() && bt.dim() == 2 && bt.size(1) <= manager_width_ &&
                   bt.size(0) <= config_.max_num_seqs && ubatch_idx >= 0 &&
                   ubatch_idx < static_cast<int64_t>(device_kernel_tables_.size()),
               "AttentionGroup: device block table {} does not fit the group's [{}, {}] tables (device {})", bt.str(),
               config_.max_num_seqs, manager_width_, config_.platform.device.str());
  const int64_t rows = bt.size(0), cols = bt.size(1), ratio = block_table_width_ / manager_width_;
  Tensor host = host_manager_table_.narrow(0, 0, rows * cols).view({rows, cols});
  host.copy_from(bt.contiguous());
  Tensor mapped = group_.map_to_kernel_block_table(host, ubatch_idx);
  Tensor dev = device_kernel_tables_[static_cast<size_t>(ubatch_idx)].narrow(0, 0, rows * cols * ratio).view({rows, cols * ratio});
  dev.copy_from(mapped.contiguous());
  out.block_table_tensor = dev;
  return out;
}

const AttentionMetadata& AttentionGroupBuilders::build_metadata(const CommonAttentionMetadata& cm, int64_t ubatch_idx,
                                                                int64_t common_prefix_len, bool fast_build) {
  AttentionMetadataBuilder& b = get_metadata_builder(ubatch_idx);
  return b.build(common_prefix_len, with_kernel_block_table(cm, ubatch_idx), fast_build);
}

const AttentionMetadata& AttentionGroupBuilders::build_metadata_for_cudagraph_capture(const CommonAttentionMetadata& cm,
                                                                                      int64_t ubatch_idx) {
  AttentionMetadataBuilder& b = get_metadata_builder(ubatch_idx);
  return b.build_for_cudagraph_capture(with_kernel_block_table(cm, ubatch_idx));
}

const AttentionMetadata& AttentionGroupBuilders::build_metadata_for_drafting(const CommonAttentionMetadata& cm,
                                                                             int64_t draft_index) {
  AttentionMetadataBuilder& b = get_metadata_builder(0);
  return b.build_for_drafting(with_kernel_block_table(cm, 0), draft_index);
}

bool AttentionGroupBuilders::supports_draft_decode_metadata_update() {
  return get_metadata_builder(0).supports_draft_decode_metadata_update();
}

void AttentionGroupBuilders::update_draft_decode_metadata(const AttentionMetadata& metadata) {
  get_metadata_builder(0).update_draft_decode_metadata(metadata);
}

}  // namespace kvattn
