// The CUDA ops against the CPU reference on random inputs: every KV layout, odd lengths, empty
// requests, fp8 caches, GQA 1/4/8, head sizes 64/128/256, split-KV, outputs poisoned with NaN
// beforehand (rows the op must not touch stay NaN).  Skips when no GPU is present.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "kvattn/core/cuda_runtime_api.h"
#include "cuda_attn_case.h"

namespace kvattn::ops {
namespace {
using namespace testing;

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kvattn::cuda::available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
  }
};

// Bitwise comparison of two CPU tensors' bytes.
::testing::AssertionResult same_bytes(const Tensor& a, const Tensor& b) {
  if (a.nbytes() != b.nbytes()) return ::testing::AssertionFailure() << "sizes differ";
  const auto* x = static_cast<const unsigned char*>(a.data());
  const auto* y = static_cast<const unsigned char*>(b.data());
  for (int64_t i = 0; i < a.nbytes(); ++i)
    if (x[i] != y[i])
      return ::testing::AssertionFailure() << "byte " << i << " differs: " << int(x[i]) << " vs " << int(y[i]);
  return ::testing::AssertionSuccess();
}

// ---- reshape_and_cache_flash ------------------------------------------------------------------------
struct CacheCase {
  int layout;
  DType src;
  KVCacheDType kvd;
  bool u8_cache;
  bool per_head;
  int64_t head, dim;
};

TEST_F(CudaOps, ReshapeAndCacheMatchesReferenceEveryLayout) {
  std::mt19937 rng(1234);
  std::vector<CacheCase> cases;
  for (int layout = 0; layout < kNumLayouts; ++layout) {
    cases.push_back({layout, DType::bf16, KVCacheDType::Auto, false, false, 8, 128});
    cases.push_back({layout, DType::f16, KVCacheDType::Fp8E4M3, false, layout % 2 == 0, 4, 64});
  }
  cases.push_back({6, DType::f32, KVCacheDType::Auto, false, false, 2, 64});
  cases.push_back({7, DType::f32, KVCacheDType::Fp8E5M2, false, true, 3, 32});
  cases.push_back({1, DType::bf16, KVCacheDType::Fp8E5M2, true, false, 8, 128});
  cases.push_back({6, DType::bf16, KVCacheDType::Fp8E4M3, true, true, 2, 256});
  cases.push_back({6, DType::bf16, KVCacheDType::Auto, false, false, 1, 20});  // dim not a vector multiple
  // every case on both same-dtype kernels (kernels.h set_cache_write_variant)
  const int variant0 = cuda_impl::cache_write_variant();
  for (int variant : {1, 0})
  for (const CacheCase& c : cases) {
    cuda_impl::set_cache_write_variant(variant);
    SCOPED_TRACE(::testing::Message() << "variant " << variant << " layout " << layout_name(c.layout) << " src " << dtype_name(c.src)
                                      << " kv " << kv_cache_dtype_name(c.kvd) << " H " << c.head << " D " << c.dim);
    const int64_t num_pages = 7, page = 16, T = 37, T_pad = 41;
    const DType cache_dt = c.kvd == KVCacheDType::Auto ? c.src
                           : c.u8_cache                ? DType::u8
                           : c.kvd == KVCacheDType::Fp8E4M3 ? DType::fp8_e4m3
                                                            : DType::fp8_e5m2;
    KVCache cache = make_kv_cache(c.layout, num_pages, page, c.head, c.dim, cache_dt == DType::u8 ? DType::u8 : cache_dt);
    {
      // random bytes in the cache (also where nothing is written)
      auto* p = static_cast<unsigned char*>(cache.backing.data());
      for (int64_t i = 0; i < cache.backing.nbytes(); ++i) p[i] = static_cast<unsigned char>(rng() & 0x7f);
    }
    // key/value as strided slices of a fused [T_pad, 3, H, D] tensor (q, k, v)
    Tensor qkv = Tensor::empty({T_pad, 3, c.head, c.dim}, c.src);
    fill_uniform(qkv, rng, -3, 3);
    Tensor key = qkv.select(1, 1), value = qkv.select(1, 2);
    std::vector<int64_t> slots(static_cast<size_t>(T));
    std::vector<int64_t> perm(static_cast<size_t>(num_pages * page));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t t = 0; t < T; ++t) slots[t] = (t % 5 == 3) ? -1 : perm[t];
    Tensor slot_t = Tensor::from_vector(slots);
    Tensor ks, vs;
    if (c.kvd != KVCacheDType::Auto) {
      ks = Tensor::empty({c.per_head ? c.head : 1}, DType::f32);
      vs = Tensor::empty({c.per_head ? c.head : 1}, DType::f32);
      fill_uniform(ks, rng, 0.01, 0.05);  // small scales: some values saturate
      fill_uniform(vs, rng, 0.5, 2.0);
    }
    Mirror mc(cache.backing), mq(qkv);
    ReshapeAndCacheArgs ref;
    ref.key = key; ref.value = value; ref.key_cache = cache.k; ref.value_cache = cache.v;
    ref.slot_mapping = slot_t; ref.kv_cache_dtype = c.kvd; ref.k_scale = ks; ref.v_scale = vs;
    if (c.u8_cache) { ref.key_cache = cache.k.view_as(DType::u8); ref.value_cache = cache.v.view_as(DType::u8); }
    ReshapeAndCacheArgs dev = ref;
    dev.key = mq.view(key); dev.value = mq.view(value);
    dev.key_cache = mc.view(ref.key_cache); dev.value_cache = mc.view(ref.value_cache);
    dev.slot_mapping = to_gpu(slot_t); dev.k_scale = to_gpu(ks); dev.v_scale = to_gpu(vs);
    reference::reshape_and_cache_flash(ref);
    reshape_and_cache_flash(dev);
    EXPECT_TRUE(same_bytes(mc.back(), cache.backing));
  }
  cuda_impl::set_cache_write_variant(variant0);
}

