// The v6 decode path of attn_kernel (plan kernel, persistent grid pulling units from a work
// counter, merge kernel) under each of its knobs (kernels.h set_decode_options /
// set_decode_splits): the whole-wave split rule for uniform lengths (default) and the v6 rule,
// forced split counts (one chunk per request, more than a short request has tiles), the merge
// with partials in registers (<= 8 splits) and in rounds (more), the token -> splits map of
// short and long query ranges.  Every setting against the CPU reference on random inputs,
// outputs poisoned, permuted block tables with block 0 reserved, odd and empty lengths,
// repeated calls on one workspace.  Batches > 32 so the small-call path never takes them.
// The Deep* tests run option bit 2 (KVATTN_DECODE_DEEP: 3-stage, 2-CTA/SM kernel at D 128).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "kvattn/core/cuda_runtime_api.h"
#include "cuda_attn_case.h"

namespace kvattn::ops::testing {
namespace {

class CudaDecodeV6 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kvattn::cuda::available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
    opts0_ = cuda_impl::decode_options();
    cuda_impl::set_small_decode_mode(1);  // v6 path for every decode call
  }
  void TearDown() override {
    if (!kvattn::cuda::available()) return;
    cuda_impl::set_decode_options(opts0_);
    cuda_impl::set_decode_splits(0);
    cuda_impl::set_small_decode_mode(0);
  }
  int opts0_ = 1;
};

// 8 q / 2 KV heads keep the CPU reference fast; lengths mixed (v6 rule) or uniform (whole-wave
// rule when opts has bit 1).
AttnCase decode_case(std::mt19937& rng, int batch, bool uniform) {
  AttnCase c;
  c.hq = 8; c.hkv = 2;
  for (int r = 0; r < batch; ++r) {
    c.q_lens.push_back(!uniform && r % 23 == 7 ? 0 : 1);
    c.kv_lens.push_back(uniform ? 999 : (r % 19 == 3 ? 0 : 1 + static_cast<int64_t>(rng() % 1500)));
  }
  if (!uniform) c.kv_lens[5] = 5001;  // one long request: many chunks
  c.repeats = 2;
  return c;
}

TEST_F(CudaDecodeV6, SplitRulesAndForcedSplitCounts) {
  std::mt19937 rng(1601);
  uint32_t seed = 1610;
  for (int opts : {1, 0}) {
    for (int splits : {0, 1, 3, 40}) {
      for (bool uniform : {true, false}) {
        if (splits != 0 && uniform) continue;  // a forced count overrides either rule
        AttnCase c = decode_case(rng, 34, uniform);
        c.name = std::string(uniform ? "uniform" : "mixed") + " opts " + std::to_string(opts) + " splits " +
                 std::to_string(splits);
        cuda_impl::set_decode_options(opts);
        cuda_impl::set_decode_splits(splits);
        ASSERT_EQ(cuda_impl::decode_options(), opts);
        run_attn_case(c, seed++);
      }
    }
  }
}

TEST_F(CudaDecodeV6, Fp8SinksWindowMultiTokenAndLongQueries) {
  std::mt19937 rng(1701);
  uint32_t seed = 1710;
  for (int opts : {1, 0}) {
    cuda_impl::set_decode_options(opts);
    AttnCase c = decode_case(rng, 34, opts == 1);
    c.name = "fp8 e4m3 sinks softcap window, opts " + std::to_string(opts);
    c.kv_dt = DType::fp8_e4m3; c.k_scale = 0.6; c.v_scale = 1.4;
    c.sinks = true; c.soft_cap = 25.0; c.window_left = 700; c.base = LseBase::E;
    run_attn_case(c, seed++);
    AttnCase m = decode_case(rng, 34, false);
    m.name = "multi-token rows, gqa 8, D 64, block-table form, opts " + std::to_string(opts);
    // 1-2 query tokens x 8 heads: <= 16 rows per request on average (decode config)
    for (size_t i = 0; i < m.q_lens.size(); ++i) {
      m.q_lens[i] = m.q_lens[i] == 0 ? 0 : 1 + static_cast<int64_t>(i % 2);
      m.kv_lens[i] = std::max(m.kv_lens[i], m.q_lens[i]);
    }
    m.hq = 16; m.hkv = 2; m.dim = 64;
    m.paged_form = false;
    run_attn_case(m, seed++);
  }
  // query ranges > 64 tokens (the plan's block-wide token map) with split KV: fp8 pages keep the
  // call on attn_kernel's prefill config, D 256 and > 8 splits take the merge's round loop
  AttnCase l;
  l.name = "long queries, fp8, split KV";
  l.kv_dt = DType::fp8_e4m3; l.k_scale = 0.9; l.v_scale = 1.1;
  l.hq = 4; l.hkv = 2;
  l.q_lens = {100, 3, 70, 0, 65};
  l.kv_lens = {1500, 500, 900, 7, 2100};
  run_attn_case(l, 1790);
  l.name = "long queries, D 256, many splits";
  l.dim = 256;
  cuda_impl::set_decode_splits(12);
  run_attn_case(l, 1791);
}

