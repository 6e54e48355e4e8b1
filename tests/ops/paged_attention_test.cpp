// paged_attention: the reference against hand-computed values, the optimised CPU path against
// the reference on random batches (every option, every KV layout), and argument errors.
#include <gtest/gtest.h>

#include "ops/cpu/cpu_ops.h"
#include "ops_test_util.h"

namespace kvattn::ops {
namespace {
using namespace testing;

// One request, hand-built cache of 2 pages x 2 slots, H = 1, D = 8, f32.
struct Tiny {
  Tensor k = Tensor::zeros({3, 2, 1, 8}, DType::f32), v = Tensor::zeros({3, 2, 1, 8}, DType::f32);
  Tensor q, out, lse;
  PagedAttentionArgs args(int64_t q_len, int64_t kv_len) {
    q = Tensor::zeros({q_len, 1, 8}, DType::f32);
    out = Tensor::empty({q_len, 1, 8}, DType::f32);
    fill_nan(out);
    lse = Tensor::empty({q_len, 1}, DType::f32);
    PagedAttentionArgs a;
    a.query = q; a.k_cache = k; a.v_cache = v; a.out = out; a.lse = lse;
    a.qo_indptr = Tensor::from_vector(std::vector<int32_t>{0, static_cast<int32_t>(q_len)});
    a.block_table = Tensor::from_vector(std::vector<int32_t>{2, 1}, Dims{1, 2});  // key j -> page 2 - j/2
    a.seq_lens = Tensor::from_vector(std::vector<int32_t>{static_cast<int32_t>(kv_len)});
    a.sm_scale = 1.0;
    return a;
  }
  void key(int64_t j, std::vector<float> kk, std::vector<float> vv) {
    const int64_t page = j < 2 ? 2 : 1;
    for (int i = 0; i < 8; ++i) {
      k.set({page, j % 2, 0, i}, i < static_cast<int>(kk.size()) ? kk[i] : 0.f);
      v.set({page, j % 2, 0, i}, i < static_cast<int>(vv.size()) ? vv[i] : 0.f);
    }
  }
};

void run_both(const PagedAttentionArgs& a, const std::function<void()>& check) {
  reference::paged_attention(a);
  check();
  fill_nan(a.out);
  paged_attention(a);
  check();
}

TEST(PagedAttentionReference, TwoKeysHandComputed) {
  Tiny t;
  t.key(0, {0}, {4});
  t.key(1, {std::log(3.f)}, {0, 8});
  auto a = t.args(1, 2);
  t.q.set({0, 0, 0}, 1.0);
  run_both(a, [&] {
    // p = (1/4, 3/4): out = (1, 6, 0...), lse = ln 4 -> base 2: 2
    EXPECT_NEAR(t.out.get({0, 0, 0}), 1.0, 1e-6);
    EXPECT_NEAR(t.out.get({0, 0, 1}), 6.0, 1e-6);
    EXPECT_EQ(t.out.get({0, 0, 2}), 0.0);
    EXPECT_NEAR(t.lse.get({0, 0}), 2.0, 1e-6);
  });
  a.lse_base = LseBase::E;
  a.v_scale = 0.5;
  run_both(a, [&] {
    EXPECT_NEAR(t.out.get({0, 0, 1}), 3.0, 1e-6);
    EXPECT_NEAR(t.lse.get({0, 0}), std::log(4.0), 1e-6);
  });
}

TEST(PagedAttentionReference, CausalWindowSinkSoftCap) {
  Tiny t;
  t.key(0, {0}, {1});
  t.key(1, {0}, {0, 1});
  t.key(2, {0}, {0, 0, 1});
  auto a = t.args(2, 3);  // query rows at positions 1 and 2
  run_both(a, [&] {
    EXPECT_NEAR(t.out.get({0, 0, 0}), 0.5, 1e-6);  // row 0 sees keys 0, 1
    EXPECT_NEAR(t.out.get({0, 0, 2}), 0.0, 1e-6);
    EXPECT_NEAR(t.out.get({1, 0, 2}), 1.0 / 3, 1e-6);  // row 1 sees all three
  });
  a.window_left = 0;  // each row sees only its own position
  run_both(a, [&] {
    EXPECT_NEAR(t.out.get({0, 0, 1}), 1.0, 1e-6);
    EXPECT_NEAR(t.out.get({1, 0, 2}), 1.0, 1e-6);
  });
  a.window_left = -1;
  a.causal = false;
  Tensor sinks = Tensor::from_vector(std::vector<float>{std::log(3.f)});
  a.sinks = sinks;  // denominator 3 keys * 1 + 3  -> each key weight 1/6
  a.lse_base = LseBase::E;
  run_both(a, [&] {
    EXPECT_NEAR(t.out.get({0, 0, 0}), 1.0 / 6, 1e-6);
    EXPECT_NEAR(t.lse.get({0, 0}), std::log(6.0), 1e-6);
  });
  // soft cap: raw logits (0, 2) with cap 1 -> (0, tanh 2)
  Tiny c;
  c.key(0, {0}, {1});
  c.key(1, {2}, {0, 1});
  auto b = c.args(1, 2);
  c.q.set({0, 0, 0}, 1.0);
  b.logits_soft_cap = 1.0;
  const double e = std::exp(std::tanh(2.0));
  run_both(b, [&] {
    EXPECT_NEAR(c.out.get({0, 0, 0}), 1 / (1 + e), 1e-6);
    EXPECT_NEAR(c.out.get({0, 0, 1}), e / (1 + e), 1e-6);
  });
}

TEST(PagedAttentionReference, EmptyRequestGivesZeroAndMinusInf) {
  Tiny t;
  auto a = t.args(1, 0);
  run_both(a, [&] {
    for (int i = 0; i < 8; ++i) EXPECT_EQ(t.out.get({0, 0, i}), 0.0);
    EXPECT_EQ(t.lse.get({0, 0}), -INFINITY);
  });
}

// ---- randomised: optimised vs reference --------------------------------------------------
struct Case {
  int layout = 6;
  DType q_dtype = DType::f32, kv_dtype = DType::f32, out_dtype = DType::f32;
  int64_t Hkv = 2, group = 2, D = 16, page_size = 4;
  std::vector<int64_t> q_lens, kv_lens;
  bool causal = true, block_table_form = false, lse = true, sinks = false, mm = false, xqa = false, lse_e = false;
  int64_t window_left = -1, pad_rows = 1;
  double cap = 0, q_scale = 1, k_scale = 1, v_scale = 1;
  std::string str() const {
    return fmt::format("layout={} q={} kv={} out={} Hkv={} G={} D={} ps={} causal={} bt={} win={} cap={} sinks={} "
                       "mm={} xqa={} q_lens={} kv_lens={}",
                       layout_name(layout), dtype_name(q_dtype), dtype_name(kv_dtype), dtype_name(out_dtype), Hkv,
                       group, D, page_size, causal, block_table_form, window_left, cap, sinks, mm, xqa,
                       fmt::join(q_lens, ","), fmt::join(kv_lens, ","));
  }
};

void check_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.str());
  std::mt19937 rng(seed);
  const Batch b = make_batch(c.q_lens, c.kv_lens, c.page_size, rng, c.pad_rows);
  const int64_t Hq = c.Hkv * c.group;
  const KVCache cache = make_kv_cache(c.layout, b.num_pages, c.page_size, c.Hkv, c.D, c.kv_dtype);
  fill_cache(cache, rng);
  PagedAttentionArgs a;
  a.query = Tensor::empty({b.num_tokens, Hq, c.D}, c.q_dtype);
  fill_uniform(a.query, rng);
  a.k_cache = cache.k;
  a.v_cache = cache.v;
  a.qo_indptr = b.qo_indptr;
  if (c.block_table_form) {
    a.block_table = b.block_table;
    a.seq_lens = b.seq_lens;
  } else {
    a.paged_kv_indptr = b.indptr;
    a.paged_kv_indices = b.indices;
    a.paged_kv_last_page_len = b.last_page_len;
  }
  a.causal = c.causal;
  a.lse_base = c.lse_e ? LseBase::E : LseBase::Two;
  a.window_left = c.window_left;
  a.logits_soft_cap = c.cap;
  a.q_scale = c.q_scale;
  a.k_scale = c.k_scale;
  a.v_scale = c.v_scale;
  if (c.sinks) {
    a.sinks = Tensor::empty({Hq}, DType::f32);
    fill_uniform(a.sinks, rng, -2, 2);
  }
  if (c.mm) {  // PrefixLM ranges on some rows
    std::vector<int32_t> mm(static_cast<size_t>(b.num_tokens * 2), -1);
    int64_t t = 0;
    for (size_t r = 0; r < c.q_lens.size(); ++r) {
      const int64_t ctx = c.kv_lens[r] - c.q_lens[r];
      for (int64_t i = 0; i < c.q_lens[r]; ++i, ++t) {
        const int64_t pos = ctx + i;
        if (pos % 7 < 4) {  // range [pos - pos%7, pos - pos%7 + 3]
          mm[t * 2] = static_cast<int32_t>(pos - pos % 7);
          mm[t * 2 + 1] = static_cast<int32_t>(pos - pos % 7 + 3);
        }
      }
    }
    a.mm_prefix_ranges = Tensor::from_vector(mm, Dims{b.num_tokens, 2});
  }
  if (c.xqa) {
    std::vector<int64_t> ql = c.q_lens;
    ql.push_back(c.pad_rows);  // padding rows get mask rows too
    a.xqa_draft_mask = make_xqa_draft_block_mask(ql, c.causal);
  }
  const Tensor out_ref = Tensor::empty({b.num_tokens, Hq, c.D}, c.out_dtype);
  const Tensor out_opt = Tensor::empty({b.num_tokens, Hq, c.D}, c.out_dtype);
  // lse in vLLM's [H, T] layout, passed transposed
  const Tensor lse_ref = Tensor::empty({Hq, b.num_tokens}, DType::f32);
  const Tensor lse_opt = Tensor::empty({Hq, b.num_tokens}, DType::f32);
  for (const Tensor* t : {&out_ref, &out_opt, &lse_ref, &lse_opt}) fill_nan(*t);
  a.out = out_ref;
  if (c.lse) a.lse = lse_ref.transpose(0, 1);
  reference::paged_attention(a);
  a.out = out_opt;
  if (c.lse) a.lse = lse_opt.transpose(0, 1);
  paged_attention(a);
  const int64_t T = b.qo_indptr.get({static_cast<int64_t>(c.q_lens.size())}) ;
  const bool exact_f32 = c.q_dtype == DType::f32 && c.kv_dtype == DType::f32 && c.out_dtype == DType::f32;
  const double tol = exact_f32 ? 1e-5 : 2e-2;
  if (T > 0) {
    EXPECT_LE(rel_error(out_opt.slice(0, 0, T), out_ref.slice(0, 0, T)), tol);
    if (c.lse) {
      EXPECT_LE(rel_error(lse_opt.slice(1, 0, T), lse_ref.slice(1, 0, T)), exact_f32 ? 1e-5 : 1e-3);
    }
    // every row of a request was written (NaN poison gone) unless the reference wrote NaN
    for (double x : out_opt.slice(0, 0, T).to_double_vector()) ASSERT_FALSE(std::isnan(x));
  }
  // rows past the last request are untouched
  for (double x : out_opt.slice(0, T, b.num_tokens).to_double_vector()) ASSERT_TRUE(std::isnan(x));
  for (double x : out_ref.slice(0, T, b.num_tokens).to_double_vector()) ASSERT_TRUE(std::isnan(x));
}