// ---- paged_attention (cases: cuda_attn_case.h) ------------------------------------------------
TEST_F(CudaOps, PagedDecodeBf16Gqa) {
  for (int64_t group : {1, 4, 8}) {
    AttnCase c;
    c.name = "decode gqa" + std::to_string(group);
    c.hkv = 4;
    c.hq = 4 * group;
    c.q_lens = {1, 1, 1, 1, 1, 1};
    c.kv_lens = {1, 17, 300, 0, 1000, 64};
    run_attn_case(c, 10 + static_cast<uint32_t>(group));
  }
}

TEST_F(CudaOps, PagedDecodeEveryLayoutAndPageForm) {
  for (int layout = 0; layout < kNumLayouts; ++layout) {
    AttnCase c;
    c.name = std::string("layout ") + layout_name(layout);
    c.layout = layout;
    c.paged_form = layout % 2 == 0;
    c.hq = 16; c.hkv = 4;
    c.q_lens = {1, 1, 1};
    c.kv_lens = {33, 129, 7};
    run_attn_case(c, 100 + static_cast<uint32_t>(layout));
  }
}

TEST_F(CudaOps, PagedDecodeHeadDimsAndDtypes) {
  uint32_t seed = 200;
  for (int64_t dim : {64, 128, 256}) {
    for (DType kv : {DType::bf16, DType::f16, DType::fp8_e4m3, DType::fp8_e5m2}) {
      AttnCase c;
      c.name = "dim " + std::to_string(dim) + " kv " + dtype_name(kv);
      c.dim = dim;
      c.kv_dt = kv;
      c.q_dt = kv == DType::f16 ? DType::f16 : DType::bf16;
      c.out_dt = kv == DType::f16 ? DType::f16 : DType::bf16;
      if (kv == DType::fp8_e4m3 || kv == DType::fp8_e5m2) { c.k_scale = 0.7; c.v_scale = 1.3; }
      c.hq = 8; c.hkv = 2;
      c.q_lens = {1, 1, 1, 1};
      c.kv_lens = {5, 250, 0, 513};
      run_attn_case(c, seed++);
    }
  }
}

