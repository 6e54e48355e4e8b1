// Layout strides, grouping, bytes per block and the KV cache planner.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "kvattn/core/error.h"
#include "kvattn/kv/kv_cache_config.h"
#include "support/sizes.h"

namespace kvattn {
namespace {

using L = KVCacheLayout;
using kvattn::test::kGiB;
using kvattn::test::kMiB;

std::vector<LayerKVCacheSpec> llama3_8b(int64_t block_size = 16) {
  std::vector<LayerKVCacheSpec> out;
  auto spec = FullAttentionSpec(block_size, 8, 128, DType::bf16);
  for (int i = 0; i < 32; ++i) out.push_back({fmt::format("model.layers.{}.self_attn.attn", i), spec});
  return out;
}

// Gemma-2-9B-like: 42 layers alternating sliding window (even) and full attention (odd).
std::vector<LayerKVCacheSpec> gemma2_like() {
  std::vector<LayerKVCacheSpec> out;
  auto sw = SlidingWindowSpec(16, 8, 256, DType::bf16, 4096);
  auto full = FullAttentionSpec(16, 8, 256, DType::bf16);
  for (int i = 0; i < 42; ++i) out.push_back({fmt::format("layers.{}", i), i % 2 == 0 ? sw : full});
  return out;
}

// 16 layers: attention at 3, 7, 11, 15; Mamba2 elsewhere.
KVCacheSpecPtr hybrid_mamba_spec() {
  return std::make_shared<MambaSpec>(16, std::vector<std::vector<int64_t>>{{3, 1024}, {8, 64, 16}},
                                     std::vector<DType>{DType::bf16, DType::f32});
}
std::vector<LayerKVCacheSpec> hybrid_like() {
  std::vector<LayerKVCacheSpec> out;
  auto attn = FullAttentionSpec(16, 8, 128, DType::bf16);
  auto mamba = hybrid_mamba_spec();
  for (int i = 0; i < 16; ++i) out.push_back({fmt::format("layers.{}", i), i % 4 == 3 ? attn : mamba});
  return out;
}

TEST(PlannerTest, LayerShapeBytes) {
  auto s = FullAttentionSpec(16, 8, 128, DType::bf16);
  EXPECT_EQ(compute_layer_kv_cache_shape_bytes(*s, 10), (std::array<int64_t, 4>{10, 8, 16, 512}));
  EXPECT_EQ(compute_layer_kv_cache_shape_bytes(*s, 10, 4), (std::array<int64_t, 4>{40, 8, 4, 512}));
  EXPECT_EQ(compute_layer_kv_cache_shape_bytes(*s, 10, 16), (std::array<int64_t, 4>{10, 8, 16, 512}));
  EXPECT_THROW((void)compute_layer_kv_cache_shape_bytes(*s, 10, 5), InvalidArgument);
  EXPECT_THROW((void)compute_layer_kv_cache_shape_bytes(*s, 10, 0), InvalidArgument);
  EXPECT_THROW((void)compute_layer_kv_cache_shape_bytes(*s, -1), InvalidArgument);
  auto mla = MLAAttentionSpec(256, 1, 128, DType::bf16, {.tokens_per_state = {4, 1}});
  EXPECT_EQ(compute_layer_kv_cache_shape_bytes(*mla, 4), (std::array<int64_t, 4>{4, 1, 64, 256}));
  EXPECT_EQ(compute_layer_kv_cache_shape_bytes(*mla, 4, 64), (std::array<int64_t, 4>{16, 1, 16, 256}));
  EXPECT_THROW((void)compute_layer_kv_cache_shape_bytes(*mla, 4, 2), InvalidArgument);  // half a state
}

TEST(PlannerTest, FixedBlockStridePropagatesOutwardInLhbnc) {
  auto s = FullAttentionSpec(16, 2, 64, DType::f16);  // H=2, N=16, C=256
  const int64_t stride = 10000;
  auto st = compute_layout_strides(*s, 3, 2, L::LHBNC, std::nullopt, {std::nullopt, stride});
  EXPECT_EQ(st[kDimB], stride);
  EXPECT_EQ(st[kDimH], stride * 3);
  EXPECT_EQ(st[kDimL], stride * 3 * 2);
  EXPECT_EQ(st[kDimN], 256);
  EXPECT_EQ(st[kDimC], 1);
  // A fixed L stride only changes L.
  auto st2 = compute_layout_strides(*s, 3, 2, L::LBHNC, std::nullopt, {123456});
  EXPECT_EQ(st2, (LayoutStrides{123456, 8192, 4096, 256, 1}));
}

TEST(PlannerTest, KernelSplitStrides) {
  auto s = FullAttentionSpec(16, 2, 64, DType::f16);  // page 8192; kernel 4 -> kernel page 2048
  EXPECT_EQ(compute_layout_strides(*s, 3, 2, L::LBNHC, 4), (LayoutStrides{24576, 2048, 256, 512, 1}));
  EXPECT_EQ(compute_layout_strides(*s, 3, 1, L::BLHNC, 4), (LayoutStrides{2048, 2048, 1024, 256, 1}));
}

TEST(PlannerTest, PaddedPageStrides) {
  auto s = FullAttentionSpec(16, 1, 2, DType::f32, {.page_size_padded = 384});  // real page 256
  EXPECT_EQ(compute_layout_strides(*s, 5, 1, L::LBHNC), (LayoutStrides{1920, 384, 256, 16, 1}));
  EXPECT_EQ(compute_layout_strides(*s, 5, 2, L::BLNHC), (LayoutStrides{384, 768, 16, 16, 1}));
  EXPECT_EQ(compute_layout_strides(*s, 5, 2, L::LBNHC), (LayoutStrides{1920, 384, 16, 16, 1}));
  EXPECT_THROW((void)compute_layout_strides(*s, 5, 1, L::LBHNC, 8), Unsupported);
  EXPECT_EQ(compute_layout_strides(*s, 5, 1, L::LBHNC, 16)[kDimB], 384);  // kernel == block: fine
  auto s2 = FullAttentionSpec(16, 2, 2, DType::f32, {.page_size_padded = 1024});
  EXPECT_THROW((void)compute_layout_strides(*s2, 5, 1, L::LHBNC), Unsupported);
  EXPECT_THROW((void)compute_layout_strides(*s2, 5, 1, L::BHLNC), Unsupported);
  EXPECT_THROW((void)compute_layout_strides(*s2, 5, 0, L::LBHNC), InvalidArgument);
}

TEST(PlannerTest, GroupsUniformModel) {
  auto groups = get_kv_cache_groups(llama3_8b());
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].layer_names.size(), 32u);
  EXPECT_EQ(groups[0].layer_names[5], "model.layers.5.self_attn.attn");
  EXPECT_EQ(groups[0].kv_cache_spec->kind(), KVCacheSpecKind::FullAttention);
}

