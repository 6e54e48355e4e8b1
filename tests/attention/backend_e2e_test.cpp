// End-to-end tests of the native (FLASHINFER) backend against dense attention over the unpaged
// K/V: allocation -> reorder -> metadata -> cache update -> forward (backend_harness.h).
#include "backend_harness.h"

namespace kvattn::test {
namespace {

E2EOptions base() { return E2EOptions{}; }

TEST(BackendE2E, StandardBatchSpecsMatchDenseReference) {
  for (const auto& spec : standard_batch_specs()) {
    SCOPED_TRACE(spec.name);
    auto r = expect_matches_oracle(base(), spec);
    // On CPU no NVIDIA kernel family applies: the FlashInfer-native paths run.
    EXPECT_EQ(r.kernel_path.find("trtllm"), std::string::npos) << r.kernel_path;
  }
}

TEST(BackendE2E, ReferenceBackendMatchesDenseReference) {
  E2EOptions o = base();
  o.backend = "REFERENCE";
  for (const auto& spec : {standard_batch_specs()[0], standard_batch_specs()[3], standard_batch_specs()[6]}) {
    SCOPED_TRACE(spec.name);
    expect_matches_oracle(o, spec);
  }
}

TEST(BackendE2E, EveryKVCacheLayoutTwoLayers) {
  const BatchSpec spec = make_batch("mixed_layouts", {40, 70, 33, 50}, {1, 1, 9, 20});
  for (KVCacheLayout layout : kAllKVCacheLayouts) {
    SCOPED_TRACE(layout_name(layout));
    E2EOptions o = base();
    o.layout = layout;
    o.num_layers = 2;
    expect_matches_oracle(o, spec);
  }
}

TEST(BackendE2E, DtypesF16AndF32) {
  const BatchSpec spec = make_batch("mixed_small", {32, 40, 48, 56}, {1, 1, 5, 5});
  for (DType d : {DType::f16, DType::f32}) {
    SCOPED_TRACE(dtype_name(d));
    E2EOptions o = base();
    o.dtype = d;
    expect_matches_oracle(o, spec);
  }
}

TEST(BackendE2E, HeadSize128AndMQA) {
  const BatchSpec spec = make_batch("mixed_small", {32, 40, 48}, {1, 1, 6});
  E2EOptions o = base();
  o.head_size = 128;
  o.num_q_heads = 4;
  o.num_kv_heads = 1;
  expect_matches_oracle(o, spec);
}

TEST(BackendE2E, SlidingWindow) {
  E2EOptions o = base();
  o.sliding_window = 24;
  for (const auto& spec : {make_batch("sw_mixed", {80, 100, 64, 90}, {1, 1, 20, 90}),
                           make_batch("sw_decode", {150, 49}, {1, 1})}) {
    SCOPED_TRACE(spec.name);
    expect_matches_oracle(o, spec);
  }
}

TEST(BackendE2E, SoftCap) {
  E2EOptions o = base();
  o.soft_cap = 5.0;
  expect_matches_oracle(o, make_batch("softcap_mixed", {60, 44, 70}, {1, 12, 70}));
}

TEST(BackendE2E, Sinks) {
  E2EOptions o = base();
  o.sinks = true;
  expect_matches_oracle(o, make_batch("sinks_mixed", {60, 44, 70, 33}, {1, 1, 12, 33}));
}

TEST(BackendE2E, SlidingWindowSoftCapAndSinksTogether) {
  E2EOptions o = base();
  o.sinks = true;
  o.soft_cap = 8.0;
  o.sliding_window = 32;
  expect_matches_oracle(o, make_batch("all_features", {90, 50, 64}, {1, 17, 64}));
}

TEST(BackendE2E, Fp8KVCache) {
  const BatchSpec spec = make_batch("fp8_mixed", {48, 64, 40, 33}, {1, 1, 10, 33});
  for (const char* kv : {"fp8", "fp8_e5m2"}) {
    SCOPED_TRACE(kv);
    E2EOptions o = base();
    o.kv_cache_dtype = parse_kv_cache_dtype(kv);
    o.k_scale = 0.5;
    o.v_scale = 0.25;
    expect_matches_oracle(o, spec);
  }
}

TEST(BackendE2E, NonCausal) {
  E2EOptions o = base();
  o.causal = false;
  auto r = expect_matches_oracle(o, make_batch("non_causal", {40, 30, 24}, {8, 30, 24}));
  EXPECT_EQ(r.kernel_path, "prefill=native decode=none");  // non-causal routes every row to prefill
}

TEST(BackendE2E, SpecDecodeOnCpuRunsAsPrefill) {
  // No XQA / trtllm-gen on CPU: spec queries stay prefills (threshold 1), still exact.
  E2EOptions o = base();
  o.num_spec_tokens = 2;
  expect_matches_oracle(o, make_batch("spec_uniform", {40, 50, 60}, {3, 3, 3}));
  expect_matches_oracle(o, make_batch("spec_ragged", {40, 50, 60, 45}, {3, 1, 2, 3}));
}

TEST(BackendE2E, KernelBlockSplittingManager64Kernel16) {
  E2EOptions o = base();
  o.block_size = 64;
  o.kernel_block_size = 16;
  o.num_layers = 2;
  for (KVCacheLayout layout : {KVCacheLayout::LBNHC, KVCacheLayout::LBHNC}) {
    SCOPED_TRACE(layout_name(layout));
    o.layout = layout;
    expect_matches_oracle(o, make_batch("split_mixed", {100, 130, 64, 65}, {1, 1, 30, 65}));
  }
}

TEST(BackendE2E, KVSharingBetweenLayers) {
  E2EOptions o = base();
  o.num_layers = 1;
  o.shared_layer = true;  // layer 1 reads layer 0's KV and writes none
  expect_matches_oracle(o, make_batch("kv_sharing", {40, 64, 50}, {1, 10, 50}));
}

TEST(BackendE2E, CascadeWithSharedPrefix) {
  E2EOptions o = base();
  o.common_prefix_len = 32;  // 2 shared pages
  auto r = expect_matches_oracle(o, make_batch("cascade", {60, 75, 48, 90}, {1, 1, 5, 12}));
  EXPECT_EQ(r.kernel_path, "cascade");
}

TEST(BackendE2E, CudaGraphPaddedDecodeBatch) {
  E2EOptions o = base();
  o.cudagraph = true;
  o.num_reqs_padded = 8;  // 3 real decodes + 5 zero-length padding requests
  expect_matches_oracle(o, make_batch("padded_decode", {40, 70, 33}, {1, 1, 1}));
}

// ---- simulated NVIDIA platforms: the seed's kernel choices, run on kvattn's kernels ------
TEST(BackendE2E, Sm90XqaDecodeWithSpecDecodeMasks) {
  E2EOptions o = base();
  o.platform.capability = DeviceCapability{9, 0};
  o.num_spec_tokens = 3;
  auto r = expect_matches_oracle(o, make_batch("xqa_uniform", {40, 50, 60, 70}, {4, 4, 4, 4}));
  EXPECT_EQ(r.kernel_path, "prefill=none decode=xqa");
  r = expect_matches_oracle(o, make_batch("xqa_ragged", {40, 50, 60, 70, 90}, {4, 1, 3, 2, 40}));
  EXPECT_EQ(r.kernel_path, "prefill=native decode=xqa");
}

TEST(BackendE2E, Sm90Fp8KVQuantisesPrefillQueryOnly) {
  E2EOptions o = base();
  o.platform.capability = DeviceCapability{9, 0};
  o.kv_cache_dtype = KVCacheDType::Fp8;
  o.q_scale = 0.5;
  o.k_scale = 0.5;
  auto r = expect_matches_oracle(o, make_batch("sm90_fp8", {48, 64, 40}, {1, 1, 40}));
  EXPECT_EQ(r.kernel_path, "prefill=native decode=xqa");
}

TEST(BackendE2E, Sm100TrtllmPrefillAndDecode) {
  E2EOptions o = base();
  o.platform.capability = DeviceCapability{10, 0};
  o.layout = KVCacheLayout::LBHNC;  // trtllm-gen reads HND pages
  o.num_spec_tokens = 1;
  auto r = expect_matches_oracle(o, make_batch("sm100", {48, 64, 40, 52}, {2, 2, 40, 9}));
  EXPECT_EQ(r.kernel_path, "prefill=trtllm decode=trtllm-gen");
}

TEST(BackendE2E, Sm100Fp8QueryAndFp8KV) {
  E2EOptions o = base();
  o.platform.capability = DeviceCapability{10, 0};
  o.layout = KVCacheLayout::BLHNC;
  o.kv_cache_dtype = KVCacheDType::Fp8;
  o.q_scale = 0.25;
  o.k_scale = 0.5;
  o.v_scale = 0.5;
  auto r = expect_matches_oracle(o, make_batch("sm100_fp8", {48, 64, 40}, {1, 1, 40}));
  EXPECT_EQ(r.kernel_path, "prefill=trtllm decode=trtllm-gen");
}

TEST(BackendE2E, Sm100Fp8KVWithModelDtypeQueryDequantisesPrefillPages) {
  E2EOptions o = base();
  o.platform.capability = DeviceCapability{10, 0};
  o.layout = KVCacheLayout::LBHNC;
  o.kv_cache_dtype = KVCacheDType::Fp8;
  o.attention_config.disable_flashinfer_q_quantization = true;
  o.attention_config.use_trtllm_attention = true;
  o.k_scale = 0.5;
  auto r = expect_matches_oracle(o, make_batch("sm100_fp8_bf16q", {48, 40, 70}, {1, 40, 20}));
  EXPECT_EQ(r.kernel_path, "prefill=trtllm decode=trtllm-gen");
}

TEST(BackendE2E, Sm100SinksAndWindowOnTrtllmPaths) {
  E2EOptions o = base();
  o.platform.capability = DeviceCapability{10, 0};
  o.layout = KVCacheLayout::LBHNC;
  o.sinks = true;
  o.sliding_window = 20;
  auto r = expect_matches_oracle(o, make_batch("sm100_sinks", {48, 64, 40}, {1, 1, 40}));
  EXPECT_EQ(r.kernel_path, "prefill=trtllm decode=trtllm-gen");
}

// ---- decode context parallel, simulated ranks -------------------------------------------
TEST(BackendE2E, DcpTwoRanksMixedBatch) {
  E2EOptions o = base();
  o.dcp = 2;
  o.num_q_heads = 4;
  o.num_kv_heads = 2;
  auto r = expect_matches_oracle(o, make_batch("dcp2", {40, 70, 33, 50}, {1, 1, 9, 20}));
  EXPECT_EQ(r.kernel_path, "prefill=dcp decode=native");
}

TEST(BackendE2E, DcpFourRanksInterleavedAllToAll) {
  E2EOptions o = base();
  o.dcp = 4;
  o.num_q_heads = 8;
  o.num_kv_heads = 2;
  o.dcp_interleave = 4;
  o.dcp_comm_backend = "a2a";
  expect_matches_oracle(o, make_batch("dcp4", {70, 90, 33, 50, 21}, {1, 1, 9, 50, 3}));
}

TEST(BackendE2E, DcpTwoRanksTrtllmGenDecode) {
  E2EOptions o = base();
  o.dcp = 2;
  o.platform.capability = DeviceCapability{10, 0};
  o.layout = KVCacheLayout::LBHNC;
  auto r = expect_matches_oracle(o, make_batch("dcp2_sm100", {40, 70, 33}, {1, 1, 12}));
  EXPECT_EQ(r.kernel_path, "prefill=dcp decode=trtllm-gen");
}

TEST(BackendE2E, ProfilingRunFillsZeros) {
  auto backend = AttentionBackendRegistry::global().get("FLASHINFER");
  BackendConfig cfg;
  cfg.num_attention_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.head_size = 64;
  cfg.max_model_len = 128;
  cfg.max_num_seqs = 4;
  cfg.max_num_batched_tokens = 64;
  AttentionImplParams p;
  p.num_heads = 4;
  p.num_kv_heads = 2;
  p.head_size = 64;
  p.scale = 0.125;
  auto impl = backend->make_impl(p, cfg);
  AttentionLayer layer = AttentionLayer::make("l0", impl);
  Tensor out = Tensor::empty({5, 4, 64}, DType::bf16);
  out.fill_(3.0);
  Tensor q = Tensor::zeros({5, 4, 64}, DType::bf16);
  impl->forward(layer, q, Tensor(), Tensor(), Tensor(), nullptr, out);
  for (double x : out.to_double_vector()) ASSERT_EQ(x, 0.0);
}

}  // namespace
}  // namespace kvattn::test

