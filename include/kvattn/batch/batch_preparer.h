// kvattn/batch/batch_preparer.h — turns the InputBatch (after the scheduler's decisions) into
// this step's CommonAttentionMetadata, without allocating.
//
// Every buffer is sized at construction from max_num_reqs, max_num_batched_tokens and
// max_model_len (vLLM's CpuGpuBuffer role) and rewritten in place each step; the returned
// metadata holds views into them and into the InputBatch's block table, valid until the next
// prepare() or until the batch changes.
#pragma once

#include <cstdint>

#include "kvattn/batch/common_attention_metadata.h"
#include "kvattn/batch/cpu_gpu_buffer.h"
#include "kvattn/batch/input_batch.h"
#include "kvattn/batch/slot_mapping.h"

namespace kvattn {

struct BatchPreparerConfig {
  int64_t max_num_reqs = 256;
  int64_t max_num_batched_tokens = 8192;
  int64_t max_model_len = 8192;
  int64_t block_size = 16;          // kernel block size (tokens per block-table entry)
  int64_t blocks_per_kv_block = 1;  // manager block size / kernel block size
  int64_t dcp_world_size = 1;
  int64_t dcp_rank = 0;
  int64_t cp_kv_cache_interleave_size = 1;
  int64_t num_blocks = 0;  // pool size for block-id checks (<= 0: unchecked)
  bool causal = true;
  Device device = Device::cpu();

  // Block-table width a request of max_model_len tokens needs on one rank (kernel blocks).
  int64_t max_num_blocks_per_req() const;
  void validate() const;
};

class BatchPreparer {
 public:
  explicit BatchPreparer(const BatchPreparerConfig& config);

  const BatchPreparerConfig& config() const noexcept { return cfg_; }

  // Builds this step's metadata from the batch's rows 0..num_reqs-1:
  //   query lengths = num_scheduled_tokens, seq_lens = num_computed + num_scheduled,
  //   positions = the consecutive positions [num_computed, seq_len) of each request,
  //   is_prefilling = num_computed < num_prompt_tokens, slot mapping per §7.1 (padded with
  //   PAD_SLOT_ID up to num_tokens_padded), DCP local lengths when dcp_world_size > 1.
  // num_reqs_padded (>= num_reqs, default num_reqs) appends zero-length requests for CUDA graphs.
  // Throws InvalidArgument naming the row for: a negative count, seq_len > max_model_len, more
  // than max_num_batched_tokens tokens, a block-table row with fewer blocks than its sequence
  // needs, a block id outside [0, num_blocks).
  const CommonAttentionMetadata& prepare(const InputBatch& batch, int64_t num_reqs_padded = -1,
                                         int64_t num_tokens_padded = -1);

  const CommonAttentionMetadata& metadata() const noexcept { return cm_; }

 private:
  BatchPreparerConfig cfg_;
  SlotMappingParams slot_params_;
  CpuGpuBuffer query_start_loc_;  // [max_num_reqs + 1] int32
  CpuGpuBuffer seq_lens_;         // [max_num_reqs] int32
  CpuGpuBuffer positions_;        // [max_num_batched_tokens] int64
  CpuGpuBuffer slot_mapping_;     // [max_num_batched_tokens] int64, PAD_SLOT_ID past the tokens
  CpuGpuBuffer dcp_local_seq_lens_;  // [max_num_reqs] int32
  CpuGpuBuffer block_table_;      // [max_num_reqs, max_blocks] int32 (device copy; unused on CPU)
  Tensor is_prefilling_;          // [max_num_reqs] uint8
  int64_t slot_high_water_ = 0;   // slot_mapping entries [0, high) may hold non-pad values
  CommonAttentionMetadata cm_;
};

}  // namespace kvattn
