// The float32-cache paged attention on CUDA (src/ops/cuda/f32_attention.cu) against the CPU
// reference: f32 query, cache and output, tolerance 1e-5 (output: max error relative to
// max(|ref|, rms(ref)); LSE: absolute).  Random inputs, NaN-poisoned outputs and LSE, NaN in
// page 0 and in the unused slots of each last page, permuted page ids, padding rows that must
// stay untouched; both page forms, every KV layout, GQA 1/4/8, head dims 8..512, decode /
// prefill / mixed batches, causal / non-causal, window, soft cap, sinks, LSE in both bases,
// PrefixLM ranges, XQA draft masks.  Skips when no GPU is present.
#include <gtest/gtest.h>

#include <string>

#include "cuda_attn_case.h"
#include "kvattn/core/cuda_runtime_api.h"

namespace kvattn::ops {
namespace {
using namespace testing;

constexpr double kTol = 1e-5;

int64_t f32_launches() { return cuda_impl::f32_attention_launches(); }  // 0 without CUDA (tests skip)

class CudaF32Attention : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kvattn::cuda::available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
  }
  // Runs the case and checks that every GPU call went to the f32 kernel.
  static void run(const AttnCase& c, uint32_t seed) {
    const int64_t before = f32_launches();
    run_attn_case(c, seed);
    EXPECT_EQ(f32_launches() - before, c.repeats) << c.name;
  }
};

AttnCase f32_case(std::string name) {
  AttnCase c;
  c.name = std::move(name);
  c.q_dt = c.kv_dt = c.out_dt = DType::f32;
  c.out_tol = kTol;
  c.lse_tol = kTol;
  c.hq = 8;
  c.hkv = 2;
  return c;
}

TEST_F(CudaF32Attention, GqaHeadDimsDecodePrefillMixed) {
  uint32_t seed = 1000;
  for (int64_t dim : {64, 128, 256}) {
    for (int64_t group : {1, 4, 8}) {
      const std::string name = "dim " + std::to_string(dim) + " group " + std::to_string(group);
      AttnCase c = f32_case(name + " decode");
      c.dim = dim;
      c.hkv = 2;
      c.hq = 2 * group;
      c.q_lens = {1, 1, 1, 1};  // decode, odd lengths, an empty request
      c.kv_lens = {1, 7, 300, 0};
      run(c, seed++);
      c.name = name + " prefill";
      c.q_lens = {7, 33, 1};  // prefill (a whole request, a chunk after context) and a 1-row one
      c.kv_lens = {7, 70, 1};
      run(c, seed++);
      c.name = name + " mixed";
      c.q_lens = {1, 5, 0, 1, 33, 1};  // mixed, with a zero-query request
      c.kv_lens = {300, 5, 9, 0, 33, 1};
      run(c, seed++);
    }
  }
}

TEST_F(CudaF32Attention, EveryLayoutBothPageFormsCausalAndNot) {
  uint32_t seed = 1100;
  for (int layout = 0; layout < kNumLayouts; ++layout) {
    for (bool paged : {true, false}) {
      for (bool causal : {true, false}) {
        AttnCase c = f32_case(std::string("layout ") + layout_name(layout) + (paged ? " paged" : " block-table") +
                              (causal ? " causal" : " non-causal"));
        c.layout = layout;
        c.paged_form = paged;
        c.causal = causal;
        c.hq = 8; c.hkv = 4;
        c.q_lens = {1, 7, 33, 1};
        c.kv_lens = {33, 7, 40, 300};
        run(c, seed++);
      }
    }
  }
}

