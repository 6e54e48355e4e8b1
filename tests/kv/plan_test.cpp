// Model geometry (presets, config.json, memory sizes) and plan_kv_cache (`kvattn plan`).
#include <gtest/gtest.h>

#include "kvattn/kv/model_config.h"
#include "support/error_message.h"
#include "support/sizes.h"

namespace kvattn {
namespace {

using kvattn::test::error_message;

using kvattn::test::kGiB;

PlanOptions budget(int64_t bytes) {
  PlanOptions o;
  o.gpu_memory = bytes;
  return o;
}

TEST(PlanModel, Presets) {
  const ModelConfig l = model_preset("llama3-8b");
  EXPECT_EQ(l.num_hidden_layers, 32);
  EXPECT_EQ(l.num_attention_heads, 32);
  EXPECT_EQ(l.num_key_value_heads, 8);
  EXPECT_EQ(l.head_dim, 128);
  EXPECT_EQ(l.dtype, DType::bf16);
  EXPECT_EQ(l.max_model_len, 8192);
  EXPECT_EQ(l.num_layers_of(ModelLayerKind::full_attention), 32);
  const ModelConfig g = model_preset("gemma2-9b");
  EXPECT_EQ(g.num_layers_of(ModelLayerKind::sliding_window), 21);
  EXPECT_EQ(g.layer_kinds[0], ModelLayerKind::sliding_window);
  EXPECT_EQ(g.layer_kinds[1], ModelLayerKind::full_attention);
  EXPECT_EQ(g.sliding_window, 4096);
  EXPECT_EQ(g.head_dim, 256);
  const ModelConfig h = model_preset("hybrid-mamba");
  EXPECT_EQ(h.num_layers_of(ModelLayerKind::full_attention), 3);
  ASSERT_TRUE(h.mamba.has_value());
  // conv [3, 8192 + 2*128] + ssm [128, 64, 128], bf16.
  EXPECT_EQ(h.mamba->page_size_bytes(), (3 * 8448 + 128 * 64 * 128) * 2);
  const std::string msg = error_message([] { (void)model_preset("llama4"); });
  EXPECT_NE(msg.find("\"llama4\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("llama3-8b, gemma2-9b, hybrid-mamba"), std::string::npos) << msg;
}

TEST(PlanModel, ParseLlamaConfigJson) {
  const ModelConfig m = parse_hf_config(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "rope_theta": 500000.0})");
  EXPECT_EQ(m.num_hidden_layers, 32);
  EXPECT_EQ(m.head_dim, 128);  // hidden_size / heads
  EXPECT_EQ(m.num_key_value_heads, 8);
  EXPECT_EQ(m.max_model_len, 131072);
  EXPECT_EQ(m.num_layers_of(ModelLayerKind::full_attention), 32);
  // Defaults: kv heads = heads, float16 dtype.
  const ModelConfig d = parse_hf_config(R"({"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 64,
    "max_position_embeddings": 2048, "torch_dtype": "float16"})");
  EXPECT_EQ(d.num_key_value_heads, 4);
  EXPECT_EQ(d.dtype, DType::f16);
}

TEST(PlanModel, ParseSlidingWindowPatterns) {
  const ModelConfig g2 = parse_hf_config(R"({"model_type": "gemma2", "num_hidden_layers": 4,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "sliding_window": 4096,
    "max_position_embeddings": 8192, "torch_dtype": "bfloat16"})");
  EXPECT_EQ(g2.layer_kinds, (std::vector<ModelLayerKind>{ModelLayerKind::sliding_window, ModelLayerKind::full_attention,
                                                         ModelLayerKind::sliding_window, ModelLayerKind::full_attention}));
  const ModelConfig lt = parse_hf_config(R"({"num_hidden_layers": 3, "num_attention_heads": 8, "head_dim": 64,
    "sliding_window": 512, "max_position_embeddings": 4096,
    "layer_types": ["full_attention", "sliding_attention", "sliding_attention"]})");
  EXPECT_EQ(lt.num_layers_of(ModelLayerKind::sliding_window), 2);
  EXPECT_EQ(lt.sliding_window, 512);
  const ModelConfig g3 = parse_hf_config(R"({"num_hidden_layers": 6, "num_attention_heads": 8, "head_dim": 64,
    "sliding_window": 1024, "sliding_window_pattern": 3, "max_position_embeddings": 4096})");
  EXPECT_EQ(g3.layer_kinds[2], ModelLayerKind::full_attention);
  EXPECT_EQ(g3.layer_kinds[5], ModelLayerKind::full_attention);
  EXPECT_EQ(g3.num_layers_of(ModelLayerKind::sliding_window), 4);
  // Qwen-style use_sliding_window: false ignores the window.
  const ModelConfig q = parse_hf_config(R"({"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64,
    "sliding_window": 1024, "use_sliding_window": false, "max_position_embeddings": 4096})");
  EXPECT_EQ(q.num_layers_of(ModelLayerKind::sliding_window), 0);
}

