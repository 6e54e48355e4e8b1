// reshape_and_cache_flash, zero_kv_blocks, copy_page_indices, mamba_align_block_table and the
// fp8 page dequantisation.
#include <gtest/gtest.h>

#include "ops_test_util.h"

namespace kvattn::ops {
namespace {
using namespace testing;

// Writes through reference and optimised paths into two identically poisoned caches and
// checks both against a direct oracle (block = slot / bs, offset = slot % bs).
void check_reshape(int layout, DType model, KVCacheDType kvdt, bool per_head, uint32_t seed) {
  SCOPED_TRACE(fmt::format("layout={} model={} kv={} per_head={}", layout_name(layout), dtype_name(model),
                           kv_cache_dtype_name(kvdt), per_head));
  std::mt19937 rng(seed);
  const int64_t num_blocks = 6, bs = 5, H = 3, D = 16, T = 11, T_pad = 14;
  const DType cache_dt = kvdt == KVCacheDType::Auto ? model
                         : kvdt == KVCacheDType::Fp8E4M3 ? DType::fp8_e4m3 : DType::fp8_e5m2;
  const KVCache ref = make_kv_cache(layout, num_blocks, bs, H, D, cache_dt);
  const KVCache opt = make_kv_cache(layout, num_blocks, bs, H, D, cache_dt);
  fill_nan(ref.backing);
  fill_nan(opt.backing);
  ReshapeAndCacheArgs a;
  // key as a strided view (every other row of a bigger tensor)
  a.key = Tensor::empty({T_pad * 2, H, D}, model).slice(0, 0, T_pad * 2, 2);
  a.value = Tensor::empty({T_pad, H, D}, model);
  fill_uniform(a.key, rng, -3, 3);
  fill_uniform(a.value, rng, -3, 3);
  // distinct slots, some negative (skipped), never block 0
  std::vector<int64_t> all;
  for (int64_t s = bs; s < num_blocks * bs; ++s) all.push_back(s);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int64_t> slots(all.begin(), all.begin() + T);
  slots[2] = -1;
  slots[7] = -5;
  a.slot_mapping = Tensor::from_vector(slots);
  a.key_cache = ref.k;
  a.value_cache = ref.v;
  a.kv_cache_dtype = kvdt;
  if (kvdt != KVCacheDType::Auto) {
    a.k_scale = Tensor::empty({per_head ? H : 1}, DType::f32);
    a.v_scale = Tensor::empty({per_head ? H : 1}, DType::f32);
    fill_uniform(a.k_scale, rng, 0.005, 0.02);  // small scales: some values saturate
    fill_uniform(a.v_scale, rng, 0.5, 2.0);
  }
  reference::reshape_and_cache_flash(a);
  a.key_cache = opt.k;
  a.value_cache = opt.v;
  reshape_and_cache_flash(a);
  // identical bytes (NaN poison included) in both caches
  const std::vector<double> rb = ref.backing.view_as(DType::u8).to_double_vector();
  const std::vector<double> ob = opt.backing.view_as(DType::u8).to_double_vector();
  ASSERT_EQ(rb, ob);
  // oracle
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    const int64_t blk = slots[t] / bs, off = slots[t] % bs;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < D; ++i) {
        for (int w = 0; w < 2; ++w) {
          const Tensor& src = w == 0 ? a.key : a.value;
          const Tensor& dst = w == 0 ? opt.k : opt.v;
          const float x = static_cast<float>(src.get({t, h, i}));
          double want = x;
          if (kvdt != KVCacheDType::Auto) {
            const Tensor& sc = w == 0 ? a.k_scale : a.v_scale;
            const float s = static_cast<float>(sc.get({per_head ? h : 0}));
            const float q = x / s;
            want = cache_dt == DType::fp8_e4m3 ? fp8_e4m3_bits_to_f32(f32_to_fp8_e4m3_bits(q))
                                               : fp8_e5m2_bits_to_f32(f32_to_fp8_e5m2_bits(q));
            const double maxv = cache_dt == DType::fp8_e4m3 ? 448.0 : 57344.0;
            ASSERT_LE(std::abs(want), maxv);  // saturated, never inf
          }
          ASSERT_EQ(dst.get({blk, off, h, i}), want) << "t=" << t << " h=" << h << " i=" << i;
        }
      }
  }
  // unwritten slots still hold the poison
  int64_t untouched = 0;
  for (double x : opt.k.to_double_vector()) untouched += std::isnan(x);
  EXPECT_EQ(untouched, (num_blocks * bs - (T - 2)) * H * D);
}

