// InputBatch, swap_states and reorder_batch_to_split_decodes_and_prefills: the upstream cases
// (tests/v1/attention/test_batch_reordering.py) and randomized properties.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include <fmt/format.h>

#include "kvattn/batch/input_batch.h"

namespace kvattn {
namespace {

struct Req {
  int32_t scheduled, computed;
};

// The upstream mock has no prompt lengths; prompt = computed makes every request with context
// "done prefilling", which is what those cases assume.
InputBatch make_batch(const std::vector<Req>& reqs, int64_t width = 8) {
  InputBatch b(static_cast<int64_t>(reqs.size()) + 4, width);
  for (size_t i = 0; i < reqs.size(); ++i) {
    RequestState s;
    s.req_id = fmt::format("r{}", i);
    s.num_scheduled_tokens = reqs[i].scheduled;
    s.num_computed_tokens = reqs[i].computed;
    s.num_prompt_tokens = reqs[i].computed;
    s.block_ids = {static_cast<int32_t>(100 + i), static_cast<int32_t>(200 + i)};
    b.add_request(s);
  }
  return b;
}

std::vector<std::string> ids(const std::vector<int>& order) {
  std::vector<std::string> v;
  for (int i : order) v.push_back(fmt::format("r{}", i));
  return v;
}

struct ReorderCase {
  const char* name;
  std::vector<Req> reqs;
  std::vector<int> expected_order;
  bool expected_modified;
  int32_t threshold = 1;
};

TEST(Reorder, UpstreamCases) {
  const std::vector<ReorderCase> cases = {
      {"all_decodes", {{1, 10}, {1, 20}, {1, 30}}, {0, 1, 2}, false},
      {"all_prefills", {{100, 100}, {200, 200}, {300, 300}}, {0, 1, 2}, false},
      {"mixed_interleaved", {{100, 100}, {1, 10}, {200, 200}, {1, 20}}, {3, 1, 2, 0}, true},
      {"already_ordered", {{1, 10}, {1, 20}, {100, 100}, {200, 0}}, {0, 1, 2, 3}, false},
      {"single_request", {{1, 10}}, {0}, false},
      {"higher_threshold", {{2, 10}, {3, 20}, {5, 30}, {6, 40}}, {0, 1, 2, 3}, false, 4},
      {"decodes_at_end", {{100, 100}, {200, 200}, {1, 10}, {1, 20}}, {2, 3, 0, 1}, true},
      {"decode_extend_prefill", {{100, 0}, {10, 50}, {1, 10}}, {2, 1, 0}, true},
      {"extend_prefill_only", {{100, 0}, {10, 50}, {200, 0}, {20, 75}}, {3, 1, 2, 0}, true},
      {"complicated_mixed_interleaved",
       {{1, 20}, {1, 50}, {374, 0}, {300, 20}, {1, 20}, {256, 0}, {1, 5}, {27, 0}, {1, 4}},
       {0, 1, 6, 8, 4, 3, 2, 7, 5},
       true},
      {"new_request_single_token_prefill", {{100, 0}, {1, 0}, {50, 100}, {1, 10}}, {3, 2, 0, 1}, true},
      {"multiple_new_requests_single_token_prefill",
       {{1, 0}, {1, 0}, {1, 50}, {200, 0}},
       {2, 1, 0, 3},
       true},
  };
  for (const auto& c : cases) {
    InputBatch b = make_batch(c.reqs);
    EXPECT_EQ(reorder_batch_to_split_decodes_and_prefills(b, c.threshold), c.expected_modified)
        << c.name;
    EXPECT_EQ(b.req_ids(), ids(c.expected_order)) << c.name;
    // Every other field moved with its request.
    for (int64_t r = 0; r < b.num_reqs(); ++r) {
      const int orig = c.expected_order[r];
      EXPECT_EQ(b.num_scheduled_tokens()[r], c.reqs[orig].scheduled) << c.name;
      EXPECT_EQ(b.num_computed_tokens_cpu()[r], c.reqs[orig].computed) << c.name;
      EXPECT_EQ(b.block_row(r)[1], 200 + orig) << c.name;
    }
  }
}

TEST(Reorder, ShortExtendsSitBetweenDecodesAndLongExtends) {
  // prompt lengths matter here: (scheduled, computed, prompt)
  InputBatch b(8, 4);
  const int32_t rows[][3] = {{50, 0, 50}, {1, 10, 40}, {8, 20, 60}, {1, 30, 30}, {1, 5, 9}};
  for (int i = 0; i < 5; ++i) {
    b.add_request({fmt::format("r{}", i), rows[i][2], rows[i][1], rows[i][0], {1}, {}});
  }
  // regions: prefill, short, long, decode, short -> decode, short, short, long, prefill
  EXPECT_TRUE(reorder_batch_to_split_decodes_and_prefills(b, 1));
  std::vector<BatchRegion> got;
  for (int64_t r = 0; r < b.num_reqs(); ++r)
    got.push_back(classify_request(b.num_scheduled_tokens()[r], b.num_computed_tokens_cpu()[r],
                                   b.num_prompt_tokens()[r], 1));
  EXPECT_EQ(got, (std::vector<BatchRegion>{BatchRegion::kDecode, BatchRegion::kShortExtend,
                                           BatchRegion::kShortExtend, BatchRegion::kLongExtend,
                                           BatchRegion::kPrefill}));
  EXPECT_EQ(b.req_ids(), (std::vector<std::string>{"r3", "r1", "r4", "r2", "r0"}));
}

// Number of cycles (of length >= 2) of the permutation the seed's walk applies.
int64_t expected_swaps(const std::vector<int>& region) {
  const int n = static_cast<int>(region.size());
  int count[4] = {0, 0, 0, 0};
  for (int g : region) ++count[g];
  std::vector<int> target;
  for (int g = 0; g < 4; ++g) target.insert(target.end(), count[g], g);
  std::vector<int> displaced;
  for (int r = 0; r < n; ++r)
    if (region[r] != target[r]) displaced.push_back(r);
  std::vector<int> src = displaced;
  std::stable_sort(src.begin(), src.end(), [&](int a, int b) { return region[a] < region[b]; });
  std::map<int, int> dest;
  for (size_t k = 0; k < src.size(); ++k) dest[src[k]] = displaced[k];
  int64_t cycles = 0;
  std::map<int, bool> seen;
  for (int s : displaced) {
    if (seen[s]) continue;
    ++cycles;
    for (int x = s; !seen[x]; x = dest[x]) seen[x] = true;
  }
  return static_cast<int64_t>(displaced.size()) - cycles;
}

TEST(Reorder, RandomBatchesAreOrderedPreserveStateAndUseMinimalSwaps) {
  std::mt19937 rng(2024);
  for (int iter = 0; iter < 4000; ++iter) {
    const int n = static_cast<int>(rng() % 48);
    const int32_t thr = 1 + static_cast<int32_t>(rng() % 3);
    InputBatch b(64, 6);
    std::map<std::string, RequestState> truth;
    std::vector<int> region;
    for (int i = 0; i < n; ++i) {
      RequestState s;
      s.req_id = fmt::format("q{}", i);
      s.num_computed_tokens = (rng() % 4 == 0) ? 0 : static_cast<int32_t>(1 + rng() % 100);
      s.num_prompt_tokens = static_cast<int32_t>(rng() % 120);
      s.num_scheduled_tokens = static_cast<int32_t>((rng() % 2) ? 1 + rng() % thr : 1 + rng() % 60);
      const int nb = static_cast<int>(rng() % 7);
      for (int k = 0; k < nb; ++k) s.block_ids.push_back(static_cast<int32_t>(rng() % 1000));
      if (rng() % 5 == 0) s.mm_features.push_back({"image", {static_cast<int64_t>(i), 3, {}}});
      region.push_back(static_cast<int>(classify_request(s.num_scheduled_tokens,
                                                         s.num_computed_tokens,
                                                         s.num_prompt_tokens, thr)));
      truth[s.req_id] = s;
      b.add_request(s);
    }
    const bool sorted_before = std::is_sorted(region.begin(), region.end());
    const int64_t swaps_before = b.num_swaps();
    const bool modified = reorder_batch_to_split_decodes_and_prefills(b, thr);
    ASSERT_EQ(modified, !sorted_before);
    ASSERT_EQ(b.num_swaps() - swaps_before, expected_swaps(region)) << "iter " << iter;
    // Region order and preserved per-request state.
    int prev = 0;
    for (int64_t r = 0; r < b.num_reqs(); ++r) {
      const auto& t = truth.at(b.req_id(r));
      ASSERT_EQ(b.num_scheduled_tokens()[r], t.num_scheduled_tokens);
      ASSERT_EQ(b.num_computed_tokens_cpu()[r], t.num_computed_tokens);
      ASSERT_EQ(b.num_prompt_tokens()[r], t.num_prompt_tokens);
      const auto row = b.block_row(r);
      ASSERT_EQ(std::vector<int32_t>(row.begin(), row.end()), t.block_ids);
      ASSERT_EQ(b.mm_features(r).size(), t.mm_features.size());
      const int g = static_cast<int>(classify_request(t.num_scheduled_tokens,
                                                      t.num_computed_tokens,
                                                      t.num_prompt_tokens, thr));
      ASSERT_GE(g, prev);
      prev = g;
    }
    ASSERT_EQ(b.num_reqs(), n);
    // A second reorder is a no-op.
    ASSERT_FALSE(reorder_batch_to_split_decodes_and_prefills(b, thr));
  }
}

// Wide block-table rows of every length (whole 8-id row copies, the overlapping last step when a
// row width is not a multiple of 8, short rows), batches large enough for long cycles, repeated
// reorders of the same batch: every request keeps its state, rows end in region order, and the
// swap count is the seed's.
TEST(Reorder, WideRowsLongCyclesPreserveStateAndCountSeedSwaps) {
  std::mt19937 rng(77);
  for (int64_t width : {1, 7, 8, 13, 21, 32, 67}) {
    for (int iter = 0; iter < 150; ++iter) {
      const int n = static_cast<int>(rng() % 200);
      InputBatch b(200, width);
      std::map<std::string, RequestState> truth;
      std::vector<int> region;
      for (int i = 0; i < n; ++i) {
        RequestState s;
        s.req_id = fmt::format("w{}", i);
        const int kind = static_cast<int>(rng() % 4);
        s.num_computed_tokens = kind == 3 ? 0 : static_cast<int32_t>(1 + rng() % 500);
        s.num_prompt_tokens = kind == 1 ? s.num_computed_tokens + 10 : static_cast<int32_t>(rng() % 400);
        s.num_scheduled_tokens = kind == 2 ? static_cast<int32_t>(2 + rng() % 30) : 1;
        const int64_t nb = static_cast<int64_t>(rng() % (width + 1));
        for (int64_t k = 0; k < nb; ++k) s.block_ids.push_back(static_cast<int32_t>(rng()));
        for (auto& id : s.block_ids) id &= 0x7fffffff;
        region.push_back(static_cast<int>(classify_request(s.num_scheduled_tokens,
                                                           s.num_computed_tokens,
                                                           s.num_prompt_tokens, 1)));
        truth[s.req_id] = s;
        b.add_request(s);
      }
      const int64_t swaps_before = b.num_swaps();
      const bool modified = reorder_batch_to_split_decodes_and_prefills(b, 1);
      ASSERT_EQ(modified, !std::is_sorted(region.begin(), region.end()));
      ASSERT_EQ(b.num_swaps() - swaps_before, expected_swaps(region)) << width << " " << iter;
      int prev = 0;
      for (int64_t r = 0; r < b.num_reqs(); ++r) {
        const auto& t = truth.at(b.req_id(r));
        ASSERT_EQ(b.num_scheduled_tokens()[r], t.num_scheduled_tokens);
        ASSERT_EQ(b.num_computed_tokens_cpu()[r], t.num_computed_tokens);
        ASSERT_EQ(b.num_prompt_tokens()[r], t.num_prompt_tokens);
        const auto row = b.block_row(r);
        ASSERT_EQ(std::vector<int32_t>(row.begin(), row.end()), t.block_ids) << width << " " << iter << " " << r;
        const int g = static_cast<int>(classify_request(t.num_scheduled_tokens, t.num_computed_tokens,
                                                        t.num_prompt_tokens, 1));
        ASSERT_GE(g, prev);
        prev = g;
      }
      ASSERT_FALSE(reorder_batch_to_split_decodes_and_prefills(b, 1));
    }
  }
}

// With displaced rows of only two regions every cycle is a 2-cycle, so the walk reaches the
// true minimum: one swap per displaced pair (checked by breadth-first search on small batches).
TEST(Reorder, TwoRegionBatchesUseGloballyFewestSwaps) {
  std::mt19937 rng(5);
  for (int iter = 0; iter < 300; ++iter) {
    const int n = 1 + static_cast<int>(rng() % 8);
    InputBatch b(8, 1);
    std::vector<int> region;
    for (int i = 0; i < n; ++i) {
      const bool decode = rng() % 2;
      b.add_request({fmt::format("x{}", i), 10, decode ? 10 : 0, decode ? 1 : 7, {}, {}});
      region.push_back(decode ? 0 : 3);
    }
    // BFS over region strings for the minimum number of transpositions.
    std::map<std::vector<int>, int> dist{{region, 0}};
    std::vector<std::vector<int>> frontier{region};
    std::vector<int> goal = region;
    std::sort(goal.begin(), goal.end());
    while (!dist.count(goal)) {
      std::vector<std::vector<int>> next;
      for (const auto& s : frontier)
        for (int i = 0; i < n; ++i)
          for (int j = i + 1; j < n; ++j) {
            auto t = s;
            std::swap(t[i], t[j]);
            if (dist.emplace(t, dist[s] + 1).second) next.push_back(t);
          }
      frontier.swap(next);
    }
    const int64_t before = b.num_swaps();
    reorder_batch_to_split_decodes_and_prefills(b, 1);
    ASSERT_EQ(b.num_swaps() - before, dist[goal]) << "iter " << iter;
  }
}

TEST(InputBatch, AddRemoveSwapAndErrors) {
  InputBatch b(3, 4);
  b.add_request({"a", 5, 2, 1, {7, 8}, {}});
  b.add_request({"b", 6, 0, 6, {9}, {}});
  b.append_block_ids(1, std::vector<int32_t>{10, 11});
  EXPECT_EQ(std::vector<int32_t>(b.block_row(1).begin(), b.block_row(1).end()),
            (std::vector<int32_t>{9, 10, 11}));
  b.swap_states(0, 1);
  EXPECT_EQ(b.req_ids(), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(std::vector<int32_t>(b.block_row(0).begin(), b.block_row(0).end()),
            (std::vector<int32_t>{9, 10, 11}));
  EXPECT_EQ(std::vector<int32_t>(b.block_row(1).begin(), b.block_row(1).end()),
            (std::vector<int32_t>{7, 8}));
  b.add_request({"c", 1, 1, 1, {}, {}});
  EXPECT_THROW(b.add_request({"d", 1, 1, 1, {}, {}}), InvalidArgument);  // full
  b.remove_request(0);  // "c" moves into row 0
  EXPECT_EQ(b.req_ids(), (std::vector<std::string>{"c", "a"}));
  EXPECT_THROW(b.swap_states(0, 2), InvalidArgument);
  EXPECT_THROW(b.append_block_ids(1, std::vector<int32_t>{1, 2, 3}), InvalidArgument);  // width 4
  EXPECT_THROW(b.add_request({"e", -1, 0, 0, {}, {}}), InvalidArgument);
  EXPECT_THROW(b.add_request({"f", 1, 0, 1, {1, 2, 3, 4, 5}, {}}), InvalidArgument);
  EXPECT_THROW(b.add_request({"g", 1, 0, 1, {-3}, {}}), InvalidArgument);
  EXPECT_THROW(InputBatch(0, 4), InvalidArgument);
}

TEST(InputBatch, ClearAndRefillReusesSlots) {
  InputBatch b(4, 2);
  for (int round = 0; round < 3; ++round) {
    b.clear();
    for (int i = 0; i < 4; ++i) {
      RequestState s{fmt::format("round{}-{}", round, i), 4, 0, 4, {i}, {}};
      if (i == 2) s.mm_features.push_back({"image", {1, 2, std::nullopt}});
      b.add_request(s);
    }
    b.swap_states(0, 3);
    b.swap_states(1, 3);
    EXPECT_EQ(b.req_ids(), (std::vector<std::string>{fmt::format("round{}-3", round),
                                                     fmt::format("round{}-0", round),
                                                     fmt::format("round{}-2", round),
                                                     fmt::format("round{}-1", round)}));
    EXPECT_EQ(b.mm_features(2).size(), 1u);
    EXPECT_EQ(b.mm_features(1).size(), 0u);
    EXPECT_EQ(b.block_row(0)[0], 3);
    b.remove_request(1);  // row 3 ("-1") moves into row 1
    EXPECT_EQ(b.req_id(1), fmt::format("round{}-1", round));
    EXPECT_EQ(b.num_reqs(), 3);
    b.add_request({"late", 1, 0, 1, {}, {}});  // reuses the freed slot
    EXPECT_EQ(b.req_id(3), "late");
    EXPECT_EQ(b.req_id(0), fmt::format("round{}-3", round));
  }
  EXPECT_THROW(b.req_id(4), InvalidArgument);
}

}  // namespace
}  // namespace kvattn