TEST(PlanModel, ParseHybridMambaConfig) {
  const ModelConfig b = parse_hf_config(R"({"model_type": "bamba", "num_hidden_layers": 8, "hidden_size": 1024,
    "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 4096,
    "attn_layer_indices": [3, 7], "mamba_n_heads": 32, "mamba_d_head": 64, "mamba_d_state": 16,
    "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2, "torch_dtype": "bfloat16"})");
  EXPECT_EQ(b.num_layers_of(ModelLayerKind::full_attention), 2);
  EXPECT_EQ(b.layer_kinds[3], ModelLayerKind::full_attention);
  ASSERT_TRUE(b.mamba.has_value());
  EXPECT_EQ(b.mamba->conv_dim(), 2048 + 2 * 16);
  EXPECT_EQ(b.mamba->page_size_bytes(), (3 * 2080 + 32 * 64 * 16) * 2);
  const ModelConfig j = parse_hf_config(R"({"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
    "max_position_embeddings": 4096, "attn_layer_period": 2, "attn_layer_offset": 1,
    "mamba_n_heads": 16, "mamba_d_head": 64, "mamba_d_state": 16})");
  EXPECT_EQ(j.layer_kinds, (std::vector<ModelLayerKind>{ModelLayerKind::mamba, ModelLayerKind::full_attention,
                                                        ModelLayerKind::mamba, ModelLayerKind::full_attention}));
}

