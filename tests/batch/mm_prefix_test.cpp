// Multimodal PrefixLM ranges: both compute_mm_prefix_ranges variants, the padded tensor form and
// the per-query-token fill (vllm-facts §6; tests/v1/attention/dense/test_mm_prefix.py behaviour).
#include <gtest/gtest.h>

#include <random>

#include "kvattn/batch/mm_prefix.h"

namespace kvattn {
namespace {

MultiModalFeature feat(const char* modality, int64_t offset, int64_t length,
                       std::optional<std::vector<uint8_t>> is_embed = std::nullopt) {
  return {modality, {offset, length, std::move(is_embed)}};
}

using R = MMPrefixRange;

TEST(MMPrefix, ExtractEmbedsRange) {
  EXPECT_EQ(PlaceholderRange({5, 4, std::nullopt}).extract_embeds_range(), (std::vector<R>{{5, 8}}));
  EXPECT_EQ(PlaceholderRange({10, 7, std::vector<uint8_t>{0, 1, 1, 0, 1, 1, 1}}).extract_embeds_range(),
            (std::vector<R>{{11, 12}, {14, 16}}));
  EXPECT_EQ(PlaceholderRange({0, 3, std::vector<uint8_t>{0, 0, 0}}).extract_embeds_range(),
            (std::vector<R>{}));
  EXPECT_THROW(PlaceholderRange({0, 3, std::vector<uint8_t>{1}}).extract_embeds_range(), InvalidArgument);
}

TEST(MMPrefix, ComputeRangesSeed000Variant) {
  const std::vector<std::vector<MultiModalFeature>> reqs = {
      {feat("image", 2, 4), feat("audio", 10, 5), feat("video", 20, 10)},
      {},
      {feat("image", 3, 6, std::vector<uint8_t>{1, 1, 0, 0, 1, 1})},
  };
  auto out = compute_mm_prefix_ranges(reqs);
  ASSERT_EQ(out.per_req.size(), 3u);
  EXPECT_EQ(out.per_req[0], (std::vector<R>{{2, 5}, {20, 29}}));  // audio skipped
  EXPECT_TRUE(out.per_req[1].empty());
  EXPECT_EQ(out.per_req[2], (std::vector<R>{{3, 4}, {7, 8}}));
  // Sliding window 8: the 10-token video is skipped unless clamped.
  EXPECT_EQ(compute_mm_prefix_ranges(reqs, 8).per_req[0], (std::vector<R>{{2, 5}}));
  EXPECT_EQ(compute_mm_prefix_ranges(reqs, 8, true).per_req[0], (std::vector<R>{{2, 5}, {20, 29}}));
  // span_pad 4: start = round_down(offset, 4) + 3, end = offset + length - 1 (one per feature).
  auto padded = compute_mm_prefix_ranges(reqs, std::nullopt, false, 4);
  EXPECT_EQ(padded.per_req[0], (std::vector<R>{{3, 5}, {23, 29}}));
  EXPECT_EQ(padded.per_req[2], (std::vector<R>{{3, 8}}));
}

TEST(MMPrefix, ComputeRangesSeed001Variant) {
  const std::vector<std::string> ids = {"a", "b", "c"};
  std::unordered_map<std::string, std::vector<MultiModalFeature>> features;
  features["a"] = {feat("image", 0, 3), feat("image", 10, 40)};
  features["c"] = {feat("video", 5, 2), feat("text", 0, 2)};
  auto out = compute_mm_prefix_ranges(ids, features, 16);
  EXPECT_EQ(out.per_req[0], (std::vector<R>{{0, 2}}));  // the 40-token image exceeds the window
  EXPECT_TRUE(out.per_req[1].empty());
  EXPECT_EQ(out.per_req[2], (std::vector<R>{{5, 6}}));
}

TEST(MMPrefix, RangeTensorPadsWithZeros) {
  EXPECT_EQ(compute_mm_prefix_range_tensor(nullptr, 3), std::nullopt);
  MMPrefixRanges empty{{{}, {{0, 0}}, {}}};
  EXPECT_EQ(compute_mm_prefix_range_tensor(&empty, 3), std::nullopt);
  MMPrefixRanges r{{{{1, 4}, {8, 9}}, {}, {{2, 3}}}};
  auto t = compute_mm_prefix_range_tensor(&r, 4);  // row 3 missing -> padding
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->shape(), (Dims{4, 2, 2}));
  EXPECT_EQ(t->to_vector<int32_t>(),
            (std::vector<int32_t>{1, 4, 8, 9, 0, 0, 0, 0, 2, 3, 0, 0, 0, 0, 0, 0}));
}

TEST(MMPrefix, FillQueryRangesHandComputed) {
  // Request 0: context 4, query 6 -> positions 4..9; range [6, 12] covers tokens 2..5.
  // Request 1: context 0, query 3 -> positions 0..2; [1, 1] is degenerate (skipped), [0, 2]
  // covers all three.
  Tensor qsl = Tensor::from_vector(std::vector<int32_t>{0, 6, 9});
  Tensor seq = Tensor::from_vector(std::vector<int32_t>{10, 3});
  MMPrefixRanges r{{{{6, 12}}, {{1, 1}, {0, 2}}}};
  Tensor out = Tensor::zeros({16, 2}, DType::i32);
  out.fill_(7);
  EXPECT_EQ(fill_mm_prefix_query_ranges(out, &r, qsl, seq), 9);
  const auto v = out.to_vector<int32_t>();
  const std::vector<int32_t> expect = {-1, -1, -1, -1, 6, 12, 6, 12, 6, 12, 6, 12,
                                       0,  2,  0,  2,  0, 2};
  EXPECT_EQ(std::vector<int32_t>(v.begin(), v.begin() + 18), expect);
  EXPECT_EQ(v[18], 7);  // rows past num_actual_tokens untouched
  // Nothing covered: 0 and `out` untouched.
  MMPrefixRanges far{{{{100, 200}}, {}}};
  out.fill_(7);
  EXPECT_EQ(fill_mm_prefix_query_ranges(out, &far, qsl, seq), 0);
  EXPECT_EQ(out.get({0, 0}), 7);
  EXPECT_EQ(fill_mm_prefix_query_ranges(out, nullptr, qsl, seq), 0);
  // Errors: staging buffer too small; a range for a request the batch does not have.
  Tensor tiny = Tensor::zeros({4, 2}, DType::i32);
  EXPECT_THROW(fill_mm_prefix_query_ranges(tiny, &r, qsl, seq), InvalidArgument);
  MMPrefixRanges extra{{{}, {}, {{0, 5}}}};
  EXPECT_THROW(fill_mm_prefix_query_ranges(out, &extra, qsl, seq), InvalidArgument);
}

TEST(MMPrefix, FillQueryRangesRandomAgainstOracle) {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 2000; ++iter) {
    const int n = 1 + static_cast<int>(rng() % 6);
    std::vector<int32_t> qsl{0}, seq;
    MMPrefixRanges r;
    r.per_req.resize(n);
    for (int i = 0; i < n; ++i) {
      const int32_t q = static_cast<int32_t>(rng() % 20);
      const int32_t s = q + static_cast<int32_t>(rng() % 30);
      qsl.push_back(qsl.back() + q);
      seq.push_back(s);
      // Non-overlapping ranges over [0, s + 10).
      int64_t at = rng() % 5;
      while (at < s + 10 && rng() % 3 != 0) {
        const int64_t len = rng() % 6;
        r.per_req[i].push_back({at, at + len});
        at += len + 1 + rng() % 4;
      }
    }
    Tensor out = Tensor::zeros({128, 2}, DType::i32);
    out.fill_(5);
    const int64_t rows = fill_mm_prefix_query_ranges(out, &r, Tensor::from_vector(qsl),
                                                     Tensor::from_vector(seq));
    bool any = false;
    std::vector<std::pair<int32_t, int32_t>> expect(qsl.back(), {-1, -1});
    for (int i = 0; i < n; ++i)
      for (int32_t t = qsl[i]; t < qsl[i + 1]; ++t) {
        const int64_t pos = (seq[i] - (qsl[i + 1] - qsl[i])) + (t - qsl[i]);
        for (const auto& [a, b] : r.per_req[i])
          if (a < b && a <= pos && pos <= b) {
            expect[t] = {static_cast<int32_t>(a), static_cast<int32_t>(b)};
            any = true;
          }
      }
    if (!any) {
      ASSERT_EQ(rows, 0);
      ASSERT_EQ(out.get({0, 0}), 5);
      continue;
    }
    ASSERT_EQ(rows, qsl.back());
    for (int32_t t = 0; t < qsl.back(); ++t) {
      ASSERT_EQ(out.get({t, 0}), expect[t].first) << "iter " << iter << " token " << t;
      ASSERT_EQ(out.get({t, 1}), expect[t].second);
    }
  }
}

}  // namespace
}  // namespace kvattn
