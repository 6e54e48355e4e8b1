// The KV cache spec family: page sizes, memory formulas, quant modes, merge, Uniform groups.
#include <gtest/gtest.h>

#include <random>

#include "kvattn/core/error.h"
#include "kvattn/kv/kv_cache_spec.h"

namespace kvattn {
namespace {

TEST(SpecTest, QuantModes) {
  EXPECT_EQ(get_kv_quant_mode("auto"), KVQuantMode::NONE);
  EXPECT_EQ(get_kv_quant_mode("bfloat16"), KVQuantMode::NONE);
  EXPECT_EQ(get_kv_quant_mode("fp8"), KVQuantMode::FP8_PER_TENSOR);
  EXPECT_EQ(get_kv_quant_mode("fp8_e4m3"), KVQuantMode::FP8_PER_TENSOR);
  EXPECT_EQ(get_kv_quant_mode("fp8_e5m2"), KVQuantMode::FP8_PER_TENSOR);
  EXPECT_EQ(get_kv_quant_mode("fp8_per_token_head"), KVQuantMode::FP8_PER_TOKEN_HEAD);
  EXPECT_EQ(get_kv_quant_mode("int8_per_token_head"), KVQuantMode::INT8_PER_TOKEN_HEAD);
  EXPECT_EQ(get_kv_quant_mode("int4_per_token_head"), KVQuantMode::INT4_PER_TOKEN_HEAD);
  EXPECT_EQ(get_kv_quant_mode("nvfp4"), KVQuantMode::NVFP4);
  EXPECT_EQ(get_kv_quant_mode("nvfp4_e2m1"), KVQuantMode::NVFP4);
  EXPECT_EQ(get_kv_quant_mode("nvfp4_ds_mla"), KVQuantMode::NVFP4_DS_MLA);
  EXPECT_EQ(get_kv_quant_mode("turboquant_k8v4"), KVQuantMode::TURBOQUANT_K8V4);
  EXPECT_EQ(get_kv_quant_mode("turboquant_3bit_nc"), KVQuantMode::TURBOQUANT_3BIT_NC);
  EXPECT_THROW((void)get_kv_quant_mode("turboquant_9bit"), InvalidArgument);
  EXPECT_EQ(static_cast<int>(KVQuantMode::NVFP4), 5);
  EXPECT_EQ(static_cast<int>(KVQuantMode::NVFP4_DS_MLA), 10);
  EXPECT_TRUE(is_per_token_head(KVQuantMode::INT4_PER_TOKEN_HEAD));
  EXPECT_FALSE(is_per_token_head(KVQuantMode::FP8_PER_TENSOR));
  EXPECT_TRUE(is_nvfp4(KVQuantMode::NVFP4));
  EXPECT_FALSE(is_nvfp4(KVQuantMode::NVFP4_DS_MLA));
  EXPECT_TRUE(is_quantized_kv_cache("fp8"));
  EXPECT_FALSE(is_quantized_kv_cache("auto"));
  EXPECT_STREQ(kv_quant_mode_name(KVQuantMode::FP8_PER_TENSOR), "FP8_PER_TENSOR");
}

TEST(SpecTest, FullAttentionLlamaPage) {
  auto s = FullAttentionSpec(16, 8, 128, DType::bf16);
  EXPECT_EQ(s->kind(), KVCacheSpecKind::FullAttention);
  EXPECT_STREQ(kv_cache_spec_kind_name(s->kind()), "full_attention");
  EXPECT_EQ(s->num_heads(), 8);
  EXPECT_EQ(s->num_states(), 16);
  EXPECT_EQ(s->head_size_v(), 128);
  EXPECT_EQ(s->state_content_size_bytes(), 512);  // (128 + 128) * 2
  EXPECT_EQ(s->page_size_bytes(), 65536);         // 8 * 16 * 512
  EXPECT_EQ(s->real_page_size_bytes(), 65536);
  EXPECT_FALSE(s->page_size_padded().has_value());
  EXPECT_TRUE(s->has_layer_views());
  EXPECT_TRUE(s->dcp_sharded());
  EXPECT_TRUE(s->uses_slot_mapping());
  EXPECT_EQ(s->get_block_stride_alignment(), 1);
  EXPECT_EQ(s->view_dtype(), DType::bf16);
  KVCacheLimits lim{.max_model_len = 8192, .max_num_batched_tokens = 2048};
  EXPECT_EQ(s->max_memory_usage_bytes(lim), 512 * 65536);  // 32 MiB per layer
  EXPECT_EQ(s->max_num_blocks_per_req(lim, 8192), 512);
  EXPECT_EQ(s->max_num_blocks_per_req(lim, 8193), 513);
  lim.decode_context_parallel_size = 2;
  EXPECT_EQ(s->max_memory_usage_bytes(lim), 256 * 65536);
  EXPECT_EQ(s->max_num_blocks_per_req(lim, 8192), 256);
  lim.max_model_len = 8193;  // cdiv(8193, 2) = 4097 tokens -> 257 blocks
  EXPECT_EQ(s->max_memory_usage_bytes(lim), 257 * 65536);
}

TEST(SpecTest, HeadSizeVAndDtypes) {
  auto s = FullAttentionSpec(32, 4, 64, DType::f32, {.head_size_v = 32});
  EXPECT_EQ(s->state_content_size_bytes(), (64 + 32) * 4);
  EXPECT_EQ(s->page_size_bytes(), 4 * 32 * 384);
  auto fp8 = FullAttentionSpec(16, 2, 128, DType::fp8_e4m3, {.kv_quant_mode = KVQuantMode::FP8_PER_TENSOR});
  EXPECT_EQ(fp8->page_size_bytes(), 2 * 16 * 256);
  EXPECT_EQ(fp8->view_dtype(), DType::fp8_e4m3);
}

TEST(SpecTest, PaddedPage) {
  // vLLM test_reshape_padded_kv_cache_strides_by_padded_page: bs 16, H 1, hs 2, fp32, padded 384.
  auto s = FullAttentionSpec(16, 1, 2, DType::f32, {.page_size_padded = 384});
  EXPECT_EQ(s->unpadded_page_size_bytes(), 256);
  EXPECT_EQ(s->page_size_bytes(), 384);
  EXPECT_EQ(s->page_size_padded(), std::optional<int64_t>(384));
  try {
    (void)FullAttentionSpec(16, 1, 2, DType::f32, {.page_size_padded = 255});
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("page_size_padded 255 is smaller than the real page of 256 bytes"),
              std::string::npos)
        << e.what();
  }
}

TEST(SpecTest, PackedHeadSlotsAndStateContent) {
  // NVFP4-style packing: H = 2 * num_kv_heads, C = nvfp4_full_dim(128) * 1 = 64 + 8 = 72 bytes.
  auto s = FullAttentionSpec(16, 4, 128, DType::u8,
                             {.kv_quant_mode = KVQuantMode::NVFP4, .num_head_slots = 8, .state_content_bytes = 72});
  EXPECT_EQ(s->num_kv_heads(), 4);
  EXPECT_EQ(s->num_heads(), 8);
  EXPECT_EQ(s->state_content_size_bytes(), 72);
  EXPECT_EQ(s->page_size_bytes(), 8 * 16 * 72);
}

TEST(SpecTest, TokensPerState) {
  // Compressed MLA: 4 tokens per state.
  auto mla = MLAAttentionSpec(256, 1, 128, DType::bf16, {.tokens_per_state = {4, 1}});
  EXPECT_EQ(mla->head_size_v(), 0);
  EXPECT_EQ(mla->kind(), KVCacheSpecKind::MLAAttention);
  EXPECT_EQ(mla->num_states(), 64);
  EXPECT_EQ(mla->get_num_kernel_states(64), 16);
  EXPECT_EQ(mla->state_content_size_bytes(), 256);
  EXPECT_EQ(mla->page_size_bytes(), 64 * 256);
  // Fraction < 1: two states per token.
  auto half = FullAttentionSpec(16, 1, 8, DType::f16, {.tokens_per_state = {1, 2}});
  EXPECT_EQ(half->num_states(), 32);
  EXPECT_EQ(half->get_num_kernel_states(8), 16);
  // Block size must hold whole states.
  EXPECT_THROW((void)FullAttentionSpec(18, 1, 8, DType::f16, {.tokens_per_state = {4, 1}}), InvalidArgument);
  EXPECT_THROW((void)FullAttentionSpec(16, 1, 8, DType::f16, {.tokens_per_state = {0, 1}}), InvalidArgument);
}

TEST(SpecTest, MlaAlignmentPadsPage) {
  // DeepSeek-like latent: hs 576, bf16 -> C 1152, page 16 * 1152 = 18432; aligned to 4096 -> 20480.
  auto mla = MLAAttentionSpec(16, 1, 576, DType::bf16, {.mla_alignment = 4096});
  EXPECT_EQ(mla->real_page_size_bytes(), 18432);
  EXPECT_EQ(mla->page_size_bytes(), 20480);
  auto exact = MLAAttentionSpec(16, 1, 576, DType::bf16, {.mla_alignment = 1152});
  EXPECT_FALSE(exact->page_size_padded().has_value());
  EXPECT_EQ(exact->page_size_bytes(), 18432);
}

TEST(SpecTest, BlockStrideAlignment) {
  // vLLM test_split_blocks_align_to_kernel_blocks: bs in {1024, 384, 256}, 4 tokens/state, C = 132,
  // backend kernel sizes [128, 256] -> block_stride_alignment = MultipleOf(256).
  auto mk = [](int64_t bs) {
    return MLAAttentionSpec(bs, 1, 64, DType::bf16,
                            {.state_content_bytes = 132, .tokens_per_state = {4, 1}, .block_stride_alignment = 256});
  };
  EXPECT_EQ(mk(1024)->get_block_stride_alignment(), 64 * 132);
  EXPECT_EQ(mk(384)->get_block_stride_alignment(), 32 * 132);
  EXPECT_EQ(mk(256)->get_block_stride_alignment(), 1);
  auto plain = FullAttentionSpec(64, 2, 64, DType::f16, {.block_stride_alignment = 16});
  EXPECT_EQ(plain->get_block_stride_alignment(), 2 * 16 * 256);
}

TEST(SpecTest, SlidingWindowMemory) {
  auto s = SlidingWindowSpec(16, 8, 128, DType::bf16, 4096);
  EXPECT_EQ(s->kind(), KVCacheSpecKind::SlidingWindow);
  EXPECT_EQ(s->sliding_window(), std::optional<int64_t>(4096));
  KVCacheLimits lim{.max_model_len = 8192, .max_num_batched_tokens = 2048};
  // min(4095 + 2048, 8192) = 6143 tokens -> 384 blocks + 1.
  EXPECT_EQ(s->max_admission_blocks_per_request(2048, 8192), 385);
  EXPECT_EQ(s->max_memory_usage_bytes(lim), 385 * 65536);
  // Short max_model_len caps it: min(6143, 1000) = 1000 -> 63 + 1.
  lim.max_model_len = 1000;
  EXPECT_EQ(s->max_memory_usage_bytes(lim), 64 * 65536);
  auto extra = SlidingWindowSpec(16, 8, 128, DType::bf16, 4096, {.extra_retained_tokens = 17});
  EXPECT_EQ(extra->max_admission_blocks_per_request(2048, 8192), 386);
  lim.decode_context_parallel_size = 2;
  try {
    (void)s->max_memory_usage_bytes(lim);
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("DCP does not support sliding window"), std::string::npos);
  }
  EXPECT_THROW((void)SlidingWindowSpec(16, 8, 128, DType::bf16, 0), InvalidArgument);
}

