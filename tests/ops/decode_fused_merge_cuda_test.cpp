// Decode option bit 64 (kOptFusedMerge, KVATTN_DECODE_FUSED_MERGE=1): the decode config's counter
// path merges split units inside the attention kernel — the piece that arrives last on its unit's
// counter merges the unit and puts the counter back to 0 — and no merge kernel runs.  Every case
// against the CPU reference on random inputs (cuda_attn_case.h: outputs and LSE poisoned, page 0
// NaN, permuted block tables, padding rows untouched), called several times in a row on one
// workspace (every call re-poisoned: the counters must be back at 0), with the launch counter
// checked.  Batches > 32 and the small path off, so every call takes the counter path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>

#include "kvattn/core/cuda_runtime_api.h"
#include "cuda_attn_case.h"

namespace kvattn::ops::testing {
namespace {

constexpr int kFused = 64;

class CudaFusedMerge : public CudaV6DecodeTest {
 protected:
  // the process's options with the fused merge on and stream-K off (its own path)
  int fused_opts() const { return (opts0_ & ~(16 | 32)) | kFused; }
  // runs c with `opts` and checks the call count of the fused path
  void run(const AttnCase& c, uint32_t seed, int opts) {
    cuda_impl::set_decode_options(opts);
    ASSERT_EQ(cuda_impl::decode_options(), opts);
    const int64_t n0 = cuda_impl::fused_merge_launches();
    run_attn_case(c, seed);
    if (opts & kFused) {
      EXPECT_EQ(cuda_impl::fused_merge_launches() - n0, c.repeats) << c.name << ": fused path not taken";
    } else {
      EXPECT_EQ(cuda_impl::fused_merge_launches(), n0) << c.name;
    }
  }
};

// mixed odd lengths with empty requests and zero-length queries, one long request
AttnCase mixed_case(std::mt19937& rng, int batch, int64_t hq, int64_t hkv) {
  AttnCase c;
  c.hq = hq; c.hkv = hkv;
  for (int r = 0; r < batch; ++r) {
    c.q_lens.push_back(r % 23 == 7 ? 0 : 1);
    c.kv_lens.push_back(r % 19 == 3 ? 0 : 1 + static_cast<int64_t>(rng() % 1500));
  }
  c.kv_lens[5] = 5001;
  c.repeats = 3;
  return c;
}

TEST_F(CudaFusedMerge, EveryLayoutGqaAndCacheType) {
  std::mt19937 rng(6401);
  uint32_t seed = 6410;
  const DType kv_types[] = {DType::bf16, DType::f16, DType::fp8_e4m3, DType::fp8_e5m2};
  const int pages[] = {16, 1, 32, 16, 64, 8, 16, 3};
  const int64_t gqa[] = {1, 4, 8};
  for (int layout = 0; layout < kNumLayouts; ++layout) {
    const int64_t group = gqa[layout % 3];
    AttnCase c = mixed_case(rng, 34, 2 * group, 2);
    c.layout = layout;
    c.page = pages[layout];
    c.paged_form = layout % 2 == 0;
    c.kv_dt = kv_types[layout % 4];
    if (c.kv_dt == DType::fp8_e4m3 || c.kv_dt == DType::fp8_e5m2) { c.k_scale = 0.7; c.v_scale = 1.3; }
    c.q_dt = c.kv_dt == DType::f16 ? DType::f16 : DType::bf16;
    c.out_dt = layout % 3 == 0 ? DType::f16 : DType::bf16;
    c.name = "layout " + std::to_string(layout) + " gqa " + std::to_string(group) + " kv " +
             std::to_string(static_cast<int>(c.kv_dt)) + (c.paged_form ? " paged" : " block table");
    cuda_impl::set_decode_splits(layout % 2 == 0 ? 0 : 3);  // the plan's rule, and 3 forced splits
    run(c, seed++, fused_opts());
  }
}

// Option bit 8: uniform lengths, a chunk that does not divide the request, the items written long
// units first, so a unit's splits are not contiguous in the item list (the counter id is the
// unit's first packed row, not an item index).  On a 132-SM GPU the D-128 plans take such a chunk
// (decode_v6_cuda_test.cpp NonDividingChunksLongUnitsFirst) — checked there.
TEST_F(CudaFusedMerge, NonDividingChunksAndMultiTokenRows) {
  std::mt19937 rng(6501);
  uint32_t seed = 6510;
  for (int v = 0; v < 4; ++v) {
    AttnCase c;
    c.hq = 4; c.hkv = 2;
    const bool fp8 = v % 2 == 1, two_tokens = v >= 2;
    for (int r = 0; r < 150; ++r) {
      c.q_lens.push_back(two_tokens ? 2 : 1);
      c.kv_lens.push_back(1500 - (r % 5 == 0 ? static_cast<int64_t>(rng() % 28) : 0));
    }
    c.layout = 2 * v + 1;
    c.paged_form = v != 2;
    c.dim = v == 3 ? 64 : 128;
    if (fp8) { c.kv_dt = v == 1 ? DType::fp8_e4m3 : DType::fp8_e5m2; c.k_scale = 0.8; c.v_scale = 1.2; }
    c.repeats = 2;
    c.name = std::string("uniform ") + (fp8 ? "fp8" : "bf16") + (two_tokens ? " two-token rows" : "");
    const int opts = fused_opts() | 1 | 8;
    const int64_t r0 = cuda_impl::rem_split_plans();
    run(c, seed++, opts);
    if (c.dim == 128 && kvattn::cuda::multiprocessor_count(0) == 132) {
      EXPECT_EQ(cuda_impl::rem_split_plans() - r0, c.repeats) << c.name << ": the plan kept a dividing chunk";
    }
  }
}

// Units of several 16-row tiles: 3-token rows at GQA 8 (24 rows: row tiles 0 and 1 of a request),
// and GQA 32 > 16 rows per token (a token's heads span two row tiles; half the requests have no
// query so the call stays in the decode config).  XQA draft masks on the multi-token rows.
TEST_F(CudaFusedMerge, RowTilesAndGroupsAboveTheTile) {
  std::mt19937 rng(6601);
  AttnCase m = mixed_case(rng, 36, 16, 2);
  for (size_t i = 0; i < m.q_lens.size(); ++i) {
    m.q_lens[i] = m.q_lens[i] == 0 ? 0 : (i % 4 == 0 ? 3 : 1);  // <= 16 rows per request on average
    m.kv_lens[i] = std::max(m.kv_lens[i], m.q_lens[i]);
  }
  m.xqa = true;
  m.paged_form = false;
  m.layout = 3;
  m.name = "3-token rows, gqa 8, xqa";
  cuda_impl::set_decode_splits(4);
  run(m, 6610, fused_opts());
  AttnCase g = mixed_case(rng, 34, 32, 1);
  for (size_t i = 0; i < g.q_lens.size(); ++i) g.q_lens[i] = i % 3 == 0 ? 1 : 0;
  g.dim = 64;
  g.layout = 5;
  g.name = "gqa 32 (two row tiles per token)";
  cuda_impl::set_decode_splits(0);
  run(g, 6611, fused_opts());
  cuda_impl::set_decode_splits(5);
  g.name = "gqa 32, 5 splits";
  run(g, 6612, fused_opts());
}

// Sinks, soft cap, window, LSE base e, f32 output, scales; D 256; more splits than one staging
// round holds (40 forced: the merge stages the partials in several rounds) and the split bound.
TEST_F(CudaFusedMerge, OptionsHeadDimsAndManySplits) {
  std::mt19937 rng(6701);
  uint32_t seed = 6710;
  for (int64_t dim : {64, 128, 256}) {
    for (int splits : {2, 40, 128}) {
      AttnCase c = mixed_case(rng, 34, 8, 2);
      c.dim = dim;
      c.sinks = true; c.soft_cap = dim == 128 ? 25.0 : 0.0; c.window_left = splits == 2 ? 700 : -1;
      c.base = LseBase::E;
      c.out_dt = splits == 40 ? DType::f32 : DType::bf16;
      c.lse = splits != 128;
      c.kv_dt = dim == 64 ? DType::fp8_e4m3 : DType::bf16;
      if (dim == 64) { c.k_scale = 0.6; c.v_scale = 1.4; }
      c.repeats = 2;
      c.name = "D " + std::to_string(dim) + " splits " + std::to_string(splits);
      cuda_impl::set_decode_splits(splits);
      run(c, seed++, fused_opts());
    }
  }
}

// The counters live in the workspace: a call of another shape (unfused, or on the stream-K or
// small path) writes that memory; the plan kernel zeroes the counters of a fused call and every
// fused call leaves them at 0, so alternating shapes and paths stays correct.
TEST_F(CudaFusedMerge, AlternatingShapesAndPaths) {
  std::mt19937 rng(6801);
  uint32_t seed = 6810;
  AttnCase a = mixed_case(rng, 40, 8, 2);
  a.repeats = 2;
  a.name = "A";
  AttnCase b = mixed_case(rng, 70, 16, 2);
  b.repeats = 1;
  b.name = "B";
  AttnCase s;
  s.hq = 8; s.hkv = 2;
  s.q_lens = {1, 1, 1};
  s.kv_lens = {1024, 333, 2049};
  s.name = "small call";
  for (int round = 0; round < 2; ++round) {
    run(a, seed++, fused_opts());
    cuda_impl::set_decode_splits(7);
    run(b, seed++, opts0_ & ~kFused);  // unfused: tok_splits map and partials of another shape
    run(b, seed++, (opts0_ & ~kFused) | 16);  // stream-K tables
    cuda_impl::set_decode_splits(0);
    cuda_impl::set_small_decode_mode(2);
    run(s, seed++, opts0_ & ~kFused);
    cuda_impl::set_small_decode_mode(1);
    run(b, seed++, fused_opts());
  }
}

TEST_F(CudaFusedMerge, OffByDefaultAndMasked) {
  if (std::getenv("KVATTN_DECODE_FUSED_MERGE") == nullptr) {
    EXPECT_EQ(opts0_ & kFused, 0) << "the fused merge is not the default";
  }
  cuda_impl::set_decode_options(opts0_ | kFused | 4096);
  EXPECT_EQ(cuda_impl::decode_options(), (opts0_ | kFused) & ~4096);
}

}  // namespace
}  // namespace kvattn::ops::testing