TEST(PagedAttention, EveryLayoutAndDtype) {
  const DType kv_types[] = {DType::f32, DType::bf16, DType::f16, DType::fp8_e4m3, DType::fp8_e5m2};
  uint32_t seed = 1;
  for (int layout = 0; layout < kNumLayouts; ++layout) {
    for (DType kv : kv_types) {
      Case c;
      c.layout = layout;
      c.kv_dtype = kv;
      c.q_dtype = kv == DType::f32 ? DType::f32 : (seed % 2 ? DType::bf16 : DType::f16);
      c.out_dtype = seed % 3 == 0 ? DType::f32 : c.q_dtype;
      c.q_lens = {1, 5, 0, 3};
      c.kv_lens = {9, 17, 6, 3};  // decode, chunked prefill, empty query, full prefill
      c.block_table_form = seed % 2 == 0;
      if (dtype_is_fp8(kv)) { c.k_scale = 0.7; c.v_scale = 1.3; c.q_scale = 1.1; }
      check_case(c, seed++);
    }
  }
}

TEST(PagedAttention, ClassifyKvLengths) {
  using H = KvLengthsHint;
  auto c = [](std::vector<int32_t> v) { return classify_kv_lengths(v); };
  EXPECT_EQ(c({}), H::unknown);
  EXPECT_EQ(c({0, 0}), H::unknown);  // no non-empty request
  EXPECT_EQ(c({4096, 4096, 4096}), H::uniform);
  EXPECT_EQ(c({100, 199}), H::uniform);
  EXPECT_EQ(c({100, 200}), H::mixed);  // twice the shortest
  EXPECT_EQ(c({0, 5, 9}), H::uniform);  // empty requests do not count
  EXPECT_EQ(c({0, 5, 10}), H::mixed);
  EXPECT_EQ(c({256, 8192, 3000}), H::mixed);
  EXPECT_EQ(c({2147483647, 1}), H::mixed);  // no overflow
}