TEST(ReshapeAndCacheFlash, EveryLayoutDtypeAndScale) {
  uint32_t seed = 1;
  for (int layout = 0; layout < kNumLayouts; ++layout) {
    for (DType model : {DType::f32, DType::bf16, DType::f16}) check_reshape(layout, model, KVCacheDType::Auto, false, seed++);
    check_reshape(layout, DType::bf16, KVCacheDType::Fp8E4M3, false, seed++);
    check_reshape(layout, DType::f16, KVCacheDType::Fp8E4M3, true, seed++);
    check_reshape(layout, DType::f32, KVCacheDType::Fp8E5M2, layout % 2 == 0, seed++);
  }
}

TEST(ReshapeAndCacheFlash, VllmOrderAndUint8Cache) {
  Tensor key = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}, Dims{1, 1, 8});
  Tensor value = Tensor::from_vector(std::vector<float>{-1, -2, -3, -4, -5, -6, -7, 900}, Dims{1, 1, 8});
  Tensor kc = Tensor::zeros({2, 2, 1, 8}, DType::u8), vc = Tensor::zeros({2, 2, 1, 8}, DType::u8);
  Tensor scale = Tensor::from_vector(std::vector<float>{2.f});
  reshape_and_cache_flash(key, value, kc, vc, Tensor::from_vector(std::vector<int64_t>{3}), "fp8", scale, scale);
  const Tensor k8 = kc.view_as(DType::fp8_e4m3), v8 = vc.view_as(DType::fp8_e4m3);
  EXPECT_EQ(k8.get({1, 1, 0, 0}), 0.5);
  EXPECT_EQ(k8.get({1, 1, 0, 7}), 4.0);
  EXPECT_EQ(v8.get({1, 1, 0, 7}), 448.0);  // 450 saturates to e4m3 max
  EXPECT_EQ(k8.get({0, 0, 0, 0}), 0.0);
}

TEST(ReshapeAndCacheFlash, BadArguments) {
  const auto base = [] {
    ReshapeAndCacheArgs a;
    a.key = Tensor::zeros({4, 2, 8}, DType::bf16);
    a.value = Tensor::zeros({4, 2, 8}, DType::bf16);
    a.key_cache = Tensor::zeros({3, 4, 2, 8}, DType::bf16);
    a.value_cache = Tensor::zeros({3, 4, 2, 8}, DType::bf16);
    a.slot_mapping = Tensor::from_vector(std::vector<int64_t>{4, 5, -1});
    return a;
  };
  reshape_and_cache_flash(base());
  const auto expect = [](const ReshapeAndCacheArgs& a, const std::string& needle) {
    for (int impl = 0; impl < 2; ++impl) {
      try {
        if (impl == 0) reshape_and_cache_flash(a);
        else reference::reshape_and_cache_flash(a);
        ADD_FAILURE() << "expected error: " << needle;
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
    }
  };
  { auto a = base(); a.slot_mapping = Tensor::from_vector(std::vector<int64_t>{4, 12}); expect(a, "beyond the cache"); }
  { auto a = base(); a.slot_mapping = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5}); expect(a, "shorter"); }
  { auto a = base(); a.value = Tensor::zeros({4, 2, 8}, DType::f16); expect(a, "value dtype"); }
  { auto a = base(); a.key_cache = Tensor::zeros({3, 4, 2, 8}, DType::f16); a.value_cache = a.key_cache; expect(a, "auto"); }
  { auto a = base(); a.key_cache = Tensor::zeros({3, 4, 3, 8}, DType::bf16); a.value_cache = a.key_cache; expect(a, "num_kv_heads"); }
  {
    auto a = base();
    a.kv_cache_dtype = KVCacheDType::Fp8E4M3;
    a.key_cache = Tensor::zeros({3, 4, 2, 8}, DType::fp8_e4m3);
    a.value_cache = Tensor::zeros({3, 4, 2, 8}, DType::fp8_e4m3);
    expect(a, "needs `k_scale`");
    a.k_scale = Tensor::from_vector(std::vector<float>{1, 1, 1});
    a.v_scale = Tensor::from_vector(std::vector<float>{1, 1, 1});
    expect(a, "num_kv_heads = 2");
    a.k_scale = Tensor::from_vector(std::vector<float>{1, 1});
    a.v_scale = Tensor::from_vector(std::vector<float>{1});
    expect(a, "both must be per tensor or per head");
    a.v_scale = Tensor::from_vector(std::vector<float>{0, 1});
    expect(a, "positive finite scale");
    a.key_cache = Tensor::zeros({3, 4, 2, 8}, DType::fp8_e5m2);
    a.value_cache = a.key_cache;
    expect(a, "fp8_e4m3");
  }
  // The cache's own 16-bit dtype by name: a bfloat16 cache takes bfloat16 keys; a float16 cache,
  // or float32 keys, are refused.
  {
    ReshapeAndCacheArgs b;
    b.key = Tensor::from_vector(std::vector<float>(2 * 2 * 8, 0.5f), Dims{2, 2, 8}).to(DType::bf16);
    b.value = b.key;
    b.key_cache = Tensor::zeros({3, 4, 2, 8}, DType::bf16);
    b.value_cache = Tensor::zeros({3, 4, 2, 8}, DType::bf16);
    b.slot_mapping = Tensor::from_vector(std::vector<int64_t>{0, 5});
    b.kv_cache_dtype = KVCacheDType::BFloat16;
    reshape_and_cache_flash(b);
    EXPECT_EQ(b.key_cache.select(0, 1).select(0, 1).to(DType::f32).data_ptr<float>()[0], 0.5f);
    b.kv_cache_dtype = KVCacheDType::Float16;
    expect(b, "stores float16");
    b.kv_cache_dtype = KVCacheDType::BFloat16;
    b.key = b.key.to(DType::f32);
    b.value = b.key;
    expect(b, "its own dtype");
    b.kv_cache_dtype = KVCacheDType::Nvfp4;
    EXPECT_THROW(reshape_and_cache_flash(b), Unsupported);
  }
  {
    const auto a = base();
    EXPECT_THROW(reshape_and_cache_flash(a.key, a.value, a.key_cache, a.value_cache, a.slot_mapping, "int4",
                                         Tensor(), Tensor()),
                 InvalidArgument);
  }
  EXPECT_EQ(parse_kv_cache_dtype("fp8"), KVCacheDType::Fp8);
}

