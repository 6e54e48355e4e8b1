// AttentionBackend traits, validate_configuration, the registry and the selector.
#include <gtest/gtest.h>

#include <algorithm>

#include "kvattn/attention/backend_registry.h"
#include "kvattn/attention/native_backend.h"
#include "kvattn/attention/reference_backend.h"
#include "kvattn/kv/block_size.h"

namespace kvattn {
namespace {

BackendConfig config(std::optional<DeviceCapability> cap = std::nullopt) {
  BackendConfig c;
  c.platform.capability = cap;
  c.num_attention_heads = 32;
  c.num_kv_heads = 8;
  c.head_size = 128;
  c.max_model_len = 4096;
  c.max_num_seqs = 64;
  c.max_num_batched_tokens = 2048;
  return c;
}

bool contains(const std::vector<std::string>& v, std::string_view needle) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& s) { return s.find(needle) != std::string::npos; });
}

std::vector<int64_t> exact_sizes(const std::vector<KernelBlockSize>& sizes) {
  std::vector<int64_t> out;
  for (const auto& s : sizes) out.push_back(std::get<int64_t>(s));
  return out;
}

TEST(BackendTraitsNative, DeclaredTraitsOnCpu) {
  FlashInferBackend b;
  const BackendConfig c = config();
  EXPECT_EQ(b.get_name(), "FLASHINFER");
  EXPECT_TRUE(b.supports_dtype(DType::bf16));
  EXPECT_TRUE(b.supports_dtype(DType::f16));
  EXPECT_FALSE(b.supports_dtype(DType::f32));
  for (const char* kv : {"auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"})
    EXPECT_TRUE(b.supports_kv_cache_dtype(parse_kv_cache_dtype(kv), c)) << kv;
  EXPECT_FALSE(b.supports_kv_cache_dtype(KVCacheDType::Nvfp4, c));
  EXPECT_FALSE(b.supports_kv_cache_dtype(KVCacheDType::Nvfp4, config(DeviceCapability{10, 0})));  // no NVFP4 kernel
  EXPECT_THROW((void)parse_kv_cache_dtype("int8"), InvalidArgument);  // not a kv_cache_dtype name
  EXPECT_EQ(exact_sizes(b.get_supported_kernel_block_sizes(nullptr, c)), (std::vector<int64_t>{16, 32, 64}));
  EXPECT_EQ(b.get_supported_head_sizes(), (std::vector<int64_t>{64, 128, 256, 512}));
  EXPECT_TRUE(b.supports_head_size(256));
  EXPECT_FALSE(b.supports_head_size(80));
  EXPECT_TRUE(b.supports_block_size(48, c));  // a multiple of 16
  EXPECT_FALSE(b.supports_block_size(8, c));
  EXPECT_EQ(b.get_preferred_block_size(8, c), 16);
  EXPECT_EQ(b.get_preferred_block_size(32, c), 32);
  EXPECT_FALSE(b.forward_includes_kv_cache_update());
  EXPECT_TRUE(b.supports_sliding_window());
  EXPECT_TRUE(b.supports_non_causal());
  EXPECT_TRUE(b.supports_sink(c));
  EXPECT_TRUE(b.supports_dcp());
  EXPECT_FALSE(b.is_mla());
  EXPECT_TRUE(b.supports_attn_type(AttentionType::DECODER));
  EXPECT_FALSE(b.supports_attn_type(AttentionType::ENCODER_DECODER));
  EXPECT_FALSE(b.supported_kv_cache_layouts(c).has_value());  // any layout (strided kernels)
}