TEST(PagedAttention, KeptPlanOnCpuTensorsIsIgnored) {
  // CPU kernels plan inline: a PagedAttentionPlan in the args changes nothing and stays unused
  std::mt19937 rng(21);
  const Batch b = make_batch({1, 3, 1}, {40, 19, 1}, 16, rng, 1);
  const KVCache cache = make_kv_cache(1, b.num_pages, 16, 2, 64, DType::bf16);
  fill_cache(cache, rng);
  const Tensor q = Tensor::empty({b.num_tokens, 8, 64}, DType::bf16);
  fill_uniform(q, rng);
  PagedAttentionArgs a = attn_args(b, cache, q, /*paged_form=*/true);
  const Tensor ref = Tensor::empty({b.num_tokens, 8, 64}, DType::f32);
  a.out = ref;
  reference::paged_attention(a);
  PagedAttentionPlan plan;
  a.plan = &plan;
  for (int call = 0; call < 2; ++call) {
    const Tensor out = Tensor::empty({b.num_tokens, 8, 64}, DType::f32);
    fill_nan(out);
    a.out = out;
    paged_attention(a);
    EXPECT_LE(rel_error(out.slice(0, 0, 5), ref.slice(0, 0, 5)), 2e-2) << "call " << call;
  }
  EXPECT_EQ(plan.plans(), 0);
  EXPECT_EQ(plan.reuses(), 0);
  plan.invalidate();  // harmless without a kept plan
}

