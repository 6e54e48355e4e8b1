// merge_attn_states, mask_empty_context_lse, and the cascade / DCP-prefill compositions.
#include <gtest/gtest.h>

#include "kvattn/ops/cascade.h"
#include "ops_test_util.h"

namespace kvattn::ops {
namespace {
using namespace testing;

MergeAttnStatesArgs merge_args(int64_t T, int64_t H, int64_t D, DType in, DType out) {
  MergeAttnStatesArgs a;
  a.output = Tensor::empty({T, H, D}, out);
  a.prefix_output = Tensor::empty({T, H, D}, in);
  a.suffix_output = Tensor::empty({T, H, D}, in);
  a.prefix_lse = Tensor::empty({H, T}, DType::f32);
  a.suffix_lse = Tensor::empty({H, T}, DType::f32);
  a.output_lse = Tensor::empty({H, T}, DType::f32);
  fill_nan(a.output);
  fill_nan(a.output_lse);
  return a;
}

TEST(MergeAttnStates, HandComputedAndInfinityGuards) {
  for (int impl = 0; impl < 2; ++impl) {
    MergeAttnStatesArgs a = merge_args(5, 1, 8, DType::f32, DType::f32);
    a.prefix_output.fill_(4.0);
    a.suffix_output.fill_(8.0);
    const float lp[5] = {0.f, INFINITY, -INFINITY, INFINITY, 0.f};
    const float ls[5] = {std::log(3.f), 1.f, -INFINITY, -INFINITY, 2.f};
    for (int t = 0; t < 5; ++t) { a.prefix_lse.set({0, t}, lp[t]); a.suffix_lse.set({0, t}, ls[t]); }
    a.prefill_tokens_with_context = 4;  // token 4 copies the suffix
    if (impl == 0) reference::merge_attn_states(a);
    else merge_attn_states(a);
    EXPECT_NEAR(a.output.get({0, 0, 3}), 4 * 0.25 + 8 * 0.75, 1e-6);
    EXPECT_NEAR(a.output_lse.get({0, 0}), std::log(4.0), 1e-6);
    EXPECT_EQ(a.output.get({1, 0, 0}), 8.0);  // +inf prefix reads as empty
    EXPECT_NEAR(a.output_lse.get({0, 1}), 1.0, 1e-6);
    EXPECT_EQ(a.output.get({2, 0, 0}), 4.0);  // both empty: prefix, -inf
    EXPECT_EQ(a.output_lse.get({0, 2}), -INFINITY);
    EXPECT_EQ(a.output.get({3, 0, 0}), 4.0);  // +inf and -inf: both empty
    EXPECT_EQ(a.output_lse.get({0, 3}), -INFINITY);
    EXPECT_EQ(a.output.get({4, 0, 0}), 8.0);
    EXPECT_EQ(a.output_lse.get({0, 4}), 2.0);
  }
}

TEST(MergeAttnStates, OptimisedMatchesReference) {
  std::mt19937 rng(11);
  struct Cfg { DType in, out; std::optional<int64_t> ptwc; };
  const Cfg cfgs[] = {{DType::f32, DType::f32, std::nullopt}, {DType::bf16, DType::bf16, 40},
                      {DType::f16, DType::f32, std::nullopt}, {DType::bf16, DType::fp8_e4m3, 17},
                      {DType::f32, DType::fp8_e5m2, std::nullopt}};
  for (const Cfg& c : cfgs) {
    SCOPED_TRACE(fmt::format("{} -> {}", dtype_name(c.in), dtype_name(c.out)));
    const int64_t T = 63, H = 3, D = 24;
    MergeAttnStatesArgs a = merge_args(T, H, D, c.in, c.out);
    fill_uniform(a.prefix_output, rng);
    fill_uniform(a.suffix_output, rng);
    fill_uniform(a.prefix_lse, rng, -5, 5);
    fill_uniform(a.suffix_lse, rng, -5, 5);
    std::uniform_int_distribution<int> pct(0, 99);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        if (pct(rng) < 10) a.prefix_lse.set({h, t}, INFINITY);
        else if (pct(rng) < 10) a.suffix_lse.set({h, t}, INFINITY);
        else if (pct(rng) < 3) { a.prefix_lse.set({h, t}, -INFINITY); a.suffix_lse.set({h, t}, -INFINITY); }
      }
    a.prefill_tokens_with_context = c.ptwc;
    if (dtype_is_fp8(c.out)) a.output_scale = Tensor::from_vector(std::vector<float>{0.05f});
    MergeAttnStatesArgs r = a;
    r.output = Tensor::empty({T, H, D}, c.out);
    r.output_lse = Tensor::empty({H, T}, DType::f32);
    fill_nan(r.output);
    reference::merge_attn_states(r);
    merge_attn_states(a);
    // fp8: values may land one code apart (e4m3 step = 1/8 relative)
    const double tol = c.out == DType::f32 && c.in == DType::f32 ? 1e-5 : dtype_is_fp8(c.out) ? 0.26 : 2e-2;
    EXPECT_LE(rel_error(a.output, r.output), tol);
    EXPECT_LE(rel_error(a.output_lse, r.output_lse), 1e-5);
  }
}

TEST(MergeAttnStates, BadArguments) {
  MergeAttnStatesArgs a = merge_args(4, 2, 8, DType::f32, DType::fp8_e4m3);
  EXPECT_THROW(merge_attn_states(a), InvalidArgument);  // fp8 output without a scale
  a = merge_args(4, 2, 8, DType::f32, DType::f32);
  a.prefix_lse = Tensor::zeros({4, 2}, DType::f32);  // [T, H] instead of [H, T]
  EXPECT_THROW(merge_attn_states(a), InvalidArgument);
  a = merge_args(4, 2, 8, DType::f32, DType::f32);
  a.suffix_output = Tensor::zeros({4, 2, 8}, DType::bf16);
  EXPECT_THROW(merge_attn_states(a), InvalidArgument);
  a = merge_args(4, 2, 8, DType::f32, DType::f32);
  a.output_scale = Tensor::from_vector(std::vector<float>{1.f});
  EXPECT_THROW(merge_attn_states(a), InvalidArgument);  // scale without fp8 output
}

TEST(MaskEmptyContextLse, VllmTestVector) {
  Tensor lse = Tensor::zeros({2, 134}, DType::f32);
  mask_empty_context_lse(lse, Tensor::from_vector(std::vector<int32_t>{0, 2, 133, 134}),
                         Tensor::from_vector(std::vector<int32_t>{0, 4, 4, 7}));
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t = 0; t < 134; ++t)
      ASSERT_EQ(lse.get({h, t}), t >= 2 && t < 133 ? -INFINITY : 0.0) << t;
  EXPECT_THROW(mask_empty_context_lse(lse, Tensor::from_vector(std::vector<int32_t>{0, 2, 200}),
                                      Tensor::from_vector(std::vector<int32_t>{0, 1, 1})),
               InvalidArgument);
}

