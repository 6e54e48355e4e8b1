// Scheduler liveness and safety as properties (engine/scheduler_check.h), over random traces x
// budgets x models x options, plus the reproducers they were written for.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "kvattn/core/error.h"
#include "kvattn/engine/runner.h"
#include "kvattn/engine/scheduler_check.h"
#include "kvattn/engine/trace.h"
#include "kvattn/kv/model_config.h"

using namespace kvattn;
using namespace kvattn::engine;

namespace {

// The trace from the hang report: two long prompts with distinct cached prefixes fill the
// 16 MiB default cache; a later request reuses a prefix and did not fit, and the prefix cache
// was never dropped although nothing ran.
const char* kHangTrace =
    "{\"arrival_step\": 0, \"prompt_len\": 4000, \"output_len\": 2, \"shared_prefix_id\": 1, \"shared_prefix_len\": 3900}\n"
    "{\"arrival_step\": 0, \"prompt_len\": 4000, \"output_len\": 2, \"shared_prefix_id\": 3, \"shared_prefix_len\": 3900}\n"
    "{\"arrival_step\": 10, \"prompt_len\": 64, \"output_len\": 2, \"shared_prefix_id\": 2, \"shared_prefix_len\": 32}\n"
    "{\"arrival_step\": 20, \"prompt_len\": 1000, \"output_len\": 2, \"shared_prefix_id\": 2, \"shared_prefix_len\": 32}\n";

SchedulerConfig config_for(const std::string& model, int64_t gpu_memory, int32_t max_num_seqs = 32,
                           int32_t max_num_batched_tokens = 1024, int64_t dcp = 1, bool prefix_sharing = true,
                           int32_t* num_blocks = nullptr) {
  PlanOptions po;
  po.gpu_memory = gpu_memory;
  po.max_num_batched_tokens = max_num_batched_tokens;
  const KVPlan plan = plan_kv_cache(load_model_config(model), po);
  if (num_blocks) *num_blocks = static_cast<int32_t>(plan.config.num_blocks);
  return make_scheduler_config(plan, max_num_seqs, max_num_batched_tokens, dcp, prefix_sharing);
}

std::vector<TraceRequest> random_trace(std::mt19937_64& rng, int n, int64_t max_len, int64_t max_gap) {
  std::vector<TraceRequest> v;
  int64_t arrival = 0;
  for (int i = 0; i < n; ++i) {
    TraceRequest r;
    r.id = i;
    r.source_line = i + 1;
    if (rng() % 8 == 0) arrival += static_cast<int64_t>(rng() % static_cast<uint64_t>(max_gap + 1));
    r.arrival_step = arrival;
    const int64_t longest = rng() % 4 == 0 ? max_len : std::max<int64_t>(2, max_len / 8);
    r.output_len = 1 + static_cast<int32_t>(rng() % static_cast<uint64_t>(std::min<int64_t>(longest - 1, 300)));
    r.prompt_len = 1 + static_cast<int32_t>(rng() % static_cast<uint64_t>(longest - r.output_len));
    if (rng() % 3 != 0) {
      r.shared_prefix_id = static_cast<int32_t>(rng() % 3);
      r.shared_prefix_len = std::min<int32_t>(r.prompt_len, 1 + static_cast<int32_t>(rng() % 700));
    }
    v.push_back(r);
  }
  return v;
}

}  // namespace

TEST(SchedulerLiveness, HangTraceFinishesWithTheDefaultBudget) {
  const Trace t = parse_trace_jsonl(kHangTrace, 4096);
  ASSERT_EQ(t.requests.size(), 4u);
  int32_t blocks = 0;
  const SchedulerConfig cfg = config_for("tiny-llama", 16LL << 20, 32, 1024, 1, true, &blocks);
  const ScheduleReport rep = simulate_schedule(cfg, blocks, t.requests);
  EXPECT_EQ(rep.rejected, 0);
  EXPECT_LT(rep.steps, 40);  // ~4 chunks per long prompt + the short ones; never an idle spin
}

TEST(SchedulerLiveness, IdleStretchesAreSkippedNotStepped) {
  for (int64_t gap : {int64_t{1000000000}, int64_t{1} << 40}) {
    std::vector<TraceRequest> reqs = {{0, 0, 20, 3, -1, 0, 1}, {1, gap, 30, 2, -1, 0, 2}};
    SchedulerConfig cfg;
    cfg.max_model_len = 4096;
    const auto t0 = std::chrono::steady_clock::now();
    const ScheduleReport rep = simulate_schedule(cfg, 64, reqs);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
    EXPECT_EQ(rep.steps, 3 + 2);  // every step computes something
    EXPECT_EQ(rep.busy_steps, rep.steps);
  }
}