TEST(SpecTest, OtherKindsMemory) {
  KVCacheLimits lim{.max_model_len = 32768, .max_num_batched_tokens = 2048, .max_num_encoder_input_tokens = 1500};
  auto chunked = ChunkedLocalAttentionSpec(16, 8, 128, DType::bf16, 8192);
  EXPECT_EQ(chunked->max_memory_usage_bytes(lim), 640 * 65536);  // min(8192 + 2048, 32768) / 16
  lim.max_model_len = 4000;                                       // min(10240, 4000) -> 250 blocks
  EXPECT_EQ(chunked->max_memory_usage_bytes(lim), 250 * 65536);
  auto cross = CrossAttentionSpec(16, 8, 128, DType::bf16);
  EXPECT_EQ(cross->max_memory_usage_bytes(lim), 94 * 65536);  // cdiv(1500, 16)
  auto enc = EncoderOnlyAttentionSpec(16, 8, 128, DType::bf16);
  EXPECT_EQ(enc->max_memory_usage_bytes(lim), 0);
  EXPECT_EQ(enc->kind(), KVCacheSpecKind::EncoderOnlyAttention);
  EXPECT_THROW((void)ChunkedLocalAttentionSpec(16, 8, 128, DType::bf16, -1), InvalidArgument);
  KVCacheLimits bad{.max_model_len = -1};
  EXPECT_THROW((void)cross->max_memory_usage_bytes(bad), InvalidArgument);
}

