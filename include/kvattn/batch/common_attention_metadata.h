// kvattn/batch/common_attention_metadata.h — the per-step batch description every attention
// backend reads (vLLM's CommonAttentionMetadata, vllm-facts §4.3).
//
// A plain aggregate of tensor *views*: it owns nothing.  The views usually point into the
// persistent buffers of a BatchPreparer (kvattn/batch/batch_preparer.h) and stay valid until its
// next prepare().  Fields with a `_cpu` twin exist twice, host and device; when the device is
// the CPU both views alias the same memory.  Requests are rows 0..num_reqs-1 in batch order
// (decode → short extend → long extend → prefill after the reorder).
#pragma once

#include <cstdint>

#include "kvattn/batch/mm_prefix.h"
#include "kvattn/core/tensor.h"

namespace kvattn {

// Slot id written for tokens whose K/V is not stored (CUDA-graph padding, other DCP ranks).
inline constexpr int64_t PAD_SLOT_ID = -1;
// Block 0 is the permanently reserved null block.
inline constexpr int32_t NULL_BLOCK_ID = 0;

struct CommonAttentionMetadata {
  Tensor query_start_loc;      // [num_reqs + 1] int32, device: cumulative query lengths, [0] = 0
  Tensor query_start_loc_cpu;  // [num_reqs + 1] int32, host copy
  Tensor seq_lens;             // [num_reqs] int32, device: context + this step's query tokens
  int64_t num_reqs = 0;           // may include CUDA-graph padding requests (query length 0)
  int64_t num_actual_tokens = 0;  // total scheduled tokens (may include padding)
  int64_t max_query_len = 0;
  int64_t max_seq_len = 0;        // may be an upper bound
  Tensor block_table_tensor;   // [num_reqs, max_blocks] int32: physical (kernel-)block ids
  Tensor slot_mapping;         // [num_actual_tokens] int64: slot per token, PAD_SLOT_ID = skip
  bool causal = true;          // scalar form only (vLLM also allows a per-request tensor)

  // Optional fields (undefined Tensor / null pointer when absent).
  Tensor seq_lens_cpu_upper_bound;  // [num_reqs] int32, host: exact for prefill rows
  Tensor is_prefilling;             // [num_reqs] uint8 (bool): num_computed < num_prompt_tokens
  Tensor dcp_local_seq_lens;        // [num_reqs] int32, device: this DCP rank's share of seq_lens
  Tensor dcp_local_seq_lens_cpu;    // [num_reqs] int32, host copy
  Tensor positions;                 // [num_actual_tokens] int64: absolute position of each token
  Tensor encoder_seq_lens;          // [num_reqs] int32, device (cross-attention)
  Tensor encoder_seq_lens_cpu;      // [num_reqs] int32, host copy
  const MMPrefixRanges* mm_req_doc_ranges = nullptr;  // PrefixLM ranges per row (not owned)

  int64_t batch_size() const { return seq_lens.defined() ? seq_lens.size(0) : 0; }

  // query_start_loc_cpu[1:] - query_start_loc_cpu[:-1] as a fresh [num_reqs] int32 host tensor.
  Tensor naive_query_lens() const;
  // Same, written into `out` (at least num_reqs entries; no allocation).  Returns num_reqs.
  int64_t naive_query_lens(std::span<int32_t> out) const;

  // The first `num_actual_reqs` requests and `num_actual_tokens` tokens: every per-request
  // field is sliced to [:num_actual_reqs] (query_start_loc to num_actual_reqs + 1), every
  // per-token field to [:num_actual_tokens].  Scalars keep their values except num_reqs and
  // num_actual_tokens.  Views only; throws when a count exceeds the current one.
  CommonAttentionMetadata unpadded(int64_t num_actual_tokens, int64_t num_actual_reqs) const;

  // Checks shapes, dtypes and value invariants, naming the first bad row: query_start_loc_cpu
  // starts at 0, never decreases and ends at or before num_actual_tokens; 0 <= query_len <= seq_len <=
  // max_seq_len and query_len <= max_query_len for every row; block_table has at
  // least num_reqs rows; slot_mapping/positions have at least num_actual_tokens entries.
  // Reads only host tensors (query_start_loc_cpu, and seq_lens_cpu_upper_bound or seq_lens when
  // it is on the CPU).
  void validate() const;
};

}  // namespace kvattn
