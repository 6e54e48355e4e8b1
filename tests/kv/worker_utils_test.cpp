// Worker utilities: KV sharing, layer index, bind_kv_cache ordering, request_memory and the
// legacy mixed-layout helpers (vllm-facts §2.7, §5).
#include <gtest/gtest.h>

#include "kvattn/kv/worker_utils.h"
#include "support/error_message.h"
#include "support/sizes.h"

namespace kvattn {
namespace {

using kvattn::test::error_message;

using kvattn::test::kGiB;
using Ordered = std::vector<std::pair<std::string, Tensor>>;

TEST(WorkerUtils, KvSharingLayersJoinTheirTargetsGroup) {
  const auto full = FullAttentionSpec(16, 1, 64, DType::bf16);
  const auto swa = SlidingWindowSpec(16, 1, 64, DType::bf16, 128);
  std::vector<KVCacheGroupSpec> groups = {{{"model.layers.0.attn", "model.layers.2.attn"}, full},
                                          {{"model.layers.1.attn"}, swa}};
  std::set<std::string> runner_only;
  add_kv_sharing_layers_to_kv_cache_groups({{"model.layers.3.attn", "model.layers.1.attn"},
                                            {"model.layers.4.attn", "model.layers.0.attn"}},
                                           groups, &runner_only);
  EXPECT_EQ(groups[0].layer_names,
            (std::vector<std::string>{"model.layers.0.attn", "model.layers.2.attn", "model.layers.4.attn"}));
  EXPECT_EQ(groups[1].layer_names, (std::vector<std::string>{"model.layers.1.attn", "model.layers.3.attn"}));
  EXPECT_EQ(runner_only, (std::set<std::string>{"model.layers.3.attn", "model.layers.4.attn"}));
  // Nothing to share: no change.
  add_kv_sharing_layers_to_kv_cache_groups({}, groups, nullptr);
  EXPECT_EQ(groups[0].layer_names.size(), 3u);
  // Unknown target, or a sharing layer that already has a group: errors, and nothing changes.
  const std::string msg = error_message(
      [&] { add_kv_sharing_layers_to_kv_cache_groups({{"model.layers.5.attn", "model.layers.9.attn"}}, groups); });
  EXPECT_NE(msg.find("model.layers.9.attn"), std::string::npos) << msg;
  EXPECT_THROW(add_kv_sharing_layers_to_kv_cache_groups({{"model.layers.0.attn", "model.layers.1.attn"}}, groups),
               InvalidArgument);
  EXPECT_THROW(add_kv_sharing_layers_to_kv_cache_groups({{"model.layers.7.attn", "model.layers.1.attn"},
                                                         {"model.layers.7.attn", "model.layers.0.attn"}},
                                                        groups),
               InvalidArgument);
  EXPECT_EQ(groups[1].layer_names.size(), 2u);
}

TEST(WorkerUtils, ExtractLayerIndex) {
  EXPECT_EQ(extract_layer_index("model.layers.12.self_attn.attn"), 12);
  EXPECT_EQ(extract_layer_index("model.layers.0.mamba"), 0);
  EXPECT_EQ(extract_layer_index("decoder.layers.3.encoder_attn.attn"), 3);
  // Several attention modules per layer: layer * modules + module.
  EXPECT_EQ(extract_layer_index("model.layers.3.attn.1", 2), 7);
  EXPECT_EQ(extract_layer_index("model.layers.3.attn", 2), 3);
  // Without "attn" in the name one integer is required even with several modules.
  EXPECT_THROW(extract_layer_index("model.layers.3.mlp.1", 2), InvalidArgument);
  EXPECT_THROW(extract_layer_index("model.layers.x.attn"), InvalidArgument);        // no integer
  EXPECT_THROW(extract_layer_index("model.layers.1.experts.2.attn"), InvalidArgument);  // two, one module
  EXPECT_THROW(extract_layer_index("model.1.layers.2.attn.3", 2), InvalidArgument);  // three
  EXPECT_THROW(extract_layer_index("model.layers.99999999999.attn"), InvalidArgument);
  EXPECT_THROW(extract_layer_index("model.layers.1.attn", 0), InvalidArgument);
  EXPECT_THROW(extract_layer_index(""), InvalidArgument);
}

Tensor tag(int v) { return Tensor::from_vector<int32_t>({v}); }
int tag_of(const Tensor& t) { return t.to_vector<int32_t>()[0]; }

TEST(WorkerUtils, BindKvCacheOrdersByLayerIndexWithDraftInterleave) {
  // Target model layers first, then the draft's (dict order); index order interleaves them.
  const std::vector<std::pair<std::string, Tensor>> kv = {{"model.layers.0.attn", tag(0)},
                                                          {"model.layers.1.attn", tag(1)},
                                                          {"draft_model.layers.0.attn", tag(10)},
                                                          {"draft_model.layers.1.attn", tag(11)}};
  KVCacheViews ctx;
  for (const auto& [n, t] : kv) ctx[n] = Tensor();
  std::vector<Tensor> runner;
  bind_kv_cache(kv, ctx, runner);
  std::vector<int> order;
  for (const auto& t : runner) order.push_back(tag_of(t));
  EXPECT_EQ(order, (std::vector<int>{0, 10, 1, 11}));
  for (const auto& [n, t] : kv) EXPECT_EQ(ctx.at(n).data(), t.data()) << n;
}

TEST(WorkerUtils, BindKvCacheEncoderDecoderAndLayerViews) {
  // Cross and self attention of one decoder layer share an index; layers get the kernel views.
  const std::vector<std::pair<std::string, Tensor>> kv = {{"decoder.layers.1.self_attn.attn", tag(1)},
                                                          {"decoder.layers.0.self_attn.attn", tag(0)},
                                                          {"decoder.layers.0.encoder_attn.attn", tag(5)}};
  KVCacheViews ctx, layer_views;
  for (const auto& [n, t] : kv) {
    ctx[n] = Tensor();
    layer_views[n] = tag(100 + tag_of(t));
  }
  std::vector<Tensor> runner;
  bind_kv_cache(kv, ctx, runner, 1, &layer_views);
  std::vector<int> order;
  for (const auto& t : runner) order.push_back(tag_of(t));
  EXPECT_EQ(order, (std::vector<int>{0, 5, 1}));  // the runner keeps the manager views
  EXPECT_EQ(tag_of(ctx.at("decoder.layers.0.encoder_attn.attn")), 105);
}

TEST(WorkerUtils, BindKvCacheErrors) {
  KVCacheViews ctx = {{"model.layers.0.attn", Tensor()}};
  std::vector<Tensor> runner;
  // Duplicate name.
  EXPECT_THROW(bind_kv_cache(Ordered{{"model.layers.0.attn", tag(0)}, {"model.layers.0.attn", tag(1)}}, ctx, runner),
               InvalidArgument);
  // Name without an index.
  EXPECT_THROW(bind_kv_cache(Ordered{{"model.attn", tag(0)}}, ctx, runner), InvalidArgument);
  // A layer the model does not have.
  const std::string msg = error_message([&] { bind_kv_cache(Ordered{{"model.layers.7.attn", tag(0)}}, ctx, runner); });
  EXPECT_NE(msg.find("model.layers.7.attn"), std::string::npos) << msg;
  EXPECT_TRUE(runner.empty());  // nothing bound on failure
  // The runner list must start empty.
  std::vector<Tensor> busy = {tag(3)};
  EXPECT_THROW(bind_kv_cache(Ordered{{"model.layers.0.attn", tag(0)}}, ctx, busy), InvalidArgument);
  // The map overload (allocate_kv_cache's output).
  KVCacheViews by_name = {{"model.layers.0.attn", tag(4)}};
  bind_kv_cache(by_name, ctx, runner);
  ASSERT_EQ(runner.size(), 1u);
  EXPECT_EQ(tag_of(ctx.at("model.layers.0.attn")), 4);
}

TEST(WorkerUtils, RequestMemory) {
  const MemorySnapshot snap{80 * kGiB, 79 * kGiB, "cuda:0"};
  EXPECT_EQ(request_memory(snap, 0.9), static_cast<int64_t>(std::ceil(80.0 * kGiB * 0.9)));
  EXPECT_EQ(request_memory(snap, 0.5), 40 * kGiB);
  // Fractional bytes round up.
  EXPECT_EQ(request_memory(MemorySnapshot{3, 3, "cuda:0"}, 0.5), 2);
  const std::string msg = error_message([&] { (void)request_memory(MemorySnapshot{80 * kGiB, 40 * kGiB}, 0.9); });
  EXPECT_NE(msg.find("Free memory on device cuda:0 (40.00/80.00 GiB)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(0.9, 72.00 GiB)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Decrease GPU memory utilization"), std::string::npos) << msg;
  // External weights: the engine's share of the budget.
  EXPECT_EQ(request_memory(snap, 0.5, 10 * kGiB), 30 * kGiB);
  const std::string ext = error_message([&] { (void)request_memory(snap, 0.5, 50 * kGiB); });
  EXPECT_NE(ext.find("Externally held weights"), std::string::npos) << ext;
  EXPECT_NE(ext.find("Increase GPU memory utilization"), std::string::npos) << ext;
  EXPECT_THROW((void)request_memory(MemorySnapshot{80 * kGiB, 20 * kGiB}, 0.5, 10 * kGiB), InvalidArgument);
  EXPECT_THROW((void)request_memory(snap, 0.0), InvalidArgument);
  EXPECT_THROW((void)request_memory(snap, 1.5), InvalidArgument);
  EXPECT_THROW((void)request_memory(snap, std::nan("")), InvalidArgument);
  EXPECT_THROW((void)request_memory(MemorySnapshot{10, 20}, 0.5), InvalidArgument);
}

// ---- legacy helpers --------------------------------------------------------------------

AttentionGroup g(KVCacheSpecPtr spec, std::vector<std::string> names, int64_t gid) {
  AttentionGroup a;
  a.kv_cache_spec = std::move(spec);
  a.layer_names = std::move(names);
  a.kv_cache_group_id = gid;
  return a;
}

TEST(WorkerUtilsLegacy, KvFirstLayersSharingPoolWithMamba) {
  const auto attn = FullAttentionSpec(16, 1, 64, DType::bf16);
  auto mamba = std::make_shared<MambaSpec>(16, std::vector<std::vector<int64_t>>{{64}}, std::vector<DType>{DType::f32});
  std::vector<AttentionGroup> groups = {g(attn, {"a.0", "a.1"}, 0), g(mamba, {"m.0"}, 1), g(attn, {"c.0"}, 2)};
  // a.* are K/V first (ROCm-style, block dim 1), c.0 blocks first.
  const KVCacheBlockDimFn dim = [](const AttentionGroup& grp, int64_t) -> int64_t {
    return grp.layer_names[0][0] == 'a' ? 1 : 0;
  };
  KVCacheConfig cfg;
  cfg.kv_cache_tensors = {KVCacheTensor{0, {"a.0", "m.0"}, 0, 0, 0}, KVCacheTensor{0, {"a.1", "c.0"}, 0, 0, 0}};
  EXPECT_EQ(kv_first_layers_sharing_pool_with_mamba(groups, {16, 16, 16}, dim, &cfg), (std::set<std::string>{"a.0"}));
  EXPECT_TRUE(kv_first_layers_sharing_pool_with_mamba(groups, {16, 16, 16}, dim, nullptr).empty());
  // Groups past kernel_block_sizes are not classified.
  EXPECT_TRUE(kv_first_layers_sharing_pool_with_mamba(groups, {}, dim, &cfg).empty());
}

TEST(WorkerUtilsLegacy, RestrideBlocksFirstToKvFirstStorage) {
  // Storage [2, B=3, half=4] viewed blocks first as [3, 2, 4].
  std::vector<int32_t> v(24);
  for (int i = 0; i < 24; ++i) v[static_cast<size_t>(i)] = i;
  const Tensor storage = Tensor::from_vector(v, {3, 2, 4});
  const Tensor r = restride_blocks_first_kv_cache_to_kv_first_storage(storage);
  EXPECT_EQ(r.strides(), (Dims{4, 12, 1}));
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t kv = 0; kv < 2; ++kv)
      for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(r.at<int32_t>({b, kv, i}), kv * 12 + b * 4 + i);
  EXPECT_THROW(restride_blocks_first_kv_cache_to_kv_first_storage(Tensor::zeros({3, 3, 4}, DType::i32)),
               InvalidArgument);
  EXPECT_THROW(restride_blocks_first_kv_cache_to_kv_first_storage(r), InvalidArgument);  // not dense blocks first
}

TEST(WorkerUtilsLegacy, AlignMixedAttentionKvCacheViews) {
  const auto attn = FullAttentionSpec(16, 1, 64, DType::bf16);
  std::vector<AttentionGroup> groups = {g(attn, {"self.0"}, 0), g(attn, {"cross.0"}, 1), g(attn, {"solo.0"}, 2)};
  const KVCacheBlockDimFn dim = [](const AttentionGroup& grp, int64_t) -> int64_t {
    return grp.layer_names[0].rfind("self", 0) == 0 ? 1 : 0;
  };
  KVCacheConfig cfg;
  cfg.kv_cache_tensors = {KVCacheTensor{0, {"self.0", "cross.0"}, 0, 0, 0},  // K/V-first storage, mixed dims
                          KVCacheTensor{0, {"solo.0"}, 0, 0, 0}};            // one dim only: untouched
  KVCacheViews caches = {{"self.0", Tensor::zeros({2, 3, 4}, DType::i32)},
                         {"cross.0", Tensor::zeros({3, 2, 4}, DType::i32)},
                         {"solo.0", Tensor::zeros({3, 2, 4}, DType::i32)}};
  KVCacheViews page_aligned_case = caches;
  align_mixed_attention_kv_cache_views(groups, caches, {16, 16, 16}, dim, cfg, {});
  EXPECT_EQ(caches.at("cross.0").strides(), (Dims{4, 12, 1}));
  EXPECT_EQ(caches.at("solo.0").strides(), (Dims{8, 4, 1}));
  EXPECT_EQ(caches.at("self.0").strides(), (Dims{12, 4, 1}));
  // A page-aligned (Mamba-sharing) layer in the tensor keeps every view as it is.
  align_mixed_attention_kv_cache_views(groups, page_aligned_case, {16, 16, 16}, dim, cfg, {"self.0"});
  EXPECT_EQ(page_aligned_case.at("cross.0").strides(), (Dims{8, 4, 1}));
  // Layout-era tensors (block_stride > 0) are never restrided.
  KVCacheConfig modern = cfg;
  modern.kv_cache_tensors[0].block_stride = 32;
  KVCacheViews untouched = page_aligned_case;
  align_mixed_attention_kv_cache_views(groups, untouched, {16, 16, 16}, dim, modern, {});
  EXPECT_EQ(untouched.at("cross.0").strides(), (Dims{8, 4, 1}));
}

}  // namespace
}  // namespace kvattn
