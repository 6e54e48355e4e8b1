// split_decodes_and_prefills / split_decodes_prefills_and_extends / split_prefill_chunks and the
// uniform-batch helpers: upstream vectors (vllm-facts §6, §8) plus randomized oracles.
#include <gtest/gtest.h>

#include <random>

#include "batch_test_util.h"
#include "kvattn/batch/split.h"

namespace kvattn {
namespace {

using testing::make_metadata;

std::vector<int32_t> seq_10x(size_t n) {
  std::vector<int32_t> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<int32_t>(10 * (i + 1));
  return s;
}

struct SplitCase {
  std::vector<int32_t> q;
  int64_t threshold;
  bool require_uniform;
  int64_t padded_tokens;
  DecodePrefillSplit expected;
};

// tests/v1/attention/test_attention_splitting.py @037a0752 (seq_lens 10 * (i + 1)).
TEST(SplitDecodesAndPrefills, UpstreamVectors) {
  const std::vector<SplitCase> cases = {
      {{1, 1, 1}, 1, false, -1, {3, 0, 3, 0}},
      {{1, 2, 1, 3, 2, 1, 2}, 3, false, -1, {7, 0, 12, 0}},
      {{4, 5, 6, 7}, 3, false, -1, {0, 4, 0, 22}},
      {{2, 1, 3, 4, 5, 6, 7, 8}, 4, false, -1, {4, 4, 10, 26}},
      {{2, 2, 1, 3, 2, 1, 2}, 3, true, -1, {2, 5, 4, 9}},
      {{2, 2, 2, 4, 5, 6, 7, 8}, 4, true, -1, {3, 5, 6, 30}},
      {{2, 1, 2, 4, 5, 6, 7, 8}, 4, true, -1, {1, 7, 2, 33}},
      {{2, 2, 2, 0}, 3, true, 8, {4, 0, 8, 0}},  // CUDA-graph padded uniform batch
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    auto f = make_metadata(c.q, seq_10x(c.q.size()), c.padded_tokens);
    EXPECT_EQ(split_decodes_and_prefills(f.cm, c.threshold, c.require_uniform), c.expected)
        << "case " << i;
  }
}

// tests/v1/attention/test_batch_reordering.py: MTP synthetic CUDA-graph decodes.
TEST(SplitDecodesAndPrefills, UpstreamMtpSyntheticDecodes) {
  auto f = make_metadata({4, 4, 4}, {4, 4, 4});
  EXPECT_EQ(split_decodes_and_prefills(f.cm, 4), (DecodePrefillSplit{3, 0, 12, 0}));
}

TEST(SplitDecodesAndPrefills, ShortExtendsAsPrefillsUseIsPrefilling) {
  // decode, decode, short extend (still prefilling), long extend.
  auto f = make_metadata({1, 1, 1, 5}, {10, 20, 30, 40}, -1, {0, 0, 1, 1});
  EXPECT_EQ(split_decodes_and_prefills(f.cm, 1, false, true), (DecodePrefillSplit{3, 1, 3, 5}));
  EXPECT_EQ(split_decodes_and_prefills(f.cm, 1, false, false), (DecodePrefillSplit{2, 2, 2, 6}));
  // The all-decode fast path is skipped when short extends are prefills.
  auto g = make_metadata({1, 1}, {10, 20}, -1, {0, 1});
  EXPECT_EQ(split_decodes_and_prefills(g.cm, 1, false, false), (DecodePrefillSplit{1, 1, 1, 1}));
  auto h = make_metadata({1, 1}, {10, 20});
  EXPECT_THROW(split_decodes_and_prefills(h.cm, 1, false, false), InvalidArgument);
}

TEST(SplitDecodesAndPrefills, EmptyBatchAndInconsistentMetadata) {
  auto f = make_metadata({}, {});
  EXPECT_EQ(split_decodes_and_prefills(f.cm), (DecodePrefillSplit{0, 0, 0, 0}));
  f.cm.max_query_len = 5;  // claims a long query in an empty batch
  EXPECT_THROW(split_decodes_and_prefills(f.cm), InvalidArgument);
  auto g = make_metadata({3, 4}, {3, 4});
  g.cm.num_reqs = 5;  // more requests than query_start_loc describes
  EXPECT_THROW(split_decodes_and_prefills(g.cm), InvalidArgument);
}

// Oracle: the first row whose query length marks it a prefill (per the flags) ends the decodes.
DecodePrefillSplit oracle_split(const std::vector<int32_t>& q, const std::vector<uint8_t>& pre,
                                int64_t thr, bool uniform, bool treat_short) {
  const int64_t n = static_cast<int64_t>(q.size());
  int64_t total = 0;
  for (int32_t x : q) total += x;
  int64_t max_q = 0;
  for (int32_t x : q) max_q = std::max<int64_t>(max_q, x);
  if (max_q <= thr && (!uniform || thr <= 1) && treat_short) return {n, 0, total, 0};
  if (q[0] > thr) return {0, n, 0, total};
  if (uniform && treat_short) {
    bool all = true;
    for (int32_t x : q) all = all && (x == q[0] || x == 0);
    if (all) return {n, 0, total, 0};
  }
  int64_t tokens = 0;
  for (int64_t r = 0; r < n; ++r) {
    bool p = uniform ? (q[r] != q[0] && q[r] != 0) : q[r] > thr;
    if (!treat_short) p = p || pre[r];
    if (p) return {r, n - r, tokens, total - tokens};
    tokens += q[r];
  }
  return {n, 0, total, 0};
}

TEST(SplitDecodesAndPrefills, RandomBatchesMatchOracleAndSumToBatch) {
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 5000; ++iter) {
    const int n = 1 + static_cast<int>(rng() % 40);
    const int64_t thr = 1 + rng() % 4;
    std::vector<int32_t> q(n), seq(n);
    std::vector<uint8_t> pre(n);
    for (int r = 0; r < n; ++r) {
      // Mostly decode-sized rows at the front, longer rows later (a reordered batch).
      q[r] = static_cast<int32_t>(r < n / 2 ? rng() % (thr + 1) : rng() % 64);
      seq[r] = q[r] + static_cast<int32_t>(rng() % 100);
      pre[r] = static_cast<uint8_t>(rng() % 4 == 0);
    }
    auto f = make_metadata(q, seq, -1, pre);
    for (int flags = 0; flags < 4; ++flags) {
      const bool uniform = flags & 1, treat_short = flags & 2;
      const auto s = split_decodes_and_prefills(f.cm, thr, uniform, treat_short);
      ASSERT_EQ(s, oracle_split(q, pre, thr, uniform, treat_short)) << "iter " << iter;
      ASSERT_EQ(s.num_decodes + s.num_prefills, n);
      ASSERT_EQ(s.num_decode_tokens + s.num_prefill_tokens, f.cm.num_actual_tokens);
    }
  }
}

TEST(SplitDecodesPrefillsAndExtends, UpstreamVector) {
  auto f = make_metadata({1, 2, 4, 5, 6}, {10, 11, 20, 5, 6});
  EXPECT_EQ(split_decodes_prefills_and_extends(f.cm, 3),
            (DecodeExtendPrefillSplit{2, 1, 2, 3, 4, 11}));
}

TEST(SplitDecodesPrefillsAndExtends, FastPathsAndMissingUpperBound) {
  auto f = make_metadata({1, 1}, {5, 6});
  EXPECT_EQ(split_decodes_prefills_and_extends(f.cm, 1), (DecodeExtendPrefillSplit{2, 0, 0, 2, 0, 0}));
  auto g = make_metadata({1, 4, 4}, {5, 9, 10});  // no prefill (all have context)
  EXPECT_EQ(split_decodes_prefills_and_extends(g.cm, 1), (DecodeExtendPrefillSplit{1, 2, 0, 1, 8, 0}));
  auto h = make_metadata({4, 4}, {4, 4});  // all prefills
  EXPECT_EQ(split_decodes_prefills_and_extends(h.cm, 1), (DecodeExtendPrefillSplit{0, 0, 2, 0, 0, 8}));
  h.cm.seq_lens_cpu_upper_bound = Tensor();
  EXPECT_THROW(split_decodes_prefills_and_extends(h.cm, 1), InvalidArgument);
}

TEST(SplitDecodesPrefillsAndExtends, RandomOrderedBatchesSumToBatch) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 3000; ++iter) {
    const int nd = rng() % 10, ne = rng() % 10, np = rng() % 10;
    const int64_t thr = 1 + rng() % 3;
    std::vector<int32_t> q, seq;
    for (int i = 0; i < nd; ++i) {
      q.push_back(static_cast<int32_t>(1 + rng() % thr));
      seq.push_back(q.back() + 1 + static_cast<int32_t>(rng() % 50));
    }
    for (int i = 0; i < ne; ++i) {
      q.push_back(static_cast<int32_t>(thr + 1 + rng() % 30));
      seq.push_back(q.back() + 1 + static_cast<int32_t>(rng() % 50));
    }
    for (int i = 0; i < np; ++i) {
      q.push_back(static_cast<int32_t>(thr + 1 + rng() % 30));
      seq.push_back(q.back());
    }
    if (q.empty()) continue;
    auto f = make_metadata(q, seq);
    const auto s = split_decodes_prefills_and_extends(f.cm, thr);
    int64_t td = 0, te = 0, tp = 0;
    for (int i = 0; i < nd; ++i) td += q[i];
    for (int i = nd; i < nd + ne; ++i) te += q[i];
    for (int i = nd + ne; i < nd + ne + np; ++i) tp += q[i];
    if (ne + np == 0) {
      ASSERT_EQ(s, (DecodeExtendPrefillSplit{nd, 0, 0, td, 0, 0}));
    } else {
      ASSERT_EQ(s, (DecodeExtendPrefillSplit{nd, ne, np, td, te, tp})) << "iter " << iter;
    }
  }
}