TEST_F(CudaF32Attention, WindowSoftCapSinksLseScales) {
  uint32_t seed = 1200;
  AttnCase c = f32_case("window 5");
  c.q_lens = {1, 7, 33, 1};
  c.kv_lens = {300, 7, 60, 1};
  c.window_left = 5;
  run(c, seed++);
  c.name = "window 100 non-causal";
  c.window_left = 100;
  c.causal = false;
  run(c, seed++);
  c.name = "window 0";
  c.window_left = 0;
  c.causal = true;
  run(c, seed++);
  c.name = "soft cap 5";
  c.window_left = -1;
  c.soft_cap = 5.0;
  run(c, seed++);
  c.name = "sinks, lse base e";
  c.soft_cap = 0;
  c.sinks = true;
  c.base = LseBase::E;
  run(c, seed++);
  c.name = "sinks, an empty request, window 0 non-causal";
  c.q_lens = {1, 1, 3};
  c.kv_lens = {0, 300, 3};
  c.window_left = 0;
  c.causal = false;  // each row sees the keys from its own position on; the empty one only its sink
  run(c, seed++);
  c.name = "everything: window, cap, sinks, scales, lse base 2, block table, GQA 8";
  c.q_lens = {1, 33, 7, 1};
  c.kv_lens = {301, 100, 7, 1};
  c.window_left = 40;
  c.causal = true;
  c.soft_cap = 8.0;
  c.sinks = true;
  c.base = LseBase::Two;
  c.k_scale = 0.7;
  c.v_scale = 1.3;
  c.paged_form = false;
  c.hq = 16; c.hkv = 2;
  run(c, seed++);
  c.name = "no lse";
  c.lse = false;
  run(c, seed++);
}

TEST_F(CudaF32Attention, PrefixLmRangesAndXqaMasks) {
  uint32_t seed = 1300;
  AttnCase c = f32_case("prefix-lm ranges");
  c.q_lens = {7, 33, 1, 4};
  c.kv_lens = {7, 50, 9, 300};
  c.mm = true;
  run(c, seed++);
  c.name = "prefix-lm ranges, window";
  c.window_left = 2;
  run(c, seed++);
  c.name = "xqa draft masks";
  c.mm = false;
  c.window_left = -1;
  c.xqa = true;
  c.q_lens = {3, 4, 1, 2};
  c.kv_lens = {50, 300, 9, 2};
  run(c, seed++);
  c.name = "xqa draft masks, block table, sinks";
  c.paged_form = false;
  c.sinks = true;
  run(c, seed++);
}

TEST_F(CudaF32Attention, OddHeadDimsPageSizesAndIndexTensors) {
  uint32_t seed = 1400;
  for (int64_t dim : {8, 40, 96, 200, 512}) {
    AttnCase c = f32_case("dim " + std::to_string(dim));
    c.dim = dim;
    c.q_lens = {1, 7, 1};
    c.kv_lens = {33, 7, 300};
    c.layout = dim % 16 == 0 ? 7 : 6;
    run(c, seed++);
  }
  for (int64_t page : {1, 5, 16, 64}) {
    AttnCase c = f32_case("page " + std::to_string(page));
    c.page = page;
    c.q_lens = {1, 33, 1};
    c.kv_lens = {1, 40, 300};
    c.paged_form = page % 2 == 0;
    run(c, seed++);
  }
  AttnCase c = f32_case("int64 strided indices, paged");
  c.q_lens = {1, 7, 33};
  c.kv_lens = {300, 7, 33};
  c.idx64 = true;
  c.idx_strided = true;
  run(c, seed++);
  c.name = "int64 strided indices, block table";
  c.paged_form = false;
  run(c, seed++);
  c.name = "long decode";
  c.idx64 = c.idx_strided = false;
  c.q_lens = {1, 1};
  c.kv_lens = {4099, 2500};
  run(c, seed++);
}

TEST_F(CudaF32Attention, QueryAndOutputDtypes) {
  uint32_t seed = 1500;
  AttnCase c = f32_case("f16 query, f32 out");
  c.q_dt = DType::f16;
  c.q_lens = {1, 7, 33};
  c.kv_lens = {300, 7, 40};
  run(c, seed++);
  c.name = "bf16 query and out";
  c.q_dt = c.out_dt = DType::bf16;
  c.out_tol = 1e-2;  // the output's bf16 rounding
  run(c, seed++);
}

TEST_F(CudaF32Attention, RepeatedCallsAndPlanIgnored) {
  AttnCase c = f32_case("repeated with a kept plan");
  c.q_lens = {1, 33, 0, 1};
  c.kv_lens = {300, 40, 3, 1};
  c.repeats = 3;
  c.keep_plan = true;
  c.plan_unused = true;
  run(c, 1600);
  c.name = "back to back";
  c.keep_plan = c.plan_unused = false;
  c.sync_each = false;
  run(c, 1601);
}

}  // namespace
}  // namespace kvattn::ops