TEST(PagedAttention, OddLengthsAndEmptyRequests) {
  Case c;
  c.q_lens = {1, 15, 17, 0, 1, 0, 2};
  c.kv_lens = {1, 15, 40, 0, 1000, 17, 0};  // includes kv 0 with query rows (empty request)
  c.Hkv = 1; c.group = 3; c.D = 8; c.page_size = 16;
  for (bool causal : {true, false}) {
    c.causal = causal;
    check_case(c, 7);
  }
  Case big;  // a 1000-token prefill
  big.q_lens = {1000};
  big.kv_lens = {1000};
  big.Hkv = 1; big.group = 1; big.D = 8; big.page_size = 16;
  check_case(big, 8);
  Case none;  // no requests at all
  none.q_lens = {};
  none.kv_lens = {};
  none.pad_rows = 2;
  check_case(none, 9);
}

TEST(PagedAttention, HeadSizesAndGqa) {
  uint32_t seed = 100;
  for (int64_t D : {64, 128, 256, 512, 24}) {
    for (int64_t group : {1, 4, 8}) {
      Case c;
      c.D = D;
      c.group = group;
      c.Hkv = group == 8 ? 1 : 2;
      c.q_lens = {1, 3};
      c.kv_lens = {70, 20};
      c.layout = static_cast<int>(seed % kNumLayouts);
      c.kv_dtype = seed % 2 ? DType::bf16 : DType::f32;
      c.q_dtype = c.kv_dtype;
      c.out_dtype = c.kv_dtype;
      check_case(c, seed++);
    }
  }
}

