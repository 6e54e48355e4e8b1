// The paged-KV builder allocates nothing per step (global operator new is counted; this file
// replaces operator new/delete for the whole test_attention binary, forwarding to malloc/free;
// under ASan it counts through the sanitizer's allocator hooks instead).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "kvattn/attention/native_backend.h"
#include "kvattn/attention/paged_kv_metadata.h"
#include "support/allocation_counter.h"

using kvattn::test::g_allocations;

namespace kvattn {
namespace {

TEST(NoAllocation, PagedKVBuildAllocatesNothing) {
  const int n = 64;
  std::vector<int32_t> qsl{0}, seq, table;
  for (int r = 0; r < n; ++r) {
    qsl.push_back(qsl.back() + (r < 40 ? 1 : 9));
    seq.push_back(100 + r * 7);
    for (int c = 0; c < 64; ++c) table.push_back(1 + r * 64 + c);
  }
  Tensor qsl_t = Tensor::from_vector(qsl), seq_t = Tensor::from_vector(seq);
  Tensor bt = Tensor::from_vector(table, {n, 64});
  CommonAttentionMetadata cm;
  cm.query_start_loc = cm.query_start_loc_cpu = qsl_t;
  cm.seq_lens = cm.seq_lens_cpu_upper_bound = seq_t;
  cm.num_reqs = n;
  cm.num_actual_tokens = qsl.back();
  cm.block_table_tensor = bt;
  PagedKVMetadataConfig c;
  c.max_num_reqs = 64;
  c.max_model_len = 1024;
  c.page_size = 16;
  c.num_blocks = 100000;
  PagedKVMetadataBuilder plain(c);
  c.dcp_world_size = 2;
  c.dcp_rank = 1;
  PagedKVMetadataBuilder dcp(c);
  plain.build(cm, 40);
  dcp.build(cm, 40);
  const long before = g_allocations.load();
  for (int step = 0; step < 4; ++step) {
    EXPECT_GT(plain.build(cm, 40, step % 2 ? 32 : 0).num_actual_pages, 0);
    EXPECT_GT(dcp.build(cm, 40).num_actual_pages, 0);
  }
  EXPECT_EQ(g_allocations.load() - before, 0);
}

// The native backend's build() is allocation-free once warm: the first build of each path
// may create its wrapper and size its plan; every later step reuses them.
TEST(NoAllocation, NativeBuildAllocatesNothingWhenWarm) {
  LayerRegistry registry;
  std::vector<AttentionLayer> layers;
  BackendConfig cfg;
  cfg.model_dtype = DType::bf16;
  cfg.num_attention_heads = 8;
  cfg.num_kv_heads = 2;
  cfg.head_size = 64;
  cfg.max_model_len = 2048;
  cfg.max_num_seqs = 64;
  cfg.max_num_batched_tokens = 1024;
  cfg.num_sms = 16;
  cfg.flashinfer_workspace_buffer_size = 0;
  cfg.cache_config.kv_cache_layout = KVCacheLayout::LBNHC;
  cfg.layers = &registry;
  AttentionImplParams p;
  p.num_heads = 8;
  p.num_kv_heads = 2;
  p.head_size = 64;
  p.scale = 0.125;
  layers.reserve(1);
  layers.push_back(AttentionLayer::make("layers.0", std::make_shared<FlashInferImpl>(p, cfg)));
  registry.add(&layers.back());
  FlashInferMetadataBuilder builder(FullAttentionSpec(16, 2, 64, DType::bf16), {"layers.0"}, cfg);

  // Two different mixed batches (decodes first, then prefills), built alternately.
  struct Batch {
    Tensor qsl, seq, bt, slots;
    CommonAttentionMetadata cm;
  };
  auto make = [](int n_dec, int n_pre, int salt) {
    Batch b;
    std::vector<int32_t> q{0}, s, table;
    const int n = n_dec + n_pre, width = 2048 / 16;
    for (int r = 0; r < n; ++r) {
      const int32_t ql = r < n_dec ? 1 : 17 + r % 5;
      q.push_back(q.back() + ql);
      s.push_back(100 + (r * 37 + salt) % 900 + ql);
      for (int c = 0; c < width; ++c) table.push_back(1 + (r * width + c + salt) % (n * width));
    }
    b.qsl = Tensor::from_vector(q);
    b.seq = Tensor::from_vector(s);
    b.bt = Tensor::from_vector(table, {n, width});
    b.slots = Tensor::zeros({q.back()}, DType::i64);
    b.cm.query_start_loc = b.cm.query_start_loc_cpu = b.qsl;
    b.cm.seq_lens = b.cm.seq_lens_cpu_upper_bound = b.seq;
    b.cm.num_reqs = n;
    b.cm.num_actual_tokens = q.back();
    b.cm.max_query_len = n_pre > 0 ? 21 : 1;
    b.cm.max_seq_len = *std::max_element(s.begin(), s.end());
    b.cm.block_table_tensor = b.bt;
    b.cm.slot_mapping = b.slots;
    return b;
  };
  Batch a = make(40, 6, 0), b = make(25, 9, 11);
  builder.build(0, a.cm);  // warm-up: first use of each path
  builder.build(0, b.cm);
  const long before = g_allocations.load();
  for (int i = 0; i < 10; ++i) {
    const auto& md = builder.build(0, (i % 2 ? a : b).cm);
    EXPECT_EQ(md.num_decodes, i % 2 ? 40 : 25);
  }
  EXPECT_EQ(g_allocations.load() - before, 0) << "native build() allocated in steady state";
}

}  // namespace
}  // namespace kvattn
