#include "kvattn/batch/split.h"

#include "kvattn/batch/tensor_access.h"

namespace kvattn {
namespace {

// Counts first: a negative num_reqs / num_actual_tokens is refused before any fast path.
void check_counts(const CommonAttentionMetadata& cm, const char* fn) {
  KVATTN_CHECK(cm.num_reqs >= 0 && cm.num_actual_tokens >= 0,
               "{}: num_reqs = {} and num_actual_tokens = {} must be >= 0 (counts of the batch's "
               "requests and scheduled tokens)", fn, cm.num_reqs, cm.num_actual_tokens);
}

std::span<const int32_t> checked_qsl(const CommonAttentionMetadata& cm, const char* fn) {
  const auto qsl = host_i32_span(cm.query_start_loc_cpu, "query_start_loc_cpu");
  KVATTN_CHECK(cm.num_reqs >= 0 && static_cast<int64_t>(qsl.size()) >= cm.num_reqs + 1,
               "{}: query_start_loc_cpu has {} entries but num_reqs = {} needs {}", fn, qsl.size(),
               cm.num_reqs, cm.num_reqs + 1);
  return qsl.first(static_cast<size_t>(cm.num_reqs + 1));
}

}  // namespace

DecodePrefillSplit split_decodes_and_prefills(const CommonAttentionMetadata& cm,
                                              int64_t decode_threshold, bool require_uniform,
                                              bool treat_short_extends_as_decodes) {
  check_counts(cm, "split_decodes_and_prefills");
  const int64_t num_reqs = cm.num_reqs;
  const int64_t num_tokens = cm.num_actual_tokens;
  if (cm.max_query_len <= decode_threshold && (!require_uniform || decode_threshold <= 1) &&
      treat_short_extends_as_decodes) {
    return {num_reqs, 0, num_tokens, 0};
  }
  const auto qsl = checked_qsl(cm, "split_decodes_and_prefills");
  KVATTN_CHECK(num_reqs > 0,
               "split_decodes_and_prefills: an empty batch (num_reqs = 0) with max_query_len = {} "
               "> decode_threshold = {}; max_query_len must be 0 for an empty batch",
               cm.max_query_len, decode_threshold);
  const auto qlen = [&](int64_t r) { return static_cast<int64_t>(qsl[r + 1]) - qsl[r]; };
  const int64_t q0 = qlen(0);
  if (q0 > decode_threshold) return {0, num_reqs, 0, num_tokens};

  const uint8_t* prefilling = nullptr;
  if (!treat_short_extends_as_decodes) {
    KVATTN_CHECK(cm.is_prefilling.defined(),
                 "split_decodes_and_prefills: treat_short_extends_as_decodes = false needs "
                 "is_prefilling ([num_reqs] uint8); fill it when building the metadata");
    KVATTN_CHECK(cm.is_prefilling.dtype() == DType::u8 && cm.is_prefilling.device().is_cpu() &&
                     cm.is_prefilling.dim() == 1 && cm.is_prefilling.size(0) >= num_reqs &&
                     (num_reqs <= 1 || cm.is_prefilling.stride(0) == 1),
                 "is_prefilling must be a contiguous [num_reqs = {}] uint8 CPU tensor, got {}",
                 num_reqs, cm.is_prefilling.str());
    prefilling = cm.is_prefilling.data_ptr<uint8_t>();
  }

  if (require_uniform && treat_short_extends_as_decodes) {
    // A padded uniform batch (full CUDA graphs): every query equals the first or is padding.
    bool all_uniform = true;
    for (int64_t r = 0; r < num_reqs && all_uniform; ++r) {
      const int64_t q = qlen(r);
      all_uniform = (q == q0 || q == 0);
    }
    if (all_uniform) return {num_reqs, 0, num_tokens, 0};
  }
  int64_t first_prefill = -1;
  for (int64_t r = 0; r < num_reqs; ++r) {
    const int64_t q = qlen(r);
    bool is_prefill = require_uniform ? (q != q0 && q != 0) : (q > decode_threshold);
    if (prefilling != nullptr) is_prefill = is_prefill || prefilling[r] != 0;
    if (is_prefill) {
      first_prefill = r;
      break;
    }
  }
  if (first_prefill < 0) return {num_reqs, 0, num_tokens, 0};
  const int64_t num_decode_tokens = qsl[first_prefill];
  return {first_prefill, num_reqs - first_prefill, num_decode_tokens, num_tokens - num_decode_tokens};
}

DecodeExtendPrefillSplit split_decodes_prefills_and_extends(const CommonAttentionMetadata& cm,
                                                            int64_t decode_threshold) {
  check_counts(cm, "split_decodes_prefills_and_extends");
  const int64_t num_reqs = cm.num_reqs;
  const int64_t num_tokens = cm.num_actual_tokens;
  if (cm.max_query_len <= decode_threshold) return {num_reqs, 0, 0, num_tokens, 0, 0};
  const auto qsl = checked_qsl(cm, "split_decodes_prefills_and_extends");
  KVATTN_CHECK(cm.seq_lens_cpu_upper_bound.defined(),
               "split_decodes_prefills_and_extends needs seq_lens_cpu_upper_bound ([num_reqs] "
               "int32, host); fill it when building the metadata");
  const auto seq = host_i32_span(cm.seq_lens_cpu_upper_bound, "seq_lens_cpu_upper_bound");
  KVATTN_CHECK(static_cast<int64_t>(seq.size()) >= num_reqs,
               "seq_lens_cpu_upper_bound has {} entries, num_reqs = {}", seq.size(), num_reqs);
  int64_t first_extend = -1, first_prefill = -1;
  for (int64_t r = 0; r < num_reqs; ++r) {
    const int64_t q = static_cast<int64_t>(qsl[r + 1]) - qsl[r];
    const bool prefill_or_extend = q > decode_threshold;
    if (prefill_or_extend && first_extend < 0) first_extend = r;
    if (prefill_or_extend && seq[r] == q) {
      first_prefill = r;
      break;
    }
  }
  // vLLM's argmax of an all-false mask is 0.
  const int64_t num_decodes = first_extend < 0 ? 0 : first_extend;
  const int64_t num_decode_tokens = qsl[num_decodes];
  if (first_extend < 0) return {num_decodes, 0, 0, num_decode_tokens, 0, 0};
  const int64_t rest_reqs = num_reqs - num_decodes;
  const int64_t rest_tokens = num_tokens - num_decode_tokens;
  if (first_prefill < 0) return {num_decodes, rest_reqs, 0, num_decode_tokens, rest_tokens, 0};
  const int64_t num_prefill_tokens = num_tokens - qsl[first_prefill];
  return {num_decodes,       first_prefill - num_decodes,      num_reqs - first_prefill,
          num_decode_tokens, rest_tokens - num_prefill_tokens, num_prefill_tokens};
}

std::vector<std::pair<int64_t, int64_t>> split_prefill_chunks(std::span<const int32_t> seq_lens,
                                                              int64_t workspace_size,
                                                              int64_t request_offset) {
  const int64_t n = static_cast<int64_t>(seq_lens.size());
  for (int64_t i = 0; i < n; ++i) {
    KVATTN_CHECK(seq_lens[i] >= 0 && seq_lens[i] <= workspace_size,
                 "split_prefill_chunks: request row {} has sequence length {}, outside [0, {}] "
                 "(workspace_size); enlarge the workspace or chunk the prefill",
                 i + request_offset, seq_lens[i], workspace_size);
  }
  std::vector<std::pair<int64_t, int64_t>> bounds;
  int64_t i = 0;
  while (i < n) {
    const int64_t start = i;
    int64_t total = 0;
    while (i < n && total + seq_lens[i] <= workspace_size) total += seq_lens[i++];
    bounds.emplace_back(start + request_offset, i + request_offset);
  }
  return bounds;
}

std::vector<std::pair<int64_t, int64_t>> split_prefill_chunks(const Tensor& seq_lens_cpu,
                                                              int64_t workspace_size,
                                                              int64_t request_offset) {
  return split_prefill_chunks(host_i32_span(seq_lens_cpu, "seq_lens_cpu"), workspace_size,
                              request_offset);
}

bool is_uniform_query_len(int64_t num_reqs, int64_t num_tokens, int64_t max_query_len) noexcept {
  return num_reqs > 0 && num_tokens == max_query_len * num_reqs;
}

std::optional<int64_t> get_uniform_decode_token_count(int64_t num_reqs, int64_t num_tokens,
                                                      int64_t max_query_len,
                                                      bool decode_graph_eligible) noexcept {
  if (decode_graph_eligible && is_uniform_query_len(num_reqs, num_tokens, max_query_len)) {
    return max_query_len;
  }
  return std::nullopt;
}

Tensor reshape_query_for_spec_decode(const Tensor& query, int64_t batch_size) {
  KVATTN_CHECK(query.defined() && query.dim() == 3,
               "query must be 3-D [total_tokens, num_heads, head_dim], got {}",
               query.defined() ? query.shape().str() : std::string("undefined"));
  KVATTN_CHECK(batch_size > 0, "batch_size = {} must be > 0", batch_size);
  const int64_t total = query.size(0);
  KVATTN_CHECK(total % batch_size == 0,
               "total_tokens = {} is not divisible by batch_size = {}; a uniform spec-decode "
               "batch has the same query length in every request", total, batch_size);
  return query.view({batch_size, total / batch_size, query.size(1), query.size(2)});
}

Tensor reshape_attn_output_for_spec_decode(const Tensor& attn_output) {
  KVATTN_CHECK(attn_output.defined(), "attn_output is undefined");
  if (attn_output.dim() == 3) return attn_output;
  KVATTN_CHECK(attn_output.dim() == 4, "attn_output must be 4-D, got {}-D (shape {})",
               attn_output.dim(), attn_output.shape().str());
  return attn_output.view(
      {attn_output.size(0) * attn_output.size(1), attn_output.size(2), attn_output.size(3)});
}

}  // namespace kvattn