TEST(PlannerTest, GroupsUniformTypeDifferentHeads) {
  auto a = FullAttentionSpec(16, 8, 128, DType::bf16);
  auto b = FullAttentionSpec(16, 2, 128, DType::bf16);
  auto groups = get_kv_cache_groups({{"x", a}, {"y", b}, {"z", a}});
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].kv_cache_spec->kind(), KVCacheSpecKind::UniformType);
  EXPECT_EQ(groups[0].kv_cache_spec->page_size_bytes(), 65536 * 2 + 16384);
}

TEST(PlannerTest, GroupsHybridChunks) {
  auto g = get_kv_cache_groups(gemma2_like());
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].kv_cache_spec->kind(), KVCacheSpecKind::SlidingWindow);
  EXPECT_EQ(g[1].kv_cache_spec->kind(), KVCacheSpecKind::FullAttention);
  ASSERT_EQ(g[0].layer_names.size(), 21u);
  EXPECT_EQ(g[0].layer_names[1], "layers.2");
  EXPECT_EQ(g[1].layer_names[20], "layers.41");

  auto h = get_kv_cache_groups(hybrid_like());
  ASSERT_EQ(h.size(), 4u);  // Mamba (first seen) cut into 3 groups of 4, attention 1 group of 4
  for (int i = 0; i < 3; ++i) EXPECT_EQ(h[static_cast<size_t>(i)].kv_cache_spec->kind(), KVCacheSpecKind::Mamba);
  EXPECT_EQ(h[0].layer_names, (std::vector<std::string>{"layers.0", "layers.1", "layers.2", "layers.4"}));
  EXPECT_EQ(h[3].layer_names, (std::vector<std::string>{"layers.3", "layers.7", "layers.11", "layers.15"}));

  // Uneven: 5 of A, 2 of B -> A in groups of 2 (2, 2, 1), B one group.
  auto a = FullAttentionSpec(16, 1, 8, DType::f16);
  auto b = SlidingWindowSpec(16, 1, 8, DType::f16, 32);
  auto u = get_kv_cache_groups({{"a0", a}, {"b0", b}, {"a1", a}, {"a2", a}, {"b1", b}, {"a3", a}, {"a4", a}});
  ASSERT_EQ(u.size(), 4u);
  EXPECT_EQ(u[2].layer_names, std::vector<std::string>{"a4"});
  EXPECT_EQ(u[3].layer_names, (std::vector<std::string>{"b0", "b1"}));

  EXPECT_THROW((void)get_kv_cache_groups({}), InvalidArgument);
  EXPECT_THROW((void)get_kv_cache_groups({{"a", a}, {"a", a}}), InvalidArgument);
  EXPECT_THROW((void)get_kv_cache_groups({{"a", nullptr}}), InvalidArgument);
}

