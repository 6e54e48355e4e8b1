// Host cost of the native backend's per-step planning: FlashInferMetadataBuilder::build()
// (split, dispatch, host lengths, paged indptr/indices/last-page, work plans) on the CPU.
//
// Targets: 256 decode requests <= 5 us median; 32 prefills + 224 decodes <= 10 us median.
// Shapes: Llama-3-8B-like (32 query heads, 8 KV heads, head_dim 128), page 16, bf16, context
// lengths uniform in [128, 1024] tokens (seeded), prefills of 64 new tokens after a context.
//   build/backend/bench/bench_host --benchmark_filter=BM_Backend
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "kvattn/attention/native_backend.h"

namespace kvattn {
namespace {

struct BuildBench {
  LayerRegistry registry;
  std::vector<AttentionLayer> layers;
  BackendConfig cfg;
  std::unique_ptr<FlashInferMetadataBuilder> builder;
  Tensor qsl, seq, bt, slots;
  CommonAttentionMetadata cm;

  BuildBench(int64_t num_decodes, int64_t num_prefills, bool cudagraph = false) {
    cfg.model_dtype = DType::bf16;
    cfg.num_attention_heads = 32;
    cfg.num_kv_heads = 8;
    cfg.head_size = 128;
    cfg.max_model_len = 4096;
    cfg.max_num_seqs = 256;
    cfg.max_num_batched_tokens = 8192;
    cfg.num_sms = 132;
    cfg.flashinfer_workspace_buffer_size = 0;
    cfg.cudagraph_decode_full = cudagraph;
    cfg.cache_config.kv_cache_layout = KVCacheLayout::LBNHC;
    cfg.layers = &registry;
    AttentionImplParams p;
    p.num_heads = 32;
    p.num_kv_heads = 8;
    p.head_size = 128;
    p.scale = 1.0 / std::sqrt(128.0);
    layers.reserve(2);
    for (int i = 0; i < 2; ++i) {
      layers.push_back(AttentionLayer::make("layers." + std::to_string(i), std::make_shared<FlashInferImpl>(p, cfg)));
      registry.add(&layers.back());
    }
    builder = std::make_unique<FlashInferMetadataBuilder>(FullAttentionSpec(16, 8, 128, DType::bf16),
                                                          std::vector<std::string>{"layers.0", "layers.1"}, cfg);
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> ctx(128, 1024);
    const int64_t n = num_decodes + num_prefills;
    std::vector<int32_t> q(static_cast<size_t>(n + 1), 0), s(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      const int32_t ql = r < num_decodes ? 1 : 64;
      q[r + 1] = q[r] + ql;
      s[r] = ctx(rng) + ql;
    }
    const int64_t width = 4096 / 16;
    std::vector<int32_t> table(static_cast<size_t>(n * width));
    std::iota(table.begin(), table.end(), 1);
    std::shuffle(table.begin(), table.end(), rng);
    qsl = Tensor::from_vector(q);
    seq = Tensor::from_vector(s);
    bt = Tensor::from_vector(table, {n, width});
    slots = Tensor::zeros({q[n]}, DType::i64);
    cm.query_start_loc = qsl;
    cm.query_start_loc_cpu = qsl;
    cm.seq_lens = seq;
    cm.seq_lens_cpu_upper_bound = seq;
    cm.num_reqs = n;
    cm.num_actual_tokens = q[n];
    cm.max_query_len = num_prefills > 0 ? 64 : 1;
    cm.max_seq_len = *std::max_element(s.begin(), s.end());
    cm.block_table_tensor = bt;
    cm.slot_mapping = slots;
  }
};

void BM_BackendBuildDecode256(benchmark::State& state) {
  BuildBench b(256, 0);
  for (auto _ : state) benchmark::DoNotOptimize(&b.builder->build(0, b.cm));
  state.counters["reqs"] = 256;
}
BENCHMARK(BM_BackendBuildDecode256)->Repetitions(9)->ReportAggregatesOnly(true);

void BM_BackendBuildDecode256CudaGraph(benchmark::State& state) {
  BuildBench b(256, 0, /*cudagraph=*/true);
  for (auto _ : state) benchmark::DoNotOptimize(&b.builder->build(0, b.cm));
}
BENCHMARK(BM_BackendBuildDecode256CudaGraph)->Repetitions(9)->ReportAggregatesOnly(true);

void BM_BackendBuildMixed32Prefill224Decode(benchmark::State& state) {
  BuildBench b(224, 32);
  for (auto _ : state) benchmark::DoNotOptimize(&b.builder->build(0, b.cm));
  state.counters["reqs"] = 256;
}
BENCHMARK(BM_BackendBuildMixed32Prefill224Decode)->Repetitions(9)->ReportAggregatesOnly(true);

void BM_BackendBuildDecode8SplitKv(benchmark::State& state) {
  BuildBench b(8, 0);  // a small batch: the planner splits the KV
  for (auto _ : state) benchmark::DoNotOptimize(&b.builder->build(0, b.cm));
}
BENCHMARK(BM_BackendBuildDecode8SplitKv)->Repetitions(9)->ReportAggregatesOnly(true);

}  // namespace
}  // namespace kvattn
