// kvattn/engine/scheduler_check.h — the scheduler's liveness and safety as a checkable
// property, without attention compute: drive a Scheduler over a trace to the end, checking
// every step, and report what a run would.  Used by the property tests and the scheduler fuzz
// target; `kvattn run` drives the same Scheduler through the attention layer.
#pragma once

#include <cstdint>
#include <vector>

#include "kvattn/engine/scheduler.h"
#include "kvattn/engine/trace.h"

namespace kvattn::engine {

struct ScheduleReport {
  int64_t steps = 0;             // schedule() calls (idle stretches before arrivals are skipped)
  int64_t busy_steps = 0;        // steps that computed tokens
  int64_t step_bound = 0;        // the bound `steps` was checked against
  int64_t preemptions = 0;
  int64_t computed_tokens = 0;
  int64_t recomputed_tokens = 0;
  int64_t rejected = 0;
  int64_t peak_blocks_used = 0;
  int64_t early_finishes = 0;          // requests ended by finish_request
  int64_t early_finishes_running = 0;  // ... of them while they ran
  int64_t early_freed_blocks = 0;      // blocks those finishes returned to the pool
};

// An early finish of one request (Scheduler::finish_request), whichever comes first: once it
// has `after_outputs` output tokens (an EOS or stop string; >= 1), or after step `at_step`
// whatever its state (an abort: waiting, prefilling, decoding or not arrived yet).  -1: never.
struct EarlyFinish {
  int32_t after_outputs = -1;
  int64_t at_step = -1;
};

// Runs the scheduler to the end, advancing time to the next arrival when idle, and checks at
// every step: the token budget and seat limit; each scheduled request holds real blocks for
// every token it computes or attends to; no request exceeds prompt_len + output_len - 1 cached
// tokens; no idle step while requests wait (a step that schedules nothing must have preempted);
// the pool's and owners' invariants (Scheduler::check_invariants).  At the end: every request
// that was not rejected produced exactly its output_len tokens, a request is rejected if and
// only if its peak need exceeds the whole cache, every block is free, and the number of steps
// is within `step_bound` = 2 * (computed tokens) + arrivals + 1 — each busy step computes at
// least one token and each idle step follows a preemption, and computed tokens are bounded by
// `max_recompute_ratio` times the necessary ones.  Throws InternalError naming the step and
// the broken property.
//
// `early` (empty, or one entry per request) ends requests early between steps through
// finish_request, and checks each time: the request holds no block afterwards, the pool gained
// exactly the blocks only it referenced, a second finish_request changes nothing; at the end,
// an early-finished request kept the outputs it had, and every other one still produced
// exactly its output_len.
ScheduleReport simulate_schedule(const SchedulerConfig& config, int32_t num_blocks,
                                 const std::vector<TraceRequest>& requests, double max_recompute_ratio = 0,
                                 const std::vector<EarlyFinish>& early = {});

}  // namespace kvattn::engine