TEST(PlannerTest, Llama3PlanLayerOuter) {
  KVCachePlanOptions opt{.limits = {.max_model_len = 8192, .max_num_batched_tokens = 2048}};
  auto r = get_kv_cache_config(llama3_8b(), L::LBNHC, 10 * kGiB, opt);
  ASSERT_TRUE(r.ok()) << r.failure().message;
  const KVCacheConfig& c = r.value();
  EXPECT_EQ(c.num_blocks, 5120);  // 10 GiB / (32 * 64 KiB)
  EXPECT_EQ(c.kv_cache_layout, std::optional<KVCacheLayout>(KVCacheLayout::LBNHC));
  ASSERT_EQ(c.kv_cache_tensors.size(), 1u);
  const auto& t = c.kv_cache_tensors[0];
  EXPECT_EQ(t.size, 10 * kGiB);
  EXPECT_EQ(t.layers.size(), 32u);
  EXPECT_EQ(t.block_stride, 65536);
  EXPECT_EQ(t.layer_stride, 65536 * 5120);
  EXPECT_EQ(t.offset, 0);
  EXPECT_EQ(c.num_blocks_of(t), 5120);
  EXPECT_EQ(get_kv_cache_bytes_per_block(c.kv_cache_groups, L::LBNHC), 2 * kMiB);
  EXPECT_EQ(kv_cache_memory_needed(c.kv_cache_groups, L::LBNHC, opt.limits), 513 * 2 * kMiB);
  EXPECT_FALSE(c.has_mamba_layers());
  EXPECT_FALSE(c.needs_kv_cache_zeroing());
  EXPECT_EQ(c.group_index_of("model.layers.31.self_attn.attn"), std::optional<size_t>(0));
  EXPECT_FALSE(c.group_index_of("nope").has_value());
  EXPECT_THROW((void)c.layer_spec("nope"), InvalidArgument);
}

TEST(PlannerTest, Llama3PlanBlockOuter) {
  KVCachePlanOptions opt{.limits = {.max_model_len = 8192}};
  auto r = get_kv_cache_config(llama3_8b(), L::BLHNC, 10 * kGiB + 12345, opt);
  ASSERT_TRUE(r.ok());
  const auto& t = r.value().kv_cache_tensors.at(0);
  EXPECT_EQ(r.value().num_blocks, 5120);
  EXPECT_EQ(t.layer_stride, 65536);
  EXPECT_EQ(t.block_stride, 2 * kMiB);
  EXPECT_EQ(t.size, 10 * kGiB);
  // LHBNC: a block's page is spread over heads; block stride = one head's N*C.
  auto r2 = get_kv_cache_config(llama3_8b(), L::LHBNC, 2 * kGiB, opt);
  ASSERT_TRUE(r2.ok()) << r2.failure().message;
  const auto& t2 = r2.value().kv_cache_tensors.at(0);
  EXPECT_EQ(t2.block_stride, 16 * 512);
  EXPECT_EQ(t2.layer_stride, 65536 * 1024);
  EXPECT_EQ(r2.value().num_blocks, 1024);
}