TEST_F(CudaOps, PagedDecodeSplitKvLongAndOptions) {
  AttnCase c;
  c.name = "split-kv long";
  c.hq = 32; c.hkv = 8;
  c.q_lens = {1, 1};
  c.kv_lens = {4099, 2500};
  run_attn_case(c, 300);
  c.name = "split-kv sinks softcap window lse-e fp8";
  c.kv_dt = DType::fp8_e4m3; c.k_scale = 0.5; c.v_scale = 2.0;
  c.sinks = true; c.soft_cap = 30.0; c.window_left = 1500; c.base = LseBase::E;
  run_attn_case(c, 301);
  c.name = "split-kv f32 query and out";
  c.kv_dt = DType::bf16; c.q_dt = DType::f32; c.out_dt = DType::f32; c.sinks = false; c.soft_cap = 0; c.window_left = -1;
  c.k_scale = c.v_scale = 1.0;
  c.paged_form = false;
  run_attn_case(c, 302);
}

// Split-KV decode called repeatedly on the same persistent workspace (as CUDA-graph replays
// do): every call must rewrite every row and give the right answer, so whatever scheduling
// state the workspace holds (work counter, per-unit counters) must be back at its start value.
// Shapes: 1 request split over many CTAs, one long request cut into many pieces per unit,
// mixed lengths with empty and zero-query requests (fp8).
TEST_F(CudaOps, PagedDecodeStreamKRepeatedCalls) {
  AttnCase c;
  c.name = "1x1024 repeated";
  c.q_lens = {1};
  c.kv_lens = {1024};
  c.repeats = 3;
  run_attn_case(c, 700);
  c.name = "one long request, many pieces per unit";
  c.kv_lens = {20011};
  c.repeats = 2;
  c.sinks = true;
  run_attn_case(c, 701);
  c.name = "mixed lengths with empty and zero-query requests, repeated";
  c.q_lens = {1, 0, 1, 1, 2, 1, 0, 1};
  c.kv_lens = {3000, 5, 0, 64, 700, 1, 0, 4097};
  c.sinks = false;
  c.repeats = 3;
  c.kv_dt = DType::fp8_e4m3; c.k_scale = 0.8; c.v_scale = 1.1;
  run_attn_case(c, 702);
  c.name = "1x1024 again after other shapes";
  c.q_lens = {1};
  c.kv_lens = {1024};
  c.kv_dt = DType::bf16; c.k_scale = c.v_scale = 1.0;
  c.repeats = 2;
  run_attn_case(c, 703);
}

// ---- the small-call decode path (one launch: per-CTA plan, attention, merge by the last piece) ----
// Each case runs with the path forced on, then off (the plan / attention / merge launches of the general path),
// on the same inputs against the CPU reference; the launch counter shows which path ran.
class CudaSmallDecode : public CudaOps {
 protected:
  void TearDown() override {
    if (kvattn::cuda::available()) cuda_impl::set_small_decode_mode(0);
  }
  static void both_paths(const AttnCase& c, uint32_t seed) {
    for (int mode : {2, 1}) {
      SCOPED_TRACE(mode == 2 ? "small path (forced)" : "general path (small path off)");
      cuda_impl::set_small_decode_mode(mode);
      const int64_t before = cuda_impl::small_decode_launches();
      run_attn_case(c, seed);
      const int64_t n = cuda_impl::small_decode_launches() - before;
      EXPECT_EQ(n, mode == 2 ? c.repeats : 0) << "routing";
    }
    cuda_impl::set_small_decode_mode(0);
  }
};