TEST(SplitPrefillChunks, GreedyChunks) {
  const std::vector<int32_t> seq = {3, 4, 2, 5, 1, 1};
  using P = std::pair<int64_t, int64_t>;
  EXPECT_EQ(split_prefill_chunks(seq, 7), (std::vector<P>{{0, 2}, {2, 4}, {4, 6}}));
  EXPECT_EQ(split_prefill_chunks(seq, 7, 10), (std::vector<P>{{10, 12}, {12, 14}, {14, 16}}));
  EXPECT_EQ(split_prefill_chunks(seq, 100), (std::vector<P>{{0, 6}}));
  EXPECT_EQ(split_prefill_chunks(std::vector<int32_t>{}, 5), (std::vector<P>{}));
  EXPECT_THROW(split_prefill_chunks(seq, 4), InvalidArgument);  // 5 > workspace
  EXPECT_EQ(split_prefill_chunks(Tensor::from_vector(seq), 5),
            (std::vector<P>{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 6}}));
}

TEST(SplitPrefillChunks, RandomChunksAreMaximalAndCover) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 2000; ++iter) {
    const int64_t ws = 1 + rng() % 200;
    std::vector<int32_t> seq(rng() % 30);
    for (auto& s : seq) s = static_cast<int32_t>(rng() % (ws + 1));
    const auto chunks = split_prefill_chunks(seq, ws);
    int64_t expect_start = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
      ASSERT_EQ(chunks[c].first, expect_start);
      int64_t sum = 0;
      for (int64_t i = chunks[c].first; i < chunks[c].second; ++i) sum += seq[i];
      ASSERT_LE(sum, ws);
      if (chunks[c].second < static_cast<int64_t>(seq.size())) {
        ASSERT_GT(sum + seq[chunks[c].second], ws);  // greedy: the next one would not fit
      }
      expect_start = chunks[c].second;
    }
    ASSERT_EQ(expect_start, static_cast<int64_t>(seq.size()));
  }
}

