#include "kvattn/engine/scheduler_check.h"

#include <fmt/format.h>

#include <algorithm>

#include "kvattn/core/error.h"

namespace kvattn::engine {

ScheduleReport simulate_schedule(const SchedulerConfig& config, int32_t num_blocks,
                                 const std::vector<TraceRequest>& requests, double max_recompute_ratio,
                                 const std::vector<EarlyFinish>& early) {
  KVATTN_CHECK(early.empty() || early.size() == requests.size(),
               "simulate_schedule: {} early-finish entries for {} requests; give none or one per request", early.size(),
               requests.size());
  Scheduler s(config, num_blocks, requests);
  std::vector<int32_t> ended_with(requests.size(), -1);  // outputs of a request when finished early
  ScheduleReport rep;
  const int64_t bs = config.block_size;
  int64_t necessary = 0;  // tokens the admissible requests need computed, without any preemption
  for (const auto& r : s.requests()) {
    const bool fits = s.peak_blocks_of(r.spec) <= s.pool().capacity();
    KVATTN_ASSERT(fits == (r.state != RequestState::Rejected),
                  "request {} (prompt {}, output {}, peak {} blocks, capacity {}) is {}rejected", r.spec.id,
                  r.spec.prompt_len, r.spec.output_len, s.peak_blocks_of(r.spec), s.pool().capacity(),
                  fits ? "" : "not ");
    if (fits) necessary += int64_t{r.spec.prompt_len} + r.spec.output_len - 1;
  }
  const double ratio = max_recompute_ratio > 0 ? max_recompute_ratio : 4.0;
  rep.step_bound = static_cast<int64_t>(2 * ratio * static_cast<double>(necessary)) +
                   static_cast<int64_t>(requests.size()) + 1;
  int64_t step = 0;
  while (!s.all_finished()) {
    step = s.next_busy_step(step);
    const SchedulerOutput out = s.schedule(step);
    ++rep.steps;
    KVATTN_ASSERT(rep.steps <= rep.step_bound, "step {}: the run exceeds its step bound {} ({} necessary tokens)", step,
                  rep.step_bound, necessary);
    KVATTN_ASSERT(out.total_tokens <= config.max_num_batched_tokens, "step {}: {} tokens over the budget {}", step,
                  out.total_tokens, config.max_num_batched_tokens);
    KVATTN_ASSERT(!out.scheduled.empty() || !out.preempted.empty(),
                  "step {}: nothing scheduled and nothing preempted while requests wait (an idle step)", step);
    int64_t sum = 0;
    for (size_t i = 0; i < out.scheduled.size(); ++i) {
      const ScheduledRequest& sr = out.scheduled[i];
      for (size_t j = 0; j < i; ++j)
        KVATTN_ASSERT(out.scheduled[j].request_id != sr.request_id, "step {}: request {} scheduled twice", step,
                      sr.request_id);
      const EngineRequest& r = s.request(sr.request_id);
      KVATTN_ASSERT(r.state == RequestState::Running, "step {}: scheduled request {} is not running", step,
                    sr.request_id);
      KVATTN_ASSERT(sr.num_new_tokens >= 1, "step {}: request {} scheduled with {} tokens", step, sr.request_id,
                    sr.num_new_tokens);
      const int64_t end = int64_t{sr.num_computed_before} + sr.num_new_tokens;
      KVATTN_ASSERT(end <= int64_t{r.spec.prompt_len} + r.spec.output_len - 1,
                    "step {}: request {} would cache {} tokens, more than prompt {} + output {} - 1", step,
                    sr.request_id, end, r.spec.prompt_len, r.spec.output_len);
      for (size_t g = 0; g < config.groups.size(); ++g) {
        const auto& ids = r.group_blocks(g);
        if (config.groups[g].kind == KVGroupKind::state) {
          KVATTN_ASSERT(ids.size() == 1 && ids[0] != 0, "step {}: request {} lacks its state block", step,
                        sr.request_id);
          continue;
        }
        KVATTN_ASSERT(static_cast<int64_t>(ids.size()) * bs >= end,
                      "step {}: request {} group {} has {} blocks for {} tokens", step, sr.request_id, g, ids.size(),
                      end);
        // Every token the step writes or attends to lies in a real block.
        int64_t first = 0;
        if (config.groups[g].kind == KVGroupKind::sliding_window)
          first = std::max<int64_t>(0, sr.num_computed_before - config.groups[g].sliding_window + 1);
        for (int64_t b = first / bs; b < (end + bs - 1) / bs; ++b)
          KVATTN_ASSERT(ids[static_cast<size_t>(b)] != 0, "step {}: request {} group {} reads the null block at {}",
                        step, sr.request_id, g, b);
      }
      sum += sr.num_new_tokens;
    }
    KVATTN_ASSERT(sum == out.total_tokens, "step {}: scheduled tokens {} != total {}", step, sum, out.total_tokens);
    for (int32_t b : out.new_block_ids) KVATTN_ASSERT(b > 0, "step {}: the null block was handed out", step);
    int64_t running = 0;
    for (const auto& r : s.requests()) running += r.state == RequestState::Running;
    KVATTN_ASSERT(running <= config.max_num_seqs, "step {}: {} requests run, over max_num_seqs {}", step, running,
                  config.max_num_seqs);
    rep.busy_steps += !out.scheduled.empty();
    s.update_after_step(out);
    s.check_invariants();
    for (size_t i = 0; i < early.size(); ++i) {
      const EngineRequest& r = s.request(static_cast<int64_t>(i));
      if (r.state == RequestState::Finished || r.state == RequestState::Rejected) continue;
      const bool stop = (early[i].after_outputs >= 1 && r.num_output_tokens >= early[i].after_outputs) ||
                        (early[i].at_step >= 0 && step >= early[i].at_step);
      if (!stop) continue;
      // The blocks only this request references return to the pool; shared ones stay.
      int64_t sole = 0;
      for (const auto& ids : r.block_ids)
        for (int32_t b : ids) sole += b != 0 && s.pool().refcount(b) == 1;
      const int32_t free_before = s.pool().num_free();
      const bool was_running = r.state == RequestState::Running;
      const int32_t outputs = r.num_output_tokens;
      KVATTN_ASSERT(s.finish_request(static_cast<int64_t>(i)), "step {}: finish_request({}) ended nothing", step, i);
      KVATTN_ASSERT(r.state == RequestState::Finished && r.num_output_tokens == outputs,
                    "step {}: request {} is not finished with its {} outputs after finish_request", step, i, outputs);
      for (const auto& ids : r.block_ids)
        KVATTN_ASSERT(ids.empty(), "step {}: request {} holds blocks after finish_request", step, i);
      // The prefix cache is dropped when the last request ends: its blocks return too.
      const int32_t gained = s.pool().num_free() - free_before;
      KVATTN_ASSERT(gained == sole || (s.all_finished() && gained >= sole),
                    "step {}: finish_request({}) returned {} blocks to the pool; it alone held {}", step, i, gained,
                    sole);
      KVATTN_ASSERT(!s.finish_request(static_cast<int64_t>(i)) && s.pool().num_free() == free_before + gained,
                    "step {}: a second finish_request({}) changed the scheduler", step, i);
      s.check_invariants();
      ended_with[i] = outputs;
      ++rep.early_finishes;
      rep.early_finishes_running += was_running;
      rep.early_freed_blocks += gained;
    }
    rep.peak_blocks_used = std::max<int64_t>(rep.peak_blocks_used, s.pool().num_used());
    ++step;
  }
  for (const auto& r : s.requests()) {
    if (r.state == RequestState::Rejected) continue;
    const int32_t ended = ended_with[static_cast<size_t>(r.spec.id)];
    const int32_t want = ended >= 0 ? ended : r.spec.output_len;
    KVATTN_ASSERT(r.state == RequestState::Finished && r.num_output_tokens == want,
                  "request {} ended with {} of {} output tokens{}", r.spec.id, r.num_output_tokens, want,
                  ended >= 0 ? " (finished early)" : "");
  }
  KVATTN_ASSERT(s.pool().num_used() == 0, "{} blocks are still in use at the end", s.pool().num_used());
  rep.preemptions = s.num_preemptions();
  rep.computed_tokens = s.num_computed_tokens_total();
  rep.recomputed_tokens = s.num_recomputed_tokens();
  rep.rejected = s.num_rejected();
  KVATTN_ASSERT(rep.computed_tokens - rep.recomputed_tokens <= necessary,
                "{} tokens computed once, more than the {} necessary", rep.computed_tokens - rep.recomputed_tokens,
                necessary);
  KVATTN_ASSERT(static_cast<double>(rep.computed_tokens) <= ratio * static_cast<double>(std::max<int64_t>(necessary, 1)),
                "{} tokens computed for {} necessary: {:.2f}x, over the bound {:.2f}x (preemption thrash)",
                rep.computed_tokens, necessary,
                static_cast<double>(rep.computed_tokens) / static_cast<double>(std::max<int64_t>(necessary, 1)), ratio);
  return rep;
}

}  // namespace kvattn::engine