TEST(SchedulerLiveness, MultiGroupModelFitsWhatPlanSays) {
  // tiny-gemma2 at 16 MiB: plan says one 4096-token request holds 417 of 511 blocks.  The
  // sliding-window group frees the blocks that leave its window, so the request runs.
  int32_t blocks = 0;
  const SchedulerConfig cfg = config_for("tiny-gemma2", 16LL << 20, 32, 1024, 1, true, &blocks);
  ASSERT_EQ(cfg.groups.size(), 2u);
  EXPECT_EQ(blocks, 512);
  std::vector<TraceRequest> reqs = {{0, 0, 4000, 96, -1, 0, 1}};
  const ScheduleReport rep = simulate_schedule(cfg, blocks, reqs);
  EXPECT_EQ(rep.rejected, 0);
  EXPECT_EQ(rep.preemptions, 0);
  // Full group: 256 blocks; sliding group: at most the window behind a 1024-token chunk.
  EXPECT_LE(rep.peak_blocks_used, 256 + (511 + 1024 + 15) / 16 + 1);
  EXPECT_GT(rep.peak_blocks_used, 256);
}

TEST(SchedulerPreemption, ExhaustionTraceRecomputesAtMostHalfAgain) {
  // 24 long requests under --gpu-memory 8421376 (256 usable blocks = 4096 tokens on
  // tiny-llama): before the admission watermark this recomputed 8.1x the necessary tokens.
  std::vector<TraceRequest> reqs;
  for (int i = 0; i < 24; ++i)
    reqs.push_back({i, 0, 1000 + (i * 397) % 1001, 200 + (i * 53) % 101, -1, 0, i + 1});
  int32_t blocks = 0;
  const SchedulerConfig cfg = config_for("tiny-llama", 8421376, 32, 1024, 1, true, &blocks);
  ASSERT_EQ(blocks, 257);
  const ScheduleReport rep = simulate_schedule(cfg, blocks, reqs, 1.5);
  const double ratio = static_cast<double>(rep.computed_tokens) /
                       static_cast<double>(rep.computed_tokens - rep.recomputed_tokens);
  EXPECT_LE(ratio, 1.5) << rep.preemptions << " preemptions, " << rep.recomputed_tokens << " recomputed";
  EXPECT_EQ(rep.computed_tokens - rep.recomputed_tokens, 42345);
}

TEST(SchedulerProperty, RandomTracesBudgetsModelsAndOptions) {
  const std::vector<std::string> models = {"tiny-llama", "tiny-gemma2", "hybrid-mamba"};
  std::mt19937_64 rng(2026);
  int runs = 0, rejected_runs = 0, preempting_runs = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const std::string& model = models[static_cast<size_t>(trial) % models.size()];
    const int32_t max_seqs = 1 + static_cast<int32_t>(rng() % 24);
    const int32_t max_batched = 16 << (rng() % 7);  // 16 .. 1024
    const int64_t dcp = model == "tiny-llama" && rng() % 4 == 0 ? 2 : 1;
    const bool sharing = rng() % 4 != 0;
    const int64_t mem = (int64_t{1} << 20) * (2 + static_cast<int64_t>(rng() % 30));
    PlanOptions po;
    po.gpu_memory = mem;
    po.max_num_batched_tokens = max_batched;
    po.max_model_len = 256 << (rng() % 5);  // 256 .. 4096
    KVPlan plan;
    try {
      plan = plan_kv_cache(load_model_config(model), po);
    } catch (const InvalidArgument&) {
      continue;  // plan says one max-length request does not fit: run refuses the same budget
    }
    SchedulerConfig cfg = make_scheduler_config(plan, max_seqs, max_batched, dcp, sharing);
    // plan's "fits" agrees with run: a max-length request is admissible.
    TraceRequest longest{0, 0, static_cast<int32_t>(*po.max_model_len - 1), 1};
    Scheduler probe(cfg, static_cast<int32_t>(plan.config.num_blocks), {longest});
    ASSERT_EQ(probe.num_rejected(), 0) << model << " max_model_len " << *po.max_model_len << " budget " << mem;
    EXPECT_LE(probe.peak_blocks_of(longest), plan.blocks_per_request);
    // Random traces, with a smaller pool half the time so that requests get rejected.
    const auto reqs = random_trace(rng, 1 + static_cast<int>(rng() % 24), *po.max_model_len, 1 << 20);
    const int32_t blocks = rng() % 2 ? static_cast<int32_t>(plan.config.num_blocks)
                                     : 2 + static_cast<int32_t>(rng() % static_cast<uint64_t>(plan.config.num_blocks));
    // Half of the runs admit optimistically, so decode growth preempts; their recompute
    // is not bounded by the watermark, only their liveness (a looser step bound).
    cfg.reserve_to_finish = rng() % 2 != 0;
    const ScheduleReport rep = simulate_schedule(cfg, blocks, reqs, cfg.reserve_to_finish ? 1.5 : 64.0);
    ++runs;
    rejected_runs += rep.rejected > 0;
    preempting_runs += rep.preemptions > 0;
  }
  // The sample exercises every path it claims to.
  EXPECT_GT(runs, 300);
  EXPECT_GT(rejected_runs, 10);
  EXPECT_GT(preempting_runs, 5);
}