TEST(PlannerTest, Llama3DoesNotFit) {
  KVCachePlanOptions opt{.limits = {.max_model_len = 131072}};
  auto r = get_kv_cache_config(llama3_8b(), L::LBNHC, kGiB, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure().kind, ErrorKind::OutOfMemory);
  const std::string& m = r.failure().message;
  EXPECT_NE(m.find("max seq len (131072)"), std::string::npos) << m;
  EXPECT_NE(m.find("17181966336 bytes (16.00 GiB)"), std::string::npos) << m;  // 8193 blocks of 2 MiB
  EXPECT_NE(m.find("available KV cache memory (1073741824 bytes, 1.00 GiB)"), std::string::npos) << m;
  EXPECT_NE(m.find("estimated maximum model length is 8176"), std::string::npos) << m;  // 511 blocks * 16
  EXPECT_NE(m.find("decreasing max_model_len"), std::string::npos) << m;
  EXPECT_THROW((void)r.value(), OutOfMemory);
  EXPECT_EQ(estimate_max_model_len(get_kv_cache_groups(llama3_8b()), L::LBNHC, opt.limits, kGiB), 8176);
  EXPECT_EQ(estimate_max_model_len(get_kv_cache_groups(llama3_8b()), L::LBNHC, opt.limits, kMiB), 0);
  // Exactly enough: 513 blocks for 8192 tokens.
  KVCachePlanOptions ok{.limits = {.max_model_len = 8192}};
  EXPECT_TRUE(get_kv_cache_config(llama3_8b(), L::LBNHC, 513 * 2 * kMiB, ok).ok());
  EXPECT_FALSE(get_kv_cache_config(llama3_8b(), L::LBNHC, 513 * 2 * kMiB - 1, ok).ok());
  EXPECT_THROW((void)get_kv_cache_config(llama3_8b(), L::LBNHC, -1, ok), InvalidArgument);
}

TEST(PlannerTest, BlockOverride) {
  KVCachePlanOptions opt{.limits = {.max_model_len = 8192}, .num_gpu_blocks_override = 600};
  auto r = get_kv_cache_config(llama3_8b(), L::LBNHC, kGiB, opt);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().num_blocks, 600);
  EXPECT_EQ(r.value().kv_cache_tensors[0].size, 600 * 2 * kMiB);
  opt.num_gpu_blocks_override = 100;
  auto f = get_kv_cache_config(llama3_8b(), L::LBNHC, kGiB, opt);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.failure().message.find("num_gpu_blocks_override"), std::string::npos);
  opt.num_gpu_blocks_override = 0;
  EXPECT_THROW((void)get_kv_cache_config(llama3_8b(), L::LBNHC, kGiB, opt), InvalidArgument);
}

TEST(PlannerTest, Gemma2SlidingWindowPlan) {
  KVCachePlanOptions opt{.limits = {.max_model_len = 8192, .max_num_batched_tokens = 2048}};
  auto r = get_kv_cache_config(gemma2_like(), L::LBNHC, 4 * kGiB, opt);
  ASSERT_TRUE(r.ok()) << r.failure().message;
  const auto& c = r.value();
  const int64_t page = 131072, bpb = 21 * page;
  EXPECT_EQ(c.num_blocks, 4 * kGiB / bpb);
  ASSERT_EQ(c.kv_cache_groups.size(), 2u);
  ASSERT_EQ(c.kv_cache_tensors.size(), 2u);
  for (const auto& t : c.kv_cache_tensors) {
    EXPECT_EQ(t.offset, 0);  // groups overlay from byte 0
    EXPECT_EQ(t.block_stride, page);
    EXPECT_EQ(t.layer_stride, page * c.num_blocks);
    EXPECT_EQ(t.size, bpb * c.num_blocks);
  }
  EXPECT_EQ(c.kv_cache_tensors[0].layers[0], "layers.0");
  EXPECT_EQ(c.kv_cache_tensors[1].layers[0], "layers.1");
  // One request: 512 full blocks + 385 window blocks + the null block.
  EXPECT_EQ(kv_cache_memory_needed(c.kv_cache_groups, L::LBNHC, opt.limits), (1 + 512 + 385) * bpb);
  auto tight = get_kv_cache_config(gemma2_like(), L::LBNHC, 897 * bpb, opt);
  ASSERT_FALSE(tight.ok());
  EXPECT_NE(tight.failure().message.find("898 blocks"), std::string::npos) << tight.failure().message;
}