TEST(UniformQueryLen, Helpers) {
  EXPECT_TRUE(is_uniform_query_len(4, 8, 2));
  EXPECT_FALSE(is_uniform_query_len(4, 7, 2));
  EXPECT_FALSE(is_uniform_query_len(0, 0, 0));
  EXPECT_EQ(get_uniform_decode_token_count(4, 8, 2, true), std::optional<int64_t>(2));
  EXPECT_EQ(get_uniform_decode_token_count(4, 8, 2, false), std::nullopt);
  EXPECT_EQ(get_uniform_decode_token_count(4, 9, 2, true), std::nullopt);
}

TEST(SpecDecodeReshape, QueryAndOutputRoundTrip) {
  std::vector<float> v(6 * 2 * 3);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  Tensor q = Tensor::from_vector(v, {6, 2, 3});
  Tensor q4 = reshape_query_for_spec_decode(q, 3);
  EXPECT_EQ(q4.shape(), (Dims{3, 2, 2, 3}));
  EXPECT_EQ(q4.get({2, 1, 1, 2}), q.get({5, 1, 2}));  // token 2*2+1 = 5
  EXPECT_EQ(q4.data(), q.data());                      // a view
  Tensor back = reshape_attn_output_for_spec_decode(q4);
  EXPECT_EQ(back.shape(), (Dims{6, 2, 3}));
  EXPECT_EQ(back.get({4, 0, 1}), q.get({4, 0, 1}));
  EXPECT_EQ(reshape_attn_output_for_spec_decode(q).data(), q.data());
  EXPECT_THROW(reshape_query_for_spec_decode(q, 4), InvalidArgument);   // 6 % 4 != 0
  EXPECT_THROW(reshape_query_for_spec_decode(q4, 3), InvalidArgument);  // 4-D input
  EXPECT_THROW(reshape_attn_output_for_spec_decode(Tensor::zeros({2, 2}, DType::f32)), InvalidArgument);
}

