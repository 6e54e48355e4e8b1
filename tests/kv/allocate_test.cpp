// allocate_kv_cache / create_kv_cache_views: every view element is checked against a byte-address
// oracle written per layout from the KVCacheTensor contract, and byte ownership is checked over
// the whole backing buffer.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/core/error.h"
#include "kvattn/kv/allocate.h"

namespace kvattn {
namespace {

using L = KVCacheLayout;

// Byte address (relative to the backing buffer) of logical element (l, b, h, n, c_byte) of a
// KVCacheTensor, derived by hand for each layout.  H, N, C = page geometry (C in bytes),
// num_layers = layers in the tensor, `bpb` = bytes per block of the whole cache (block-outer).
int64_t oracle_address(L layout, const KVCacheTensor& t, int64_t H, int64_t N, int64_t C, int64_t l, int64_t b,
                       int64_t h, int64_t n, int64_t c) {
  const auto num_layers = static_cast<int64_t>(t.layers.size());
  switch (layout) {
    case L::LBHNC:
    case L::BLHNC:  // page (l, b) is one run at offset + l*layer_stride + b*block_stride, HND inside
      return t.offset + l * t.layer_stride + b * t.block_stride + h * N * C + n * C + c;
    case L::LBNHC:
    case L::BLNHC:  // same run, NHD inside
      return t.offset + l * t.layer_stride + b * t.block_stride + n * H * C + h * C + c;
    case L::LHBNC: {  // [L][H][B][N][C] dense, num_blocks = layer_stride / (H*N*C)
      const int64_t B = t.layer_stride / (H * N * C);
      return t.offset + l * H * B * N * C + h * B * N * C + b * N * C + n * C + c;
    }
    case L::BHLNC:  // per block: [H][L][N][C]
      return t.offset + b * t.block_stride + h * num_layers * N * C + l * N * C + n * C + c;
  }
  return -1;
}

// Byte address of element `idx` of a view relative to the start of its storage.
int64_t view_address(const Tensor& v, int64_t b, int64_t h, int64_t n, int64_t ce) {
  const int64_t el = v.element_size();
  return v.byte_offset() + (b * v.stride(0) + h * v.stride(1) + n * v.stride(2) + ce * v.stride(3)) * el;
}

// 4 layers alternating sliding window / full attention -> 2 overlaid groups of 2 layers.
// H=2, block 4, head 4, f16: C = 16 bytes, page = 128.
std::vector<LayerKVCacheSpec> two_group_model() {
  auto sw = SlidingWindowSpec(4, 2, 4, DType::f16, 8);
  auto full = FullAttentionSpec(4, 2, 4, DType::f16);
  return {{"l0", sw}, {"l1", full}, {"l2", sw}, {"l3", full}};
}

TEST(AllocateTest, ViewsMatchByteOracleEveryLayout) {
  const int64_t H = 2, N = 4, C = 16, nb = 3;
  for (L layout : kAllKVCacheLayouts) {
    SCOPED_TRACE(layout_name(layout));
    const auto cfg = materialize_kv_cache_config(get_kv_cache_groups(two_group_model()), layout, nb);
    ASSERT_EQ(cfg.kv_cache_groups.size(), 2u);
    const auto views = allocate_kv_cache(cfg, Device::cpu(), layout);
    ASSERT_EQ(views.size(), 4u);
    const int64_t size = cfg.kv_cache_tensors[0].size;
    ASSERT_EQ(size, nb * 2 * 128);
    std::vector<std::vector<int>> owners_by_group(2, std::vector<int>(static_cast<size_t>(size), -1));
    for (const auto& t : cfg.kv_cache_tensors) {
      const size_t g = *cfg.group_index_of(t.layers[0]);
      for (size_t l = 0; l < t.layers.size(); ++l) {
        const Tensor& v = views.at(t.layers[l]);
        ASSERT_EQ(v.dtype(), DType::f16);
        ASSERT_EQ(v.shape(), (Dims{nb, H, N, C / 2}));
        ASSERT_EQ(v.storage(), views.at("l0").storage());  // one backing buffer
        for (int64_t b = 0; b < nb; ++b)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t n = 0; n < N; ++n)
              for (int64_t ce = 0; ce < C / 2; ++ce) {
                const int64_t addr = view_address(v, b, h, n, ce);
                ASSERT_EQ(addr, oracle_address(layout, t, H, N, C, static_cast<int64_t>(l), b, h, n, ce * 2));
                for (int64_t k = 0; k < 2; ++k) {
                  ASSERT_GE(addr + k, 0);
                  ASSERT_LT(addr + k, size);
                  int& owner = owners_by_group[g][static_cast<size_t>(addr + k)];
                  ASSERT_EQ(owner, -1) << "byte " << addr + k << " owned twice in group " << g;
                  owner = static_cast<int>(l);
                }
              }
      }
    }
    // Each group covers the whole buffer exactly once; the two groups overlay the same bytes.
    for (const auto& owners : owners_by_group)
      for (int o : owners) ASSERT_NE(o, -1);
  }
}

TEST(AllocateTest, WritesThroughViewsLandOnOracleBytes) {
  const int64_t H = 2, N = 4, C = 16, nb = 3;
  for (L layout : kAllKVCacheLayouts) {
    SCOPED_TRACE(layout_name(layout));
    const auto cfg = materialize_kv_cache_config(get_kv_cache_groups(two_group_model()), layout, nb);
    const auto views = allocate_kv_cache(cfg, Device::cpu(), layout);
    const Tensor raw16 = Tensor::from_buffer(views.at("l0").storage(), 0, Dims{cfg.kv_cache_tensors[0].size / 2},
                                             Dims{1}, DType::f16);
    for (const auto& t : cfg.kv_cache_tensors) {  // group by group: the later group overwrites
      for (size_t l = 0; l < t.layers.size(); ++l) {
        Tensor v = views.at(t.layers[l]);
        for (int64_t b = 0; b < nb; ++b)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t n = 0; n < N; ++n)
              for (int64_t ce = 0; ce < C / 2; ++ce)
                v.set({b, h, n, ce}, static_cast<double>(((l * 7 + b) * 5 + h) * 40 + n * 8 + ce) + 1);
      }
      for (size_t l = 0; l < t.layers.size(); ++l)
        for (int64_t b = 0; b < nb; ++b)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t n = 0; n < N; ++n)
              for (int64_t ce = 0; ce < C / 2; ++ce) {
                const int64_t addr = oracle_address(layout, t, H, N, C, static_cast<int64_t>(l), b, h, n, ce * 2);
                ASSERT_EQ(raw16.get({addr / 2}),
                          static_cast<double>(((static_cast<int64_t>(l) * 7 + b) * 5 + h) * 40 + n * 8 + ce) + 1);
              }
    }
  }
}

