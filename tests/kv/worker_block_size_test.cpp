// Kernel block sizes: MultipleOf, block_size_is_supported, select_common_block_size,
// customize_attention_spec, prepare_kernel_block_sizes (vllm-facts §4.1, §5).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "kvattn/kv/attention_group.h"
#include "kvattn/kv/block_size.h"
#include "kvattn/kv/kv_cache_config.h"
#include "support/error_message.h"

namespace kvattn {
namespace {

using kvattn::test::error_message;

using BS = BlockSizeBackend;

TEST(WorkerBlockSize, SupportedExactAndMultipleOf) {
  const BS fi = BS::with_sizes("FLASHINFER", {int64_t{16}, int64_t{32}, int64_t{64}});
  const BS any16 = BS::with_sizes("ANY16", {MultipleOf{16}});
  EXPECT_TRUE(block_size_is_supported({&fi}, 32));
  EXPECT_FALSE(block_size_is_supported({&fi}, 128));  // exact sizes must match exactly
  EXPECT_TRUE(block_size_is_supported({&any16}, 128));
  EXPECT_FALSE(block_size_is_supported({&any16}, 24));
  EXPECT_TRUE(block_size_is_supported({&fi, &any16}, 64));
  EXPECT_FALSE(block_size_is_supported({&fi, &any16}, 48));
  // The default declaration (no function) is MultipleOf(1): everything.
  BS dflt;
  dflt.name = "DEFAULT";
  EXPECT_TRUE(block_size_is_supported({&dflt}, 7));
  EXPECT_EQ(format_kernel_block_sizes(dflt.get_supported_kernel_block_sizes(nullptr)), "[MultipleOf(1)]");
  EXPECT_EQ(format_kernel_block_sizes({int64_t{16}, MultipleOf{32}}), "[16, MultipleOf(32)]");
}

TEST(WorkerBlockSize, UnknownAndInvalidDeclarationsAreErrors) {
  const BS unknown = BS::with_sizes("WEIRD", {int64_t{16}, KernelBlockSize{}});
  const std::string msg = error_message([&] { (void)block_size_is_supported({&unknown}, 16); });
  EXPECT_NE(msg.find("Unknown supported size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("WEIRD"), std::string::npos) << msg;
  const BS zero_base = BS::with_sizes("ZERO", {MultipleOf{0}});
  EXPECT_THROW((void)block_size_is_supported({&zero_base}, 16), InvalidArgument);
  const BS neg = BS::with_sizes("NEG", {int64_t{-16}});
  EXPECT_THROW((void)select_common_block_size(16, {&neg}), InvalidArgument);
  const BS fi = BS::with_sizes("FI", {int64_t{16}});
  EXPECT_THROW((void)block_size_is_supported({&fi}, 0), InvalidArgument);
  EXPECT_THROW((void)block_size_is_supported({&fi}, 16, {nullptr, nullptr}), InvalidArgument);  // 2 specs, 1 backend
}

TEST(WorkerBlockSize, SelectCommonBlockSize) {
  const BS fi = BS::with_sizes("FLASHINFER", {int64_t{16}, int64_t{32}, int64_t{64}});
  const BS any16 = BS::with_sizes("ANY16", {MultipleOf{16}});
  EXPECT_EQ(select_common_block_size(64, {&fi}), 64);     // manager size accepted as is
  EXPECT_EQ(select_common_block_size(1024, {&fi}), 64);   // largest exact divisor
  EXPECT_EQ(select_common_block_size(1024, {&any16}), 1024);
  EXPECT_EQ(select_common_block_size(96, {&fi, &any16}), 32);  // 96 % 64 != 0; 32 accepted by both
  const BS a = BS::with_sizes("A", {int64_t{64}});
  const BS b = BS::with_sizes("B", {int64_t{256}});
  const std::string msg = error_message([&] { (void)select_common_block_size(1024, {&a, &b}); });
  EXPECT_NE(msg.find("No common block size for 1024 (A: [64]; B: [256])."), std::string::npos) << msg;
}

TEST(WorkerBlockSize, SelectCommonBlockSizeRandomAgainstBruteForce) {
  std::mt19937 rng(11);
  const int64_t pool[] = {1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256};
  for (int iter = 0; iter < 500; ++iter) {
    std::vector<BS> backends;
    const int nb = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < nb; ++i) {
      std::vector<KernelBlockSize> sizes;
      const int ns = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < ns; ++k) {
        const int64_t v = pool[rng() % std::size(pool)];
        if (rng() % 3 == 0) sizes.emplace_back(MultipleOf{v}); else sizes.emplace_back(v);
      }
      std::string name = "B";  // appended, not "B" + std::string: GCC 12 warns (-Wrestrict) on that
      name += std::to_string(i);
      backends.push_back(BS::with_sizes(name, sizes));
    }
    std::vector<const BS*> ptrs;
    for (auto& b : backends) ptrs.push_back(&b);
    const int64_t manager = pool[rng() % std::size(pool)] * (1 + static_cast<int64_t>(rng() % 4));
    // Oracle: accepts(size) for every backend; manager first, else the largest exact
    // declared divisor everyone accepts.
    auto all_accept = [&](int64_t s) {
      for (auto& b : backends) {
        bool ok = false;
        for (auto& d : b.get_supported_kernel_block_sizes(nullptr)) {
          if (auto* v = std::get_if<int64_t>(&d)) ok |= *v == s;
          if (auto* m = std::get_if<MultipleOf>(&d)) ok |= s % m->base == 0;
        }
        if (!ok) return false;
      }
      return true;
    };
    int64_t expected = -1;
    if (all_accept(manager)) {
      expected = manager;
    } else {
      for (auto& b : backends)
        for (auto& d : b.get_supported_kernel_block_sizes(nullptr))
          if (auto* v = std::get_if<int64_t>(&d); v && manager % *v == 0 && all_accept(*v))
            expected = std::max(expected, *v);
    }
    if (expected < 0) {
      EXPECT_THROW((void)select_common_block_size(manager, ptrs), InvalidArgument) << manager;
    } else {
      EXPECT_EQ(select_common_block_size(manager, ptrs), expected) << manager;
    }
  }
}

TEST(WorkerBlockSize, SpecSpecificDeclarations) {
  // A backend whose sizes depend on the spec (FlashInfer-like: more sizes for GQA specs).
  BS b;
  b.name = "SPECIFIC";
  b.supported_kernel_block_sizes = [](const KVCacheSpec* s) -> std::vector<KernelBlockSize> {
    if (s && s->num_heads() == 1) return {int64_t{16}, int64_t{32}, int64_t{64}, int64_t{128}};
    return {int64_t{16}, int64_t{32}, int64_t{64}};
  };
  const auto one = FullAttentionSpec(256, 1, 64, DType::bf16);
  const auto eight = FullAttentionSpec(256, 8, 64, DType::bf16);
  EXPECT_EQ(select_common_block_size(256, {&b}, {one.get()}), 128);
  EXPECT_EQ(select_common_block_size(256, {&b}, {eight.get()}), 64);
}

TEST(WorkerBlockSize, CustomizeAttentionSpecSetsAlignment) {
  const auto spec = FullAttentionSpec(1024, 1, 64, DType::bf16);
  const BS fixed = BS::with_sizes("FIXED", {int64_t{128}, int64_t{256}});
  auto out = customize_attention_spec(fixed, spec);
  ASSERT_TRUE(out->block_stride_alignment().has_value());
  EXPECT_EQ(*out->block_stride_alignment(), 256);
  EXPECT_FALSE(spec->block_stride_alignment().has_value());  // the input is immutable
  // A MultipleOf entry (or no sizes) leaves the alignment unset.
  const BS mixed = BS::with_sizes("MIXED", {int64_t{128}, MultipleOf{16}});
  EXPECT_FALSE(customize_attention_spec(mixed, spec)->block_stride_alignment().has_value());
  const BS none = BS::with_sizes("NONE", {});
  EXPECT_FALSE(customize_attention_spec(none, spec)->block_stride_alignment().has_value());
  // An alignment already set is kept.
  AttentionSpecOptions o;
  o.block_stride_alignment = 64;
  EXPECT_EQ(*customize_attention_spec(fixed, FullAttentionSpec(1024, 1, 64, DType::bf16, o))->block_stride_alignment(), 64);
  // The backend hook runs first (NVFP4-style head slot packing), then the sizes see its result.
  BS hook = BS::with_sizes("HOOK", {int64_t{32}});
  hook.customize_spec = [](const std::shared_ptr<const AttentionSpec>& s) {
    AttentionSpecOptions opt = s->options();
    opt.num_head_slots = 2 * s->num_kv_heads();
    return s->with_options(opt);
  };
  auto packed = customize_attention_spec(hook, spec);
  EXPECT_EQ(packed->num_heads(), 2);
  EXPECT_EQ(*packed->block_stride_alignment(), 32);
}

AttentionGroup attn_group(const BS* backend, std::vector<std::string> names, KVCacheSpecPtr spec, int64_t gid) {
  AttentionGroup g;
  g.backend = backend;
  g.layer_names = std::move(names);
  g.kv_cache_spec = std::move(spec);
  g.kv_cache_group_id = gid;
  return g;
}

TEST(WorkerBlockSize, PrepareKernelBlockSizesPackedBlockOuterKeepsManagerSize) {
  // Upstream vector: packed BLHNC config, two backends (64 and 256) on a 1024 spec -> [1024].
  const auto spec = FullAttentionSpec(1024, 1, 64, DType::bf16);
  const BS b64 = BS::with_sizes("B64", {int64_t{64}});
  const BS b256 = BS::with_sizes("B256", {int64_t{256}});
  const std::vector<KVCacheGroupSpec> groups = {{{"l.0", "l.1"}, spec}};
  const KVCacheConfig packed = materialize_kv_cache_config(groups, KVCacheLayout::BLHNC, 2);
  ASSERT_GT(packed.kv_cache_tensors[0].block_stride, packed.kv_cache_tensors[0].layer_stride);
  std::vector<std::vector<AttentionGroup>> ag = {
      {attn_group(&b64, {"l.0"}, spec, 0), attn_group(&b256, {"l.1"}, spec, 0)}};
  EXPECT_EQ(prepare_kernel_block_sizes(packed, ag), (std::vector<int64_t>{1024}));
  // Layer-compact: the group is split; 64 and 256 have no common size -> error, 64 alone -> 64.
  const KVCacheConfig compact = materialize_kv_cache_config(groups, KVCacheLayout::LBNHC, 2);
  EXPECT_THROW((void)prepare_kernel_block_sizes(compact, ag), InvalidArgument);
  std::vector<std::vector<AttentionGroup>> ag64 = {{attn_group(&b64, {"l.0", "l.1"}, spec, 0)}};
  EXPECT_EQ(prepare_kernel_block_sizes(compact, ag64), (std::vector<int64_t>{64}));
}

TEST(WorkerBlockSize, PrepareKernelBlockSizesMambaAndEncoderOnly) {
  const auto attn = FullAttentionSpec(64, 1, 64, DType::bf16);
  const auto enc = EncoderOnlyAttentionSpec(64, 1, 64, DType::bf16);
  auto mamba = std::make_shared<MambaSpec>(64, std::vector<std::vector<int64_t>>{{4096}},
                                           std::vector<DType>{DType::bf16},
                                           MambaSpecOptions{.page_size_padded = 64 * 256});
  const BS b16 = BS::with_sizes("B16", {int64_t{16}, int64_t{32}});
  // Pages: attn 64*256 = 16384, mamba padded 16384, encoder-only 16384.
  const std::vector<KVCacheGroupSpec> groups = {{{"e.0"}, enc}, {{"a.0"}, attn}, {{"m.0"}, mamba}};
  const KVCacheConfig cfg = materialize_kv_cache_config(groups, KVCacheLayout::LBNHC, 2);
  std::vector<std::vector<AttentionGroup>> ag = {{attn_group(&b16, {"e.0"}, enc, 0)},
                                                 {attn_group(&b16, {"a.0"}, attn, 1)},
                                                 {attn_group(nullptr, {"m.0"}, mamba, 2)}};
  // Encoder-only gets no entry (as upstream), attention 64 -> 32, Mamba keeps 64.
  EXPECT_EQ(prepare_kernel_block_sizes(cfg, ag), (std::vector<int64_t>{32, 64}));
  // Missing attention groups for an attention KV cache group.
  std::vector<std::vector<AttentionGroup>> short_ag = {{attn_group(&b16, {"e.0"}, enc, 0)}};
  EXPECT_THROW((void)prepare_kernel_block_sizes(cfg, short_ag), InvalidArgument);
}

TEST(WorkerBlockSize, OneBackendAttentionGroups) {
  const auto full = FullAttentionSpec(64, 1, 64, DType::bf16);
  const auto swa = SlidingWindowSpec(64, 1, 64, DType::bf16, 128);
  const std::vector<KVCacheGroupSpec> groups = {{{"l.0", "l.2"}, full}, {{"l.1", "l.3"}, swa}};
  const KVCacheConfig cfg = materialize_kv_cache_config(groups, KVCacheLayout::LBNHC, 2);
  const BS b16 = BS::with_sizes("B16", {int64_t{16}, int64_t{32}});
  const auto ag = one_backend_attention_groups(cfg, b16);
  ASSERT_EQ(ag.size(), 2u);
  for (size_t gid = 0; gid < ag.size(); ++gid) {
    ASSERT_EQ(ag[gid].size(), 1u);
    EXPECT_EQ(ag[gid][0].backend, &b16);
    EXPECT_EQ(ag[gid][0].kv_cache_group_id, static_cast<int64_t>(gid));
    EXPECT_EQ(ag[gid][0].layer_names, cfg.kv_cache_groups[gid].layer_names);
    EXPECT_EQ(ag[gid][0].kv_cache_spec, cfg.kv_cache_groups[gid].kv_cache_spec);
  }
  // Both groups' manager blocks of 64 split into the largest accepted size that divides them.
  EXPECT_EQ(prepare_kernel_block_sizes(cfg, ag), (std::vector<int64_t>{32, 32}));
}

}  // namespace
}  // namespace kvattn
