// AttentionGroup: manager-block <-> kernel-block mapping (vllm-facts §2.6).
#include <gtest/gtest.h>

#include "kvattn/kv/allocate.h"
#include "kvattn/kv/attention_group.h"
#include "kvattn/kv/kv_cache_config.h"

namespace kvattn {
namespace {

AttentionGroup make_group(KVCacheSpecPtr spec, std::optional<int64_t> kernel, const BlockSizeBackend* backend = nullptr) {
  AttentionGroup g;
  g.backend = backend;
  g.layer_names = {"model.layers.0.attn"};
  g.kv_cache_spec = std::move(spec);
  g.configure_kernel_blocks(kernel, /*num_ubatches=*/2, /*max_num_reqs=*/4, /*block_table_width=*/8);
  return g;
}

TEST(WorkerAttentionGroup, KernelBlockTableUpstreamVector) {
  // bt [[0, 2]], 64-token blocks split into 16-token kernel blocks (ratio 4).
  AttentionGroup g = make_group(FullAttentionSpec(64, 1, 64, DType::bf16), 16);
  ASSERT_EQ(g.kernel_block_size, 16);
  EXPECT_EQ(g.blocks_per_kv_block(), 4);
  EXPECT_EQ(g.kernel_block_offsets.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2, 3}));
  const Tensor bt = Tensor::from_vector<int32_t>({0, 2}, {1, 2});
  Tensor out = g.map_to_kernel_block_table(bt);
  EXPECT_EQ(out.shape(), (Dims{1, 8}));
  EXPECT_EQ(out.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2, 3, 8, 9, 10, 11}));
  // The result is a view of the persistent per-ubatch table.
  EXPECT_EQ(out.data(), g.kernel_block_table.select(0, 0).data());
  // Packed cache: kernel block stride 5.
  g.kernel_block_stride = 5;
  EXPECT_EQ(g.map_to_kernel_block_table(bt, 1).to_vector<int32_t>(),
            (std::vector<int32_t>{0, 1, 2, 3, 10, 11, 12, 13}));
  EXPECT_EQ(g.kernel_block_table.select(0, 1).select(0, 0).slice(0, 0, 8).to_vector<int32_t>(),
            (std::vector<int32_t>{0, 1, 2, 3, 10, 11, 12, 13}));
}

TEST(WorkerAttentionGroup, KernelBlockTableMultiRowAndStrided) {
  AttentionGroup g = make_group(FullAttentionSpec(32, 1, 64, DType::bf16), 16);  // ratio 2
  // A strided (non-contiguous) block table view: every other column of [[1,9,3,9],[4,9,7,9]].
  const Tensor full = Tensor::from_vector<int32_t>({1, 9, 3, 9, 4, 9, 7, 9}, {2, 4});
  const Tensor bt = full.slice(1, 0, 4, 2);
  EXPECT_EQ(g.map_to_kernel_block_table(bt).to_vector<int32_t>(),
            (std::vector<int32_t>{2, 3, 6, 7, 8, 9, 14, 15}));
}

TEST(WorkerAttentionGroup, NoKernelBlockSizeIsIdentityAndErrors) {
  AttentionGroup same = make_group(FullAttentionSpec(16, 1, 64, DType::bf16), 16);
  EXPECT_FALSE(same.kernel_block_size.has_value());  // equal to the block size: no split
  const Tensor bt = Tensor::from_vector<int32_t>({5, 6}, {1, 2});
  EXPECT_EQ(same.map_to_kernel_block_table(bt).data(), bt.data());

  AttentionGroup g = make_group(FullAttentionSpec(64, 1, 64, DType::bf16), 16);
  EXPECT_THROW(g.map_to_kernel_block_table(Tensor::zeros({5, 2}, DType::i32)), InvalidArgument);  // 5 rows > 4
  EXPECT_THROW(g.map_to_kernel_block_table(Tensor::zeros({1, 9}, DType::i32)), InvalidArgument);  // 36 > 32 cols
  EXPECT_THROW(g.map_to_kernel_block_table(Tensor::zeros({1, 2}, DType::i64)), InvalidArgument);
  EXPECT_THROW(g.map_to_kernel_block_table(bt, 2), InvalidArgument);  // ubatch out of range
  EXPECT_THROW(g.map_to_kernel_block_table(Tensor::from_vector<int32_t>({1 << 30}, {1, 1})), InvalidArgument);
  // A kernel size that does not divide the block size.
  AttentionGroup bad;
  bad.kv_cache_spec = FullAttentionSpec(64, 1, 64, DType::bf16);
  EXPECT_THROW(bad.configure_kernel_blocks(24, 1, 1, 1), InvalidArgument);
}

TEST(WorkerAttentionGroup, ConfigureNarrowsToBackendSize) {
  // The backend only takes 16: a requested 32 is narrowed (select_common_block_size).
  const BlockSizeBackend b = BlockSizeBackend::with_sizes("B16", {int64_t{16}});
  AttentionGroup g = make_group(FullAttentionSpec(64, 1, 64, DType::bf16), 32, &b);
  EXPECT_EQ(g.kernel_block_size, 16);
  EXPECT_EQ(g.kernel_block_table.shape(), (Dims{2, 4, 32}));
}