TEST(PlannerTest, HybridMambaNeedsBlockOuterLayout) {
  KVCachePlanOptions opt{.limits = {.max_model_len = 4096}};
  for (L bad : {L::LBNHC, L::LBHNC, L::LHBNC, L::BHLNC}) {
    try {
      (void)get_kv_cache_config(hybrid_like(), bad, 100 * kMiB, opt);
      ADD_FAILURE() << layout_name(bad);
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("KV cache layout {} cannot express this model's mixed page "
                                                       "sizes (38912, 65536 bytes across 4 cache groups)",
                                                       layout_name(bad))),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("VLLM_KV_CACHE_LAYOUT=BLHNC"), std::string::npos);
    }
  }
  auto r = get_kv_cache_config(hybrid_like(), L::BLHNC, 100 * kMiB, opt);
  ASSERT_TRUE(r.ok()) << r.failure().message;
  const auto& c = r.value();
  const int64_t bpb = 4 * 65536;
  EXPECT_EQ(get_kv_cache_bytes_per_block(c.kv_cache_groups, L::BLHNC), bpb);
  EXPECT_EQ(c.num_blocks, 100 * kMiB / bpb);
  EXPECT_TRUE(c.has_mamba_layers());
  EXPECT_TRUE(c.needs_kv_cache_zeroing());
  ASSERT_EQ(c.kv_cache_tensors.size(), 4u);
  EXPECT_EQ(c.kv_cache_tensors[0].layer_stride, 38912);
  EXPECT_EQ(c.kv_cache_tensors[0].block_stride, bpb);
  EXPECT_EQ(c.kv_cache_tensors[3].layer_stride, 65536);
  EXPECT_EQ(c.kv_cache_tensors[3].block_stride, bpb);
  // 256 attention blocks + 1 per Mamba group + null.
  EXPECT_EQ(kv_cache_memory_needed(c.kv_cache_groups, L::BLHNC, opt.limits), (256 + 3 + 1) * bpb);
  // A single (Uniform) group with mixed pages is fine even layer-outer.
  auto a = FullAttentionSpec(16, 8, 128, DType::bf16);
  auto b = FullAttentionSpec(16, 2, 128, DType::bf16);
  EXPECT_TRUE(get_kv_cache_config({{"x", a}, {"y", b}}, L::LBNHC, 100 * kMiB, opt).ok());
}

TEST(PlannerTest, UniformGroupTensorsPerSpec) {
  auto a = FullAttentionSpec(16, 8, 128, DType::bf16);  // 65536
  auto b = FullAttentionSpec(16, 2, 128, DType::bf16);  // 16384
  std::vector<LayerKVCacheSpec> layers = {{"x", a}, {"y", b}, {"z", a}};
  auto lo = materialize_kv_cache_config(get_kv_cache_groups(layers), L::LBNHC, 10);
  ASSERT_EQ(lo.kv_cache_tensors.size(), 2u);
  EXPECT_EQ(lo.kv_cache_tensors[0].layers, (std::vector<std::string>{"x", "z"}));
  EXPECT_EQ(lo.kv_cache_tensors[0].offset, 0);
  EXPECT_EQ(lo.kv_cache_tensors[0].layer_stride, 655360);
  EXPECT_EQ(lo.kv_cache_tensors[1].offset, 2 * 655360);
  EXPECT_EQ(lo.kv_cache_tensors[1].layer_stride, 163840);
  EXPECT_EQ(lo.kv_cache_tensors[1].size, 10 * (2 * 65536 + 16384));
  EXPECT_EQ(lo.layer_spec("y"), b);
  auto bo = materialize_kv_cache_config(get_kv_cache_groups(layers), L::BLNHC, 10);
  EXPECT_EQ(bo.kv_cache_tensors[1].offset, 2 * 65536);
  EXPECT_EQ(bo.kv_cache_tensors[1].block_stride, 2 * 65536 + 16384);
  EXPECT_EQ(bo.kv_cache_tensors[0].layer_stride, 65536);
}

TEST(PlannerTest, BlockStrideAlignment) {
  // Real page 512, padded 600, kernel blocks of 16 tokens (256 bytes) -> block stride 768.
  auto s = FullAttentionSpec(32, 1, 2, DType::f32, {.page_size_padded = 600, .block_stride_alignment = 16});
  ASSERT_EQ(s->get_block_stride_alignment(), 256);
  std::vector<KVCacheGroupSpec> g = {{{"a", "b"}, s}};
  EXPECT_EQ(get_kv_cache_bytes_per_block(g, L::LBHNC), 2 * 768);
  EXPECT_EQ(get_kv_cache_bytes_per_block(g, L::BLHNC), 1280);  // round_up(1200, 256)
  auto lo = materialize_kv_cache_config(g, L::LBHNC, 4);
  EXPECT_EQ(lo.kv_cache_tensors[0].block_stride, 768);
  EXPECT_EQ(lo.kv_cache_tensors[0].layer_stride, 768 * 4);
  EXPECT_EQ(lo.kv_cache_tensors[0].size, 2 * 768 * 4);
  auto bo = materialize_kv_cache_config(g, L::BLHNC, 4);
  EXPECT_EQ(bo.kv_cache_tensors[0].block_stride, 1280);
  EXPECT_EQ(bo.kv_cache_tensors[0].layer_stride, 600);
  // Not block-compact: cannot align.
  auto s2 = FullAttentionSpec(32, 1, 2, DType::f32, {.block_stride_alignment = 16});
  auto s3 = FullAttentionSpec(32, 1, 2, DType::f32, {.page_size_padded = 600, .block_stride_alignment = 16});
  EXPECT_EQ(materialize_kv_cache_config({{{"a"}, s2}}, L::LHBNC, 4).kv_cache_tensors[0].block_stride, 512);
  EXPECT_THROW((void)materialize_kv_cache_config({{{"a"}, s3}}, L::LHBNC, 4), InvalidArgument);
}