TEST_F(CudaSmallDecode, GqaEveryLayoutOddLengths) {
  std::mt19937 rng(901);
  uint32_t seed = 910;
  for (int64_t group : {1, 4, 8}) {
    for (int layout = 0; layout < kNumLayouts; ++layout) {
      AttnCase c;
      c.name = "small gqa" + std::to_string(group) + " layout " + layout_name(layout);
      c.layout = layout;
      c.paged_form = (layout + group) % 2 == 0;
      c.hkv = 2 + layout % 3;
      c.hq = c.hkv * group;
      const int B = 1 + static_cast<int>(rng() % 5);
      for (int r = 0; r < B; ++r) {
        c.q_lens.push_back(1);
        c.kv_lens.push_back(rng() % 9 == 0 ? 0 : 1 + 2 * static_cast<int64_t>(rng() % 900));  // odd
      }
      c.base = layout % 2 ? LseBase::E : LseBase::Two;
      both_paths(c, seed++);
    }
  }
}

TEST_F(CudaSmallDecode, HeadDimsDtypesAndOptions) {
  uint32_t seed = 950;
  for (int64_t dim : {64, 128, 256}) {
    for (DType kv : {DType::bf16, DType::f16, DType::fp8_e4m3, DType::fp8_e5m2}) {
      AttnCase c;
      c.name = "small dim " + std::to_string(dim) + " kv " + dtype_name(kv);
      c.dim = dim;
      c.kv_dt = kv;
      c.q_dt = kv == DType::f16 ? DType::f16 : DType::bf16;
      c.out_dt = c.q_dt;
      if (kv == DType::fp8_e4m3 || kv == DType::fp8_e5m2) { c.k_scale = 0.7; c.v_scale = 1.3; }
      c.hq = 16; c.hkv = 4;
      c.q_lens = {1, 1, 1};
      c.kv_lens = {1537, 3, 611};
      if (dim == 128) { c.sinks = true; c.soft_cap = 25.0; c.window_left = 700; c.base = LseBase::E; }
      both_paths(c, seed++);
    }
  }
  AttnCase c;
  c.name = "small f32 query and out, block-table form";
  c.q_dt = DType::f32; c.out_dt = DType::f32;
  c.paged_form = false;
  c.q_lens = {1, 1};
  c.kv_lens = {2049, 77};
  both_paths(c, seed++);
}

// Multi-token decode rows (up to 16 rows of one KV head per unit: the merge stages 7 pieces
// of 16 rows at a time, so 32 pieces take several rounds), XQA masks, sinks.
TEST_F(CudaSmallDecode, MultiTokenRowsAndDraftMask) {
  AttnCase c;
  c.name = "small multi-token causal, 16-row units, many pieces";
  c.hq = 32; c.hkv = 8;
  c.q_lens = {4, 1, 3};
  c.kv_lens = {9001, 40, 300};
  c.sinks = true;
  both_paths(c, 960);
  c.name = "small multi-token xqa";
  c.sinks = false;
  c.xqa = true;
  c.kv_lens = {1200, 40, 300};
  both_paths(c, 961);
}

// The anchor shape 1 x 1024 and longer single requests (up to the 32-piece bound, merged in
// two staging rounds) called repeatedly on one workspace: the per-unit arrival counters must
// be back at 0 after every call (as for CUDA-graph replays), or the next call would merge
// early or never; other shapes (and the general path) run in between.
TEST_F(CudaSmallDecode, RepeatedCallsCountersReset) {
  AttnCase c;
  c.name = "small 1x1024 repeated";
  c.q_lens = {1};
  c.kv_lens = {1024};
  c.repeats = 4;
  both_paths(c, 970);
  c.name = "small 1x20011 repeated (32 pieces per unit)";
  c.kv_lens = {20011};
  c.repeats = 3;
  both_paths(c, 971);
  c.name = "small mixed with empty and zero-query requests, fp8, repeated";
  c.q_lens = {1, 0, 1, 1, 2, 1, 0, 1};
  c.kv_lens = {3000, 5, 0, 64, 700, 1, 0, 4097};
  c.kv_dt = DType::fp8_e4m3; c.k_scale = 0.8; c.v_scale = 1.1;
  c.repeats = 3;
  both_paths(c, 972);
  c.name = "small 1x1024 again";
  c.q_lens = {1};
  c.kv_lens = {1024};
  c.kv_dt = DType::bf16; c.k_scale = c.v_scale = 1.0;
  c.repeats = 2;
  both_paths(c, 973);
}