TEST(PagedAttention, RandomOptionMatrix) {
  std::mt19937 pick(42);
  auto coin = [&](int n = 2) { return static_cast<int>(pick() % static_cast<unsigned>(n)); };
  const DType f[] = {DType::f32, DType::f16, DType::bf16};
  const DType kv[] = {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2};
  for (int i = 0; i < 60; ++i) {
    Case c;
    c.layout = coin(kNumLayouts);
    c.q_dtype = f[coin(3)];
    c.kv_dtype = kv[coin(5)];
    c.out_dtype = f[coin(3)];
    c.Hkv = 1 + coin(2);
    c.group = 1 + coin(4);
    c.D = 8 * (1 + coin(4));
    c.page_size = 1 + coin(8);
    const int nreq = coin(5);
    for (int r = 0; r < nreq; ++r) {
      const int64_t q = coin(4) == 0 ? 0 : 1 + coin(20);
      c.q_lens.push_back(q);
      c.kv_lens.push_back(coin(3) == 0 ? q : q + coin(60));
    }
    c.causal = coin(4) != 0;
    c.block_table_form = coin() == 1;
    c.window_left = coin(3) == 0 ? coin(20) : -1;
    c.cap = coin(3) == 0 ? 0.5 + coin(30) : 0;
    c.sinks = coin(4) == 0;
    c.mm = coin(4) == 0 && c.causal;
    c.xqa = !c.mm && coin(5) == 0;
    c.lse = coin(4) != 0;
    c.lse_e = coin() == 1;
    c.q_scale = coin() ? 1.0 : 0.9;
    c.k_scale = coin() ? 1.0 : 1.2;
    c.v_scale = coin() ? 1.0 : 0.8;
    c.pad_rows = coin(3);
    check_case(c, 1000 + i);
  }
}

TEST(PagedAttention, BaselineIsaKernelMatchesReference) {
  // The AVX2 kernel is chosen at run time; check the portable one too.
  cpu::set_force_generic_kernel(true);
  uint32_t seed = 500;
  for (DType kv : {DType::f32, DType::bf16, DType::f16, DType::fp8_e4m3}) {
    Case c;
    c.kv_dtype = kv;
    c.q_dtype = kv == DType::f32 ? DType::f32 : DType::bf16;
    c.out_dtype = c.q_dtype;
    c.group = 4;
    c.D = 40;
    c.q_lens = {1, 6, 0};
    c.kv_lens = {30, 6, 3};
    c.layout = static_cast<int>(seed % kNumLayouts);
    c.sinks = seed % 2 == 0;
    c.cap = seed % 3 == 0 ? 3.0 : 0.0;
    check_case(c, seed++);
  }
  cpu::set_force_generic_kernel(false);
}

TEST(PagedAttention, DecodeKernelLongSequencesAndSplitKv) {
  // Decode and short multi-token decode (q_len x group <= 16 rows per KV head) run the decode
  // kernel; long requests with few work items are split over their keys and merged.  Every
  // instruction set the machine has (AVX512-BF16, AVX2, baseline), 1 and 8 threads (8:
  // split-KV), every KV dtype, GQA 1..16.
  const int n = cpu_num_threads();
  const DType kv_types[] = {DType::bf16, DType::f16, DType::f32, DType::fp8_e4m3, DType::fp8_e5m2};
  uint32_t seed = 900;
  for (int isa : {2, 1, 0}) {
    cpu::set_force_generic_kernel(isa == 0);
    cpu::set_disable_avx512_kernel(isa == 1);
    for (int threads : {1, 8}) {
      set_cpu_num_threads(threads);
      for (int i = 0; i < 8; ++i, ++seed) {
        Case c;
        c.kv_dtype = kv_types[seed % 5];
        c.q_dtype = c.kv_dtype == DType::f32 ? DType::f32 : (seed % 2 ? DType::bf16 : DType::f16);
        c.out_dtype = seed % 3 == 0 ? DType::f32 : c.q_dtype;
        const int64_t groups[] = {1, 2, 3, 4, 8, 16, 5};
        c.group = groups[seed % 7];
        c.Hkv = c.group >= 8 ? 1 : 2;
        const int64_t dims[] = {128, 64, 40, 256};
        c.D = dims[(seed / 3) % 4];
        c.page_size = seed % 4 == 0 ? 1 : 16;
        c.layout = static_cast<int>(seed % kNumLayouts);
        const int64_t max_q = std::max<int64_t>(1, 16 / c.group);
        c.q_lens = {1, std::min<int64_t>(max_q, 2), 1, max_q};
        c.kv_lens = {1201, 700, 1, 333};
        if (i % 3 == 1) {  // one long request only: split-KV (3 parts) with 8 threads
          c.q_lens = {1};
          c.kv_lens = {1600};
        }
        c.block_table_form = seed % 2 == 0;
        c.window_left = i % 4 == 1 ? 700 : -1;  // i = 1: a window inside a split request
        c.cap = i % 5 == 4 ? 20.0 : 0.0;
        c.sinks = i % 2 == 0;
        c.lse_e = i % 3 == 0;
        if (dtype_is_fp8(c.kv_dtype)) { c.k_scale = 0.7; c.v_scale = 1.3; c.q_scale = 1.1; }
        check_case(c, seed);
      }
    }
  }
  cpu::set_force_generic_kernel(false);
  cpu::set_disable_avx512_kernel(false);
  set_cpu_num_threads(n);
}

