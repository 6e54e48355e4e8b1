// kvattn/batch/split.h — finding the decode / extend / prefill boundaries of a reordered batch,
// prefill chunking, uniform-batch tests and the speculative-decode reshapes
// (vllm.v1.attention.backends.utils, vllm.v1.worker.utils).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kvattn/batch/common_attention_metadata.h"

namespace kvattn {

struct DecodePrefillSplit {
  int64_t num_decodes = 0;
  int64_t num_prefills = 0;
  int64_t num_decode_tokens = 0;
  int64_t num_prefill_tokens = 0;
  friend bool operator==(const DecodePrefillSplit&, const DecodePrefillSplit&) = default;
};

// Assuming a batch ordered decode → short_extend → long_extend → prefill, returns where the
// decodes end.  A request is a decode when its query length is <= decode_threshold; with
// require_uniform, decodes must also share the first request's query length (zero-length
// CUDA-graph padding rows count as decodes); with treat_short_extends_as_decodes = false, rows
// whose is_prefilling flag is set are prefills (needs cm.is_prefilling).  Fast paths: every row a
// decode when max_query_len <= threshold (and not require_uniform with threshold > 1, and short
// extends count as decodes); every row a prefill when the first row's query exceeds the threshold.
// Reads query_start_loc_cpu (and is_prefilling) only.
DecodePrefillSplit split_decodes_and_prefills(const CommonAttentionMetadata& cm,
                                              int64_t decode_threshold = 1,
                                              bool require_uniform = false,
                                              bool treat_short_extends_as_decodes = true);

struct DecodeExtendPrefillSplit {
  int64_t num_decodes = 0;
  int64_t num_extends = 0;
  int64_t num_prefills = 0;
  int64_t num_decode_tokens = 0;
  int64_t num_extend_tokens = 0;
  int64_t num_prefill_tokens = 0;
  friend bool operator==(const DecodeExtendPrefillSplit&, const DecodeExtendPrefillSplit&) = default;
};

// Three-way split: decodes (query <= threshold), extends (longer query over existing context),
// prefills (seq_len == query_len: no context).  Uses seq_lens_cpu_upper_bound, which is exact
// for prefill rows (required unless every query is <= threshold).
DecodeExtendPrefillSplit split_decodes_prefills_and_extends(const CommonAttentionMetadata& cm,
                                                            int64_t decode_threshold = 1);

// Greedy chunks [start, end) of consecutive requests whose sequence lengths sum to at most
// workspace_size; indices are shifted by request_offset.  Every length must be <= workspace_size.
std::vector<std::pair<int64_t, int64_t>> split_prefill_chunks(std::span<const int32_t> seq_lens_cpu,
                                                              int64_t workspace_size,
                                                              int64_t request_offset = 0);
std::vector<std::pair<int64_t, int64_t>> split_prefill_chunks(const Tensor& seq_lens_cpu,
                                                              int64_t workspace_size,
                                                              int64_t request_offset = 0);

// num_reqs > 0 and every request has max_query_len tokens.
bool is_uniform_query_len(int64_t num_reqs, int64_t num_tokens, int64_t max_query_len) noexcept;
// max_query_len when decode_graph_eligible and the batch is uniform, else nullopt.
std::optional<int64_t> get_uniform_decode_token_count(int64_t num_reqs, int64_t num_tokens,
                                                      int64_t max_query_len,
                                                      bool decode_graph_eligible) noexcept;

// [total_tokens, num_heads, head_dim] -> [batch_size, total_tokens / batch_size, num_heads,
// head_dim] (a view).  total_tokens must be divisible by batch_size.
Tensor reshape_query_for_spec_decode(const Tensor& query, int64_t batch_size);
// [batch, seq, num_heads, head_dim] -> [batch * seq, num_heads, head_dim]; 3-D input unchanged.
Tensor reshape_attn_output_for_spec_decode(const Tensor& attn_output);

}  // namespace kvattn