TEST(AllocateTest, HybridMambaBlockOuter) {
  auto attn = FullAttentionSpec(4, 2, 4, DType::f16);  // page 128
  KVCacheSpecPtr mamba = std::make_shared<MambaSpec>(4, std::vector<std::vector<int64_t>>{{10}},
                                                     std::vector<DType>{DType::f32});  // page 40
  std::vector<LayerKVCacheSpec> layers = {{"m0", mamba}, {"a0", attn}, {"m1", mamba}, {"m2", mamba}, {"a1", attn}};
  for (L layout : {L::BLHNC, L::BLNHC}) {
    const auto cfg = materialize_kv_cache_config(get_kv_cache_groups(layers), layout, 5);
    const int64_t bpb = get_kv_cache_bytes_per_block(cfg.kv_cache_groups, layout);
    ASSERT_EQ(bpb, 256);  // max(2 * 40 (+ a group of 1 Mamba), 2 * 128)
    const auto views = allocate_kv_cache(cfg, Device::cpu(), layout);
    ASSERT_EQ(views.size(), 5u);
    for (const char* m : {"m0", "m1", "m2"}) {
      const Tensor& r = views.at(m);
      EXPECT_EQ(r.dim(), 1);
      EXPECT_EQ(r.dtype(), DType::u8);
      EXPECT_EQ(r.size(0), 5 * bpb);
      EXPECT_EQ(r.storage(), views.at("a0").storage());
    }
    std::vector<int> owner(static_cast<size_t>(5 * bpb), -1);
    for (const auto& t : cfg.kv_cache_tensors) {
      if (!cfg.layer_spec(t.layers[0])->has_layer_views()) continue;
      for (size_t l = 0; l < t.layers.size(); ++l) {
        const Tensor& v = views.at(t.layers[l]);
        ASSERT_EQ(v.shape(), (Dims{5, 2, 4, 8}));
        for (int64_t b = 0; b < 5; ++b)
          for (int64_t h = 0; h < 2; ++h)
            for (int64_t n = 0; n < 4; ++n)
              for (int64_t ce = 0; ce < 8; ++ce) {
                const int64_t addr = view_address(v, b, h, n, ce);
                ASSERT_EQ(addr, oracle_address(layout, t, 2, 4, 16, static_cast<int64_t>(l), b, h, n, ce * 2));
                ASSERT_GE(addr, b * bpb);
                ASSERT_LT(addr + 1, (b + 1) * bpb);
                ASSERT_EQ(owner[static_cast<size_t>(addr)], -1);
                owner[static_cast<size_t>(addr)] = static_cast<int>(l);
              }
      }
    }
  }
}

