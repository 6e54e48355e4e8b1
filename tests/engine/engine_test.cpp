#include <gtest/gtest.h>

#include <random>
#include <set>

#include "kvattn/core/error.h"
#include "kvattn/engine/block_pool.h"
#include "kvattn/engine/scheduler.h"
#include "kvattn/engine/trace.h"

using namespace kvattn;
using namespace kvattn::engine;

TEST(Trace, ParsesValidLinesAndReportsEachBadLine) {
  const char* text =
      "# comment\n"
      "{\"arrival_step\": 2, \"prompt_len\": 10, \"output_len\": 3}\n"
      "\n"
      "{\"arrival\": 0, \"prompt_len\": 5, \"output_len\": 1, \"shared_prefix_id\": 7, \"shared_prefix_len\": 4}\n"
      "{not json}\n"
      "{\"arrival_step\": 1, \"prompt_len\": -3, \"output_len\": 2}\n"
      "{\"arrival_step\": 1, \"prompt_len\": 90, \"output_len\": 20}\n"
      "[1,2]\n"
      "{\"arrival_step\": 1, \"prompt_len\": 8}\n"
      "{\"arrival_step\": 3, \"prompt_len\": 8, \"output_len\": 2, \"shared_prefix_len\": 9}\n"
      "{\"arrival_step\": 4, \"prompt_len\": 8, \"output_len\": 2}";
  Trace t = parse_trace_jsonl(text, 100);
  ASSERT_EQ(t.requests.size(), 3u);
  // Sorted by arrival, ids re-numbered, source lines kept.
  EXPECT_EQ(t.requests[0].arrival_step, 0);
  EXPECT_EQ(t.requests[0].source_line, 4);
  EXPECT_EQ(t.requests[0].shared_prefix_id, 7);
  EXPECT_EQ(t.requests[0].shared_prefix_len, 4);
  EXPECT_EQ(t.requests[1].prompt_len, 10);
  EXPECT_EQ(t.requests[1].id, 1);
  EXPECT_EQ(t.requests[2].source_line, 11);
  ASSERT_EQ(t.errors.size(), 6u);
  EXPECT_EQ(t.errors[0].line, 5);
  EXPECT_NE(t.errors[0].message.find("JSON"), std::string::npos);
  EXPECT_EQ(t.errors[1].line, 6);
  EXPECT_NE(t.errors[1].message.find("prompt_len"), std::string::npos);
  EXPECT_EQ(t.errors[2].line, 7);
  EXPECT_NE(t.errors[2].message.find("max length 100"), std::string::npos);
  EXPECT_EQ(t.errors[3].line, 8);
  EXPECT_EQ(t.errors[4].line, 9);
  EXPECT_NE(t.errors[4].message.find("output_len"), std::string::npos);
  EXPECT_EQ(t.errors[5].line, 10);
  EXPECT_NE(t.errors[5].message.find("shared_prefix"), std::string::npos);
}

TEST(Trace, DefaultTraceIsDeterministicAndValid) {
  Trace a = default_trace(4096), b = default_trace(4096);
  ASSERT_EQ(a.requests.size(), 48u);
  int shared = 0, long_ctx = 0;
  for (size_t i = 0; i < a.requests.size(); ++i) {
    const auto& r = a.requests[i];
    EXPECT_EQ(r.prompt_len, b.requests[i].prompt_len);
    EXPECT_EQ(r.id, static_cast<int64_t>(i));
    EXPECT_GE(r.prompt_len, 1);
    EXPECT_LE(r.prompt_len + r.output_len, 4096);
    EXPECT_LE(r.shared_prefix_len, r.prompt_len);
    shared += r.shared_prefix_id >= 0;
    long_ctx += r.prompt_len > 1000;
    if (i > 0) {
      EXPECT_GE(r.arrival_step, a.requests[i - 1].arrival_step);
    }
  }
  EXPECT_GT(shared, 10);
  EXPECT_GT(long_ctx, 2);
}

TEST(BlockPool, NullBlockNeverHandedOutAndRefcounts) {
  BlockPool pool(5);
  EXPECT_EQ(pool.capacity(), 4);
  std::vector<int32_t> got;
  EXPECT_TRUE(pool.allocate(4, got));
  EXPECT_EQ(std::set<int32_t>(got.begin(), got.end()), (std::set<int32_t>{1, 2, 3, 4}));
  EXPECT_FALSE(pool.allocate(1, got));
  EXPECT_EQ(got.size(), 4u);  // a failed allocation takes nothing
  pool.incref(2);
  pool.release(std::vector<int32_t>{2, 3});
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.refcount(2), 1);
  pool.check_invariants();
  EXPECT_THROW(pool.release(std::vector<int32_t>{3}), InternalError);
  EXPECT_THROW(BlockPool(1), InvalidArgument);
  EXPECT_EQ(pool.peak_used(), 4);
}