// Cascade equals one causal pass over the full tables.
TEST(CascadeAttention, MatchesSinglePass) {
  std::mt19937 rng(21);
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int layout : {1, 0, 4}) {
      const int64_t ps = 4, ncb = 3, Hkv = 2, G = 2, D = 16;
      const std::vector<int64_t> q_lens = {1, 5, 0, 3}, suffix = {2, 9, 4, 3};
      const int64_t B = 4;
      std::vector<int32_t> qo{0}, full_bt, uniq_ip{0}, uniq_idx, uniq_last, sl;
      int32_t next_page = 1 + ncb;
      const int64_t width = ncb + 4;
      std::vector<int32_t> shared;
      for (int i = 0; i < ncb; ++i) shared.push_back(1 + i);
      for (int64_t r = 0; r < B; ++r) {
        qo.push_back(qo.back() + static_cast<int32_t>(q_lens[r]));
        const int64_t n = (suffix[r] + ps - 1) / ps;
        std::vector<int32_t> row(shared);
        for (int64_t i = 0; i < n; ++i) { row.push_back(next_page); uniq_idx.push_back(next_page++); }
        row.resize(static_cast<size_t>(width), 0);
        full_bt.insert(full_bt.end(), row.begin(), row.end());
        uniq_ip.push_back(uniq_ip.back() + static_cast<int32_t>(n));
        uniq_last.push_back(static_cast<int32_t>(n == 0 ? 0 : suffix[r] - (n - 1) * ps));
        sl.push_back(static_cast<int32_t>(ncb * ps + suffix[r]));
      }
      const int64_t T = qo.back();
      const KVCache cache = make_kv_cache(layout, next_page, ps, Hkv, D, dt);
      fill_cache(cache, rng);
      const Tensor q = Tensor::empty({T, Hkv * G, D}, dt);
      fill_uniform(q, rng);
      PagedAttentionArgs full;
      full.query = q; full.k_cache = cache.k; full.v_cache = cache.v;
      full.qo_indptr = Tensor::from_vector(qo);
      full.block_table = Tensor::from_vector(full_bt, Dims{B, width});
      full.seq_lens = Tensor::from_vector(sl);
      full.out = Tensor::empty({T, Hkv * G, D}, dt);
      full.logits_soft_cap = 5.0;
      reference::paged_attention(full);
      CascadeAttentionArgs c;
      c.query = q; c.k_cache = cache.k; c.v_cache = cache.v;
      c.qo_indptr = full.qo_indptr;
      c.shared_kv_page_indices = Tensor::from_vector(shared);
      c.paged_kv_indptr = Tensor::from_vector(uniq_ip);
      c.paged_kv_indices = Tensor::from_vector(uniq_idx);
      c.paged_kv_last_page_len = Tensor::from_vector(uniq_last);
      c.out = Tensor::empty({T, Hkv * G, D}, dt);
      fill_nan(c.out);
      c.logits_soft_cap = 5.0;
      cascade_attention(c);
      EXPECT_LE(rel_error(c.out, full.out), dt == DType::f32 ? 1e-5 : 2e-2) << layout_name(layout);
      // The shared options refuse what cascade cannot merge: a window, sinks.
      CascadeAttentionArgs w = c;
      w.window_left = 3;
      EXPECT_THROW(cascade_attention(w), InvalidArgument);
      CascadeAttentionArgs sk = c;
      sk.sinks = Tensor::zeros({Hkv * G}, DType::f32);
      EXPECT_THROW(cascade_attention(sk), InvalidArgument);
    }
  }
}

