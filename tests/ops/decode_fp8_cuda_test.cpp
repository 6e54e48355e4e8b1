// The fp8 fast variant of attn_kernel's decode config (decode option bit 4, on by default;
// attn_kernel<KVe4m3f | KVe5m2f, D 64 / 128, 1, 4>): the same tiles as the default
// fp8 kernel with fewer instructions per tile (conversions, MUFU-only exp2, loader).  Every case
// against the CPU reference on random inputs, outputs poisoned, permuted block tables with
// block 0 reserved (NaN codes in page 0), odd and empty lengths, repeated calls on one
// workspace; each call is checked to have run the fast variant (fp8_fast_launches()).  Both
// fp8 formats, GQA 1 / 4 / 8, D 64 / 128, both split rules and forced split counts, sinks + soft cap + window, multi-token rows, every
// cache layout and the block-table form, page sizes 1..64.  (Attention takes one K and one V
// scale per call: per-head scales exist only in the cache-write ops.)  Batches > 32 and the
// small path switched off, so the general path takes every call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>

#include "kvattn/core/cuda_runtime_api.h"
#include "cuda_attn_case.h"

namespace kvattn::ops::testing {
namespace {

constexpr int kFast = 4;  // decode option bit: fp8 fast variant

// (the fp8 fast variant is launched on sm_90+ only)
class CudaDecodeFp8Fast : public CudaGeneralDecodeTest {
 protected:
  CudaDecodeFp8Fast() : CudaGeneralDecodeTest(90) {}
};

std::string fp8_name(DType d) { return d == DType::fp8_e4m3 ? "e4m3" : "e5m2"; }

// 34 requests; mixed: empty, odd and one long (5001 keys) request, some padding-only rows;
// uniform: every request 999 keys (the whole-wave split rule when opts has bit 1).
AttnCase fp8_case(std::mt19937& rng, DType kv, int64_t hq, int64_t hkv, int64_t dim, bool uniform) {
  AttnCase c;
  c.kv_dt = kv;
  c.k_scale = 0.7; c.v_scale = 1.3;
  c.hq = hq; c.hkv = hkv; c.dim = dim;
  for (int r = 0; r < 34; ++r) {
    c.q_lens.push_back(!uniform && r % 23 == 7 ? 0 : 1);
    c.kv_lens.push_back(uniform ? 999 : (r % 19 == 3 ? 0 : 1 + static_cast<int64_t>(rng() % 1500)));
  }
  if (!uniform) c.kv_lens[5] = 5001;
  c.repeats = 2;
  return c;
}

// Runs the case and checks that each of its calls took the fast variant.
void run_fast(const AttnCase& c, uint32_t seed) {
  const int64_t n0 = cuda_impl::fp8_fast_launches();
  run_attn_case(c, seed);
  EXPECT_EQ(cuda_impl::fp8_fast_launches() - n0, c.repeats) << c.name << ": not every call ran the fast variant";
}

TEST_F(CudaDecodeFp8Fast, FormatsGqaHeadDims) {
  std::mt19937 rng(2501);
  uint32_t seed = 2510;
  const int64_t heads[3][2] = {{8, 8}, {8, 2}, {16, 2}};  // GQA 1, 4, 8
  for (DType kv : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    for (const auto& h : heads) {
      for (int64_t dim : {64, 128}) {
        const int opts = 1 | kFast;
        cuda_impl::set_decode_options(opts);
        ASSERT_EQ(cuda_impl::decode_options(), opts);
        AttnCase c = fp8_case(rng, kv, h[0], h[1], dim, false);
        c.name = fp8_name(kv) + " gqa " + std::to_string(h[0] / h[1]) + " D " + std::to_string(dim);
        run_fast(c, seed++);
      }
    }
  }
}

TEST_F(CudaDecodeFp8Fast, SplitRulesSinksSoftcapWindowMultiToken) {
  std::mt19937 rng(2601);
  uint32_t seed = 2610;
  for (int rule : {1, 0}) {
    for (int splits : {0, 1, 3, 40}) {
      for (bool uniform : {true, false}) {
        if (splits != 0 && uniform) continue;
        const int opts = rule | kFast;
        cuda_impl::set_decode_options(opts);
        ASSERT_EQ(cuda_impl::decode_options(), opts);
        cuda_impl::set_decode_splits(splits);
        for (DType kv : {DType::fp8_e4m3, DType::fp8_e5m2}) {
          AttnCase c = fp8_case(rng, kv, 8, 2, 128, uniform);
          c.name = fp8_name(kv) + (uniform ? " uniform" : " mixed") + " opts " + std::to_string(opts) + " splits " +
                   std::to_string(splits);
          run_fast(c, seed++);
        }
      }
    }
  }
  cuda_impl::set_decode_options(1 | kFast);
  cuda_impl::set_decode_splits(0);
  for (DType kv : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    AttnCase c = fp8_case(rng, kv, 8, 2, 128, false);
    c.name = fp8_name(kv) + " sinks softcap window, LSE base e";
    c.sinks = true; c.soft_cap = 25.0; c.window_left = 700; c.base = LseBase::E;
    run_fast(c, seed++);
    AttnCase m = fp8_case(rng, kv, 16, 2, 64, false);
    m.name = fp8_name(kv) + " multi-token rows, gqa 8, D 64, block-table form";
    for (size_t i = 0; i < m.q_lens.size(); ++i) {  // 1-2 tokens x 8 heads: <= 16 rows (decode config)
      m.q_lens[i] = m.q_lens[i] == 0 ? 0 : 1 + static_cast<int64_t>(i % 2);
      m.kv_lens[i] = std::max(m.kv_lens[i], m.q_lens[i]);
    }
    m.paged_form = false;
    run_fast(m, seed++);
  }
}

TEST_F(CudaDecodeFp8Fast, LayoutsPageSizesQueryTypes) {
  std::mt19937 rng(2701);
  uint32_t seed = 2710;
  const int64_t pages[] = {1, 8, 16, 32, 64};
  cuda_impl::set_decode_options(1 | kFast);
  for (int layout = 0; layout < kNumLayouts; ++layout) {
    const DType kv = layout % 3 == 0 ? DType::fp8_e5m2 : DType::fp8_e4m3;
    AttnCase c = fp8_case(rng, kv, 8, 2, layout % 4 == 1 ? 64 : 128, false);
    c.layout = layout;
    c.page = pages[layout % 5];
    c.paged_form = layout % 4 != 3;
    if (layout == 2) { c.q_dt = DType::f16; c.out_dt = DType::f16; }
    if (layout == 5) { c.q_dt = DType::f32; c.out_dt = DType::f32; }
    c.name = fp8_name(kv) + " layout " + std::to_string(layout) + " page " + std::to_string(c.page) +
             (c.paged_form ? "" : " block-table form");
    run_fast(c, seed++);
  }
}

// Bit 4 off: the default fp8 kernel runs (the counter does not move).
// The default options include the fast bit (test binaries start from the library's defaults).
TEST_F(CudaDecodeFp8Fast, OnByDefault) {
  EXPECT_NE(opts0_ & 4, 0);
  std::mt19937 rng(2802);
  cuda_impl::set_decode_options(opts0_);
  AttnCase c = fp8_case(rng, DType::fp8_e5m2, 5, 1, 64, true);
  c.name = "default options";
  const int64_t n0 = cuda_impl::fp8_fast_launches();
  run_attn_case(c, 2811);
  EXPECT_GT(cuda_impl::fp8_fast_launches(), n0);
}

// Without the bit the previous fp8 kernel runs (and still matches the reference).
TEST_F(CudaDecodeFp8Fast, BitOffRunsPreviousKernel) {
  std::mt19937 rng(2801);
  cuda_impl::set_decode_options(1);
  AttnCase c = fp8_case(rng, DType::fp8_e4m3, 8, 2, 128, false);
  c.name = "fast bit off";
  const int64_t n0 = cuda_impl::fp8_fast_launches();
  run_attn_case(c, 2810);
  EXPECT_EQ(cuda_impl::fp8_fast_launches(), n0);
}

}  // namespace
}  // namespace kvattn::ops::testing