TEST(ZeroKvBlocks, ZeroesOnlyTheRequestedBlocksOfEverySegment) {
  // Two segments over one int32 buffer: seg 0 pages of 6 words every 10 words, seg 1 pages of
  // 3 words every 7 words starting at word 400.
  std::vector<int32_t> buf(600);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<int32_t>(i + 1);
  const int64_t base = static_cast<int64_t>(reinterpret_cast<uintptr_t>(buf.data()));
  const Tensor addrs = Tensor::from_vector(std::vector<int64_t>{base, base + 400 * 4});
  const Tensor strides = Tensor::from_vector(std::vector<int64_t>{10, 7});
  const Tensor pages = Tensor::from_vector(std::vector<int64_t>{6, 3});
  zero_kv_blocks(addrs, strides, pages, Tensor::from_vector(std::vector<int32_t>{3, 0, 20}));
  for (int64_t i = 0; i < 600; ++i) {
    bool zero = false;
    for (int64_t b : {3, 0, 20}) {
      if (i >= b * 10 && i < b * 10 + 6) zero = true;
      if (i >= 400 + b * 7 && i < 400 + b * 7 + 3) zero = true;
    }
    ASSERT_EQ(buf[i], zero ? 0 : i + 1) << "word " << i;
  }
  zero_kv_blocks(addrs, strides, pages, Tensor::empty({0}, DType::i64));  // no blocks: no-op
  EXPECT_THROW(zero_kv_blocks(addrs, strides, pages, Tensor::from_vector(std::vector<int64_t>{-1})), InvalidArgument);
  EXPECT_THROW(zero_kv_blocks(addrs, strides, Tensor::from_vector(std::vector<int64_t>{6}), Tensor::from_vector(std::vector<int64_t>{1})),
               InvalidArgument);
  EXPECT_THROW(zero_kv_blocks(addrs, strides.to(DType::i32), pages, Tensor::from_vector(std::vector<int64_t>{1})),
               InvalidArgument);
  EXPECT_THROW(zero_kv_blocks(Tensor::from_vector(std::vector<int64_t>{base + 2, base}), strides, pages,
                              Tensor::from_vector(std::vector<int64_t>{1})),
               InvalidArgument);
}