// DCP prefill (context pass + new-token pass + merge) equals one causal pass over the cache
// holding context and new tokens.
TEST(DcpPrefill, MatchesSinglePass) {
  std::mt19937 rng(31);
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t ps = 4, Hkv = 2, G = 3, D = 8;
    const std::vector<int64_t> ctx = {0, 7, 12, 1}, q_lens = {5, 3, 1, 17};
    const int64_t B = 4;
    std::vector<int64_t> kv;
    for (int64_t r = 0; r < B; ++r) kv.push_back(ctx[r] + q_lens[r]);
    const Batch full = make_batch(q_lens, kv, ps, rng);
    const int64_t T = full.num_tokens - 0;
    const KVCache cache = make_kv_cache(5, full.num_pages, ps, Hkv, D, dt);
    fill_cache(cache, rng);
    const Tensor q = Tensor::empty({T, Hkv * G, D}, dt), key = Tensor::empty({T, Hkv, D}, dt),
                 value = Tensor::empty({T, Hkv, D}, dt);
    for (const Tensor* t : {&q, &key, &value}) fill_uniform(*t, rng);
    // write the new tokens into the cache at positions ctx + i
    std::vector<int64_t> slots(static_cast<size_t>(T), -1);
    std::vector<int32_t> ctx_ip{0}, ctx_idx, ctx_last;
    int64_t t = 0;
    for (int64_t r = 0; r < B; ++r) {
      for (int64_t i = 0; i < q_lens[r]; ++i, ++t) {
        const int64_t pos = ctx[r] + i;
        slots[t] = full.block_table.get({r, pos / ps}) * static_cast<double>(ps) + pos % ps;
      }
      const int64_t n = (ctx[r] + ps - 1) / ps;
      for (int64_t i = 0; i < n; ++i) ctx_idx.push_back(static_cast<int32_t>(full.block_table.get({r, i})));
      ctx_ip.push_back(ctx_ip.back() + static_cast<int32_t>(n));
      ctx_last.push_back(static_cast<int32_t>(n == 0 ? 0 : ctx[r] - (n - 1) * ps));
    }
    reshape_and_cache_flash(key, value, cache.k, cache.v, Tensor::from_vector(slots), "auto", Tensor(), Tensor());
    PagedAttentionArgs one;
    one.query = q; one.k_cache = cache.k; one.v_cache = cache.v;
    one.qo_indptr = full.qo_indptr;
    one.block_table = full.block_table;
    one.seq_lens = full.seq_lens;
    one.out = Tensor::empty({T, Hkv * G, D}, dt);
    reference::paged_attention(one);
    DcpPrefillArgs d;
    d.query = q; d.k_cache = cache.k; d.v_cache = cache.v; d.qo_indptr = full.qo_indptr;
    d.paged_kv_indptr = Tensor::from_vector(ctx_ip);
    d.paged_kv_indices = Tensor::from_vector(ctx_idx);
    d.paged_kv_last_page_len = Tensor::from_vector(ctx_last);
    d.key = key; d.value = value;
    d.out = Tensor::empty({T, Hkv * G, D}, dt);
    fill_nan(d.out);
    dcp_prefill_attention(d);
    EXPECT_LE(rel_error(d.out, one.out), dt == DType::f32 ? 1e-5 : 2e-2);
    // The same context given as a vLLM block table (the other form of PagedKVCache).
    DcpPrefillArgs bt = d;
    bt.paged_kv_indptr = Tensor();
    bt.paged_kv_indices = Tensor();
    bt.paged_kv_last_page_len = Tensor();
    bt.block_table = full.block_table;
    std::vector<int32_t> ctx32(ctx.begin(), ctx.end());
    bt.seq_lens = Tensor::from_vector(ctx32);
    bt.out = Tensor::empty({T, Hkv * G, D}, dt);
    fill_nan(bt.out);
    dcp_prefill_attention(bt);
    EXPECT_LE(rel_error(bt.out, one.out), dt == DType::f32 ? 1e-5 : 2e-2);
    DcpPrefillArgs sk = d;
    sk.sinks = Tensor::zeros({Hkv * G}, DType::f32);
    EXPECT_THROW(dcp_prefill_attention(sk), InvalidArgument);
  }
}

}  // namespace
}  // namespace kvattn::ops
