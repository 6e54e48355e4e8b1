// Per-step host metadata cost: reorder + prepare (query start locations, sequence lengths,
// positions, slot mapping) + split + paged-KV indptr/indices/last_page_len, on one core.
//
//   Mixed/256:    192 decodes + 32 long extends + 32 prefills, arriving shuffled (the reorder
//                 does real work every iteration); context 64..1024 tokens, block size 16.
//   Decode/1024:  1024 decodes already in order, context 64..1024 tokens, block size 16.
//
// The batch is restored to its arrival order before each iteration outside the timed region
// (manual timing), so every measured step starts from the same unsorted batch.
//
// BM_StepFloor_* time, in the same setting, only the step's unavoidable data movement: the
// reorder (its row swaps are the seed's algorithm), writing the int64 positions and slots, and
// one memcpy per request of its page ids into a flat buffer — what any implementation of the
// step pays before per-request bookkeeping.  A timed region also carries the clock read itself
// (~0.5 us thread CPU on this VM: see BM_ClockOverhead).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <random>

#include "kvattn/attention/paged_kv_metadata.h"
#include "kvattn/batch/batch.h"

namespace {

using namespace kvattn;

constexpr int64_t kBlockSize = 16;
constexpr int64_t kMaxModelLen = 4096;

struct Scenario {
  std::vector<RequestState> requests;  // arrival order
  int64_t max_num_reqs = 0;
  int64_t max_num_batched_tokens = 0;
};

Scenario make_scenario(int num_decodes, int num_extends, int num_prefills, uint32_t seed,
                       bool shuffle) {
  std::mt19937 rng(seed);
  Scenario s;
  int32_t next_block = 1;  // block 0 is the null block
  auto blocks_for = [&](int64_t tokens) {
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < (tokens + kBlockSize - 1) / kBlockSize; ++i) ids.push_back(next_block++);
    return ids;
  };
  int64_t tokens = 0;
  for (int i = 0; i < num_decodes + num_extends + num_prefills; ++i) {
    RequestState r;
    r.req_id = "req-" + std::to_string(i);
    if (i < num_decodes) {
      r.num_computed_tokens = static_cast<int32_t>(64 + rng() % 961);
      r.num_prompt_tokens = r.num_computed_tokens / 2;
      r.num_scheduled_tokens = 1;
    } else if (i < num_decodes + num_extends) {
      r.num_computed_tokens = static_cast<int32_t>(64 + rng() % 961);
      r.num_prompt_tokens = r.num_computed_tokens + 512;
      r.num_scheduled_tokens = static_cast<int32_t>(8 + rng() % 25);
    } else {
      r.num_computed_tokens = 0;
      r.num_prompt_tokens = static_cast<int32_t>(16 + rng() % 49);
      r.num_scheduled_tokens = r.num_prompt_tokens;
    }
    r.block_ids = blocks_for(r.num_computed_tokens + r.num_scheduled_tokens);
    tokens += r.num_scheduled_tokens;
    s.requests.push_back(std::move(r));
  }
  if (shuffle) std::shuffle(s.requests.begin(), s.requests.end(), rng);
  s.max_num_reqs = static_cast<int64_t>(s.requests.size());
  s.max_num_batched_tokens = std::max<int64_t>(tokens, 8192);
  return s;
}

// Timed-region clock.  Argument 0: wall clock (steady_clock).  Argument 1: this thread's CPU
// time (CLOCK_THREAD_CPUTIME_ID), which excludes time the thread spends descheduled — the
// figure to read on a shared, oversubscribed machine.
double now_seconds(bool thread_cpu) {
  if (thread_cpu) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void restore(InputBatch& batch, const Scenario& s) {
  batch.clear();
  for (const auto& r : s.requests) batch.add_request(r);
}

void run_step(benchmark::State& state, const Scenario& s) {
  BatchPreparerConfig cfg;
  cfg.max_num_reqs = s.max_num_reqs;
  cfg.max_num_batched_tokens = s.max_num_batched_tokens;
  cfg.max_model_len = kMaxModelLen;
  cfg.block_size = kBlockSize;
  BatchPreparer prep(cfg);
  PagedKVMetadataConfig pc;
  pc.max_num_reqs = s.max_num_reqs;
  pc.max_model_len = kMaxModelLen;
  pc.page_size = kBlockSize;
  PagedKVMetadataBuilder paged(pc);
  InputBatch batch(s.max_num_reqs, cfg.max_num_blocks_per_req());
  int64_t pages = 0, tokens = 0;
  const bool thread_cpu = state.range(0) != 0;
  for (auto _ : state) {
    restore(batch, s);  // untimed
    const double t0 = now_seconds(thread_cpu);
    reorder_batch_to_split_decodes_and_prefills(batch, 1);
    const CommonAttentionMetadata& cm = prep.prepare(batch);
    const DecodePrefillSplit split = split_decodes_and_prefills(cm, 1);
    const PagedKVMetadata& md = paged.build(cm, split.num_decodes);
    const double t1 = now_seconds(thread_cpu);
    benchmark::DoNotOptimize(md.num_actual_pages);
    state.SetIterationTime(t1 - t0);
    pages = md.num_actual_pages;
    tokens = cm.num_actual_tokens;
  }
  state.counters["reqs"] = static_cast<double>(s.requests.size());
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["pages"] = static_cast<double>(pages);
}

void BM_StepMetadata_Mixed256(benchmark::State& state) {
  static const Scenario s = make_scenario(192, 32, 32, 1, /*shuffle=*/true);
  run_step(state, s);
}
BENCHMARK(BM_StepMetadata_Mixed256)->ArgName("thread_cpu")->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_StepMetadata_Decode1024(benchmark::State& state) {
  static const Scenario s = make_scenario(1024, 0, 0, 2, /*shuffle=*/false);
  run_step(state, s);
}
BENCHMARK(BM_StepMetadata_Decode1024)->ArgName("thread_cpu")->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);