TEST(SchedulerFinish, EarlyFinishFreesBlocksForTheWaitingRequest) {
  // 12 usable blocks of 4 tokens.  Request 0 (9 + up to 40 tokens: 12 blocks at its peak) runs;
  // request 1 (40 + 8 tokens) waits behind its reserve.  Request 0 stops after 3 outputs (an EOS):
  // its blocks return at once and request 1 starts at the next step, on some of those blocks.
  SchedulerConfig cfg;
  cfg.block_size = 4;
  std::vector<TraceRequest> reqs = {{0, 0, 9, 40, -1, 0, 1}, {1, 0, 40, 8, -1, 0, 2}};
  Scheduler s(cfg, 13, reqs);
  int64_t step = 0;
  std::vector<int32_t> held_by_0;
  for (; s.request(0).num_output_tokens < 3; ++step) {
    const SchedulerOutput out = s.schedule(step);
    ASSERT_EQ(out.scheduled.size(), 1u);
    EXPECT_EQ(out.scheduled[0].request_id, 0);
    s.update_after_step(out);
  }
  EXPECT_EQ(step, 3);
  held_by_0 = s.request(0).group_blocks(0);
  ASSERT_EQ(held_by_0.size(), 3u);  // 11 tokens cached (9 + 2 outputs)
  EXPECT_EQ(s.pool().num_used(), 3);
  EXPECT_EQ(s.request(1).state, RequestState::Waiting);

  EXPECT_TRUE(s.finish_request(0));
  EXPECT_EQ(s.request(0).state, RequestState::Finished);
  EXPECT_EQ(s.request(0).num_output_tokens, 3);
  EXPECT_EQ(s.pool().num_used(), 0);
  EXPECT_EQ(s.num_finished_early(), 1);
  EXPECT_FALSE(s.finish_request(0));  // idempotent
  EXPECT_EQ(s.pool().num_used(), 0);
  s.check_invariants();

  const SchedulerOutput out = s.schedule(step++);
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].request_id, 1);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 40);
  ASSERT_EQ(out.new_block_ids.size(), 10u);
  // 10 of 12 blocks: the FIFO free list hands out the never-used 9 first, then a freed one.
  int reused = 0;
  for (int32_t b : out.new_block_ids) reused += std::count(held_by_0.begin(), held_by_0.end(), b) > 0;
  EXPECT_EQ(reused, 1);
  s.update_after_step(out);
  while (!s.all_finished()) s.update_after_step(s.schedule(step++));
  EXPECT_EQ(s.request(1).num_output_tokens, 8);
  EXPECT_EQ(step, 3 + 8);  // without the early finish: 40 + 8
  EXPECT_EQ(s.num_computed_tokens_total(), (9 + 2) + (40 + 7));
  EXPECT_EQ(s.pool().num_used(), 0);
  EXPECT_FALSE(s.has_pending_work());
}

