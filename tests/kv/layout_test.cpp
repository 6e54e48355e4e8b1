// KVCacheLayout: properties, §1 stride table, names, merge / resolve / record.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>

#include "kvattn/core/error.h"
#include "kvattn/kv/kv_cache_config.h"
#include "kvattn/kv/kv_cache_layout.h"
#include "kvattn/kv/kv_cache_spec.h"

namespace kvattn {
namespace {

using L = KVCacheLayout;

struct Row {
  L layout;
  std::array<int, 4> view_order;
  LayoutStrides strides;
  bool layer_compact, block_compact, block_outermost, block_contiguous;
  const char* flashinfer;  // nullptr: rejected
};

// vllm-facts.md §1 table: L=2, B=3, H=2, N=16, C=256 (page 8192).
const Row kTable[] = {
    {L::LBHNC, {0, 1, 2, 3}, {24576, 8192, 4096, 256, 1}, true, true, false, true, "HND"},
    {L::LBNHC, {0, 2, 1, 3}, {24576, 8192, 256, 512, 1}, true, true, false, false, "NHD"},
    {L::LHBNC, {1, 0, 2, 3}, {24576, 4096, 12288, 256, 1}, true, false, false, false, nullptr},
    {L::BLHNC, {0, 1, 2, 3}, {8192, 16384, 4096, 256, 1}, false, true, true, true, "HND"},
    {L::BLNHC, {0, 2, 1, 3}, {8192, 16384, 256, 512, 1}, false, true, true, false, "NHD"},
    {L::BHLNC, {0, 1, 2, 3}, {4096, 16384, 8192, 256, 1}, false, false, true, false, "HND"},
};

// H=2 heads, N=16 states (block 16), C=(64+64)*2 bytes = 256.
KVCacheSpecPtr table_spec() { return FullAttentionSpec(16, 2, 64, DType::f16); }

TEST(LayoutTest, EnumOrderAndStrideOrder) {
  ASSERT_EQ(kAllKVCacheLayouts.size(), 6u);
  const char* names[] = {"LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(static_cast<size_t>(kAllKVCacheLayouts[i]), i);
    EXPECT_STREQ(layout_name(kAllKVCacheLayouts[i]), names[i]);
  }
  EXPECT_EQ(stride_order(L::LBHNC), (std::array<int, 5>{0, 1, 2, 3, 4}));
  EXPECT_EQ(stride_order(L::LBNHC), (std::array<int, 5>{0, 1, 3, 2, 4}));
  EXPECT_EQ(stride_order(L::LHBNC), (std::array<int, 5>{0, 2, 1, 3, 4}));
  EXPECT_EQ(stride_order(L::BLHNC), (std::array<int, 5>{1, 0, 2, 3, 4}));
  EXPECT_EQ(stride_order(L::BLNHC), (std::array<int, 5>{1, 0, 3, 2, 4}));
  EXPECT_EQ(stride_order(L::BHLNC), (std::array<int, 5>{1, 2, 0, 3, 4}));
  EXPECT_EQ(std::vector<L>(kDefaultLayoutPreference.begin(), kDefaultLayoutPreference.end()),
            (std::vector<L>{L::LBNHC, L::LBHNC, L::BLNHC, L::BLHNC, L::BHLNC, L::LHBNC}));
}

TEST(LayoutTest, PropertyAndStrideTable) {
  auto spec = table_spec();
  ASSERT_EQ(spec->page_size_bytes(), 8192);
  for (const Row& r : kTable) {
    SCOPED_TRACE(layout_name(r.layout));
    EXPECT_EQ(layer_view_order(r.layout), r.view_order);
    EXPECT_EQ(compute_layout_strides(*spec, 3, 2, r.layout), r.strides);
    EXPECT_EQ(is_layer_compact(r.layout), r.layer_compact);
    EXPECT_EQ(is_block_compact(r.layout), r.block_compact);
    EXPECT_EQ(is_block_outermost(r.layout), r.block_outermost);
    EXPECT_EQ(is_block_contiguous(r.layout), r.block_contiguous);
    if (r.flashinfer) {
      EXPECT_STREQ(get_flashinfer_layout_string(r.layout), r.flashinfer);
    } else {
      try {
        (void)get_flashinfer_layout_string(r.layout);
        ADD_FAILURE() << "LHBNC must be rejected";
      } catch (const Unsupported& e) {
        EXPECT_NE(std::string(e.what()).find("LHBNC has no FlashInfer equivalent"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(LayoutTest, NamesAndAliases) {
  for (L l : kAllKVCacheLayouts) EXPECT_EQ(layout_from_name(layout_name(l)), l);
  EXPECT_EQ(layout_from_name("NHD"), L::LBNHC);
  EXPECT_EQ(layout_from_name("HND"), L::LBHNC);
  EXPECT_EQ(format_layout_names({L::LBNHC, L::BHLNC}), "['LBNHC', 'BHLNC']");
  EXPECT_EQ(layout_names({L::LHBNC}), std::vector<std::string>{"LHBNC"});
  for (const char* bad : {"lbnhc", "XYZ", "", "NHD ", "HDN"}) {
    try {
      (void)layout_from_name(bad);
      ADD_FAILURE() << bad;
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(fmt::format("Unknown KV cache layout '{}'", bad)), std::string::npos) << m;
      EXPECT_NE(m.find("Valid layouts: ['LBHNC', 'LBNHC', 'LHBNC', 'BLHNC', 'BLNHC', 'BHLNC']"), std::string::npos)
          << m;
    }
  }
}

TEST(LayoutTest, MergeIdenticalListsKeepOrder) {
  std::vector<LayoutList> lists = {{L::BHLNC, L::LBHNC}, {L::BHLNC, L::LBHNC}};
  EXPECT_EQ(merge_supported_layouts(lists), (LayoutList{L::BHLNC, L::LBHNC}));
  EXPECT_EQ(merge_supported_layouts({{L::LHBNC}}), LayoutList{L::LHBNC});
}

TEST(LayoutTest, MergeVotesAndTies) {
  // Intersection {LBHNC, LBNHC, BLHNC}; votes LBNHC=1, BLHNC=2 -> BLHNC, LBNHC, then LBHNC (0 votes).
  std::vector<LayoutList> lists = {
      {L::BLHNC, L::LBHNC, L::LBNHC}, {L::LBNHC, L::BLHNC, L::LBHNC, L::LHBNC}, {L::BLHNC, L::LBNHC, L::LBHNC}};
  EXPECT_EQ(merge_supported_layouts(lists), (LayoutList{L::BLHNC, L::LBNHC, L::LBHNC}));
  // Tie (1 vote each) keeps enum order: LBHNC before BLHNC.
  EXPECT_EQ(merge_supported_layouts({{L::BLHNC, L::LBHNC}, {L::LBHNC, L::BLHNC}}), (LayoutList{L::LBHNC, L::BLHNC}));
  // No votes at all inside the intersection: enum order.
  EXPECT_EQ(merge_supported_layouts({{L::LHBNC, L::BHLNC, L::LBNHC}, {L::BLNHC, L::LBNHC, L::BHLNC}}),
            (LayoutList{L::LBNHC, L::BHLNC}));
}

TEST(LayoutTest, MergeEmptyIntersection) {
  try {
    (void)merge_supported_layouts({{L::LBNHC}, {L::BLHNC, L::LBHNC}});
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("No KV cache layout satisfies every supported set: [['LBNHC'], ['BLHNC', "
                                         "'LBHNC']]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)merge_supported_layouts({}), InvalidArgument);
}

// Property test: merge against a brute-force oracle on random supported sets.
TEST(LayoutTest, MergeRandomizedAgainstOracle) {
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 3000; ++iter) {
    const int n = 1 + static_cast<int>(rng() % 4);
    std::vector<LayoutList> lists;
    for (int i = 0; i < n; ++i) {
      LayoutList all(kAllKVCacheLayouts.begin(), kAllKVCacheLayouts.end());
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(1 + rng() % 6);
      lists.push_back(all);
      if (rng() % 4 == 0 && i + 1 < n) {  // duplicates make the "all equal" branch likely
        lists.push_back(all);
        ++i;
      }
    }
    // Oracle.
    bool all_equal = std::all_of(lists.begin(), lists.end(), [&](const auto& l) { return l == lists[0]; });
    LayoutList expected;
    if (all_equal) {
      expected = lists[0];
    } else {
      std::vector<std::pair<int, int>> keyed;  // (-votes, enum index)
      for (int e = 0; e < 6; ++e) {
        L cand = static_cast<L>(e);
        bool everywhere = true;
        for (const auto& l : lists) everywhere &= std::count(l.begin(), l.end(), cand) == 1;
        if (!everywhere) continue;
        int votes = 0;
        for (const auto& l : lists) votes += l.front() == cand;
        keyed.emplace_back(-votes, e);
      }
      std::sort(keyed.begin(), keyed.end());
      for (auto [v, e] : keyed) expected.push_back(static_cast<L>(e));
    }
    if (expected.empty()) {
      EXPECT_THROW((void)merge_supported_layouts(lists), InvalidArgument);
    } else {
      EXPECT_EQ(merge_supported_layouts(lists), expected) << "iteration " << iter;
    }
  }
}

TEST(LayoutTest, SupportedLayoutsOfBackends) {
  // No backend declares: default preference.
  EXPECT_EQ(get_supported_kv_cache_layouts({std::nullopt, std::nullopt}),
            LayoutList(kDefaultLayoutPreference.begin(), kDefaultLayoutPreference.end()));
  EXPECT_EQ(get_supported_kv_cache_layouts({}),
            LayoutList(kDefaultLayoutPreference.begin(), kDefaultLayoutPreference.end()));
  // FlashInfer on SM100 declares (LBHNC, BLHNC); an undeclaring backend doesn't vote.
  EXPECT_EQ(get_supported_kv_cache_layouts({LayoutList{L::LBHNC, L::BLHNC}, std::nullopt}),
            (LayoutList{L::LBHNC, L::BLHNC}));
  // Ascend (LBNHC, LBHNC) + AITER DiffKV (LHBNC, LBHNC) -> only LBHNC.
  EXPECT_EQ(get_supported_kv_cache_layouts({LayoutList{L::LBNHC, L::LBHNC}, LayoutList{L::LHBNC, L::LBHNC}}),
            LayoutList{L::LBHNC});
  EXPECT_THROW((void)get_supported_kv_cache_layouts({LayoutList{L::LBNHC}, LayoutList{L::BLHNC}}), InvalidArgument);
}

TEST(LayoutTest, CacheConfigGetBeforeResolutionRaises) {
  CacheConfig c;
  try {
    (void)c.get_resolved_kv_cache_layout();
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache layout has not been resolved yet"), std::string::npos);
  }
}

TEST(LayoutTest, RecordRoundTripAliasesAndWriteOnce) {
  CacheConfig c;
  record_kv_cache_layout(c, "NHD");
  EXPECT_EQ(c.kv_cache_layout, std::optional<KVCacheLayout>(L::LBNHC));
  EXPECT_EQ(c.get_resolved_kv_cache_layout(), L::LBNHC);
  record_kv_cache_layout(c, "LBNHC");  // same layout again: fine
  record_kv_cache_layout(c, "NHD");
  try {
    record_kv_cache_layout(c, "HND");
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache layout is already resolved to LBNHC; cannot change it to LBHNC."),
              std::string::npos)
        << e.what();
  }
  CacheConfig d;
  record_kv_cache_layout(d, "HND");
  EXPECT_EQ(*d.kv_cache_layout, L::LBHNC);
  CacheConfig e;
  EXPECT_THROW(record_kv_cache_layout(e, "nhd"), InvalidArgument);
  EXPECT_FALSE(e.kv_cache_layout.has_value());
}

std::vector<std::string> names_of(const LayoutList& l) { return layout_names(l); }

TEST(LayoutTest, ResolveRecordsAndPresetWins) {
  CacheConfig c;
  EXPECT_EQ(resolve_kv_cache_layout(c, {names_of({L::BLHNC, L::LBHNC})}), L::BLHNC);
  EXPECT_EQ(*c.kv_cache_layout, L::BLHNC);
  // Second resolution: preset wins, even against the request and supported sets.
  EXPECT_EQ(resolve_kv_cache_layout(c, {{"LBNHC"}}, {}, std::string("LBNHC")), L::BLHNC);
  CacheConfig p;
  p.kv_cache_layout = KVCacheLayout::LHBNC;
  EXPECT_EQ(resolve_kv_cache_layout(p, {{"LBNHC"}}), L::LHBNC);
  CacheConfig q;
  EXPECT_THROW((void)resolve_kv_cache_layout(q, {}), InvalidArgument);
  EXPECT_THROW((void)resolve_kv_cache_layout(q, {{"LBNHC"}, {}}), InvalidArgument);
  EXPECT_THROW((void)resolve_kv_cache_layout(q, {{"bogus"}}), InvalidArgument);
  EXPECT_FALSE(q.kv_cache_layout.has_value());
}

TEST(LayoutTest, ResolveDefaultPreferenceWorkersDoNotVote) {
  const auto def = names_of(LayoutList(kDefaultLayoutPreference.begin(), kDefaultLayoutPreference.end()));
  CacheConfig c;
  EXPECT_EQ(resolve_kv_cache_layout(c, {def, {"BLHNC", "LBHNC"}, def}), L::BLHNC);
  CacheConfig d;
  EXPECT_EQ(resolve_kv_cache_layout(d, {def, def}), L::LBNHC);
  // Pipeline stages with different declarations: votes decide.
  CacheConfig e;
  EXPECT_EQ(resolve_kv_cache_layout(e, {{"LBHNC", "BLHNC"}, {"BLHNC", "LBHNC"}, {"BLHNC", "LBHNC"}}), L::BLHNC);
}

TEST(LayoutTest, ResolveEnvOverride) {
  const std::vector<std::vector<std::string>> sets = {{"LBNHC", "LBHNC"}};
  CacheConfig c;
  EXPECT_EQ(resolve_kv_cache_layout(c, sets, {}, std::string("HND")), L::LBHNC);
  EXPECT_EQ(*c.kv_cache_layout, L::LBHNC);
  CacheConfig d;
  try {
    (void)resolve_kv_cache_layout(d, sets, {}, std::string("BLHNC"));
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "VLLM_KV_CACHE_LAYOUT=BLHNC does not satisfy every supported set; valid layouts: ['LBNHC', "
                  "'LBHNC']"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(d.kv_cache_layout.has_value());
}

TEST(LayoutTest, ResolveEnvWrapperReadsVariable) {
  const std::vector<std::vector<std::string>> sets = {{"LBNHC", "LBHNC", "BLHNC"}};
  ::unsetenv("VLLM_KV_CACHE_LAYOUT");
  EXPECT_FALSE(kv_cache_layout_from_env().has_value());
  CacheConfig a;
  EXPECT_EQ(resolve_kv_cache_layout_from_env(a, sets), L::LBNHC);
  ::setenv("VLLM_KV_CACHE_LAYOUT", "BLHNC", 1);
  CacheConfig b;
  EXPECT_EQ(resolve_kv_cache_layout_from_env(b, sets), L::BLHNC);
  ::setenv("VLLM_KV_CACHE_LAYOUT", "blhnc", 1);
  try {
    (void)kv_cache_layout_from_env();
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("Invalid value 'blhnc' for VLLM_KV_CACHE_LAYOUT"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("'NHD', 'HND'"), std::string::npos);
  }
  ::setenv("VLLM_KV_CACHE_LAYOUT", "", 1);
  EXPECT_FALSE(kv_cache_layout_from_env().has_value());
  ::unsetenv("VLLM_KV_CACHE_LAYOUT");
}

TEST(LayoutTest, ResolveMixedHncShapesNeedBlockCompact) {
  // Two attention specs with different HNC shapes.
  std::vector<KVCacheSpecPtr> mixed = {FullAttentionSpec(16, 8, 128, DType::bf16),
                                       FullAttentionSpec(16, 2, 128, DType::bf16)};
  std::vector<KVCacheSpecPtr> uniform = {FullAttentionSpec(16, 8, 128, DType::bf16),
                                         FullAttentionSpec(16, 8, 128, DType::bf16)};
  CacheConfig a;
  EXPECT_EQ(resolve_kv_cache_layout(a, {{"LHBNC", "LBNHC"}}, mixed), L::LBNHC);
  CacheConfig b;
  try {
    (void)resolve_kv_cache_layout(b, {{"LHBNC"}}, mixed);
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("Specs with mixed HNC shapes need a block-compact layout"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[['LHBNC']]"), std::string::npos) << e.what();
  }
  CacheConfig c;
  EXPECT_EQ(resolve_kv_cache_layout(c, {{"LHBNC"}}, uniform), L::LHBNC);
  // Specs without layer views (Mamba) don't count.
  std::vector<KVCacheSpecPtr> with_mamba = {FullAttentionSpec(16, 8, 128, DType::bf16),
                                            std::make_shared<MambaSpec>(16, std::vector<std::vector<int64_t>>{{4, 4}},
                                                                        std::vector<DType>{DType::f32})};
  CacheConfig d;
  EXPECT_EQ(resolve_kv_cache_layout(d, {{"LHBNC"}}, with_mamba), L::LHBNC);
  // A Uniform group is expanded per layer.
  auto u = UniformTypeKVCacheSpecs::from_specs({{"a", mixed[0]}, {"b", mixed[1]}});
  ASSERT_NE(u, nullptr);
  CacheConfig e;
  EXPECT_EQ(resolve_kv_cache_layout(e, {{"LHBNC", "BHLNC", "BLNHC"}}, {u}), L::BLNHC);
}

TEST(LayoutTest, ResolveDcpReplicatedDraftWithMixedPages) {
  auto target = FullAttentionSpec(16, 8, 128, DType::bf16);
  auto draft = FullAttentionSpec(16, 8, 128, DType::bf16, {.page_size_padded = 65536 * 2, .dcp_sharded = false});
  // Same H/N but different page sizes: block compact first (mixed HNC), then block-outermost.
  CacheConfig a;
  EXPECT_EQ(resolve_kv_cache_layout(a, {{"LBNHC", "LBHNC", "BLNHC", "BLHNC"}}, {target, draft}), L::BLNHC);
  CacheConfig b;
  try {
    (void)resolve_kv_cache_layout(b, {{"LBNHC", "LBHNC"}}, {target, draft});
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("DCP with a replicated draft and mixed KV page sizes requires a block-outer"),
              std::string::npos);
  }
  // A self-addressed ring (no slot mapping) doesn't count toward DCP sharding.
  auto ring = FullAttentionSpec(16, 8, 128, DType::bf16,
                                {.page_size_padded = 65536 * 2, .dcp_sharded = false, .uses_slot_mapping = false});
  CacheConfig c;
  EXPECT_EQ(resolve_kv_cache_layout(c, {{"LBNHC", "LBHNC"}}, {target, ring}), L::LBNHC);
}

TEST(LayoutTest, ResolveConnectorPreference) {
  const std::vector<std::vector<std::string>> sets = {{"LBNHC", "LBHNC"}};
  CacheConfig a;
  EXPECT_EQ(resolve_kv_cache_layout(a, sets, {}, std::nullopt, std::string("HND")), L::LBHNC);
  CacheConfig b;  // incompatible connector preference: warning + first candidate
  EXPECT_EQ(resolve_kv_cache_layout(b, sets, {}, std::nullopt, std::string("BLHNC")), L::LBNHC);
  EXPECT_EQ(*b.kv_cache_layout, L::LBNHC);
  CacheConfig c;  // the explicit request beats the connector
  EXPECT_EQ(resolve_kv_cache_layout(c, sets, {}, std::string("LBNHC"), std::string("HND")), L::LBNHC);
}

}  // namespace
}  // namespace kvattn