TEST(PlanModel, ParseErrorsNameTheProblem) {
  auto msg = [](const char* text) { return error_message([&] { (void)parse_hf_config(text, "cfg.json"); }); };
  EXPECT_NE(msg("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(msg("[1, 2]").find("JSON object"), std::string::npos);
  EXPECT_NE(msg(R"({"num_attention_heads": 8})").find("missing \"num_hidden_layers\""), std::string::npos);
  EXPECT_NE(msg(R"({"num_hidden_layers": "32"})").find("must be an integer"), std::string::npos);
  EXPECT_NE(msg(R"({"num_hidden_layers": -1})").find("out of range"), std::string::npos);
  EXPECT_NE(msg(R"({"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 3, "head_dim": 64,
    "max_position_embeddings": 10})").find("not a multiple of num_key_value_heads"), std::string::npos);
  EXPECT_NE(msg(R"({"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64})").find("max_position_embeddings"),
            std::string::npos);
  EXPECT_NE(msg(R"({"num_hidden_layers": 1, "num_attention_heads": 8, "head_dim": 64, "max_position_embeddings": 10,
    "torch_dtype": "int8"})").find("torch_dtype"), std::string::npos);
  EXPECT_NE(msg(R"({"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64, "max_position_embeddings": 10,
    "layer_types": ["full_attention"]})").find("layer_types"), std::string::npos);
  EXPECT_NE(msg(R"({"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64, "max_position_embeddings": 10,
    "attn_layer_indices": [5]})").find("attn_layer_indices"), std::string::npos);
  EXPECT_NE(msg(R"({"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64, "max_position_embeddings": 10,
    "layer_types": ["full_attention", "mamba"]})").find("mamba_n_heads"), std::string::npos);
  EXPECT_THROW((void)load_model_config("/nonexistent/config.json"), InvalidArgument);
}

TEST(PlanModel, MemorySizes) {
  EXPECT_EQ(parse_memory_size("80GiB"), 80 * kGiB);
  EXPECT_EQ(parse_memory_size("16GB"), 16'000'000'000);
  EXPECT_EQ(parse_memory_size("512 MiB"), 512 << 20);
  EXPECT_EQ(parse_memory_size("1.5GiB"), 3 * kGiB / 2);
  EXPECT_EQ(parse_memory_size("1073741824"), kGiB);
  EXPECT_EQ(parse_memory_size("4096b"), 4096);
  EXPECT_EQ(parse_memory_size("2g"), 2'000'000'000);
  for (const char* bad : {"", "GiB", "12XB", "1.2.3GB", "-5GB", "99999999999999999999", "123456789012345678901234567890.5GB", "1e30GiB", "."}) {
    const std::string m = error_message([&] { (void)parse_memory_size(bad); });
    EXPECT_NE(m.find("invalid memory size"), std::string::npos) << bad << ": " << m;
  }
  EXPECT_EQ(format_bytes(16 * kGiB), "16.00 GiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(12), "12 B");
}

TEST(Plan, Llama3At16GiB) {
  const KVPlan p = plan_kv_cache(model_preset("llama3-8b"), budget(16 * kGiB));
  EXPECT_EQ(p.layout, KVCacheLayout::LBNHC);
  EXPECT_NE(p.layout_reason.find("default preference"), std::string::npos);
  EXPECT_EQ(p.layout_candidates.size(), 6u);
  EXPECT_EQ(p.block_size, 16);
  ASSERT_EQ(p.config.kv_cache_groups.size(), 1u);
  // page = 16 tokens * 8 heads * (128 + 128) * 2 B = 65536; 32 layers per block.
  EXPECT_EQ(p.config.kv_cache_groups[0].kv_cache_spec->page_size_bytes(), 65536);
  EXPECT_EQ(p.bytes_per_block, 32 * 65536);
  EXPECT_EQ(p.config.num_blocks, 8192);
  EXPECT_EQ(p.total_bytes, 16 * kGiB);
  EXPECT_EQ(p.blocks_per_request, 512);  // 8192 / 16
  EXPECT_DOUBLE_EQ(p.max_concurrency, 8191.0 / 512.0);
  ASSERT_EQ(p.views.size(), 32u);
  // LBNHC: [B, H, N, C] with physical [B, N, H, C]; C = 256 bf16 elements.
  EXPECT_EQ(p.views[0].shape, (Dims{8192, 8, 16, 256}));
  EXPECT_EQ(p.views[0].strides, (Dims{16 * 8 * 256, 256, 8 * 256, 1}));
  EXPECT_EQ(p.views[31].byte_offset, 31 * int64_t{8192} * 65536);
  EXPECT_EQ(p.views[5].layer_name, "model.layers.5.self_attn.attn");
}

TEST(Plan, LayoutOverrideAndFp8) {
  PlanOptions o = budget(16 * kGiB);
  o.layout = layout_from_name("BLHNC");
  o.kv_cache_dtype = KVCacheDType::Fp8;
  const KVPlan p = plan_kv_cache(model_preset("llama3-8b"), o);
  EXPECT_EQ(p.layout, KVCacheLayout::BLHNC);
  EXPECT_NE(p.layout_reason.find("--layout BLHNC"), std::string::npos);
  EXPECT_EQ(p.kv_dtype, DType::fp8_e4m3);
  EXPECT_EQ(p.config.kv_cache_groups[0].kv_cache_spec->page_size_bytes(), 32768);
  EXPECT_EQ(p.config.num_blocks, 16384);
  // BLHNC: block stride = 32 layers * page; layer l at l * page.
  EXPECT_EQ(p.views[0].strides, (Dims{32 * 32768, 16 * 256, 256, 1}));
  EXPECT_EQ(p.views[3].byte_offset, 3 * 32768);
  PlanOptions alias = budget(16 * kGiB);
  alias.layout = layout_from_name("HND");
  EXPECT_EQ(plan_kv_cache(model_preset("llama3-8b"), alias).layout, KVCacheLayout::LBHNC);
}

TEST(Plan, Gemma2TwoGroupsWithSlidingWindow) {
  const KVPlan p = plan_kv_cache(model_preset("gemma2-9b"), budget(16 * kGiB));
  ASSERT_EQ(p.config.kv_cache_groups.size(), 2u);
  EXPECT_EQ(p.config.kv_cache_groups[0].kv_cache_spec->kind(), KVCacheSpecKind::SlidingWindow);
  EXPECT_EQ(p.config.kv_cache_groups[0].layer_names.size(), 21u);
  // page 16 * 8 * 512 * 2 = 131072; 21 layers per group, groups alias.
  EXPECT_EQ(p.bytes_per_block, 21 * 131072);
  EXPECT_EQ(p.config.num_blocks, 16 * kGiB / (21 * 131072));
  // Sliding window: cdiv(min(4095 + 2048, 8192), 16) + 1 = 385; full: 512.
  EXPECT_EQ(p.blocks_per_request, 385 + 512);
  EXPECT_EQ(p.views[0].spec_kind, "sliding_window");
  EXPECT_EQ(p.views[1].spec_kind, "full_attention");
  EXPECT_EQ(p.views[1].byte_offset, 0);  // first layer of the second group overlays group 0
}

TEST(Plan, HybridMambaRaisesBlockSizeAndPadsMambaPage) {
  const KVPlan p = plan_kv_cache(model_preset("hybrid-mamba"), budget(16 * kGiB));
  // Attention page per token 2 * 8 * 128 * 2 = 4096 B; Mamba state 2147840 B ->
  // 16 * cdiv(2147840, 16 * 4096) = 528 tokens.
  EXPECT_EQ(p.block_size, 528);
  int raw = 0;
  for (const auto& v : p.views) {
    if (v.raw) {
      ++raw;
      EXPECT_EQ(v.page_size_bytes, 528 * 4096);  // Mamba page padded to the attention page
    }
  }
  EXPECT_EQ(raw, 29);
  for (const auto& g : p.config.kv_cache_groups) EXPECT_EQ(g.kv_cache_spec->page_size_bytes(), 528 * 4096);
  // A user block size too small for a Mamba state is an error naming the minimum.
  PlanOptions o = budget(16 * kGiB);
  o.block_size = 16;
  const std::string msg = error_message([&] { (void)plan_kv_cache(model_preset("hybrid-mamba"), o); });
  EXPECT_NE(msg.find("--block-size >= 525"), std::string::npos) << msg;
}

TEST(Plan, MixedShapesNeedBlockOuterLayout) {
  // Sliding layers with 4 KV heads, full layers with 8: mixed (H, N, page) shapes and two
  // page sizes across two groups.  Only block-compact, block-outermost layouts can hold it.
  const ModelConfig m = parse_hf_config(R"({"model_type": "gemma2", "num_hidden_layers": 4,
    "num_attention_heads": 16, "num_key_value_heads": 8, "swa_num_key_value_heads": 4, "head_dim": 128,
    "sliding_window": 1024, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"})", "mixed.json");
  EXPECT_EQ(m.swa_num_key_value_heads, 4);
  const KVPlan p = plan_kv_cache(m, budget(kGiB));
  EXPECT_EQ(p.layout_candidates, (LayoutList{KVCacheLayout::BLNHC, KVCacheLayout::BLHNC}));
  EXPECT_EQ(p.layout, KVCacheLayout::BLNHC);
  EXPECT_NE(p.layout_reason.find("block-compact"), std::string::npos) << p.layout_reason;
  EXPECT_NE(p.layout_reason.find("cannot express mixed page sizes"), std::string::npos) << p.layout_reason;
  // Pages: sliding 16*4*256*2 = 32768, full 65536; a block holds both groups' layers packed:
  // max(2*32768, 2*65536) = 131072.
  EXPECT_EQ(p.bytes_per_block, 131072);
  EXPECT_EQ(p.views[0].shape, (Dims{p.config.num_blocks, 4, 16, 256}));
  EXPECT_EQ(p.views[1].shape, (Dims{p.config.num_blocks, 8, 16, 256}));
  EXPECT_EQ(p.views[0].strides[0], 131072 / 2);
  PlanOptions o = budget(kGiB);
  o.layout = layout_from_name("LHBNC");
  std::string msg = error_message([&] { (void)plan_kv_cache(m, o); });
  EXPECT_NE(msg.find("mixed (heads, states, page) shapes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("['BLNHC', 'BLHNC']"), std::string::npos) << msg;
  o.layout = layout_from_name("NHD");  // LBNHC: block-compact but layer-outer
  msg = error_message([&] { (void)plan_kv_cache(m, o); });
  EXPECT_NE(msg.find("mixed page sizes"), std::string::npos) << msg;
  o.layout = layout_from_name("BLHNC");
  EXPECT_EQ(plan_kv_cache(m, o).layout, KVCacheLayout::BLHNC);
}

TEST(Plan, BadInputsSayWhatToChange) {
  const ModelConfig llama = model_preset("llama3-8b");
  PlanOptions o = budget(16 * kGiB);
  std::string m = error_message([&] { (void)parse_kv_cache_dtype("int3"); });
  EXPECT_NE(m.find("int3"), std::string::npos) << m;
  EXPECT_NE(m.find("auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, nvfp4"), std::string::npos) << m;
  o.kv_cache_dtype = KVCacheDType::Nvfp4;
  EXPECT_THROW((void)plan_kv_cache(llama, o), Unsupported);
  o = budget(16 * kGiB);
  m = error_message([&] { (void)parse_layout_option("XYZ"); });
  EXPECT_NE(m.find("XYZ"), std::string::npos) << m;
  EXPECT_NE(m.find("LBHNC"), std::string::npos) << m;
  // Too small for one 8192-token request (512 blocks + the null block of 2 MiB).
  m = error_message([&] { (void)plan_kv_cache(llama, budget(512 << 20)); });
  EXPECT_NE(m.find("estimated maximum model length"), std::string::npos) << m;
  EXPECT_NE(m.find("--gpu-memory"), std::string::npos) << m;
  EXPECT_THROW((void)plan_kv_cache(llama, budget(0)), InvalidArgument);
  o = budget(16 * kGiB);
  o.block_size = 0;
  EXPECT_THROW((void)plan_kv_cache(llama, o), InvalidArgument);
  // A shorter max length fits a small budget: 1024 tokens = 64 blocks + 1.
  o = budget(65 * 2 * (int64_t{1} << 20));
  o.max_model_len = 1024;
  const KVPlan p = plan_kv_cache(llama, o);
  EXPECT_EQ(p.config.num_blocks, 65);
  EXPECT_DOUBLE_EQ(p.max_concurrency, 1.0);
}

}  // namespace
}  // namespace kvattn