// A compressed MLA-like cache (4 tokens per state) packed block-outer with a second layer.
struct Packed {
  KVCacheConfig cfg;
  KVCacheViews views;
  std::shared_ptr<const AttentionSpec> spec;
};
Packed packed_cache(int64_t num_blocks) {
  AttentionSpecOptions o;
  o.tokens_per_state = Fraction{4, 1};
  Packed p;
  p.spec = MLAAttentionSpec(256, 1, 128, DType::bf16, o);  // N = 64 states, C = 128 el
  p.cfg = materialize_kv_cache_config({{{"m.0", "m.1"}, p.spec}}, KVCacheLayout::BLHNC, num_blocks);
  p.views = allocate_kv_cache(p.cfg, Device::cpu(), KVCacheLayout::BLHNC);
  return p;
}

TEST(WorkerAttentionGroup, MapPackedCacheToKernelBlocksAndBack) {
  Packed p = packed_cache(4);
  const Tensor kv = p.views.at("m.1");
  ASSERT_EQ(kv.shape(), (Dims{4, 1, 64, 128}));
  ASSERT_EQ(kv.stride(0), 2 * 64 * 128);  // two layers' pages per block
  AttentionGroup g;
  g.layer_names = {"m.0", "m.1"};
  g.kv_cache_spec = p.spec;
  g.kernel_block_size = 64;  // 16 states per kernel block, 4 kernel blocks per block
  const Tensor k = g.map_kv_cache_to_kernel_blocks(kv);
  // page stride = 16 * 128 el; kernel_block_stride = 2 pages * 4 = 8; pages = 3 * 8 + 4.
  EXPECT_EQ(g.kernel_block_stride, 8);
  EXPECT_EQ(k.shape(), (Dims{28, 1, 16, 128}));
  EXPECT_EQ(k.strides(), (Dims{16 * 128, kv.stride(1), 128, 1}));
  // Kernel block b*8 + j, state r  ==  manager block b, state j*16 + r (same address).
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t r : {0, 15}) {
        const Tensor a = k.select(0, b * 8 + j).select(0, 0).select(0, r);
        const Tensor m = kv.select(0, b).select(0, 0).select(0, j * 16 + r);
        EXPECT_EQ(a.data(), m.data()) << b << " " << j << " " << r;
      }
  // Already kernel-granular views are returned unchanged.
  EXPECT_EQ(g.map_kv_cache_to_kernel_blocks(k).data(), k.data());
  const Tensor back = g.map_kv_cache_to_manager_blocks(k, 4);
  EXPECT_EQ(back.shape(), kv.shape());
  EXPECT_EQ(back.strides(), kv.strides());
  EXPECT_EQ(back.data(), kv.data());
}

TEST(WorkerAttentionGroup, TokenCacheCannotBeSplitWhenPacked) {
  // Upstream: packed token caches (tokens_per_state 1) cannot be split into kernel blocks.
  const auto spec = FullAttentionSpec(64, 1, 64, DType::bf16);
  const KVCacheConfig cfg = materialize_kv_cache_config({{{"a.0", "a.1"}, spec}}, KVCacheLayout::BLHNC, 2);
  KVCacheViews views = allocate_kv_cache(cfg, Device::cpu(), KVCacheLayout::BLHNC);
  const BlockSizeBackend b = BlockSizeBackend::with_sizes("FLASHINFER", {int64_t{16}});
  AttentionGroup g;
  g.backend = &b;
  g.layer_names = {"a.0", "a.1"};
  g.kv_cache_spec = spec;
  g.kernel_block_size = 16;
  try {
    g.map_kv_cache_to_kernel_blocks(views.at("a.0"));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("FLASHINFER needs 16-token kernel blocks"), std::string::npos) << m;
    EXPECT_NE(m.find("Reduce --block-size to 16"), std::string::npos) << m;
  }
  EXPECT_THROW(g.map_kv_cache_to_manager_blocks(views.at("a.0"), 2), InvalidArgument);  // stride unset
}

TEST(WorkerAttentionGroup, MapKvCachesToKernelBlocksReplacesOnlySplitGroups) {
  Packed p = packed_cache(2);
  const auto other = FullAttentionSpec(256, 1, 64, DType::bf16);
  std::vector<AttentionGroup> groups(2);
  groups[0].layer_names = {"m.0", "m.1"};
  groups[0].kv_cache_spec = p.spec;
  groups[0].kernel_block_size = 64;
  groups[1].layer_names = {"x.0"};
  groups[1].kv_cache_spec = other;
  KVCacheViews caches = p.views;
  caches["x.0"] = Tensor::zeros({2, 1, 256, 128}, DType::bf16);
  const KVCacheViews mapped = map_kv_caches_to_kernel_blocks(caches, groups);
  EXPECT_EQ(mapped.at("m.0").shape(), (Dims{8 + 4, 1, 16, 128}));  // (2-1)*8 + 4 kernel pages
  EXPECT_EQ(mapped.at("x.0").data(), caches.at("x.0").data());
  EXPECT_EQ(mapped.at("x.0").shape(), caches.at("x.0").shape());
  EXPECT_EQ(caches.at("m.0").shape(), (Dims{2, 1, 64, 128}));  // manager views untouched
}

}  // namespace
}  // namespace kvattn
