#include "kvattn/batch/mm_prefix.h"

#include <algorithm>

#include "kvattn/batch/tensor_access.h"

namespace kvattn {
namespace {

bool is_visual(const std::string& modality) { return modality == "image" || modality == "video"; }

int64_t round_down(int64_t x, int64_t m) {
  // Python floor semantics for negative offsets too.
  int64_t q = x / m;
  if ((x % m != 0) && ((x < 0) != (m < 0))) --q;
  return q * m;
}

}  // namespace

std::vector<MMPrefixRange> PlaceholderRange::extract_embeds_range() const {
  KVATTN_CHECK(length >= 0, "PlaceholderRange: length = {} is negative", length);
  if (!is_embed.has_value()) return {{offset, offset + length - 1}};
  const auto& m = *is_embed;
  KVATTN_CHECK(static_cast<int64_t>(m.size()) == length,
               "PlaceholderRange: is_embed has {} entries but length = {}; they must match",
               m.size(), length);
  std::vector<MMPrefixRange> out;
  int64_t i = 0;
  const int64_t n = length;
  while (i < n) {
    if (!m[i]) {
      ++i;
      continue;
    }
    int64_t j = i;
    while (j + 1 < n && m[j + 1]) ++j;
    out.emplace_back(offset + i, offset + j);
    i = j + 1;
  }
  return out;
}

MMPrefixRanges compute_mm_prefix_ranges(
    std::span<const std::vector<MultiModalFeature>> mm_features_per_req,
    std::optional<int64_t> sliding_window, bool clamp_sliding_window, int64_t span_pad) {
  KVATTN_CHECK(span_pad >= 0, "compute_mm_prefix_ranges: span_pad = {} must be >= 0", span_pad);
  MMPrefixRanges out;
  out.per_req.resize(mm_features_per_req.size());
  for (size_t r = 0; r < mm_features_per_req.size(); ++r) {
    auto& ranges = out.per_req[r];
    for (const auto& f : mm_features_per_req[r]) {
      if (!is_visual(f.modality)) continue;
      std::vector<MMPrefixRange> feature_ranges;
      if (span_pad != 0) {
        const int64_t start = round_down(f.mm_position.offset, span_pad) + span_pad - 1;
        feature_ranges.emplace_back(start, f.mm_position.offset + f.mm_position.length - 1);
      } else {
        feature_ranges = f.mm_position.extract_embeds_range();
      }
      for (const auto& rg : feature_ranges) {
        if (!clamp_sliding_window && sliding_window.has_value() &&
            rg.second - rg.first + 1 > *sliding_window) {
          continue;
        }
        ranges.push_back(rg);
      }
    }
  }
  return out;
}

MMPrefixRanges compute_mm_prefix_ranges(
    std::span<const std::string> req_ids,
    const std::unordered_map<std::string, std::vector<MultiModalFeature>>& mm_features,
    std::optional<int64_t> sliding_window) {
  MMPrefixRanges out;
  out.per_req.resize(req_ids.size());
  for (size_t r = 0; r < req_ids.size(); ++r) {
    auto it = mm_features.find(req_ids[r]);
    if (it == mm_features.end()) continue;
    for (const auto& f : it->second) {
      if (!is_visual(f.modality)) continue;
      for (const auto& rg : f.mm_position.extract_embeds_range()) {
        if (sliding_window.has_value() && rg.second - rg.first + 1 > *sliding_window) continue;
        out.per_req[r].push_back(rg);
      }
    }
  }
  return out;
}

std::optional<Tensor> compute_mm_prefix_range_tensor(const MMPrefixRanges* ranges, int64_t num_seqs) {
  if (ranges == nullptr) return std::nullopt;
  KVATTN_CHECK(num_seqs >= 0, "compute_mm_prefix_range_tensor: num_seqs = {} is negative", num_seqs);
  // A missing or empty row counts as the single padding range (0, 0).
  int64_t max_ranges = 1;
  bool any = false;
  for (int64_t r = 0; r < num_seqs; ++r) {
    const auto* row = ranges->get(r);
    if (row == nullptr || row->empty()) continue;
    max_ranges = std::max<int64_t>(max_ranges, static_cast<int64_t>(row->size()));
    // vLLM returns None only when every row is exactly [(0, 0)].
    any = any || row->size() != 1 || (*row)[0] != MMPrefixRange{0, 0};
  }
  if (!any) return std::nullopt;
  Tensor t = Tensor::zeros({num_seqs, max_ranges, 2}, DType::i32);
  int32_t* p = t.data_ptr<int32_t>();
  for (int64_t r = 0; r < num_seqs; ++r) {
    const auto* row = ranges->get(r);
    if (row == nullptr) continue;
    for (size_t k = 0; k < row->size(); ++k) {
      p[(r * max_ranges + static_cast<int64_t>(k)) * 2 + 0] = static_cast<int32_t>((*row)[k].first);
      p[(r * max_ranges + static_cast<int64_t>(k)) * 2 + 1] = static_cast<int32_t>((*row)[k].second);
    }
  }
  return t;
}

int64_t fill_mm_prefix_query_ranges(const Tensor& out, const MMPrefixRanges* ranges,
                                    const Tensor& query_start_loc_cpu, const Tensor& seq_lens_cpu) {
  if (ranges == nullptr) return 0;
  const auto qsl = host_i32_span(query_start_loc_cpu, "query_start_loc_cpu");
  const auto seq = host_i32_span(seq_lens_cpu, "seq_lens_cpu");
  KVATTN_CHECK(!qsl.empty(), "query_start_loc_cpu is empty; it has num_reqs + 1 >= 1 entries");
  const int64_t num_reqs = static_cast<int64_t>(qsl.size()) - 1;
  const int64_t num_actual_tokens = qsl[num_reqs];
  if (num_actual_tokens <= 0) return 0;
  KVATTN_CHECK(out.defined() && out.dim() == 2 && out.size(1) == 2 && out.dtype() == DType::i32 &&
                   out.device().is_cpu() && out.is_contiguous(),
               "fill_mm_prefix_query_ranges: out must be a contiguous [max_num_batched_tokens, 2] "
               "int32 CPU tensor, got {}", out.defined() ? out.str() : std::string("undefined"));
  KVATTN_CHECK(num_actual_tokens <= out.size(0),
               "mm_prefix staging buffer holds {} tokens, got {}; size it from "
               "max_num_batched_tokens", out.size(0), num_actual_tokens);
  int32_t* o = out.data_ptr<int32_t>();
  bool any = false;
  // Two passes (resolve, then write) so that `out` stays untouched when nothing matches; the
  // first pass only decides whether anything matches, the second writes.
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      if (!any) return 0;
      std::fill(o, o + num_actual_tokens * 2, -1);
    }
    for (size_t req = 0; req < ranges->per_req.size(); ++req) {
      const auto& rr = ranges->per_req[req];
      if (rr.empty()) continue;
      KVATTN_CHECK(static_cast<int64_t>(req) < num_reqs,
                   "mm_prefix ranges name request row {} but the batch has {} requests", req,
                   num_reqs);
      KVATTN_CHECK(static_cast<int64_t>(req) < static_cast<int64_t>(seq.size()),
                   "seq_lens_cpu has {} entries, request row {} needs one", seq.size(), req);
      const int64_t token_start = qsl[req];
      const int64_t query_len = static_cast<int64_t>(qsl[req + 1]) - token_start;
      if (query_len <= 0) continue;
      KVATTN_CHECK(token_start >= 0 && token_start + query_len <= num_actual_tokens,
                   "request row {}: query tokens [{}, {}) fall outside [0, {}); "
                   "query_start_loc_cpu must be non-decreasing from 0", req, token_start,
                   token_start + query_len, num_actual_tokens);
      const int64_t context_len = static_cast<int64_t>(seq[req]) - query_len;
      for (const auto& [start, end] : rr) {
        if (start >= end) continue;
        const int64_t first = std::max<int64_t>(start - context_len, 0);
        const int64_t last = std::min<int64_t>(end - context_len, query_len - 1);
        if (first > last) continue;
        if (pass == 0) {
          any = true;
          break;
        }
        for (int64_t t = token_start + first; t <= token_start + last; ++t) {
          o[t * 2] = static_cast<int32_t>(start);
          o[t * 2 + 1] = static_cast<int32_t>(end);
        }
      }
    }
  }
  return num_actual_tokens;
}

}  // namespace kvattn