namespace {

struct SimResult {
  int64_t steps = 0;
  int64_t preemptions = 0;
  std::vector<int32_t> outputs;
};

SimResult simulate(const SchedulerConfig& cfg, int32_t num_blocks, const std::vector<TraceRequest>& reqs) {
  Scheduler s(cfg, num_blocks, reqs);
  SimResult res;
  int64_t step = 0;
  while (!s.all_finished()) {
    SchedulerOutput out = s.schedule(step);
    EXPECT_LE(out.total_tokens, cfg.max_num_batched_tokens);
    int32_t sum = 0;
    std::set<int64_t> ids;
    for (const auto& sr : out.scheduled) {
      sum += sr.num_new_tokens;
      EXPECT_TRUE(ids.insert(sr.request_id).second) << "scheduled twice";
      EXPECT_GE(sr.num_new_tokens, 1);
      const auto& r = s.request(sr.request_id);
      EXPECT_GE(static_cast<int64_t>(r.block_ids[0].size()) * cfg.block_size, sr.num_computed_before + sr.num_new_tokens);
      EXPECT_LE(sr.num_computed_before + sr.num_new_tokens, r.spec.prompt_len + r.spec.output_len - 1);
    }
    EXPECT_EQ(sum, out.total_tokens);
    for (int32_t b : out.new_block_ids) EXPECT_NE(b, 0);
    int running = 0;
    for (const auto& r : s.requests()) running += r.state == RequestState::Running;
    EXPECT_LE(running, cfg.max_num_seqs);
    s.update_after_step(out);
    s.check_invariants();
    ++step;
    if (step > 200000) {
      ADD_FAILURE() << "scheduler made no progress";
      break;
    }
  }
  EXPECT_EQ(s.pool().num_used(), 0) << "every block is freed at the end";
  res.steps = step;
  res.preemptions = s.num_preemptions();
  for (const auto& r : s.requests()) res.outputs.push_back(r.num_output_tokens);
  return res;
}

std::vector<TraceRequest> random_requests(std::mt19937& rng, int n, int max_len) {
  std::vector<TraceRequest> v;
  int64_t arrival = 0;
  for (int i = 0; i < n; ++i) {
    TraceRequest r;
    r.id = i;
    arrival += rng() % 3;
    r.arrival_step = arrival;
    r.output_len = 1 + static_cast<int32_t>(rng() % 20);
    r.prompt_len = 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(max_len - r.output_len));
    if (rng() % 2) {
      r.shared_prefix_id = static_cast<int32_t>(rng() % 2);
      r.shared_prefix_len = std::min<int32_t>(r.prompt_len, 40);
    }
    v.push_back(r);
  }
  return v;
}

}  // namespace

