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
ScheduleReport simulate_schedule(const SchedulerConfig& config, int32_t num_blocks,
                                 const std::vector<TraceRequest>& requests, double max_recompute_ratio = 0);

}  // namespace kvattn::engine