// ---- KVATTN_DECODE_DEEP (option bit 2): D 128 decode calls on attn_kernel<..., DEEP> (3 K/V
// stages, 2 CTAs / SM, its own grid and wave plan); other head dims keep the default kernel.
// Each case checks the routing through decode_deep_launches().
constexpr int kDeep = 2;
void run_deep(const AttnCase& c, uint32_t seed) {
  const int64_t before = cuda_impl::decode_deep_launches();
  run_attn_case(c, seed);
  const int64_t want = c.dim == 128 ? c.repeats : 0;
  EXPECT_EQ(cuda_impl::decode_deep_launches() - before, want) << "deep routing, case " << c.name;
}

TEST_F(CudaDecodeV6, DeepEveryLayoutGqaOddLengths) {
  std::mt19937 rng(1801);
  uint32_t seed = 1810;
  for (int64_t group : {1, 4, 8}) {
    for (int layout = 0; layout < kNumLayouts; ++layout) {
      const int opts = kDeep | (layout % 2 == 0 ? 1 : 0);  // whole-wave rule and v6 rule
      cuda_impl::set_decode_options(opts);
      ASSERT_EQ(cuda_impl::decode_options(), opts);
      AttnCase c;
      c.name = "deep gqa" + std::to_string(group) + " layout " + layout_name(layout) + " opts " + std::to_string(opts);
      c.layout = layout;
      c.paged_form = (layout + group) % 2 == 0;
      c.hkv = 1 + layout % 3;
      c.hq = c.hkv * group;
      c.kv_dt = layout % 4 == 3 ? DType::f16 : DType::bf16;
      c.q_dt = c.out_dt = c.kv_dt;
      const int B = 3 + static_cast<int>(rng() % 40);
      for (int r = 0; r < B; ++r) {
        c.q_lens.push_back(1);
        c.kv_lens.push_back(rng() % 9 == 0 ? 0 : 1 + 2 * static_cast<int64_t>(rng() % 1100));  // odd
      }
      c.kv_lens[0] = 4001;  // one long request: many chunks (merge)
      c.base = layout % 2 ? LseBase::E : LseBase::Two;
      c.repeats = 2;
      run_deep(c, seed++);
    }
  }
}

TEST_F(CudaDecodeV6, DeepDtypesHeadDimsSplitsAndOptions) {
  std::mt19937 rng(1901);
  uint32_t seed = 1910;
  // every cache dtype at D 128 (deep) and D 64 (default kernel: routing only), uniform lengths
  // (the whole-wave rule on the deep grid) and mixed, forced split counts
  for (int64_t dim : {128, 64}) {
    for (DType kv : {DType::bf16, DType::f16, DType::fp8_e4m3, DType::fp8_e5m2}) {
      for (int splits : {0, 1, 3, 40}) {
        const bool uniform = splits == 0 && kv != DType::f16;
        cuda_impl::set_decode_options(kDeep | 1);
        cuda_impl::set_decode_splits(splits);
        AttnCase c = decode_case(rng, 34, uniform);
        c.name = std::string("deep dim ") + std::to_string(dim) + " kv " + dtype_name(kv) + " splits " +
                 std::to_string(splits) + (uniform ? " uniform" : " mixed");
        c.dim = dim;
        c.kv_dt = kv;
        c.q_dt = c.out_dt = kv == DType::f16 ? DType::f16 : DType::bf16;
        if (kv == DType::fp8_e4m3 || kv == DType::fp8_e5m2) { c.k_scale = 0.7; c.v_scale = 1.3; }
        if (splits == 3) { c.sinks = true; c.soft_cap = 25.0; c.window_left = 700; c.base = LseBase::E; }
        if (splits == 40) c.lse = false;
        run_deep(c, seed++);
      }
    }
  }
  cuda_impl::set_decode_splits(0);
  // multi-token decode rows (1-2 query tokens x gqa 8 <= 16 rows per request on average: decode
  // config), block-table form, sinks + window, both split rules
  for (int opts : {kDeep | 1, kDeep}) {
    cuda_impl::set_decode_options(opts);
    AttnCase m = decode_case(rng, 34, false);
    m.name = "deep multi-token rows, gqa 8, block-table form, opts " + std::to_string(opts);
    for (size_t i = 0; i < m.q_lens.size(); ++i) {
      m.q_lens[i] = m.q_lens[i] == 0 ? 0 : 1 + static_cast<int64_t>(i % 2);
      m.kv_lens[i] = std::max(m.kv_lens[i], m.q_lens[i]);
    }
    m.hq = 16; m.hkv = 2;
    m.paged_form = false;
    m.sinks = true; m.window_left = 300;
    run_deep(m, seed++);
  }
  // the bit is ignored where the small-call path takes the call (automatic routing, 3 requests)
  cuda_impl::set_small_decode_mode(0);
  cuda_impl::set_decode_options(kDeep | 1);
  AttnCase s;
  s.name = "deep bit on a small-path call";
  s.q_lens = {1, 1, 1};
  s.kv_lens = {2001, 17, 900};
  const int64_t before = cuda_impl::decode_deep_launches();
  run_attn_case(s, seed++);
  EXPECT_EQ(cuda_impl::decode_deep_launches(), before) << "small-call path has no deep variant";
}

}  // namespace
}  // namespace kvattn::ops::testing