TEST(Scheduler, HandComputedDecodeAndChunkedPrefill) {
  SchedulerConfig cfg;
  cfg.block_size = 4;
  cfg.max_num_batched_tokens = 6;
  cfg.max_num_seqs = 4;
  cfg.max_model_len = 64;
  std::vector<TraceRequest> reqs(2);
  reqs[0] = {0, 0, 10, 2};  // prompt 10 -> chunks of 6 and 4
  reqs[1] = {1, 0, 3, 1};
  Scheduler s(cfg, 32, reqs);
  auto o0 = s.schedule(0);
  ASSERT_EQ(o0.scheduled.size(), 1u);
  EXPECT_EQ(o0.scheduled[0].num_new_tokens, 6);
  EXPECT_EQ(o0.new_block_ids.size(), 2u);
  s.update_after_step(o0);
  auto o1 = s.schedule(1);
  ASSERT_EQ(o1.scheduled.size(), 2u);
  EXPECT_EQ(o1.scheduled[0].num_new_tokens, 4);  // rest of the prompt
  EXPECT_EQ(o1.scheduled[1].num_new_tokens, 2);  // budget left for request 1
  EXPECT_EQ(s.update_after_step(o1).size(), 0u);
  EXPECT_EQ(s.request(0).num_output_tokens, 1);
  auto o2 = s.schedule(2);
  ASSERT_EQ(o2.scheduled.size(), 2u);
  EXPECT_EQ(o2.scheduled[0].num_new_tokens, 1);  // decode
  EXPECT_EQ(o2.scheduled[0].num_computed_before, 10);
  EXPECT_EQ(o2.scheduled[1].num_new_tokens, 1);  // last prompt token of request 1
  auto fin = s.update_after_step(o2);
  EXPECT_EQ(fin, (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(s.all_finished());
  EXPECT_EQ(s.pool().num_used(), 0);
}

TEST(Scheduler, RandomTracesFinishWithCorrectOutputCounts) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    SchedulerConfig cfg;
    cfg.block_size = 1 << (rng() % 4 + 2);
    cfg.max_num_seqs = 1 + static_cast<int32_t>(rng() % 16);
    cfg.max_num_batched_tokens = 8 + static_cast<int32_t>(rng() % 256);
    cfg.max_model_len = 256;
    auto reqs = random_requests(rng, 1 + static_cast<int>(rng() % 40), 256);
    const int32_t min_blocks = (256 + cfg.block_size - 1) / cfg.block_size + 1;
    const int32_t num_blocks = min_blocks + static_cast<int32_t>(rng() % (4 * min_blocks));
    SimResult r = simulate(cfg, num_blocks, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(r.outputs[i], reqs[i].output_len);
  }
}

TEST(Scheduler, OversubscribedCachePreemptsAndLosesNothing) {
  std::mt19937 rng(5);
  std::vector<TraceRequest> reqs;
  for (int i = 0; i < 24; ++i) reqs.push_back({i, 0, 100 + i * 7, 60});
  SchedulerConfig cfg;
  cfg.block_size = 16;
  cfg.max_num_seqs = 24;
  cfg.max_num_batched_tokens = 4096;
  cfg.max_model_len = 512;
  cfg.reserve_to_finish = false;
  // Room for ~5 full requests at once: admission is optimistic (prefill only), so decode
  // growth must preempt.
  SimResult r = simulate(cfg, 60, reqs);
  EXPECT_GT(r.preemptions, 0);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(r.outputs[i], 60);
}

TEST(Scheduler, SharedPrefixBlocksAreReused) {
  SchedulerConfig cfg;
  cfg.block_size = 4;
  cfg.max_num_batched_tokens = 64;
  cfg.max_model_len = 64;
  std::vector<TraceRequest> reqs(2);
  reqs[0] = {0, 0, 12, 3, 5, 9};
  reqs[1] = {1, 2, 14, 2, 5, 9};  // arrives after request 0 computed its prompt
  Scheduler s(cfg, 32, reqs);
  auto o = s.schedule(0);
  s.update_after_step(o);
  s.update_after_step(s.schedule(1));
  auto o2 = s.schedule(2);
  ASSERT_EQ(o2.scheduled.size(), 2u);
  EXPECT_EQ(o2.scheduled[1].request_id, 1);
  EXPECT_EQ(o2.scheduled[1].num_computed_before, 8);  // two full prefix blocks reused
  EXPECT_EQ(s.request(1).block_ids[0][0], s.request(0).block_ids[0][0]);
  EXPECT_EQ(s.request(1).block_ids[0][1], s.request(0).block_ids[0][1]);
  EXPECT_EQ(s.pool().refcount(s.request(0).block_ids[0][0]), 3);  // two requests + the prefix cache
  s.check_invariants();
}

TEST(Scheduler, RejectsOnlyTheRequestThatCanNeverFitNamingItsTraceLine) {
  SchedulerConfig cfg;
  cfg.block_size = 16;
  cfg.max_model_len = 4096;
  // 9 usable blocks = 144 tokens.  The middle request (trace line 7) needs 64 blocks.
  std::vector<TraceRequest> reqs = {{0, 0, 40, 4, -1, 0, 2}, {1, 0, 1000, 10, -1, 0, 7}, {2, 1, 100, 8, -1, 0, 3}};
  Scheduler s(cfg, 10, reqs);
  EXPECT_EQ(s.num_rejected(), 1);
  EXPECT_EQ(s.request(1).state, RequestState::Rejected);
  EXPECT_NE(s.request(1).reject_reason.find("trace line 7"), std::string::npos) << s.request(1).reject_reason;
  EXPECT_NE(s.request(1).reject_reason.find("64 KV cache blocks"), std::string::npos) << s.request(1).reject_reason;
  EXPECT_NE(s.request(1).reject_reason.find("only 9"), std::string::npos) << s.request(1).reject_reason;
  int64_t step = 0;
  while (!s.all_finished() && step < 1000) {
    s.update_after_step(s.schedule(step));
    s.check_invariants();
    ++step;
  }
  EXPECT_TRUE(s.all_finished());
  EXPECT_EQ(s.request(0).num_output_tokens, 4);
  EXPECT_EQ(s.request(2).num_output_tokens, 8);
  EXPECT_EQ(s.request(1).num_output_tokens, 0);
  EXPECT_EQ(s.pool().num_used(), 0);
}
