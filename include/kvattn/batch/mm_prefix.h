// kvattn/batch/mm_prefix.h — multimodal PrefixLM ranges (vLLM compute_mm_prefix_ranges and kin).
//
// Image and video placeholder tokens attend to each other bidirectionally ("PrefixLM"): every
// token of one image sees every other token of that image.  The ranges are absolute prompt
// positions, inclusive at both ends, and never overlap within a request.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvattn/core/tensor.h"

namespace kvattn {

// Inclusive [first, second] absolute positions of one bidirectional span.
using MMPrefixRange = std::pair<int64_t, int64_t>;

// Per request row, its ranges (vLLM's dict[int, list[tuple[int, int]]] keyed by row index;
// rows past the end or with an empty list have no range).
struct MMPrefixRanges {
  std::vector<std::vector<MMPrefixRange>> per_req;

  const std::vector<MMPrefixRange>* get(int64_t req) const noexcept {
    return req >= 0 && req < static_cast<int64_t>(per_req.size()) ? &per_req[req] : nullptr;
  }
  friend bool operator==(const MMPrefixRanges&, const MMPrefixRanges&) = default;
};

// vLLM's PlaceholderRange: `length` placeholder tokens starting at prompt position `offset`;
// `is_embed` (length entries, optional) marks which of them carry embeddings.
struct PlaceholderRange {
  int64_t offset = 0;
  int64_t length = 0;
  std::optional<std::vector<uint8_t>> is_embed;

  // Inclusive runs of embedding positions: [(offset, offset + length - 1)] without is_embed,
  // else one range per maximal run of true entries (absolute positions).
  std::vector<MMPrefixRange> extract_embeds_range() const;
};

// vLLM's MultiModalFeatureSpec, reduced to what the range helpers read.
struct MultiModalFeature {
  std::string modality;  // "image", "video", "audio", ...
  PlaceholderRange mm_position;
};

// Seed 000 variant.  Per request row: the embed ranges of its image/video features, in order.
// A range longer than `sliding_window` tokens is skipped (so early tokens do not attend across
// the whole image) unless `clamp_sliding_window` (the kernel clamps instead).  With
// `span_pad > 0`, each feature contributes one range
// (round_down(offset, span_pad) + span_pad - 1, offset + length - 1).
MMPrefixRanges compute_mm_prefix_ranges(
    std::span<const std::vector<MultiModalFeature>> mm_features_per_req,
    std::optional<int64_t> sliding_window = std::nullopt, bool clamp_sliding_window = false,
    int64_t span_pad = 0);

// Seed 001 variant (vllm.v1.worker.gpu.attn_utils): features looked up by request id; ranges
// longer than the window are always skipped; no padding.
MMPrefixRanges compute_mm_prefix_ranges(
    std::span<const std::string> req_ids,
    const std::unordered_map<std::string, std::vector<MultiModalFeature>>& mm_features,
    std::optional<int64_t> sliding_window = std::nullopt);

// Padded [num_seqs, max_ranges, 2] int32 CPU tensor for the kernel; missing or empty rows and
// padding are (0, 0) (skipped by the kernel's start < end test).  nullopt when there is no
// range at all (or `ranges` is null), as vLLM returns None.
std::optional<Tensor> compute_mm_prefix_range_tensor(const MMPrefixRanges* ranges, int64_t num_seqs);

// Maps every scheduled query token to the bidirectional range containing it.  `out` is a
// caller-owned [max_num_batched_tokens, 2] int32 CPU staging tensor.  Returns the number of rows
// written: num_actual_tokens (= query_start_loc_cpu[-1]) when at least one scheduled token lies
// in a range — rows of tokens in no range are (-1, -1) — else 0 and `out` is untouched.
// Token i of request r has absolute position (seq_len[r] - query_len[r]) + (i - qsl[r]).
// Degenerate ranges (start >= end) are skipped.
int64_t fill_mm_prefix_query_ranges(const Tensor& out, const MMPrefixRanges* ranges,
                                    const Tensor& query_start_loc_cpu, const Tensor& seq_lens_cpu);

}  // namespace kvattn