TEST(SpecTest, InvalidAttentionSpecs) {
  EXPECT_THROW((void)FullAttentionSpec(0, 8, 128, DType::bf16), InvalidArgument);
  EXPECT_THROW((void)FullAttentionSpec(16, 0, 128, DType::bf16), InvalidArgument);
  EXPECT_THROW((void)FullAttentionSpec(16, 8, 0, DType::bf16), InvalidArgument);
  EXPECT_THROW((void)FullAttentionSpec(16, 8, 128, DType::bf16, {.num_head_slots = 0}), InvalidArgument);
  EXPECT_THROW((void)AttentionSpec(KVCacheSpecKind::Mamba, 16, 8, 128, DType::bf16), InvalidArgument);
}

TEST(SpecTest, MambaSpecPagesAndModes) {
  // conv state [3, 1024] bf16 = 6144 bytes; ssm state [8, 64, 16] f32 = 32768 bytes.
  MambaSpec m(16, {{3, 1024}, {8, 64, 16}}, {DType::bf16, DType::f32});
  EXPECT_EQ(m.kind(), KVCacheSpecKind::Mamba);
  EXPECT_FALSE(m.has_layer_views());
  EXPECT_EQ(m.num_heads(), 1);
  EXPECT_EQ(m.num_states(), 1);
  EXPECT_EQ(m.get_num_kernel_states(4), 1);
  EXPECT_EQ(m.state_content_size_bytes(), 38912);
  EXPECT_EQ(m.page_size_bytes(), 38912);
  EXPECT_FALSE(m.view_dtype().has_value());
  KVCacheLimits lim{.max_model_len = 1000};
  EXPECT_EQ(m.max_memory_usage_bytes(lim), 38912);
  EXPECT_EQ(m.max_num_blocks_per_req(lim, 1000), 1);
  MambaSpec spec2(16, {{3, 1024}, {8, 64, 16}}, {DType::bf16, DType::f32},
                  {.page_size_padded = 40960, .num_speculative_blocks = 2});
  EXPECT_EQ(spec2.page_size_bytes(), 40960);
  EXPECT_EQ(spec2.max_memory_usage_bytes(lim), 3 * 40960);
  EXPECT_EQ(spec2.max_num_blocks_per_req(lim, 1000), 3);
  MambaSpec all(16, {{4}}, {DType::f32}, {.mamba_cache_mode = "all", .num_speculative_blocks = 1});
  EXPECT_EQ(all.max_memory_usage_bytes(lim), (63 + 1) * 16);
  MambaSpec align(16, {{4}}, {DType::f32},
                  {.mamba_cache_mode = "align", .num_speculative_blocks = 1, .num_prefill_checkpoint_blocks = 2});
  EXPECT_EQ(align.max_memory_usage_bytes(lim), (2 + 1 + 2) * 16);
  EXPECT_EQ(align.max_num_blocks_per_req(lim, 1000), 63 + 1);
  EXPECT_THROW(MambaSpec(16, {{4}}, {DType::f32, DType::f32}), InvalidArgument);
  EXPECT_THROW(MambaSpec(16, {{4, 0}}, {DType::f32}), InvalidArgument);
  EXPECT_THROW(MambaSpec(16, {{4}}, {DType::f32}, {.page_size_padded = 8}), InvalidArgument);
  EXPECT_THROW(MambaSpec(16, {{4}}, {DType::f32}, {.mamba_cache_mode = "sometimes"}), InvalidArgument);
  auto copy = m.copy_with_new_block_size(64);
  EXPECT_EQ(copy->block_size(), 64);
  EXPECT_EQ(copy->page_size_bytes(), 38912);
}