TEST(PagedAttention, PageZeroIsNeverRead) {
  // fill_cache already puts NaN in page 0 of every case; check explicitly that a NaN there
  // does not reach the output even when every page of a full batch sits next to it.
  Case c;
  c.q_lens = {4, 1};
  c.kv_lens = {33, 64};
  c.page_size = 1;  // many pages: neighbours of page 0 are used
  check_case(c, 77);
}

TEST(PagedAttention, MultiThreadedMatchesSingleThreaded) {
  const int n = cpu_num_threads();
  Case c;
  c.q_lens = {1, 1, 1, 7, 33};
  c.kv_lens = {100, 50, 1, 60, 33};
  c.kv_dtype = DType::bf16;
  set_cpu_num_threads(3);
  check_case(c, 5);
  set_cpu_num_threads(1);
  check_case(c, 5);
  set_cpu_num_threads(n);
}

// ---- argument errors ------------------------------------------------------------------------
struct ErrFixture {
  std::mt19937 rng{3};
  Batch b = make_batch({2, 1}, {5, 9}, 4, rng);
  KVCache cache = make_kv_cache(6, b.num_pages, 4, 2, 16, DType::bf16);
  PagedAttentionArgs a;
  ErrFixture() {
    fill_cache(cache, rng);
    a.query = Tensor::zeros({b.num_tokens, 4, 16}, DType::bf16);
    a.out = Tensor::zeros({b.num_tokens, 4, 16}, DType::bf16);
    a.k_cache = cache.k;
    a.v_cache = cache.v;
    a.qo_indptr = b.qo_indptr;
    a.paged_kv_indptr = b.indptr;
    a.paged_kv_indices = b.indices;
    a.paged_kv_last_page_len = b.last_page_len;
  }
};