TEST(SchedulerFinish, WaitingNotArrivedRejectedAndUnknownRequests) {
  SchedulerConfig cfg;
  cfg.block_size = 4;
  cfg.max_num_seqs = 1;
  // 0 runs, 1 waits for the seat, 2 arrives at step 100, 3 can never fit (rejected).
  std::vector<TraceRequest> reqs = {
      {0, 0, 8, 4, -1, 0, 1}, {1, 0, 8, 4, -1, 0, 2}, {2, 100, 8, 4, -1, 0, 3}, {3, 100, 400, 4, -1, 0, 4}};
  Scheduler s(cfg, 17, reqs);
  ASSERT_EQ(s.request(3).state, RequestState::Rejected);
  s.update_after_step(s.schedule(0));
  EXPECT_EQ(s.request(1).state, RequestState::Waiting);
  EXPECT_TRUE(s.finish_request(1));  // waiting: leaves the queue, held nothing
  EXPECT_TRUE(s.finish_request(2));  // not arrived yet: skipped when it arrives
  EXPECT_FALSE(s.finish_request(3));  // rejected: nothing to end
  EXPECT_EQ(s.num_finished_early(), 2);
  s.check_invariants();
  EXPECT_THROW(s.finish_request(4), InvalidArgument);
  EXPECT_THROW(s.finish_request(-1), InvalidArgument);
  int64_t step = 1;
  while (!s.all_finished()) {
    step = s.next_busy_step(step);
    const SchedulerOutput out = s.schedule(step++);
    for (const auto& sr : out.scheduled) EXPECT_EQ(sr.request_id, 0);
    s.update_after_step(out);
  }
  EXPECT_EQ(step, 4);  // request 0's 4 steps; no step waits for the arrival at 100
  EXPECT_EQ(s.request(0).num_output_tokens, 4);
  EXPECT_EQ(s.request(1).num_output_tokens, 0);
  EXPECT_EQ(s.request(2).num_output_tokens, 0);
  EXPECT_EQ(s.pool().num_used(), 0);
}

TEST(SchedulerProperty, RandomEarlyFinishesReturnBlocksAndOthersCompleteExactly) {
  // As RandomTracesBudgetsModelsAndOptions, with a third of the requests stopping after a random
  // number of outputs and a sixth aborted at a random step (waiting, prefilling or not arrived).
  const std::vector<std::string> models = {"tiny-llama", "tiny-gemma2", "hybrid-mamba"};
  std::mt19937_64 rng(37);
  int runs = 0;
  int64_t early = 0, early_running = 0, freed = 0, preempting_runs = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const std::string& model = models[static_cast<size_t>(trial) % models.size()];
    const int32_t max_seqs = 1 + static_cast<int32_t>(rng() % 24);
    const int32_t max_batched = 16 << (rng() % 7);
    const int64_t dcp = model == "tiny-llama" && rng() % 4 == 0 ? 2 : 1;
    PlanOptions po;
    po.gpu_memory = (int64_t{1} << 20) * (2 + static_cast<int64_t>(rng() % 30));
    po.max_num_batched_tokens = max_batched;
    po.max_model_len = 256 << (rng() % 5);
    KVPlan plan;
    try {
      plan = plan_kv_cache(load_model_config(model), po);
    } catch (const InvalidArgument&) {
      continue;
    }
    SchedulerConfig cfg = make_scheduler_config(plan, max_seqs, max_batched, dcp, rng() % 4 != 0);
    cfg.reserve_to_finish = rng() % 2 != 0;
    const auto reqs = random_trace(rng, 1 + static_cast<int>(rng() % 24), *po.max_model_len, 1 << 10);
    std::vector<EarlyFinish> plan_early(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      const uint64_t k = rng() % 6;
      if (k < 2 && reqs[i].output_len > 1)
        plan_early[i].after_outputs = 1 + static_cast<int32_t>(rng() % static_cast<uint64_t>(reqs[i].output_len - 1));
      else if (k == 2)
        plan_early[i].at_step = static_cast<int64_t>(rng() % static_cast<uint64_t>(reqs[i].arrival_step + 200));
    }
    const int32_t blocks = rng() % 2 ? static_cast<int32_t>(plan.config.num_blocks)
                                     : 2 + static_cast<int32_t>(rng() % static_cast<uint64_t>(plan.config.num_blocks));
    const ScheduleReport rep =
        simulate_schedule(cfg, blocks, reqs, cfg.reserve_to_finish ? 1.5 : 64.0, plan_early);
    ++runs;
    early += rep.early_finishes;
    early_running += rep.early_finishes_running;
    freed += rep.early_freed_blocks;
    preempting_runs += rep.preemptions > 0;
  }
  EXPECT_GT(runs, 150);
  EXPECT_GT(early, 500);
  EXPECT_GT(early_running, 400);
  EXPECT_GT(early - early_running, 50);  // waiting or not yet arrived
  EXPECT_GT(freed, 5000);
  EXPECT_GT(preempting_runs, 5);
}