TEST(SpecTest, EqualityAndCopy) {
  auto a = FullAttentionSpec(16, 8, 128, DType::bf16);
  auto b = FullAttentionSpec(16, 8, 128, DType::bf16);
  auto c = FullAttentionSpec(16, 8, 128, DType::f16);
  EXPECT_TRUE(*a == *b);
  EXPECT_FALSE(*a == *c);
  auto d = a->copy_with_new_block_size(32);
  EXPECT_EQ(d->block_size(), 32);
  EXPECT_EQ(d->page_size_bytes(), 2 * 65536);
  EXPECT_EQ(d->kind(), KVCacheSpecKind::FullAttention);
  auto mla = MLAAttentionSpec(64, 1, 512, DType::bf16);
  EXPECT_EQ(as_attention_spec(mla->copy_with_new_block_size(16))->head_size_v(), 0);
  EXPECT_NE(as_attention_spec(a), nullptr);
  KVCacheSpecPtr mamba = std::make_shared<MambaSpec>(16, std::vector<std::vector<int64_t>>{{2}},
                                                     std::vector<DType>{DType::f32});
  EXPECT_EQ(as_attention_spec(mamba), nullptr);
}

TEST(SpecTest, MergeSpecs) {
  auto full = FullAttentionSpec(16, 8, 128, DType::bf16);
  auto sw = FullAttentionSpec(16, 8, 128, DType::bf16, {.sliding_window = 4096});
  auto nc = FullAttentionSpec(16, 8, 128, DType::bf16, {.non_causal = true});
  EXPECT_EQ(merge_kv_cache_specs({full, full}), full);
  const KVCacheSpecPtr merged_ptr = merge_kv_cache_specs({full, sw, nc});
  const AttentionSpec* merged = as_attention_spec(merged_ptr);
  ASSERT_NE(merged, nullptr);
  EXPECT_EQ(merged->sliding_window(), std::optional<int64_t>(4096));
  EXPECT_TRUE(merged->options().non_causal);
  auto sw2 = FullAttentionSpec(16, 8, 128, DType::bf16, {.sliding_window = 1024});
  EXPECT_THROW((void)merge_kv_cache_specs({sw, sw2}), InvalidArgument);
  auto chunk = FullAttentionSpec(16, 8, 128, DType::bf16, {.attention_chunk_size = 1024});
  EXPECT_THROW((void)merge_kv_cache_specs({sw, chunk}), InvalidArgument);
  auto other = FullAttentionSpec(16, 4, 128, DType::bf16);
  EXPECT_THROW((void)merge_kv_cache_specs({full, other}), InvalidArgument);
  auto window = SlidingWindowSpec(16, 8, 128, DType::bf16, 4096);
  auto window2 = SlidingWindowSpec(16, 8, 128, DType::bf16, 1024);
  EXPECT_THROW((void)merge_kv_cache_specs({window, window2}), InvalidArgument);
  EXPECT_THROW((void)merge_kv_cache_specs({}), InvalidArgument);
}