TEST(BackendTraitsNative, PlatformDependentTraits) {
  FlashInferBackend b;
  // Large pages only with GQA on SM100 where trtllm-gen is usable.
  EXPECT_EQ(exact_sizes(b.get_supported_kernel_block_sizes(nullptr, config(DeviceCapability{10, 0}))),
            (std::vector<int64_t>{16, 32, 64, 128, 256, 512, 1024}));
  BackendConfig mha = config(DeviceCapability{10, 0});
  mha.num_kv_heads = 32;
  EXPECT_EQ(exact_sizes(b.get_supported_kernel_block_sizes(nullptr, mha)), (std::vector<int64_t>{16, 32, 64}));
  BackendConfig never = config(DeviceCapability{10, 0});
  never.attention_config.use_trtllm_attention = false;
  EXPECT_EQ(exact_sizes(b.get_supported_kernel_block_sizes(nullptr, never)), (std::vector<int64_t>{16, 32, 64}));
  // Layouts: SM100 needs head-major block interiors.
  EXPECT_EQ(*b.supported_kv_cache_layouts(config(DeviceCapability{10, 0})),
            (LayoutList{KVCacheLayout::LBHNC, KVCacheLayout::BLHNC}));
  EXPECT_FALSE(b.supported_kv_cache_layouts(config(DeviceCapability{9, 0})).has_value());
  // Compute capability window [8.0, 12.1]; CPU always.
  EXPECT_TRUE(b.supports_compute_capability(std::nullopt));
  EXPECT_FALSE(b.supports_compute_capability(DeviceCapability{7, 5}));
  EXPECT_TRUE(b.supports_compute_capability(DeviceCapability{8, 0}));
  EXPECT_TRUE(b.supports_compute_capability(DeviceCapability{12, 1}));
  EXPECT_FALSE(b.supports_compute_capability(DeviceCapability{12, 2}));
  // Device/host query-length mismatch: only trtllm-gen decode (SM100, no DCP).
  EXPECT_FALSE(b.supports_device_cpu_query_lens_mismatch(config()));
  EXPECT_FALSE(b.supports_device_cpu_query_lens_mismatch(config(DeviceCapability{9, 0})));
  EXPECT_TRUE(b.supports_device_cpu_query_lens_mismatch(config(DeviceCapability{10, 0})));
  BackendConfig dcp = config(DeviceCapability{10, 0});
  dcp.decode_context_parallel_size = 2;
  EXPECT_FALSE(b.supports_device_cpu_query_lens_mismatch(dcp));
}

TEST(BackendTraitsNative, CudaGraphSupportAndVarlenMaxQueryLen) {
  FlashInferBackend b;
  auto spec64 = FullAttentionSpec(16, 8, 64, DType::bf16);
  auto spec512 = FullAttentionSpec(16, 8, 512, DType::bf16);
  EXPECT_EQ(b.get_cudagraph_support(config(), spec64), AttentionCGSupport::UNIFORM_SINGLE_TOKEN_DECODE);
  EXPECT_EQ(b.get_cudagraph_support(config(DeviceCapability{10, 0}), spec64), AttentionCGSupport::UNIFORM_BATCH);
  EXPECT_EQ(b.get_cudagraph_support(config(DeviceCapability{9, 0}), spec64), AttentionCGSupport::UNIFORM_BATCH);
  // XQA's head-dim limit.
  EXPECT_EQ(b.get_cudagraph_support(config(DeviceCapability{9, 0}), spec512),
            AttentionCGSupport::UNIFORM_SINGLE_TOKEN_DECODE);
  BackendConfig dcp = config(DeviceCapability{10, 0});
  dcp.decode_context_parallel_size = 2;
  EXPECT_EQ(b.get_cudagraph_support(dcp, spec64), AttentionCGSupport::UNIFORM_SINGLE_TOKEN_DECODE);
  BackendConfig nc = config(DeviceCapability{10, 0});
  nc.attention_config.use_non_causal = true;
  EXPECT_EQ(b.get_cudagraph_support(nc, spec64), AttentionCGSupport::UNIFORM_SINGLE_TOKEN_DECODE);
  // Varlen graphs: trtllm-gen with adaptive verification only.
  BackendConfig av = config(DeviceCapability{10, 0});
  av.num_speculative_tokens = 2;
  av.enable_adaptive_verification = true;
  EXPECT_EQ(b.get_varlen_cudagraph_max_query_len(av, spec64), std::optional<int64_t>(3));
  av.parallel_drafting = true;
  EXPECT_EQ(b.get_varlen_cudagraph_max_query_len(av, spec64), std::optional<int64_t>(5));
  av.enable_adaptive_verification = false;
  EXPECT_FALSE(b.get_varlen_cudagraph_max_query_len(av, spec64).has_value());
  EXPECT_FALSE(b.get_varlen_cudagraph_max_query_len(config(), spec64).has_value());
}