template <typename E>
void expect_error(const PagedAttentionArgs& a, const std::string& needle) {
  for (int impl = 0; impl < 2; ++impl) {
    try {
      if (impl == 0) paged_attention(a);
      else reference::paged_attention(a);
      ADD_FAILURE() << "expected an error mentioning '" << needle << "'";
    } catch (const E& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

TEST(PagedAttentionErrors, BadArgumentsAreRejected) {
  {
    ErrFixture f;
    paged_attention(f.a);  // the fixture itself is valid
  }
  {
    ErrFixture f;
    f.a.query = Tensor::zeros({f.b.num_tokens, 3, 16}, DType::bf16);
    f.a.out = Tensor::zeros({f.b.num_tokens, 3, 16}, DType::bf16);
    expect_error<InvalidArgument>(f.a, "not a multiple of num_kv_heads");
  }
  {
    ErrFixture f;
    f.a.out = Tensor::zeros({f.b.num_tokens, 4, 8}, DType::bf16);
    expect_error<InvalidArgument>(f.a, "out shape");
  }
  {
    ErrFixture f;
    f.a.out = Tensor::zeros({f.b.num_tokens, 4, 16}, DType::i32);
    expect_error<InvalidArgument>(f.a, "valid dtypes");
  }
  {
    ErrFixture f;
    f.a.v_cache = Tensor::zeros(f.cache.v.shape(), DType::f32);
    expect_error<InvalidArgument>(f.a, "v_cache dtype");
  }
  {
    std::mt19937 rng(1);
    Batch b = make_batch({1}, {5}, 4, rng);
    KVCache c = make_kv_cache(6, b.num_pages, 4, 1, 12, DType::f32);
    PagedAttentionArgs a;
    a.query = Tensor::zeros({1, 1, 12}, DType::f32);
    a.out = Tensor::zeros({1, 1, 12}, DType::f32);
    a.k_cache = c.k; a.v_cache = c.v; a.qo_indptr = b.qo_indptr;
    a.paged_kv_indptr = b.indptr; a.paged_kv_indices = b.indices; a.paged_kv_last_page_len = b.last_page_len;
    expect_error<Unsupported>(a, "head_dim = 12");
  }
  {
    ErrFixture f;
    f.a.paged_kv_indices = Tensor::from_vector(std::vector<int32_t>{1, 2, 99, 3, 4});
    expect_error<InvalidArgument>(f.a, "outside the cache");
  }
  {
    ErrFixture f;
    f.a.paged_kv_indices = Tensor::from_vector(std::vector<int32_t>{1, 2, -1, 3, 4});
    expect_error<InvalidArgument>(f.a, "outside the cache");
  }
  {
    ErrFixture f;
    f.a.paged_kv_last_page_len = Tensor::from_vector(std::vector<int32_t>{5, 1});
    expect_error<InvalidArgument>(f.a, "paged_kv_last_page_len[0] = 5");
  }
  {
    ErrFixture f;
    f.a.qo_indptr = Tensor::from_vector(std::vector<int32_t>{0, 2, 99});
    expect_error<InvalidArgument>(f.a, "exceeds the query");
  }
  {
    ErrFixture f;  // block table with an entry beyond the cache
    f.a.paged_kv_indptr = Tensor();
    f.a.paged_kv_indices = Tensor();
    f.a.paged_kv_last_page_len = Tensor();
    f.a.block_table = Tensor::from_vector(std::vector<int32_t>{1, 2, 3, 1000}, Dims{2, 2});
    f.a.seq_lens = Tensor::from_vector(std::vector<int32_t>{5, 8});
    expect_error<InvalidArgument>(f.a, "id 1000");
    f.a.seq_lens = Tensor::from_vector(std::vector<int32_t>{5, 9});
    expect_error<InvalidArgument>(f.a, "seq_lens[1] = 9");
  }
  {
    ErrFixture f;
    f.a.block_table = f.b.block_table;
    expect_error<InvalidArgument>(f.a, "either");
  }
  {
    ErrFixture f;
    f.a.sinks = Tensor::zeros({3}, DType::f32);
    expect_error<InvalidArgument>(f.a, "sinks");
    f.a.sinks = Tensor::zeros({4}, DType::bf16);
    expect_error<InvalidArgument>(f.a, "sinks");
  }
  {
    ErrFixture f;
    f.a.lse = Tensor::zeros({4, f.b.num_tokens}, DType::f32);
    expect_error<InvalidArgument>(f.a, "transpose");
  }
  {
    ErrFixture f;
    f.a.k_scale = 0;
    expect_error<InvalidArgument>(f.a, "k_scale");
    f.a.k_scale = 1;
    f.a.window_left = -5;
    expect_error<InvalidArgument>(f.a, "window_left");
  }
  {
    ErrFixture f;
    f.a.k_cache = f.cache.k.view_as(DType::u8);
    expect_error<InvalidArgument>(f.a, "uint8");
  }
  {
    ErrFixture f;
    f.a.xqa_draft_mask = Tensor::zeros({f.b.num_tokens, 1}, DType::i32);
    f.a.qo_indptr = Tensor::from_vector(std::vector<int32_t>{0, 2, 3});
    paged_attention(f.a);  // fine
    f.a.xqa_draft_mask = Tensor::zeros({f.b.num_tokens, 1}, DType::i64);
    expect_error<InvalidArgument>(f.a, "xqa_draft_mask");
  }
  {
    ErrFixture f;  // query lengths 2 and 1: max_query_len is a promise the host checks
    f.a.max_query_len = 2;
    paged_attention(f.a);
    f.a.max_query_len = 5;  // a loose bound is fine
    paged_attention(f.a);
    f.a.max_query_len = 1;
    expect_error<InvalidArgument>(f.a, "request 0 has 2 query rows but max_query_len = 1");
    f.a.max_query_len = -2;
    expect_error<InvalidArgument>(f.a, "max_query_len = -2 must be -1 (unknown) or >= 0");
  }
}

TEST(PagedAttentionHelpers, XqaMaskPacking) {
  const Tensor m = make_xqa_draft_block_mask({3, 1}, true);
  ASSERT_EQ(m.shape(), (Dims{4, 1}));
  EXPECT_EQ(m.get({0, 0}), 0b1);
  EXPECT_EQ(m.get({1, 0}), 0b11);
  EXPECT_EQ(m.get({2, 0}), 0b111);
  EXPECT_EQ(m.get({3, 0}), 0b1);
  const Tensor n = make_xqa_draft_block_mask({33}, false);
  ASSERT_EQ(n.shape(), (Dims{33, 2}));
  EXPECT_EQ(static_cast<uint32_t>(static_cast<int32_t>(n.get({5, 0}))), 0xffffffffu);
  EXPECT_EQ(n.get({5, 1}), 1);
}

}  // namespace
}  // namespace kvattn::ops