TEST(AllocateTest, KernelBlockSplitting) {
  // bs 8, kernel 4 -> each manager block = 2 back-to-back dense kernel pages [H, 4, C].
  const int64_t H = 2, C = 16, nb = 3, page = H * 8 * C, kpage = page / 2;
  auto spec = FullAttentionSpec(8, H, 4, DType::f16);
  struct Case {
    L layout;
    int layers;
  };
  for (Case cs : {Case{L::LBHNC, 2}, Case{L::LBNHC, 2}, Case{L::BLHNC, 1}, Case{L::BLNHC, 1}}) {
    SCOPED_TRACE(layout_name(cs.layout));
    std::vector<std::string> names;
    for (int i = 0; i < cs.layers; ++i) names.push_back(fmt::format("x{}", i));
    const auto cfg = materialize_kv_cache_config({{names, spec}}, cs.layout, nb);
    const auto views = allocate_kv_cache(cfg, Device::cpu(), cs.layout, std::vector<int64_t>{4});
    const auto& t = cfg.kv_cache_tensors[0];
    for (int l = 0; l < cs.layers; ++l) {
      const Tensor& v = views.at(names[static_cast<size_t>(l)]);
      ASSERT_EQ(v.shape(), (Dims{nb * 2, H, 4, C / 2}));
      for (int64_t kb = 0; kb < nb * 2; ++kb)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t n = 0; n < 4; ++n)
            for (int64_t ce = 0; ce < C / 2; ++ce) {
              const int64_t base = t.offset + l * t.layer_stride + (kb / 2) * t.block_stride + (kb % 2) * kpage;
              const bool hnd = cs.layout == L::LBHNC || cs.layout == L::BLHNC;
              const int64_t inner = hnd ? h * 4 * C + n * C + ce * 2 : n * H * C + h * C + ce * 2;
              ASSERT_EQ(view_address(v, kb, h, n, ce), base + inner);
            }
    }
  }
  // Refused where a block's page is not one dense run of its own.
  for (Case cs : {Case{L::BLHNC, 2}, Case{L::LHBNC, 1}, Case{L::BHLNC, 2}}) {
    std::vector<std::string> names;
    for (int i = 0; i < cs.layers; ++i) names.push_back(fmt::format("x{}", i));
    const auto cfg = materialize_kv_cache_config({{names, spec}}, cs.layout, nb);
    try {
      (void)allocate_kv_cache(cfg, Device::cpu(), cs.layout, std::vector<int64_t>{4});
      ADD_FAILURE() << layout_name(cs.layout);
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("does not store blocks as dense, unpadded pages"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("Reduce --block-size to 4"), std::string::npos);
    }
  }
  // A kernel size that does not divide the block size.
  const auto cfg = materialize_kv_cache_config({{{"x0"}, spec}}, L::LBHNC, nb);
  EXPECT_THROW((void)allocate_kv_cache(cfg, Device::cpu(), L::LBHNC, std::vector<int64_t>{3}), InvalidArgument);
  // kernel_block_sizes shorter than the groups: the group is not split.
  EXPECT_EQ(allocate_kv_cache(cfg, Device::cpu(), L::LBHNC, std::vector<int64_t>{}).at("x0").size(0), nb);
}

