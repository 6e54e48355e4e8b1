// kvattn/engine/scheduler.h — a first-come-first-served continuous-batching scheduler with a
// token budget, chunked prefill, shared-prefix block reuse and recompute preemption: the
// part of a serving engine that decides, each step, which tokens of which requests run.
//
// Token accounting (as vLLM's): a request knows prompt_len + num_output_tokens tokens; each
// step computes some of the not-yet-computed ones; when all known tokens are computed the
// step "samples" one output token.  A request finishes when it has output_len tokens, so its
// KV cache holds at most prompt_len + output_len - 1 tokens.
//
// Each step: (1) running requests in order get their remaining tokens (decode: 1; a prefill
// chunk: as many as the budget allows), allocating blocks; when the pool is empty the
// shared-prefix cache is dropped first, then the most recently admitted running request is
// preempted (blocks freed, computed tokens reset, back to the front of the waiting queue) —
// possibly the request being scheduled itself. (2) waiting requests that have arrived are
// admitted in order while seats (max_num_seqs), budget and blocks last.  Nothing is lost:
// every preempted request resumes later and recomputes.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "kvattn/engine/block_pool.h"
#include "kvattn/engine/trace.h"

namespace kvattn::engine {

struct SchedulerConfig {
  int32_t block_size = 16;
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 8192;
  bool enable_prefix_sharing = true;
};

enum class RequestState { Waiting, Running, Finished };

struct EngineRequest {
  TraceRequest spec;
  RequestState state = RequestState::Waiting;
  int32_t num_computed_tokens = 0;
  int32_t num_output_tokens = 0;
  std::vector<int32_t> block_ids;  // manager blocks, in token order
  int32_t num_preemptions = 0;
  int32_t num_shared_prefix_blocks = 0;  // leading blocks shared through the prefix cache
  int64_t admitted_order = -1;           // increases with every admission (preemption victim order)

  int32_t num_known_tokens() const { return spec.prompt_len + num_output_tokens; }
  bool is_prefilling() const { return num_computed_tokens < spec.prompt_len; }
};

struct ScheduledRequest {
  int64_t request_id = 0;
  int32_t num_computed_before = 0;  // tokens already in the KV cache
  int32_t num_new_tokens = 0;       // tokens this step computes (query length)
};

struct SchedulerOutput {
  int64_t step = 0;
  std::vector<ScheduledRequest> scheduled;  // running order (not yet reordered)
  std::vector<int32_t> new_block_ids;       // allocated this step: to be zeroed before use
  std::vector<int64_t> preempted;           // request ids preempted this step
  int32_t total_tokens = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, int32_t num_blocks, const std::vector<TraceRequest>& requests);

  // Plans one step.  Requests arriving at or before `step` become eligible.
  SchedulerOutput schedule(int64_t step);
  // Applies the step's results: computed tokens advance, sampled tokens are counted, finished
  // requests free their blocks.  Returns the ids that finished.
  std::vector<int64_t> update_after_step(const SchedulerOutput& out);

  bool all_finished() const noexcept { return num_finished_ == static_cast<int64_t>(requests_.size()); }
  bool has_pending_work() const noexcept { return !running_.empty() || !waiting_.empty() || next_arrival_ < requests_.size(); }
  const EngineRequest& request(int64_t id) const { return requests_.at(static_cast<size_t>(id)); }
  const std::vector<EngineRequest>& requests() const noexcept { return requests_; }
  const BlockPool& pool() const noexcept { return pool_; }
  const SchedulerConfig& config() const noexcept { return config_; }
  int64_t num_preemptions() const noexcept { return num_preemptions_; }
  // Every invariant of the pool and of the requests' block ownership (InternalError if broken).
  void check_invariants() const;

 private:
  bool ensure_blocks(EngineRequest& r, int32_t num_tokens, SchedulerOutput& out);
  void preempt(EngineRequest& r, SchedulerOutput& out);
  void drop_prefix_cache();
  void reuse_shared_prefix(EngineRequest& r);
  void maybe_publish_shared_prefix(EngineRequest& r);

  SchedulerConfig config_;
  BlockPool pool_;
  std::vector<EngineRequest> requests_;
  size_t next_arrival_ = 0;        // requests_[next_arrival_..] have not arrived yet
  std::deque<int64_t> waiting_;    // arrived, not running (preempted ones at the front)
  std::vector<int64_t> running_;   // admission order
  std::map<int32_t, std::vector<int32_t>> prefix_cache_;  // prefix id -> its full blocks (one ref each)
  int64_t admissions_ = 0;
  int64_t num_finished_ = 0;
  int64_t num_preemptions_ = 0;
};

}  // namespace kvattn::engine