TEST(CopyPageIndices, GathersEachRowPrefix) {
  const Tensor bt = Tensor::from_vector(std::vector<int32_t>{5, 6, 7, 9, 9, 9, 1, 2, 3}, Dims{3, 3});
  const Tensor ip = Tensor::from_vector(std::vector<int32_t>{0, 2, 2, 5});
  Tensor out = Tensor::from_vector(std::vector<int32_t>{-1, -1, -1, -1, -1, -1});
  copy_page_indices(out, bt.transpose(0, 1).contiguous().transpose(0, 1), ip);  // strided table
  EXPECT_EQ(out.to_vector<int32_t>(), (std::vector<int32_t>{5, 6, 1, 2, 3, -1}));
  EXPECT_THROW(copy_page_indices(out, bt, Tensor::from_vector(std::vector<int32_t>{0, 4, 4, 5})), InvalidArgument);
  EXPECT_THROW(copy_page_indices(out, bt, Tensor::from_vector(std::vector<int32_t>{0, 2, 4, 7})), InvalidArgument);
  EXPECT_THROW(copy_page_indices(out, bt, Tensor::from_vector(std::vector<int32_t>{0, 2, 4})), InvalidArgument);
}

TEST(MambaAlignBlockTable, GathersTheLastBlocks) {
  // block_size 4: seq 0 -> start 0 (clamped), seq 5 -> start 1, seq 8 -> start 1, seq 9 -> start 2
  const Tensor bt = Tensor::from_vector(std::vector<int64_t>{10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33,
                                                             40, 41, 42, 43},
                                        Dims{4, 4});
  const Tensor sl = Tensor::from_vector(std::vector<int32_t>{0, 5, 8, 9});
  Tensor out = Tensor::zeros({4, 2}, DType::i64);
  mamba_align_block_table(out, bt, sl, 4);
  EXPECT_EQ(out.to_vector<int64_t>(), (std::vector<int64_t>{10, 11, 21, 22, 31, 32, 42, 43}));
  Tensor out3 = Tensor::zeros({4, 3}, DType::i64);
  EXPECT_THROW(mamba_align_block_table(out3, bt, sl, 4), InvalidArgument);  // 2 + 3 > 4 columns
  EXPECT_THROW(mamba_align_block_table(out, bt, sl.slice(0, 0, 3), 4), InvalidArgument);
  EXPECT_THROW(mamba_align_block_table(Tensor::zeros({4, 2}, DType::i32), bt, sl, 4), InvalidArgument);
}

TEST(KvFp8Dequant, FillsTheScratchCachePerRequest) {
  std::mt19937 rng(5);
  for (int layout : {1, 3, 7}) {
    const KVCache c = make_kv_cache(layout, 6, 4, 2, 8, DType::fp8_e4m3);
    fill_cache(c, rng);
    const Tensor bt = Tensor::from_vector(std::vector<int32_t>{3, 5, 0, 1, 2, 4}, Dims{2, 3});
    const Tensor ks = Tensor::from_vector(std::vector<float>{0.5f}), vs = Tensor::from_vector(std::vector<float>{2.f});
    const Tensor ok = Tensor::empty({7, 4, 2, 8}, DType::bf16), ov = Tensor::empty({7, 4, 2, 8}, DType::bf16);
    fill_nan(ok);
    fill_nan(ov);
    kvfp8_dequant(c.k, c.v, bt, ks, vs, ok, ov);
    const Tensor mock = make_mock_block_table(2, 3);
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t col = 0; col < 3; ++col) {
        const int64_t page = bt.get({r, col}), m = mock.get({r, col});
        EXPECT_EQ(m, r * 3 + 1 + col);
        for (double x : ok.select(0, m).to_double_vector()) EXPECT_EQ(std::isnan(x), page == 0);
        if (page == 0) continue;
        for (int64_t s = 0; s < 4; ++s)
          for (int64_t h = 0; h < 2; ++h)
            for (int64_t i = 0; i < 8; ++i) {
              EXPECT_EQ(ok.get({m, s, h, i}), bf16_bits_to_f32(f32_to_bf16_bits(static_cast<float>(c.k.get({page, s, h, i})) * 0.5f)));
              EXPECT_EQ(ov.get({m, s, h, i}), bf16_bits_to_f32(f32_to_bf16_bits(static_cast<float>(c.v.get({page, s, h, i})) * 2.f)));
            }
      }
    for (double x : ok.select(0, 0).to_double_vector()) EXPECT_TRUE(std::isnan(x));  // mock page 0 untouched
    EXPECT_THROW(kvfp8_dequant(c.k, c.v, bt, ks, vs, ok.slice(0, 0, 6), ov), InvalidArgument);
    EXPECT_THROW(kvfp8_dequant(c.k, c.v, Tensor::from_vector(std::vector<int32_t>{6}, Dims{1, 1}), ks, vs, ok, ov),
                 InvalidArgument);
  }
}

}  // namespace
}  // namespace kvattn::ops