TEST(CommonAttentionMetadata, NaiveQueryLensUnpaddedAndValidate) {
  auto f = make_metadata({3, 1, 0, 2}, {5, 7, 2, 2});
  EXPECT_EQ(f.cm.naive_query_lens().to_vector<int32_t>(), (std::vector<int32_t>{3, 1, 0, 2}));
  EXPECT_EQ(f.cm.batch_size(), 4);
  EXPECT_NO_THROW(f.cm.validate());
  Tensor slots = Tensor::from_vector(std::vector<int64_t>{10, 11, 12, 13, -1, -1});
  f.cm.slot_mapping = slots;
  const auto u = f.cm.unpadded(4, 2);
  EXPECT_EQ(u.num_reqs, 2);
  EXPECT_EQ(u.num_actual_tokens, 4);
  EXPECT_EQ(u.query_start_loc_cpu.to_vector<int32_t>(), (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(u.seq_lens.to_vector<int32_t>(), (std::vector<int32_t>{5, 7}));
  EXPECT_EQ(u.slot_mapping.to_vector<int64_t>(), (std::vector<int64_t>{10, 11, 12, 13}));
  EXPECT_EQ(u.block_table_tensor.size(0), 2);
  EXPECT_THROW(f.cm.unpadded(4, 5), InvalidArgument);
  EXPECT_THROW(f.cm.unpadded(7, 2), InvalidArgument);

  auto bad = make_metadata({3, 4}, {5, 3});  // row 1: query 4 > seq 3
  try {
    bad.cm.validate();
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("request row 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("= 3"), std::string::npos) << e.what();
  }
  auto neg = make_metadata({3, 4}, {5, 9});
  neg.cm.query_start_loc_cpu.set({2}, 1);  // decreasing
  EXPECT_THROW(neg.cm.validate(), InvalidArgument);
  auto shape = make_metadata({3, 4}, {5, 9});
  shape.cm.block_table_tensor = Tensor::zeros({1, 4}, DType::i32);  // too few rows
  EXPECT_THROW(shape.cm.validate(), InvalidArgument);
}

}  // namespace
}  // namespace kvattn