TEST(BackendTraitsNative, ValidateConfigurationListsEveryReason) {
  FlashInferBackend b;
  AttentionSelectorConfig ok;
  ok.block_size = 16;
  EXPECT_TRUE(b.validate_configuration(ok, config()).empty());
  AttentionSelectorConfig bad;
  bad.head_size = 80;
  bad.dtype = DType::f32;
  bad.kv_cache_dtype = KVCacheDType::Nvfp4;
  bad.block_size = 8;
  bad.use_mla = true;
  bad.use_sparse = true;
  bad.use_mm_prefix = true;
  bad.attn_type = AttentionType::ENCODER;
  bad.use_pcp = true;
  bad.use_adaptive_verification = true;  // needs SM100 trtllm-gen
  const auto reasons = b.validate_configuration(bad, config());
  EXPECT_TRUE(contains(reasons, "head_size 80 not supported (supported: [64, 128, 256, 512])"));
  EXPECT_TRUE(contains(reasons, "dtype float32 not supported (supported: [float16, bfloat16])"));
  EXPECT_TRUE(contains(reasons, "kv_cache_dtype 'nvfp4' not supported"));
  EXPECT_TRUE(contains(reasons, "block_size 8 not supported (kernel block sizes: [16, 32, 64])"));
  EXPECT_TRUE(contains(reasons, "MLA not supported"));
  EXPECT_TRUE(contains(reasons, "sparse not supported"));
  EXPECT_TRUE(contains(reasons, "partial multimodal token full attention not supported"));
  EXPECT_TRUE(contains(reasons, "attention type encoder not supported"));
  EXPECT_TRUE(contains(reasons, "prefill context parallel not supported"));
  EXPECT_TRUE(contains(reasons, "device-cpu query lens mismatch not supported"));
  EXPECT_EQ(reasons.size(), 10u);
  // Compute capability below SM80.
  EXPECT_TRUE(contains(b.validate_configuration(ok, config(DeviceCapability{7, 5})),
                       "compute capability 7.5 not supported"));
  // Adaptive verification is fine on SM100.
  AttentionSelectorConfig av = ok;
  av.use_adaptive_verification = true;
  EXPECT_TRUE(b.validate_configuration(av, config(DeviceCapability{10, 0})).empty());
}

TEST(BackendTraitsReference, AcceptsWhatTheNativeBackendRejects) {
  ReferenceBackend r;
  AttentionSelectorConfig sel;
  sel.head_size = 80;
  sel.dtype = DType::f32;
  sel.block_size = 8;
  sel.has_sink = true;
  sel.has_sliding_window = true;
  EXPECT_TRUE(r.validate_configuration(sel, config()).empty());
  sel.use_dcp = true;
  EXPECT_TRUE(contains(r.validate_configuration(sel, config()), "decode context parallel not supported"));
  sel.use_dcp = false;
  EXPECT_TRUE(contains(r.validate_configuration(sel, config(DeviceCapability{9, 0})), "compute capability 9.0"));
}

TEST(BackendRegistry, NamesGetAndCustomBackends) {
  auto& g = AttentionBackendRegistry::global();
  EXPECT_EQ(g.names(), (std::vector<std::string>{"FLASHINFER", "REFERENCE"}));
  EXPECT_EQ(g.get("FLASHINFER")->get_name(), "FLASHINFER");
  try {
    (void)g.get("FLASH_ATTN");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("registered backends: [FLASHINFER, REFERENCE]"), std::string::npos) << e.what();
  }
  AttentionBackendRegistry local;
  local.register_backend(std::make_shared<ReferenceBackend>(), 0);
  local.register_backend(std::make_shared<FlashInferBackend>(), 5);
  EXPECT_EQ(local.names(), (std::vector<std::string>{"REFERENCE", "FLASHINFER"}));
  EXPECT_TRUE(local.contains("REFERENCE"));
  EXPECT_FALSE(local.contains("X"));
}

TEST(BackendSelector, PicksTheFirstValidBackendAndSaysWhy) {
  AttentionSelectorConfig sel;
  sel.block_size = 16;
  auto s = select_attention_backend(sel, config());
  EXPECT_EQ(s.backend->get_name(), "FLASHINFER");
  EXPECT_EQ(s.log, (std::vector<std::string>{"FLASHINFER: selected", "REFERENCE: valid, not taken (lower priority)"}));

  sel.head_size = 80;
  s = select_attention_backend(sel, config());
  EXPECT_EQ(s.backend->get_name(), "REFERENCE");
  ASSERT_EQ(s.log.size(), 2u);
  EXPECT_EQ(s.log[0], "FLASHINFER: rejected (head_size 80 not supported (supported: [64, 128, 256, 512]))");
  EXPECT_EQ(s.log[1], "REFERENCE: selected");
}