TEST(PlannerTest, MixedPrecision) {
  auto a = FullAttentionSpec(16, 1, 8, DType::bf16);
  auto b = FullAttentionSpec(16, 1, 8, DType::fp8_e4m3, {.kv_quant_mode = KVQuantMode::FP8_PER_TENSOR});
  auto c = materialize_kv_cache_config(get_kv_cache_groups({{"a", a}, {"b", b}}), L::BLHNC, 2);
  EXPECT_TRUE(c.has_mixed_precision_kv_cache());
  EXPECT_TRUE(c.needs_kv_cache_zeroing());
}

// Property: for random models and every valid layout, every page's bytes stay inside the backing
// allocation, tensors of one group never overlap (block-compact layouts, where a page is one run),
// and block-outer packing keeps each block's pages inside its block stride.
TEST(PlannerTest, RandomizedPlansStayInBounds) {
  std::mt19937 rng(99);
  int checked = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<LayerKVCacheSpec> layers;
    const int n = 1 + static_cast<int>(rng() % 6);
    std::vector<KVCacheSpecPtr> pool = {
        FullAttentionSpec(4, 1 + rng() % 3, 4, DType::f16),
        SlidingWindowSpec(4, 1 + rng() % 3, 4, DType::f16, 8),
        FullAttentionSpec(4, 2, 4, DType::f32, {.page_size_padded = 300}),
        std::make_shared<MambaSpec>(4, std::vector<std::vector<int64_t>>{{1 + static_cast<int64_t>(rng() % 40)}},
                                    std::vector<DType>{DType::f32})};
    const int kinds = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) layers.push_back({fmt::format("l{}", i), pool[rng() % static_cast<unsigned>(kinds)]});
    const auto groups = get_kv_cache_groups(layers);
    const int64_t nb = 1 + rng() % 5;
    for (L layout : kAllKVCacheLayouts) {
      KVCacheConfig cfg;
      try {
        cfg = materialize_kv_cache_config(groups, layout, nb);
      } catch (const Error&) {
        continue;  // layout cannot express this model (asserted by the dedicated tests)
      }
      ++checked;
      const int64_t bpb = get_kv_cache_bytes_per_block(groups, layout);
      std::map<size_t, std::vector<std::pair<int64_t, int64_t>>> runs_by_group;
      for (const auto& t : cfg.kv_cache_tensors) {
        ASSERT_EQ(t.size, bpb * nb);
        const auto spec = cfg.layer_spec(t.layers[0]);
        const int64_t page = spec->page_size_bytes();
        for (size_t l = 0; l < t.layers.size(); ++l)
          for (int64_t b = 0; b < nb; ++b) {
            const int64_t start = t.offset + static_cast<int64_t>(l) * t.layer_stride + b * t.block_stride;
            ASSERT_GE(start, 0);
            if (is_block_compact(layout)) {
              ASSERT_LE(start + page, t.size) << layout_name(layout);
              runs_by_group[*cfg.group_index_of(t.layers[l])].emplace_back(start, start + page);
              if (is_block_outermost(layout)) {
                ASSERT_GE(start, b * bpb);
                ASSERT_LE(start + page, (b + 1) * bpb);
              }
            }
          }
      }
      for (auto& [g, runs] : runs_by_group) {
        std::sort(runs.begin(), runs.end());
        for (size_t i = 1; i < runs.size(); ++i) ASSERT_LE(runs[i - 1].second, runs[i].first) << layout_name(layout);
      }
    }
  }
  EXPECT_GT(checked, 300);
}

}  // namespace
}  // namespace kvattn
