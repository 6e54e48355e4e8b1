// The native backend end to end on a CUDA device (kvattn's CUDA ops), against the same dense
// oracle as the CPU suite.  Skips where no GPU exists.
#include "backend_harness.h"
#include "kvattn/core/cuda_runtime_api.h"

namespace kvattn::test {
namespace {

E2EOptions cuda_options() {
  E2EOptions o;
  o.device = Device::cuda(0);
  return o;
}

#define REQUIRE_GPU() \
  if (!kvattn::cuda::available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)"

TEST(BackendE2ECuda, NativePathsMixedBatches) {
  REQUIRE_GPU();
  for (const auto& spec : {standard_batch_specs()[1], standard_batch_specs()[4], standard_batch_specs()[6]}) {
    SCOPED_TRACE(spec.name);
    auto r = expect_matches_oracle(cuda_options(), spec);
    EXPECT_EQ(r.kernel_path.find("trtllm"), std::string::npos) << r.kernel_path;
  }
}

TEST(BackendE2ECuda, EveryLayoutWithWindowSinksAndSoftCap) {
  REQUIRE_GPU();
  for (KVCacheLayout layout : kAllKVCacheLayouts) {
    SCOPED_TRACE(layout_name(layout));
    E2EOptions o = cuda_options();
    o.layout = layout;
    o.num_layers = 2;
    o.sinks = true;
    o.soft_cap = 8.0;
    o.sliding_window = 32;
    expect_matches_oracle(o, make_batch("features", {90, 50, 64}, {1, 17, 64}));
  }
}

TEST(BackendE2ECuda, Sm90XqaDecodeFp8AndSpecDecode) {
  REQUIRE_GPU();
  E2EOptions o = cuda_options();
  o.platform.capability = DeviceCapability{9, 0};
  o.num_spec_tokens = 3;
  auto r = expect_matches_oracle(o, make_batch("xqa_uniform", {40, 50, 60, 70}, {4, 4, 4, 4}));
  EXPECT_EQ(r.kernel_path, "prefill=none decode=xqa");
  E2EOptions f = cuda_options();
  f.platform.capability = DeviceCapability{9, 0};
  f.kv_cache_dtype = KVCacheDType::Fp8;
  f.k_scale = 0.5;
  r = expect_matches_oracle(f, make_batch("sm90_fp8", {48, 64, 40}, {1, 1, 40}));
  EXPECT_EQ(r.kernel_path, "prefill=native decode=xqa");
}

TEST(BackendE2ECuda, Sm100TrtllmPathsAndFp8Dequant) {
  REQUIRE_GPU();
  E2EOptions o = cuda_options();
  o.platform.capability = DeviceCapability{10, 0};
  o.layout = KVCacheLayout::LBHNC;
  o.kv_cache_dtype = KVCacheDType::Fp8;
  o.attention_config.disable_flashinfer_q_quantization = true;
  o.attention_config.use_trtllm_attention = true;
  auto r = expect_matches_oracle(o, make_batch("sm100_fp8_bf16q", {48, 40, 70}, {1, 40, 20}));
  EXPECT_EQ(r.kernel_path, "prefill=trtllm decode=trtllm-gen");
}

TEST(BackendE2ECuda, CascadeSplittingAndGraphPadding) {
  REQUIRE_GPU();
  E2EOptions c = cuda_options();
  c.common_prefix_len = 32;
  EXPECT_EQ(expect_matches_oracle(c, make_batch("cascade", {60, 75, 48, 90}, {1, 1, 5, 12})).kernel_path, "cascade");
  E2EOptions k = cuda_options();
  k.block_size = 64;
  k.kernel_block_size = 16;
  expect_matches_oracle(k, make_batch("split", {100, 130, 64, 65}, {1, 1, 30, 65}));
  E2EOptions g = cuda_options();
  g.cudagraph = true;
  g.num_reqs_padded = 8;
  expect_matches_oracle(g, make_batch("padded_decode", {40, 70, 33}, {1, 1, 1}));
}

// A float32 model (kv_cache_dtype "auto" = float32 caches): build() -> do_kv_cache_update ->
// forward on the GPU (the f32 attention kernel, the f32 cache write, the f32 cascade merge)
// against the oracle and against the same steps on the CPU backend (max |GPU - CPU| <= 1e-5).
TEST(BackendE2ECuda, Float32ModelMatchesCpuBackend) {
  REQUIRE_GPU();
  struct Variant {
    const char* name;
    E2EOptions o;
    bool mixed_only = false;  // the layout sweep: one batch each
  };
  std::vector<Variant> variants;
  {
    E2EOptions o;
    o.dtype = DType::f32;
    o.num_layers = 2;
    variants.push_back({"plain", o});
    for (KVCacheLayout layout : kAllKVCacheLayouts) {
      E2EOptions l = o;
      l.layout = layout;
      l.num_layers = 1;
      variants.push_back({layout_name(layout), l, true});
    }
    o.layout = KVCacheLayout::LBHNC;
    o.sinks = true;
    o.soft_cap = 8.0;
    o.sliding_window = 32;
    o.num_q_heads = 8;
    o.head_size = 128;
    variants.push_back({"HND, sinks, soft cap, window, GQA 4, D 128", o});
    E2EOptions c;
    c.dtype = DType::f32;
    c.common_prefix_len = 32;
    variants.push_back({"cascade", c});
    E2EOptions g;
    g.dtype = DType::f32;
    g.cudagraph = true;
    g.num_reqs_padded = 8;
    variants.push_back({"padded decode", g});
  }
  const std::vector<BatchSpec> specs = {make_batch("f32_mixed", {1, 7, 33, 300}, {1, 7, 33, 1}),
                                        make_batch("f32_decode", {300, 41, 1}, {1, 1, 1}),
                                        make_batch("f32_prefix", {60, 75, 48, 90}, {1, 1, 5, 12})};
  for (const Variant& v : variants) {
    for (const BatchSpec& spec : specs) {
      if (v.o.common_prefix_len > 0 && spec.name != "f32_prefix") continue;  // cascade needs the shared prefix
      if (v.o.cudagraph && spec.name != "f32_decode") continue;              // a pure decode batch
      if (v.mixed_only && spec.name != "f32_mixed") continue;
      SCOPED_TRACE(std::string(v.name) + " / " + spec.name);
      E2EOptions gpu = v.o;
      gpu.device = Device::cuda(0);
      const E2EResult g = expect_matches_oracle(gpu, spec);
      if (v.o.common_prefix_len > 0) {
        EXPECT_EQ(g.kernel_path, "cascade");
      }
      const E2EResult c = expect_matches_oracle(v.o, spec);
      EXPECT_LE(max_output_diff(g, c), 1e-5) << "GPU f32 output differs from the CPU backend's";
    }
  }
}

}  // namespace
}  // namespace kvattn::test
