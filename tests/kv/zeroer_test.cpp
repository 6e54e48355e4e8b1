// KVBlockZeroer: hand-computed segment tables per layout and a byte-exact oracle test that
// zeroing block ids touches exactly those blocks' bytes in every layout.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>

#include "kvattn/kv/allocate.h"
#include "kvattn/kv/attention_group.h"
#include "kvattn/kv/kv_block_zeroer.h"
#include "kvattn/kv/kv_cache_config.h"

namespace kvattn {
namespace {

// bs 4 tokens, 2 KV heads, head 2, f32: C = (2+2)*4 = 16 bytes, N = 4, page = 2*4*16 = 128 B.
std::shared_ptr<const AttentionSpec> small_spec(int64_t bs = 4) { return FullAttentionSpec(bs, 2, 2, DType::f32); }

struct Cache {
  KVCacheConfig cfg;
  KVCacheViews views;
  std::vector<AttentionGroup> groups;
  int64_t base = 0;  // address of the backing buffer
  uint8_t* bytes = nullptr;
  int64_t size = 0;
};

Cache make_cache(const std::vector<KVCacheGroupSpec>& groups, KVCacheLayout layout, int64_t num_blocks,
                 std::optional<std::vector<int64_t>> kernel_block_sizes = std::nullopt) {
  Cache c;
  c.cfg = materialize_kv_cache_config(groups, layout, num_blocks);
  c.views = allocate_kv_cache(c.cfg, Device::cpu(), layout, kernel_block_sizes);
  const Tensor& any = c.views.begin()->second;
  c.bytes = static_cast<uint8_t*>(any.storage()->data());
  c.size = static_cast<int64_t>(any.storage()->size());
  c.base = static_cast<int64_t>(reinterpret_cast<intptr_t>(c.bytes));
  for (size_t g = 0; g < groups.size(); ++g) {
    AttentionGroup ag;
    ag.layer_names = groups[g].layer_names;
    ag.kv_cache_spec = groups[g].kv_cache_spec;
    ag.kv_cache_group_id = static_cast<int64_t>(g);
    c.groups.push_back(ag);
  }
  return c;
}

KVCacheGroupSpec group(std::vector<std::string> names, KVCacheSpecPtr spec) {
  return KVCacheGroupSpec{std::move(names), std::move(spec)};
}

struct Seg {
  int64_t addr_off, stride, page;
  friend bool operator==(const Seg&, const Seg&) = default;
};
std::vector<Seg> segs_of(const KVBlockZeroer& z, int64_t base) {
  std::vector<Seg> out;
  const auto& s = z.segments();
  for (size_t i = 0; i < s.size(); ++i) out.push_back({s.addrs[i] - base, s.block_strides[i], s.page_sizes[i]});
  return out;
}
void PrintTo(const Seg& s, std::ostream* os) { *os << "{" << s.addr_off << ", " << s.stride << ", " << s.page << "}"; }

TEST(ZeroerSegments, LBNHCOneSegmentPerLayer) {
  const auto spec = small_spec();
  Cache c = make_cache({group({"l.0", "l.1"}, spec)}, KVCacheLayout::LBNHC, 3);
  const std::vector<int64_t> kbs = {4};
  KVBlockZeroer z(Device::cpu(), c.groups, kbs, c.views, 3);
  // layer stride 3 * 128 = 384 B; block stride 128 B = 32 words; page 32 words.
  EXPECT_EQ(segs_of(z, c.base), (std::vector<Seg>{{0, 32, 32}, {384, 32, 32}}));
}

TEST(ZeroerSegments, LHBNCOneSegmentPerHeadGroup) {
  const auto spec = small_spec();
  Cache c = make_cache({group({"l.0", "l.1"}, spec)}, KVCacheLayout::LHBNC, 3);
  const std::vector<int64_t> kbs = {4};
  KVBlockZeroer z(Device::cpu(), c.groups, kbs, c.views, 3);
  // [L, H, B, N, C]: N 16 B, B 64 B (16 words), H 192 B (outside the block), L 384 B.
  // page = 4 + 3*16 + 3*4 = 64 B = 16 words.
  EXPECT_EQ(segs_of(z, c.base), (std::vector<Seg>{{0, 16, 16}, {192, 16, 16}, {384, 16, 16}, {576, 16, 16}}));
}

TEST(ZeroerSegments, BHLNCPageSpansOtherLayers) {
  const auto spec = small_spec();
  Cache c = make_cache({group({"l.0", "l.1"}, spec)}, KVCacheLayout::BHLNC, 3);
  const std::vector<int64_t> kbs = {4};
  KVBlockZeroer z(Device::cpu(), c.groups, kbs, c.views, 3);
  // [B, H, L, N, C]: N 16 B, L 64 B, H 128 B, B 256 B (64 words).
  // page = 4 + 1*128 + 3*16 + 3*4 = 192 B = 48 words; layer 1 starts 64 B in.
  EXPECT_EQ(segs_of(z, c.base), (std::vector<Seg>{{0, 64, 48}, {64, 64, 48}}));
}

TEST(ZeroerSegments, BLHNCPackedBlocks) {
  const auto spec = small_spec();
  Cache c = make_cache({group({"l.0", "l.1"}, spec)}, KVCacheLayout::BLHNC, 3);
  const std::vector<int64_t> kbs = {4};
  KVBlockZeroer z(Device::cpu(), c.groups, kbs, c.views, 3);
  // [B, L, H, N, C]: page 128 B dense, L 128 B, B 256 B (64 words).
  EXPECT_EQ(segs_of(z, c.base), (std::vector<Seg>{{0, 64, 32}, {128, 64, 32}}));
}

TEST(ZeroerSegments, KernelBlockSplitOneSegmentPerVirtualBlock) {
  // LBHNC, 2 layers, manager block 4 tokens split into kernel blocks of 2: view [6, 2, 2, 4]
  // with kernel page 64 B; manager block stride 128 B = 32 words; page 16 words.
  const auto spec = small_spec();
  Cache c = make_cache({group({"l.0", "l.1"}, spec)}, KVCacheLayout::LBHNC, 3, std::vector<int64_t>{2});
  ASSERT_EQ(c.views.at("l.0").shape(), (Dims{6, 2, 2, 4}));
  const std::vector<int64_t> kbs = {2};
  KVBlockZeroer z(Device::cpu(), c.groups, kbs, c.views, 3);
  EXPECT_EQ(segs_of(z, c.base), (std::vector<Seg>{{0, 32, 16}, {64, 32, 16}, {384, 32, 16}, {448, 32, 16}}));
}

TEST(ZeroerSegments, OverlaidGroupsKeepWidestPage) {
  // Two groups aliasing from byte 0 in a block-outer layout with different pages:
  // group 0 page 128 B, group 1 page 64 B (1 head).  Same address and block stride -> one
  // segment with the wider page.
  const auto a = small_spec();
  const auto b = FullAttentionSpec(4, 1, 2, DType::f32);
  Cache c = make_cache({group({"a.0"}, a), group({"b.0"}, b)}, KVCacheLayout::BLHNC, 3);
  const std::vector<int64_t> kbs = {4, 4};
  KVBlockZeroer z(Device::cpu(), c.groups, kbs, c.views, 3);
  EXPECT_EQ(segs_of(z, c.base), (std::vector<Seg>{{0, 32, 32}}));
}

TEST(ZeroerSegments, SkipsRunnerOnlyMissingAndOutOfRangeGroups) {
  const auto spec = small_spec();
  Cache c = make_cache({group({"l.0", "l.1"}, spec)}, KVCacheLayout::LBNHC, 3);
  std::set<std::string> runner_only = {"l.1"};
  const std::vector<int64_t> kbs = {4};
  KVBlockZeroer z(Device::cpu(), c.groups, kbs, c.views, 3, &runner_only);
  EXPECT_EQ(segs_of(z, c.base), (std::vector<Seg>{{0, 32, 32}}));
  // Group id past kernel_block_sizes: skipped entirely, nothing to zero (no-op calls).
  KVBlockZeroer none(Device::cpu(), c.groups, std::span<const int64_t>{}, c.views, 3);
  EXPECT_TRUE(none.segments().empty());
  const std::vector<int64_t> ids = {1};
  none.zero_block_ids(ids);
  none.warmup(3);
}

TEST(ZeroerSegments, RejectsBadInput) {
  const auto spec = small_spec();
  Cache c = make_cache({group({"l.0", "l.1"}, spec)}, KVCacheLayout::LBNHC, 3);
  const std::vector<int64_t> kbs = {4};
  // 3 blocks of views but a pool of 2 manager blocks: 3 % 2 != 0.
  EXPECT_THROW(KVBlockZeroer(Device::cpu(), c.groups, kbs, c.views, 2), InvalidArgument);
  EXPECT_THROW(KVBlockZeroer(Device::cpu(), c.groups, kbs, c.views, 0), InvalidArgument);
  const std::vector<int64_t> bad_kbs = {3};
  EXPECT_THROW(KVBlockZeroer(Device::cpu(), c.groups, bad_kbs, c.views, 3), InvalidArgument);
  KVBlockZeroer z(Device::cpu(), c.groups, kbs, c.views, 3);
  const std::vector<int64_t> out_of_range = {0, 3};
  try {
    z.zero_block_ids(out_of_range);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("block id 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("0..2"), std::string::npos) << e.what();
  }
  const std::vector<int32_t> negative = {-1};
  EXPECT_THROW(z.zero_block_ids(negative), InvalidArgument);
  // Views the kernel cannot zero word by word.
  KVZeroSegmentBuilder builder(4);
  const Tensor odd = Tensor::zeros({4, 1, 1, 6}, DType::u8);  // 6-byte block stride
  EXPECT_THROW(builder.add_layer("odd", odd), InvalidArgument);
  const Tensor odd_page = Tensor::zeros({4, 1, 1, 8}, DType::u8).slice(3, 0, 6);  // 6-byte page, 8-byte stride
  EXPECT_THROW(builder.add_layer("odd_page", odd_page), InvalidArgument);
  EXPECT_THROW(builder.add_layer("none", Tensor()), InvalidArgument);
  EXPECT_TRUE(builder.segments().empty());
}

// ---------------------------------------------------------------------------------------
// Oracle: the bytes of kv[b] over every layer view, b in ids (kernel views: the ratio
// kernel blocks of each manager block).

void mark_view_block_bytes(const Tensor& kv, int64_t first_row, int64_t rows, int64_t base,
                           std::vector<char>& marked) {
  const int64_t el = kv.element_size();
  const Dims shape = kv.shape();
  const Dims st = kv.strides();
  const int64_t view_base = static_cast<int64_t>(reinterpret_cast<intptr_t>(kv.data())) - base;
  for (int64_t r = first_row; r < first_row + rows; ++r)
    for (int64_t h = 0; h < shape[1]; ++h)
      for (int64_t n = 0; n < shape[2]; ++n)
        for (int64_t cc = 0; cc < shape[3]; ++cc) {
          const int64_t off = view_base + (r * st[0] + h * st[1] + n * st[2] + cc * st[3]) * el;
          for (int64_t k = 0; k < el; ++k) marked[static_cast<size_t>(off + k)] = 1;
        }
}

void check_zeroing(Cache& c, int64_t num_blocks, const std::vector<int64_t>& kbs, const std::vector<int64_t>& ids,
                   const std::string& what) {
  std::memset(c.bytes, 0xA5, static_cast<size_t>(c.size));
  KVBlockZeroer z(Device::cpu(), c.groups, kbs, c.views, num_blocks);
  z.zero_block_ids(ids);
  std::vector<char> marked(static_cast<size_t>(c.size), 0);
  for (const AttentionGroup& g : c.groups) {
    if (!as_attention_spec(g.kv_cache_spec)) continue;
    for (const auto& name : g.layer_names) {
      const Tensor& kv = c.views.at(name);
      const int64_t ratio = kv.size(0) / num_blocks;
      for (int64_t b : ids) mark_view_block_bytes(kv, b * ratio, ratio, c.base, marked);
    }
  }
  int64_t wrong_zero = 0, not_zeroed = 0;
  for (int64_t i = 0; i < c.size; ++i) {
    const uint8_t v = c.bytes[i];
    if (marked[static_cast<size_t>(i)] && v != 0) ++not_zeroed;
    if (!marked[static_cast<size_t>(i)] && v != 0xA5) ++wrong_zero;
  }
  EXPECT_EQ(not_zeroed, 0) << what;
  EXPECT_EQ(wrong_zero, 0) << what;
}

TEST(ZeroerOracle, ZeroesExactlyTheBlocksInEveryLayout) {
  const auto spec = small_spec();
  for (KVCacheLayout layout : kAllKVCacheLayouts) {
    Cache c = make_cache({group({"l.0", "l.1", "l.2"}, spec)}, layout, 5);
    check_zeroing(c, 5, {4}, {1, 3}, layout_name(layout));
    check_zeroing(c, 5, {4}, {0, 4, 2}, layout_name(layout));
  }
}

TEST(ZeroerOracle, KernelBlockSplitLayerCompactLayouts) {
  const auto spec = small_spec(8);
  for (KVCacheLayout layout : {KVCacheLayout::LBHNC, KVCacheLayout::LBNHC, KVCacheLayout::BLHNC}) {
    // Block-outer layouts keep pages dense only with one layer per block.
    std::vector<std::string> names = is_block_outermost(layout) ? std::vector<std::string>{"l.0"}
                                                                : std::vector<std::string>{"l.0", "l.1"};
    Cache c = make_cache({group(names, spec)}, layout, 4, std::vector<int64_t>{2});
    ASSERT_EQ(c.views.at("l.0").size(0), 16) << layout_name(layout);
    check_zeroing(c, 4, {2}, {2}, std::string(layout_name(layout)) + " split 4");
    check_zeroing(c, 4, {2}, {1, 3}, std::string(layout_name(layout)) + " split 4");
  }
}

TEST(ZeroerOracle, MixedPagesAndMambaGroups) {
  // Attention groups with different pages overlay Mamba state in a block-outer pool; Mamba is
  // skipped (its raw view is not an attention layer), the attention blocks are exact.
  const auto a = small_spec();
  const auto b = FullAttentionSpec(4, 1, 2, DType::f32);
  auto mamba = std::make_shared<MambaSpec>(4, std::vector<std::vector<int64_t>>{{8}}, std::vector<DType>{DType::f32},
                                           MambaSpecOptions{.page_size_padded = 128});
  for (KVCacheLayout layout : {KVCacheLayout::BLHNC, KVCacheLayout::BLNHC}) {
    Cache c = make_cache({group({"a.0", "a.1"}, a), group({"b.0"}, b), group({"m.0"}, mamba)}, layout, 4);
    check_zeroing(c, 4, {4, 4, 4}, {1, 2}, layout_name(layout));
  }
}

TEST(ZeroerOracle, RandomizedAgainstOracle) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 40; ++iter) {
    const KVCacheLayout layout = kAllKVCacheLayouts[rng() % kAllKVCacheLayouts.size()];
    const int64_t heads = 1 + rng() % 3, hs = 1 + rng() % 3, bs = 2 << (rng() % 2);
    const auto spec = FullAttentionSpec(bs, heads, hs, rng() % 2 ? DType::f32 : DType::bf16);
    if (spec->page_size_bytes() % 4) continue;  // the kernel writes whole words
    const int64_t L = 1 + rng() % 3, nb = 2 + rng() % 5;
    std::vector<std::string> names;
    for (int64_t l = 0; l < L; ++l) names.push_back("l." + std::to_string(l));
    Cache c = make_cache({group(names, spec)}, layout, nb);
    std::vector<int64_t> ids;
    for (int64_t b = 0; b < nb; ++b)
      if (rng() % 2) ids.push_back(b);
    check_zeroing(c, nb, {bs}, ids, fmt::format("{} H={} hs={} bs={} L={} nb={}", layout_name(layout), heads, hs, bs, L, nb));
  }
}

TEST(ZeroerOracle, Int32IdsAndWarmupZeroBlockZero) {
  const auto spec = small_spec();
  Cache c = make_cache({group({"l.0"}, spec)}, KVCacheLayout::LBNHC, 3);
  std::memset(c.bytes, 0xA5, static_cast<size_t>(c.size));
  const std::vector<int64_t> kbs = {4};
  KVBlockZeroer z(Device::cpu(), c.groups, kbs, c.views, 3);
  z.warmup(3);  // zeroes block 0 (the null block)
  for (int64_t i = 0; i < 128; ++i) EXPECT_EQ(c.bytes[i], 0);
  EXPECT_EQ(c.bytes[128], 0xA5);
  const std::vector<int32_t> ids = {2};
  z.zero_block_ids(ids);
  for (int64_t i = 256; i < 384; ++i) EXPECT_EQ(c.bytes[i], 0);
  for (int64_t i = 128; i < 256; ++i) EXPECT_EQ(c.bytes[i], 0xA5);
  EXPECT_EQ(z.max_page_size_words(), 32);
}

TEST(ZeroerOracle, PackedKernelViewIsZeroedByManagerBlock) {
  // A compressed (tokens_per_state 4) cache packed block-outer with another layer; the group's
  // bound views address kernel blocks, the zeroer maps them back to manager blocks.
  AttentionSpecOptions o;
  o.tokens_per_state = Fraction{4, 1};
  const auto mla = MLAAttentionSpec(16, 1, 4, DType::f32, o);  // N = 4 states, C = 16 B, page 64 B
  const auto other = FullAttentionSpec(4, 1, 4, DType::f32);   // page 4*32 = 128 B
  Cache c = make_cache({group({"m.0"}, mla), group({"o.0"}, other)}, KVCacheLayout::BLHNC, 3);
  c.groups[0].kernel_block_size = 8;  // 2 states per kernel block
  KVCacheViews bound = map_kv_caches_to_kernel_blocks(c.views, c.groups);
  EXPECT_GT(c.groups[0].kernel_block_stride, 0);
  std::memset(c.bytes, 0xA5, static_cast<size_t>(c.size));
  const std::vector<int64_t> kbs = {16, 4};
  KVBlockZeroer z(Device::cpu(), c.groups, kbs, bound, 3);
  const std::vector<int64_t> ids = {1};
  z.zero_block_ids(ids);
  std::vector<char> marked(static_cast<size_t>(c.size), 0);
  mark_view_block_bytes(c.views.at("m.0"), 1, 1, c.base, marked);
  mark_view_block_bytes(c.views.at("o.0"), 1, 1, c.base, marked);
  for (int64_t i = 0; i < c.size; ++i)
    ASSERT_EQ(c.bytes[i], marked[static_cast<size_t>(i)] ? 0 : 0xA5) << "byte " << i;
}

}  // namespace
}  // namespace kvattn