TEST(BackendSelector, RequestedAndImpossibleConfigurations) {
  AttentionSelectorConfig sel;
  sel.head_size = 80;
  try {
    (void)select_attention_backend(sel, config(), std::string("FLASHINFER"));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("Attention backend FLASHINFER cannot run this configuration"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("head_size 80 not supported"), std::string::npos);
  }
  EXPECT_THROW((void)select_attention_backend(sel, config(), std::string("NOPE")), InvalidArgument);
  AttentionSelectorConfig mla;
  mla.use_mla = true;
  try {
    (void)select_attention_backend(mla, config());
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("No attention backend supports this configuration"), std::string::npos);
    EXPECT_NE(w.find("FLASHINFER: rejected (MLA not supported)"), std::string::npos) << w;
    EXPECT_NE(w.find("REFERENCE: rejected (MLA not supported)"), std::string::npos) << w;
  }
}

TEST(BackendTraitsNative, BlockSizeBackendFeedsTheKernelBlockSelection) {
  FlashInferBackend b;
  const BlockSizeBackend bsb = b.block_size_backend(config());
  EXPECT_EQ(bsb.get_name(), "FLASHINFER");
  EXPECT_EQ(select_common_block_size(64, {&bsb}), 64);
  EXPECT_EQ(select_common_block_size(128, {&bsb}), 64);  // the largest exact size dividing 128
  EXPECT_THROW((void)select_common_block_size(8, {&bsb}), InvalidArgument);
}

TEST(BackendTraitsNative, CustomizeSpecPacksNvfp4Heads) {
  FlashInferBackend b;
  AttentionSpecOptions o;
  o.kv_quant_mode = KVQuantMode::NVFP4;
  auto spec = FullAttentionSpec(16, 4, 128, DType::u8, o);
  auto c = b.customize_spec(spec, config());
  EXPECT_EQ(c->num_heads(), 8);                       // K and V head slots
  EXPECT_EQ(c->state_content_size_bytes(), 64 + 8);  // packed fp4 data + fp8 block scales
  auto plain = FullAttentionSpec(16, 4, 128, DType::bf16);
  EXPECT_EQ(b.customize_spec(plain, config()), plain);
}

TEST(BackendTraitsNative, TrtllmAvailabilityRules) {
  const BackendConfig cpu = config(), sm90 = config(DeviceCapability{9, 0}), sm100 = config(DeviceCapability{10, 0}),
                      sm120 = config(DeviceCapability{12, 0});
  EXPECT_FALSE(supports_trtllm_attention(cpu, false));
  EXPECT_TRUE(supports_trtllm_attention(sm90, false));
  EXPECT_FALSE(supports_trtllm_attention(sm90, true));  // XQA decode only
  EXPECT_TRUE(supports_trtllm_attention(sm120, false));
  EXPECT_TRUE(supports_trtllm_attention(sm100, true));
  BackendConfig inv = sm100;
  inv.batch_invariant = true;
  EXPECT_FALSE(supports_trtllm_attention(inv, true));
  EXPECT_FALSE(can_use_trtllm_attention(sm100, 30, 8));  // heads not divisible
  // use_trtllm_attention decision table.
  auto use = [](const BackendConfig& c, int64_t tokens, std::string_view kv, DType q, bool prefill,
                std::optional<bool> force, bool sinks = false, bool spec = false, int64_t dcp = 1) {
    return use_trtllm_attention(c, 32, 8, tokens, 4096, dcp, parse_kv_cache_dtype(kv), q, prefill, force, sinks, spec);
  };
  EXPECT_TRUE(use(sm100, 1000, "auto", DType::bf16, true, std::nullopt));
  EXPECT_FALSE(use(sm100, 1000, "fp8", DType::bf16, true, std::nullopt));
  EXPECT_TRUE(use(sm100, 1000, "fp8", DType::fp8_e4m3, true, std::nullopt));  // fp8 query
  EXPECT_TRUE(use(sm100, 1000, "fp8", DType::bf16, true, std::nullopt, /*sinks=*/true));
  EXPECT_FALSE(use(sm100, 1000, "auto", DType::bf16, true, false));
  EXPECT_FALSE(use(sm100, 10, "auto", DType::bf16, true, true, false, false, /*dcp=*/2));
  EXPECT_TRUE(use(sm100, 256, "auto", DType::bf16, false, std::nullopt));
  EXPECT_FALSE(use(sm100, 257, "auto", DType::bf16, false, std::nullopt));
  EXPECT_TRUE(use(sm100, 257, "auto", DType::bf16, false, std::nullopt, false, /*spec=*/true));
  EXPECT_TRUE(use(sm90, 1000, "fp8", DType::bf16, false, std::nullopt));  // XQA with fp8 KV
  EXPECT_FALSE(use(sm90, 10, "auto", DType::bf16, true, true));          // no SM90 trtllm prefill
}

}  // namespace
}  // namespace kvattn