TEST(SpecTest, UniformTypeSpecs) {
  auto a = FullAttentionSpec(16, 8, 128, DType::bf16);  // page 65536
  auto b = FullAttentionSpec(16, 2, 64, DType::bf16);   // page 2 * 16 * 256 = 8192
  auto u = UniformTypeKVCacheSpecs::from_specs({{"l0", a}, {"l1", b}, {"l2", a}});
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(u->kind(), KVCacheSpecKind::UniformType);
  EXPECT_EQ(u->block_size(), 16);
  EXPECT_EQ(u->page_size_bytes(), 65536 * 2 + 8192);
  EXPECT_TRUE(u->has_layer_views());
  EXPECT_EQ(u->spec_of("l1"), b);
  EXPECT_THROW((void)u->spec_of("l9"), InvalidArgument);
  EXPECT_THROW((void)u->num_heads(), Unsupported);
  EXPECT_THROW((void)u->state_content_size_bytes(), Unsupported);
  KVCacheLimits lim{.max_model_len = 160};
  EXPECT_EQ(u->max_memory_usage_bytes(lim), 10 * u->page_size_bytes());
  EXPECT_EQ(u->max_num_blocks_per_req(lim, 160), 10);
  EXPECT_EQ(iter_layer_specs(u).size(), 3u);
  EXPECT_EQ(iter_layer_specs(a).size(), 1u);
  auto u32 = u->copy_with_new_block_size(32);
  EXPECT_EQ(u32->page_size_bytes(), 2 * u->page_size_bytes());
  // Not uniform: different kinds, block sizes, windows, or Mamba.
  auto sw = SlidingWindowSpec(16, 8, 128, DType::bf16, 128);
  EXPECT_EQ(UniformTypeKVCacheSpecs::from_specs({{"a", a}, {"b", sw}}), nullptr);
  EXPECT_EQ(UniformTypeKVCacheSpecs::from_specs({{"a", a}, {"b", a->copy_with_new_block_size(32)}}), nullptr);
  EXPECT_EQ(UniformTypeKVCacheSpecs::from_specs({{"a", sw}, {"b", SlidingWindowSpec(16, 2, 128, DType::bf16, 64)}}),
            nullptr);
  EXPECT_EQ(UniformTypeKVCacheSpecs::from_specs({}), nullptr);
  EXPECT_THROW(UniformTypeKVCacheSpecs(16, {{"a", a}, {"a", b}}), InvalidArgument);
  EXPECT_THROW(UniformTypeKVCacheSpecs(32, {{"a", a}}), InvalidArgument);
}

// Property: page = H * N * C for random attention specs, with N from the rational tokens/state.
TEST(SpecTest, RandomizedPageFormula) {
  std::mt19937 rng(7);
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3};
  for (int i = 0; i < 500; ++i) {
    const int64_t tps = 1 << (rng() % 3);
    const int64_t bs = tps * (1 + rng() % 64);
    const int64_t h = 1 + rng() % 16, hs = 8 * (1 + rng() % 32);
    const DType dt = dtypes[rng() % 4];
    auto s = FullAttentionSpec(bs, h, hs, dt, {.tokens_per_state = {tps, 1}});
    int64_t states = 0;
    for (int64_t tok = 0; tok < bs; tok += tps) ++states;  // brute force
    EXPECT_EQ(s->num_states(), states);
    EXPECT_EQ(s->page_size_bytes(), h * states * 2 * hs * dtype_size(dt));
    KVCacheLimits lim{.max_model_len = static_cast<int64_t>(rng() % 100000)};
    int64_t blocks = 0;
    for (int64_t covered = 0; covered < lim.max_model_len; covered += bs) ++blocks;
    EXPECT_EQ(s->max_memory_usage_bytes(lim), blocks * s->page_size_bytes());
  }
}

}  // namespace
}  // namespace kvattn
