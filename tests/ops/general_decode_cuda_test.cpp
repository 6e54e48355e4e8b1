// The general decode path of attn_kernel (plan kernel, persistent grid pulling units from a work
// counter, merge kernel) under each of its knobs (kernels.h set_decode_options /
// set_decode_splits): the whole-wave split rule for uniform lengths (default) and the per-request rule,
// forced split counts (one chunk per request, more than a short request has tiles), the merge
// with partials in registers (<= 8 splits) and in rounds (more), the token -> splits map of
// short and long query ranges.  Every setting against the CPU reference on random inputs,
// outputs poisoned, permuted block tables with block 0 reserved, odd and empty lengths,
// repeated calls on one workspace.  Batches > 32 so the small-call path never takes them.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "kvattn/core/cuda_runtime_api.h"
#include "cuda_attn_case.h"

namespace kvattn::ops::testing {
namespace {

class CudaGeneralDecode : public CudaGeneralDecodeTest {};

// 8 q / 2 KV heads keep the CPU reference fast; lengths mixed (per-request rule) or uniform (whole-wave
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

TEST_F(CudaGeneralDecode, SplitRulesAndForcedSplitCounts) {
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

TEST_F(CudaGeneralDecode, Fp8SinksWindowMultiTokenAndLongQueries) {
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

// Option bit 8: uniform lengths may take a chunk that does not divide the request (units of ct,
// ..., ct and a short rem), the plan writing the items long units first.  bf16 and fp8 (fast
// variant), single- and two-token rows, D 128 and 64, every layout, both page-table forms,
// against the CPU reference.  Whether the rule takes a remainder chunk depends on the grid: for
// 150 requests x 1500 keys at 4 q / 2 KV heads the model picks
// one with 64-key and 128-key tiles at 132, 264, 396 and 528 CTAs, so on a 132-SM GPU (H100/H200;
// D 128 runs 3 CTAs per SM there) every D-128 call is checked to have taken it
// (rem_split_plans()); on other GPUs the calls are still checked against the reference.
TEST_F(CudaGeneralDecode, NonDividingChunksLongUnitsFirst) {
  std::mt19937 rng(1801);
  uint32_t seed = 1810;
  const int pages[] = {16, 1, 32, 16, 64};
  for (int layout = 0; layout < kNumLayouts; ++layout) {
    AttnCase c;
    c.hq = 4; c.hkv = 2;  // (the plan sees 300 (request, KV head) pairs; 4 q heads keep the reference quick)
    const bool fp8 = layout % 2 == 1, two_tokens = layout % 3 == 2;
    for (int r = 0; r < 150; ++r) {
      c.q_lens.push_back(two_tokens ? 2 : 1);
      c.kv_lens.push_back(1500 - (r % 5 == 0 ? static_cast<int64_t>(rng() % 28) : 0));  // same tile count
    }
    c.layout = layout;
    c.page = pages[layout % 5];
    c.paged_form = layout % 4 != 3;
    c.dim = layout == 4 ? 64 : 128;
    if (fp8) { c.kv_dt = layout % 3 == 0 ? DType::fp8_e5m2 : DType::fp8_e4m3; c.k_scale = 0.7; c.v_scale = 1.3; }
    c.repeats = layout == 0 ? 2 : 1;
    c.name = "layout " + std::to_string(layout) + (fp8 ? " fp8" : " bf16") + (two_tokens ? " two-token rows" : "");
    cuda_impl::set_decode_options(1 | 4 | 8);
    const int64_t n0 = cuda_impl::rem_split_plans();
    run_attn_case(c, seed++);
    if (c.dim == 128 && kvattn::cuda::multiprocessor_count(0) == 132) {
      EXPECT_EQ(cuda_impl::rem_split_plans() - n0, c.repeats) << c.name << ": the plan kept a dividing chunk";
    }
  }
  // the bit is on by default; without it no plan takes a remainder chunk
  EXPECT_EQ(opts0_ & 8, 8);
  cuda_impl::set_decode_options(1 | 4);
  AttnCase c = decode_case(rng, 150, true);
  c.name = "uniform, bit off";
  const int64_t n0 = cuda_impl::rem_split_plans();
  run_attn_case(c, seed++);
  EXPECT_EQ(cuda_impl::rem_split_plans(), n0);
}

// The forced remainder chunk (set_decode_chunk, the measurement knob of the tail's unit sizes):
// every layout and page size, bf16 (2 stages at D 128, 3 at D 64) and fp8 (fast variant), the
// work counter and the stream-K schedule (which ignores the knob), uniform lengths (forced chunks
// of 3, 7 and 11 tiles cut the 999-key, 16-tile requests into long units and a short last one)
// and mixed ones with empty requests, page ids / block tables of int32 and int64 and strided,
// against the CPU reference.
TEST_F(CudaGeneralDecode, ForcedChunksEveryLayout) {
  std::mt19937 rng(1901);
  uint32_t seed = 1910;
  const int pages[] = {16, 1, 32, 16, 64};
  for (int layout = 0; layout < kNumLayouts; ++layout) {
    for (int variant = 0; variant < 3; ++variant) {
      const bool uniform = (layout + variant) % 2 == 0;
      AttnCase c = decode_case(rng, 40, uniform);
      c.layout = layout;
      c.page = pages[layout % 5];
      c.paged_form = layout % 4 != 3;
      const bool fp8 = (layout + variant) % 3 == 1;
      if (fp8) { c.kv_dt = DType::fp8_e4m3; c.k_scale = 0.8; c.v_scale = 1.2; }
      if (!fp8 && variant == 1) c.dim = 64;
      const int sched = variant == 2 && layout % 2 == 1 ? 16 : 0;  // stream-K on some
      const int chunk = uniform ? 3 + 4 * (layout % 3) : 0;
      c.repeats = variant == 0 ? 2 : 1;
      c.idx64 = (layout + variant) % 2 == 1;  // the page-id loads of both widths and strides
      c.idx_strided = (layout + variant) % 3 != 2;
      c.name = "layout " + std::to_string(layout) + (fp8 ? " fp8" : " bf16") + " D " + std::to_string(c.dim) +
               (uniform ? " uniform, chunk " + std::to_string(chunk) : " mixed") + (sched ? " stream-K" : "") +
               (c.idx64 ? ", int64 indices" : ", int32 indices") + (c.idx_strided ? " (strided)" : "");
      cuda_impl::set_decode_options(1 | 4 | 8 | sched);
      cuda_impl::set_decode_chunk(chunk);
      ASSERT_EQ(cuda_impl::decode_options(), 1 | 4 | 8 | sched);
      const int64_t n0 = cuda_impl::rem_split_plans();
      run_attn_case(c, seed++);
      // 16 bf16 tiles in chunks of 3 / 7 / 11 never divide: every counter-path call took the chunk
      if (uniform && sched == 0 && !fp8 && c.dim == 128) {
        EXPECT_EQ(cuda_impl::rem_split_plans() - n0, c.repeats) << c.name;
      }
    }
  }
}

}  // namespace
}  // namespace kvattn::ops::testing