namespace kvattn::test {
namespace {

std::string first_error(const E2EOptions& o, const BatchSpec& spec) {
  E2ERunner runner(o);
  const E2EResult r = runner.run(spec);
  return r.errors.empty() ? std::string("no error") : r.errors.front();
}

TEST(BackendE2ERejects, DcpPrefillOfAKVSharingLayer) {
  E2EOptions o;
  o.dcp = 2;
  o.shared_layer = true;
  const std::string e = first_error(o, make_batch("dcp_sharing", {40, 30}, {1, 12}));
  EXPECT_NE(e.find("FlashInfer DCP prefill does not support KV-sharing layers"), std::string::npos) << e;
}

TEST(BackendE2ERejects, TrtllmGenDecodeNeedsAnHndLayout) {
  E2EOptions o;
  o.platform.capability = DeviceCapability{10, 0};
  o.layout = KVCacheLayout::LBNHC;
  const std::string e = first_error(o, make_batch("nhd", {40, 30}, {1, 1}));
  EXPECT_NE(e.find("trtllm-gen decode needs an HND KV cache layout, got LBNHC"), std::string::npos) << e;
}

TEST(BackendE2ERejects, CascadeWithAnFp8Cache) {
  E2EOptions o;
  o.kv_cache_dtype = KVCacheDType::Fp8;
  o.common_prefix_len = 16;
  const std::string e = first_error(o, make_batch("cascade_fp8", {40, 30}, {1, 1}));
  EXPECT_NE(e.find("cascade attention needs one query dtype for prefill and decode and an unquantised KV cache"),
            std::string::npos)
      << e;
}

TEST(BackendE2ERejects, SinksWithDcpOnTheTrtllmGenPath) {
  E2EOptions o;
  o.dcp = 2;
  o.sinks = true;
  o.platform.capability = DeviceCapability{10, 0};
  o.layout = KVCacheLayout::LBHNC;
  const std::string e = first_error(o, make_batch("dcp_sinks", {40, 30}, {1, 1}));
  EXPECT_NE(e.find("DCP decode does not support attention sinks"), std::string::npos) << e;
}

TEST(BackendE2ERejects, ReferenceBackendHasNoCascade) {
  E2EOptions o;
  o.backend = "REFERENCE";
  o.common_prefix_len = 16;
  const std::string e = first_error(o, make_batch("ref_cascade", {40, 30}, {1, 1}));
  EXPECT_NE(e.find("REFERENCE backend: cascade attention"), std::string::npos) << e;
}

}  // namespace
}  // namespace kvattn::test