TEST(AllocateTest, CompressedMlaShapes) {
  // vLLM test_allocate_compressed_mla_cache: bs 256, 4 tokens/state, hs 128, bf16, 4 pages.
  auto mla = MLAAttentionSpec(256, 1, 128, DType::bf16, {.tokens_per_state = {4, 1}});
  const auto cfg = materialize_kv_cache_config({{{"mla"}, mla}}, L::LBNHC, 4);
  EXPECT_EQ(allocate_kv_cache(cfg, Device::cpu(), L::LBNHC).at("mla").shape(), (Dims{4, 1, 64, 128}));
  EXPECT_EQ(allocate_kv_cache(cfg, Device::cpu(), L::LBNHC, std::vector<int64_t>{64}).at("mla").shape(),
            (Dims{16, 1, 16, 128}));
}

TEST(AllocateTest, PaddedPageStrides) {
  // vLLM test_reshape_padded_kv_cache_strides_by_padded_page.
  auto spec = FullAttentionSpec(16, 1, 2, DType::f32, {.page_size_padded = 384});
  const auto cfg = materialize_kv_cache_config({{{"p"}, spec}}, L::LBHNC, 5);
  const Tensor v = allocate_kv_cache(cfg, Device::cpu(), L::LBHNC).at("p");
  EXPECT_EQ(v.shape(), (Dims{5, 1, 16, 4}));
  EXPECT_EQ(v.stride(0), 384 / 4);
  EXPECT_TRUE(v.select(0, 0).is_contiguous());
  EXPECT_EQ(v.storage()->size(), 5u * 384u);
  EXPECT_THROW((void)allocate_kv_cache(cfg, Device::cpu(), L::LBHNC, std::vector<int64_t>{8}), InvalidArgument);
}

TEST(AllocateTest, BlockDensityMatchesLayoutCompactness) {
  auto spec = FullAttentionSpec(4, 2, 4, DType::f16);  // page 128
  for (L layout : kAllKVCacheLayouts) {
    const auto cfg = materialize_kv_cache_config({{{"a", "b"}, spec}}, layout, 3);
    const auto views = allocate_kv_cache(cfg, Device::cpu(), layout);
    for (const auto& [name, v] : views) {
      const Tensor blk = v.select(0, 1);
      auto [lo, hi] = blk.byte_extent();
      const bool dense = hi - lo == 128;
      EXPECT_EQ(dense, is_block_compact(layout)) << layout_name(layout);
      if (!is_block_compact(layout))
        for (int64_t h = 0; h < 2; ++h) {  // otherwise each head's [N, C] of a block is dense
          auto [hlo, hhi] = v.select(1, h).select(0, 1).byte_extent();
          EXPECT_EQ(hhi - hlo, 64) << layout_name(layout);
        }
      // Physical-order permutation is contiguous within a block for block-compact layouts.
      const auto o = layer_view_order(layout);
      const Tensor phys = v.permute(Dims{o[0], o[1], o[2], o[3]});
      if (is_layer_compact(layout) && layout != L::LHBNC) {
        EXPECT_TRUE(phys.is_contiguous()) << layout_name(layout);
      }
    }
  }
}