// Automatic routing across the boundary: batches 1..33 of decode requests (32 q / 8 KV
// heads); small batches take the small path, from some batch on (at the latest 33 > 32
// requests) the general path, and the switch happens once.  Every call checked against the CPU.
TEST_F(CudaSmallDecode, AutomaticRoutingBoundary) {
  cuda_impl::set_small_decode_mode(0);
  std::mt19937 rng(990);
  int first_general = -1;
  for (int B = 1; B <= 33; ++B) {
    AttnCase c;
    c.name = "auto batch " + std::to_string(B);
    for (int r = 0; r < B; ++r) {
      c.q_lens.push_back(1);
      c.kv_lens.push_back(1 + static_cast<int64_t>(rng() % 400));
    }
    const int64_t before = cuda_impl::small_decode_launches();
    run_attn_case(c, 990 + static_cast<uint32_t>(B));
    const bool small = cuda_impl::small_decode_launches() - before == 1;
    if (!small && first_general < 0) first_general = B;
    if (small) {
      EXPECT_LT(first_general, 0) << "batch " << B << " took the small path after batch " << first_general << " did not";
    }
  }
  EXPECT_GT(first_general, 1) << "batch 1 must take the small path";
  EXPECT_LE(first_general, 33);
  std::printf("[ small path for batches < %d (this device) ]\n", first_general);
}

// More requests than one CTA-wide round of planning (1024 threads; 128 x 8 in the v7 attempt).
TEST_F(CudaOps, PagedDecodeLargeBatch) {
  std::mt19937 rng(801);
  AttnCase c;
  c.name = "1100 requests";
  c.hq = 8; c.hkv = 2; c.dim = 64;
  for (int r = 0; r < 1100; ++r) {
    c.q_lens.push_back(r % 97 == 5 ? 0 : 1);
    c.kv_lens.push_back(rng() % 7 == 0 ? 0 : 1 + rng() % 300);
  }
  c.kv_lens[17] = 5000;  // one long request split over many CTAs
  c.paged_form = false;
  c.repeats = 2;
  run_attn_case(c, 800);
}

TEST_F(CudaOps, PagedMultiTokenDecodeDraftMask) {
  AttnCase c;
  c.name = "multi-token causal";
  c.hq = 16; c.hkv = 2;
  c.q_lens = {3, 1, 4, 2};
  c.kv_lens = {40, 9, 300, 2};
  run_attn_case(c, 400);
  c.name = "multi-token xqa";
  c.xqa = true;
  run_attn_case(c, 401);
  c.name = "multi-token xqa sinks window";
  c.sinks = true; c.window_left = 20;
  run_attn_case(c, 402);
}

TEST_F(CudaOps, PagedPrefillCausalAndNonCausal) {
  AttnCase c;
  c.name = "prefill causal";
  c.hq = 8; c.hkv = 2; c.dim = 128;
  c.q_lens = {70, 129, 5};
  c.kv_lens = {70, 200, 5};  // request 1 is a chunked prefill (71 cached keys)
  run_attn_case(c, 500);
  c.name = "prefill non-causal";
  c.causal = false;
  run_attn_case(c, 501);
  c.name = "prefill window softcap sinks fp8";
  c.causal = true; c.window_left = 31; c.soft_cap = 20; c.sinks = true; c.kv_dt = DType::fp8_e5m2;
  run_attn_case(c, 502);
  c.name = "prefill mm prefix";
  c.window_left = -1; c.soft_cap = 0; c.sinks = false; c.kv_dt = DType::bf16; c.mm = true;
  run_attn_case(c, 503);
  for (int64_t dim : {64, 256}) {
    AttnCase d;
    d.name = "prefill dim " + std::to_string(dim);
    d.dim = dim; d.hq = 4; d.hkv = 4; d.page = 8;
    d.q_lens = {33, 64};
    d.kv_lens = {100, 64};
    d.layout = 7;
    run_attn_case(d, 510 + static_cast<uint32_t>(dim));
  }
}