void run_floor(benchmark::State& state, const Scenario& s) {
  InputBatch batch(s.max_num_reqs, (kMaxModelLen + kBlockSize - 1) / kBlockSize);
  std::vector<int64_t> pos(static_cast<size_t>(s.max_num_batched_tokens));
  std::vector<int64_t> slots(static_cast<size_t>(s.max_num_batched_tokens));
  std::vector<int32_t> ids(static_cast<size_t>(s.max_num_reqs * batch.max_num_blocks_per_req()));
  for (auto _ : state) {
    restore(batch, s);  // untimed
    const double t0 = now_seconds(true);
    reorder_batch_to_split_decodes_and_prefills(batch, 1);
    const int32_t* sched = batch.num_scheduled_tokens().data();
    const int32_t* nblocks = batch.num_blocks_per_row().data();
    int64_t tokens = 0;
    for (int64_t r = 0; r < batch.num_reqs(); ++r) tokens += sched[r];
    for (int64_t t = 0; t < tokens; ++t) {
      pos[t] = t;
      slots[t] = t;
    }
    const int32_t* bt = batch.block_table().data_ptr<int32_t>();
    int64_t off = 0;
    for (int64_t r = 0; r < batch.num_reqs(); ++r) {
      std::memcpy(ids.data() + off, bt + r * batch.max_num_blocks_per_req(),
                  sizeof(int32_t) * static_cast<size_t>(nblocks[r]));
      off += nblocks[r];
    }
    const double t1 = now_seconds(true);
    benchmark::DoNotOptimize(ids.data());
    benchmark::DoNotOptimize(slots.data());
    state.SetIterationTime(t1 - t0);
  }
}

void BM_StepFloor_Mixed256(benchmark::State& state) {
  static const Scenario s = make_scenario(192, 32, 32, 1, /*shuffle=*/true);
  run_floor(state, s);
}
BENCHMARK(BM_StepFloor_Mixed256)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_StepFloor_Decode1024(benchmark::State& state) {
  static const Scenario s = make_scenario(1024, 0, 0, 2, /*shuffle=*/false);
  run_floor(state, s);
}
BENCHMARK(BM_StepFloor_Decode1024)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_ClockOverhead(benchmark::State& state) {
  for (auto _ : state) {
    const double t0 = now_seconds(true);
    const double t1 = now_seconds(true);
    state.SetIterationTime(t1 - t0);
  }
}
BENCHMARK(BM_ClockOverhead)->UseManualTime()->Unit(benchmark::kMicrosecond);

// Components of the mixed step, for attribution.
void BM_Reorder_Mixed256(benchmark::State& state) {
  static const Scenario s = make_scenario(192, 32, 32, 1, true);
  InputBatch batch(s.max_num_reqs, (kMaxModelLen + kBlockSize - 1) / kBlockSize);
  const bool thread_cpu = state.range(0) != 0;
  for (auto _ : state) {
    restore(batch, s);
    const double t0 = now_seconds(thread_cpu);
    const bool changed = reorder_batch_to_split_decodes_and_prefills(batch, 1);
    const double t1 = now_seconds(thread_cpu);
    benchmark::DoNotOptimize(changed);
    state.SetIterationTime(t1 - t0);
  }
}
BENCHMARK(BM_Reorder_Mixed256)->ArgName("thread_cpu")->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_Prepare_Mixed256(benchmark::State& state) {
  static const Scenario s = make_scenario(192, 32, 32, 1, true);
  BatchPreparerConfig cfg;
  cfg.max_num_reqs = s.max_num_reqs;
  cfg.max_num_batched_tokens = s.max_num_batched_tokens;
  cfg.max_model_len = kMaxModelLen;
  cfg.block_size = kBlockSize;
  BatchPreparer prep(cfg);
  InputBatch batch(s.max_num_reqs, cfg.max_num_blocks_per_req());
  restore(batch, s);
  reorder_batch_to_split_decodes_and_prefills(batch, 1);
  for (auto _ : state) benchmark::DoNotOptimize(prep.prepare(batch).num_actual_tokens);
}
BENCHMARK(BM_Prepare_Mixed256)->Unit(benchmark::kMicrosecond);

void BM_PagedKV_Decode1024(benchmark::State& state) {
  static const Scenario s = make_scenario(1024, 0, 0, 2, false);
  BatchPreparerConfig cfg;
  cfg.max_num_reqs = s.max_num_reqs;
  cfg.max_num_batched_tokens = s.max_num_batched_tokens;
  cfg.max_model_len = kMaxModelLen;
  cfg.block_size = kBlockSize;
  BatchPreparer prep(cfg);
  PagedKVMetadataConfig pc;
  pc.max_num_reqs = s.max_num_reqs;
  pc.max_model_len = kMaxModelLen;
  pc.page_size = kBlockSize;
  PagedKVMetadataBuilder paged(pc);
  InputBatch batch(s.max_num_reqs, cfg.max_num_blocks_per_req());
  restore(batch, s);
  const auto& cm = prep.prepare(batch);
  for (auto _ : state) benchmark::DoNotOptimize(paged.build(cm, cm.num_reqs).num_actual_pages);
}
BENCHMARK(BM_PagedKV_Decode1024)->Unit(benchmark::kMicrosecond);

}  // namespace