TEST(AllocateTest, DtypesAndRawViews) {
  auto fp8 = FullAttentionSpec(4, 1, 8, DType::fp8_e4m3, {.kv_quant_mode = KVQuantMode::FP8_PER_TENSOR});
  const auto cfg = materialize_kv_cache_config({{{"q"}, fp8}}, L::LBNHC, 2);
  const Tensor v = allocate_kv_cache(cfg, Device::cpu(), L::LBNHC).at("q");
  EXPECT_EQ(v.dtype(), DType::fp8_e4m3);
  EXPECT_EQ(v.shape(), (Dims{2, 1, 4, 16}));
  // create_kv_cache_views directly on a caller-provided raw tensor with a byte offset.
  const Tensor raw = Tensor::zeros(Dims{1024}, DType::u8);
  KVCacheTensor t{1024, {"a"}, 128, 128, 256};
  auto f32 = FullAttentionSpec(4, 1, 4, DType::f32);  // page 4 * 32 = 128
  auto vs = create_kv_cache_views(raw, *f32, 2, L::LBHNC, t);
  ASSERT_EQ(vs.size(), 1u);
  EXPECT_EQ(vs[0].byte_offset(), 256);
  EXPECT_EQ(vs[0].shape(), (Dims{2, 1, 4, 8}));
  EXPECT_THROW((void)create_kv_cache_views(raw.view_as(DType::f32), *f32, 2, L::LBHNC, t), InvalidArgument);
  KVCacheTensor too_far{1024, {"a"}, 128, 128, 1000};
  EXPECT_THROW((void)create_kv_cache_views(raw, *f32, 2, L::LBHNC, too_far), InvalidArgument);
  KVCacheTensor none{1024, {}, 128, 128, 0};
  EXPECT_THROW((void)create_kv_cache_views(raw, *f32, 2, L::LBHNC, none), InvalidArgument);
}

TEST(AllocateTest, ConfigErrors) {
  EXPECT_TRUE(allocate_kv_cache(KVCacheConfig{}, Device::cpu(), L::LBNHC).empty());
  auto spec = FullAttentionSpec(4, 1, 4, DType::f32);
  auto cfg = materialize_kv_cache_config({{{"a"}, spec}, {{"b"}, spec}}, L::LBNHC, 2);
  ASSERT_EQ(cfg.kv_cache_tensors.size(), 2u);
  auto bad = cfg;
  bad.kv_cache_tensors[1].size += 1;
  try {
    (void)allocate_kv_cache(bad, Device::cpu(), L::LBNHC);
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache tensors must share one backing allocation"), std::string::npos);
  }
  auto orphan = cfg;
  orphan.kv_cache_tensors[1].layers = {"zzz"};
  EXPECT_THROW((void)allocate_kv_cache(orphan, Device::cpu(), L::LBNHC), InvalidArgument);
  auto oob = cfg;
  oob.kv_cache_tensors[1].offset = 1 << 20;
  EXPECT_THROW((void)allocate_kv_cache(oob, Device::cpu(), L::LBNHC), InvalidArgument);
  auto tiny = cfg;
  for (auto& t : tiny.kv_cache_tensors) t.size = 64;  // smaller than 2 blocks of 128
  EXPECT_THROW((void)allocate_kv_cache(tiny, Device::cpu(), L::LBNHC), InvalidArgument);
  // Groups overlay: both layers start at byte 0.
  const auto views = allocate_kv_cache(cfg, Device::cpu(), L::LBNHC);
  EXPECT_EQ(views.at("a").data(), views.at("b").data());
}

TEST(AllocateTest, CudaDevice) {
  auto spec = FullAttentionSpec(16, 8, 128, DType::bf16);
  const auto cfg = materialize_kv_cache_config({{{"a", "b"}, spec}}, L::BLHNC, 4);
  if (!cuda::built_with_cuda()) {
    EXPECT_THROW((void)allocate_kv_cache(cfg, Device::cuda(0), L::BLHNC), Unsupported);
    return;
  }
  if (!cuda::available()) GTEST_SKIP() << "built with CUDA but no GPU present";
  const auto views = allocate_kv_cache(cfg, Device::cuda(0), L::BLHNC);
  EXPECT_TRUE(views.at("a").device().is_cuda());
  EXPECT_EQ(views.at("b").shape(), (Dims{4, 8, 16, 256}));
  EXPECT_EQ(views.at("b").stride(0), 2 * 65536 / 2);
}

}  // namespace
}  // namespace kvattn