TEST_F(CudaOps, PagedAttentionPageSizes) {
  for (int64_t page : {1, 8, 32, 64}) {
    AttnCase c;
    c.name = "page " + std::to_string(page);
    c.page = page;
    c.hq = 8; c.hkv = 8;
    c.q_lens = {1, 2, 1};
    c.kv_lens = {77, 130, 1};
    run_attn_case(c, 600 + static_cast<uint32_t>(page));
  }
}

TEST_F(CudaOps, PagedAttentionRandomised) {
  std::mt19937 rng(77);
  for (int iter = 0; iter < 12; ++iter) {
    AttnCase c;
    c.name = "random " + std::to_string(iter);
    const int64_t groups[] = {1, 4, 8};
    c.hkv = 1 + rng() % 3;
    c.hq = c.hkv * groups[rng() % 3];
    const int64_t dims[] = {64, 128, 256};
    c.dim = dims[rng() % 3];
    const DType kvs[] = {DType::bf16, DType::f16, DType::fp8_e4m3, DType::fp8_e5m2};
    c.kv_dt = kvs[rng() % 4];
    c.q_dt = c.kv_dt == DType::f16 ? DType::f16 : DType::bf16;
    c.out_dt = c.q_dt;
    const int64_t pages[] = {8, 16, 32};
    c.page = pages[rng() % 3];
    c.layout = static_cast<int>(rng() % kNumLayouts);
    c.paged_form = rng() % 2;
    c.causal = rng() % 4 != 0;
    if (rng() % 3 == 0) c.window_left = rng() % 100;
    if (rng() % 3 == 0) c.soft_cap = 10 + rng() % 40;
    c.sinks = rng() % 3 == 0;
    c.base = rng() % 2 ? LseBase::Two : LseBase::E;
    const int B = 1 + rng() % 6;
    for (int r = 0; r < B; ++r) {
      const int64_t ql = rng() % 3 == 0 ? 1 + rng() % 40 : 1;
      c.q_lens.push_back(ql);
      c.kv_lens.push_back(ql + (rng() % 4 == 0 ? 0 : rng() % 700));
    }
    run_attn_case(c, 1000 + static_cast<uint32_t>(iter));
  }
}

