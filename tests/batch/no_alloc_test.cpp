// A step allocates nothing: global operator new is counted while reorder + prepare + split run
// on a warmed-up BatchPreparer.  (This file replaces operator new/delete for the whole test_batch
// binary — only counting, forwarding to malloc/free; under ASan it counts through the
// sanitizer's allocator hooks instead.)
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <random>

#include "kvattn/batch/batch.h"
#include "support/allocation_counter.h"

using kvattn::test::g_allocations;

namespace kvattn {
namespace {

TEST(NoAllocation, StepPipelineAllocatesNothing) {
  BatchPreparerConfig cfg;
  cfg.max_num_reqs = 128;
  cfg.max_num_batched_tokens = 4096;
  cfg.max_model_len = 2048;
  cfg.block_size = 16;
  cfg.num_blocks = 100000;
  BatchPreparer prep(cfg);
  InputBatch batch(cfg.max_num_reqs, cfg.max_num_blocks_per_req());
  std::mt19937 rng(1);
  int32_t next = 1;
  for (int i = 0; i < 100; ++i) {
    RequestState r;
    r.req_id = "req" + std::to_string(i);
    const bool prefill = rng() % 4 == 0;
    r.num_computed_tokens = prefill ? 0 : static_cast<int32_t>(1 + rng() % 900);
    r.num_prompt_tokens = prefill ? 40 : r.num_computed_tokens;
    r.num_scheduled_tokens = prefill ? 40 : 1;
    for (int64_t k = 0; k < (r.num_computed_tokens + r.num_scheduled_tokens + 15) / 16; ++k)
      r.block_ids.push_back(next++);
    batch.add_request(r);
  }
  {  // The counter sees allocations (positive control).
    const long b0 = g_allocations.load();
    auto* v = new std::vector<int>(10);
    delete v;
    EXPECT_GE(g_allocations.load() - b0, 2);
  }
  // Warm-up step (first use), then measure several steps with changing batches.
  reorder_batch_to_split_decodes_and_prefills(batch, 1);
  prep.prepare(batch);
  for (int step = 0; step < 5; ++step) {
    // Shuffle rows so the reorder has work (swap_states itself must not allocate either).
    for (int k = 0; k < 30; ++k) batch.swap_states(rng() % 100, rng() % 100);
    const long before = g_allocations.load();
    const bool changed = reorder_batch_to_split_decodes_and_prefills(batch, 1);
    const auto& cm = prep.prepare(batch, 104, 1200 + step);
    const auto split = split_decodes_and_prefills(cm, 1);
    const auto split3 = split_decodes_prefills_and_extends(cm, 1);
    const long after = g_allocations.load();
    EXPECT_EQ(after - before, 0) << "step " << step;
    EXPECT_TRUE(changed || step > 0);
    EXPECT_EQ(split.num_decodes + split.num_prefills, 104);
    EXPECT_EQ(split3.num_decode_tokens + split3.num_extend_tokens + split3.num_prefill_tokens,
              cm.num_actual_tokens);
  }
}

}  // namespace
}  // namespace kvattn