// ---- merge_attn_states --------------------------------------------------------------------------------
TEST_F(CudaOps, MergeAttnStatesMatchesReference) {
  std::mt19937 rng(5);
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    for (int with_ctx = 0; with_ctx < 2; ++with_ctx) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " ctx " << with_ctx);
      const int64_t T = 45, H = 6, D = 128;
      Tensor po = Tensor::empty({T, H, D}, dt), so = Tensor::empty({T, H, D}, dt);
      fill_uniform(po, rng); fill_uniform(so, rng);
      Tensor pl = Tensor::empty({H, T}, DType::f32), sl = Tensor::empty({H, T}, DType::f32);
      fill_uniform(pl, rng, -5, 5); fill_uniform(sl, rng, -5, 5);
      for (int64_t t = 0; t < T; t += 7) pl.set({t % H, t}, -INFINITY);
      for (int64_t t = 3; t < T; t += 11) sl.set({t % H, t}, INFINITY);
      pl.set({1, 2}, -INFINITY); sl.set({1, 2}, -INFINITY);  // both empty
      Tensor out = Tensor::empty({T, H, D}, dt), olse = Tensor::empty({H, T}, DType::f32);
      fill_nan(out); fill_nan(olse);
      MergeAttnStatesArgs a;
      a.output = out; a.prefix_output = po; a.prefix_lse = pl; a.suffix_output = so; a.suffix_lse = sl;
      a.output_lse = olse;
      if (with_ctx) a.prefill_tokens_with_context = 30;
      MergeAttnStatesArgs g = a;
      g.output = out.to(gpu()); g.prefix_output = to_gpu(po); g.prefix_lse = to_gpu(pl);
      g.suffix_output = to_gpu(so); g.suffix_lse = to_gpu(sl); g.output_lse = olse.to(gpu());
      reference::merge_attn_states(a);
      merge_attn_states(g);
      EXPECT_LT(rel_error(g.output.to(Device::cpu()), out), dt == DType::f32 ? 1e-5 : 1e-2);
      EXPECT_LT(rel_error(g.output_lse.to(Device::cpu()), olse), 1e-5);
    }
  }
  // fp8 output with a scale
  const int64_t T = 9, H = 2, D = 64;
  Tensor po = Tensor::empty({T, H, D}, DType::bf16), so = Tensor::empty({T, H, D}, DType::bf16);
  fill_uniform(po, rng); fill_uniform(so, rng);
  Tensor pl = Tensor::empty({H, T}, DType::f32), sl = Tensor::empty({H, T}, DType::f32);
  fill_uniform(pl, rng, -2, 2); fill_uniform(sl, rng, -2, 2);
  Tensor out = Tensor::empty({T, H, D}, DType::fp8_e4m3);
  Tensor scale = Tensor::from_vector(std::vector<float>{0.01f});
  MergeAttnStatesArgs a;
  a.output = out; a.prefix_output = po; a.prefix_lse = pl; a.suffix_output = so; a.suffix_lse = sl;
  a.output_scale = scale;
  MergeAttnStatesArgs g = a;
  g.output = Tensor::empty({T, H, D}, DType::fp8_e4m3, gpu()); g.prefix_output = to_gpu(po);
  g.prefix_lse = to_gpu(pl); g.suffix_output = to_gpu(so); g.suffix_lse = to_gpu(sl); g.output_scale = to_gpu(scale);
  reference::merge_attn_states(a);
  merge_attn_states(g);
  // float vs double weights may move a value across an fp8 rounding boundary: allow one code
  const Tensor got = g.output.to(Device::cpu());
  const auto* x = static_cast<const uint8_t*>(got.data());
  const auto* y = static_cast<const uint8_t*>(out.data());
  int off = 0;
  for (int64_t i = 0; i < got.numel(); ++i) off += std::abs(int(x[i] & 0x7f) - int(y[i] & 0x7f)) > 1;
  EXPECT_EQ(off, 0);
}

TEST_F(CudaOps, MaskEmptyContextLse) {
  std::mt19937 rng(9);
  const int64_t H = 3, T = 20;
  Tensor lse = Tensor::empty({H, T}, DType::f32);
  fill_uniform(lse, rng);
  Tensor qsl = Tensor::from_vector(std::vector<int32_t>{0, 4, 9, 9, 15, 20});
  Tensor csl = Tensor::from_vector(std::vector<int64_t>{0, 0, 10, 10, 10, 30});
  Tensor g = lse.to(gpu());
  mask_empty_context_lse(lse, qsl, csl);
  mask_empty_context_lse(g, to_gpu(qsl), to_gpu(csl));
  EXPECT_TRUE(same_bytes(g.to(Device::cpu()), lse));
}

// ---- small ops ------------------------------------------------------------------------------------------
TEST_F(CudaOps, ZeroKvBlocksSegmentTable) {
  // two segments over one device buffer, odd page sizes and misaligned starts
  const int64_t words = 1 << 16;
  Tensor host = Tensor::empty({words}, DType::i32);
  for (int64_t i = 0; i < words; ++i) host.data_ptr<int32_t>()[i] = static_cast<int32_t>(i + 1);
  Tensor dev = host.to(gpu());
  const int64_t base = reinterpret_cast<int64_t>(dev.data());
  std::vector<int64_t> addrs = {base + 4, base + 4 * 30000}, strides = {1001, 700}, pages = {997, 5000};
  std::vector<int64_t> ids = {0, 3, 7, 5};
  zero_kv_blocks(to_gpu(Tensor::from_vector(addrs)), to_gpu(Tensor::from_vector(strides)),
                 to_gpu(Tensor::from_vector(pages)), to_gpu(Tensor::from_vector(ids)));
  // expected on the host copy
  for (size_t s = 0; s < addrs.size(); ++s)
    for (int64_t id : ids) {
      const int64_t w0 = (addrs[s] - base) / 4 + id * strides[s];
      for (int64_t i = 0; i < pages[s]; ++i) host.data_ptr<int32_t>()[w0 + i] = 0;
    }
  EXPECT_TRUE(same_bytes(dev.to(Device::cpu()), host));
}

TEST_F(CudaOps, CopyPageIndicesAndMambaAlign) {
  std::mt19937 rng(3);
  const int64_t R = 5, W = 12;
  Tensor bt = Tensor::empty({R, W}, DType::i32);
  for (int64_t i = 0; i < R * W; ++i) bt.data_ptr<int32_t>()[i] = static_cast<int32_t>(rng() % 1000);
  Tensor indptr = Tensor::from_vector(std::vector<int64_t>{0, 3, 3, 15, 20, 21});
  Tensor ind = Tensor::empty({24}, DType::i64);
  for (int64_t i = 0; i < 24; ++i) ind.data_ptr<int64_t>()[i] = -7;
  Tensor gind = ind.to(gpu());
  copy_page_indices(ind, bt, indptr);
  copy_page_indices(gind, to_gpu(bt), to_gpu(indptr));
  EXPECT_TRUE(same_bytes(gind.to(Device::cpu()), ind));

  Tensor sl = Tensor::from_vector(std::vector<int32_t>{0, 1, 16, 17, 40});
  Tensor out = Tensor::empty({R, 3}, DType::i32);
  Tensor gout = Tensor::empty({R, 3}, DType::i32, gpu());
  mamba_align_block_table(out, bt, sl, 16);
  mamba_align_block_table(gout, to_gpu(bt), to_gpu(sl), 16);
  EXPECT_TRUE(same_bytes(gout.to(Device::cpu()), out));
}

TEST_F(CudaOps, Fp8PageDequant) {
  std::mt19937 rng(4);
  for (DType fp8 : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    const int64_t pages = 9, ps = 16, H = 2, D = 64, R = 2, P = 4;
    KVCache c = make_kv_cache(6, pages, ps, H, D, fp8);
    fill_uniform(c.backing, rng, -3, 3);
    Tensor bt = Tensor::from_vector(std::vector<int32_t>{3, 0, 8, 1, 5, 6, -1, 2}, Dims{R, P});
    Tensor ks = Tensor::from_vector(std::vector<float>{0.5f}), vs = Tensor::from_vector(std::vector<float>{3.f});
    KVCache o = make_kv_cache(6, R * P + 1, ps, H, D, DType::bf16);
    fill_nan(o.backing);
    Mirror mc(c.backing), mo(o.backing);
    kvfp8_dequant(c.k, c.v, bt, ks, vs, o.k, o.v);
    kvfp8_dequant(mc.view(c.k), mc.view(c.v), to_gpu(bt), to_gpu(ks), to_gpu(vs), mo.view(o.k), mo.view(o.v));
    EXPECT_TRUE(same_bytes(mo.back(), o.backing)) << dtype_name(fp8);
  }
}

}  // namespace
}  // namespace kvattn::ops
