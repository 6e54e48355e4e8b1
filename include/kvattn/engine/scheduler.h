// kvattn/engine/scheduler.h — a first-come-first-served continuous-batching scheduler with a
// token budget, chunked prefill, shared-prefix block reuse and recompute preemption: the
// part of a serving engine that decides, each step, which tokens of which requests run.
//
// Token accounting (as vLLM's): a request knows prompt_len + num_output_tokens tokens; each
// step computes some of the not-yet-computed ones; when all known tokens are computed the
// step "samples" one output token.  A request finishes when it has output_len tokens, so its
// KV cache holds at most prompt_len + output_len - 1 tokens.
//
// KV cache groups (vLLM's hybrid allocator): every group of the model takes its blocks from
// the one pool, so all groups share the pool's block-id space and a block id belongs to one
// group of one request (or the prefix cache) at a time.  A full-attention group holds one
// block per block_size tokens; a sliding-window group frees the blocks that fell out of the
// window before each step (their table entries become the null block 0, as vLLM's
// SlidingWindowManager does); a state group (Mamba) holds one block per request.
//
// Each step: (1) running requests in order get their remaining tokens (decode: 1; a prefill
// chunk: as many as the budget allows), allocating blocks; when the pool is empty the
// shared-prefix cache is dropped first, then the most recently admitted running request is
// preempted (blocks freed, computed tokens reset, back to the front of the waiting queue) —
// possibly the request being scheduled itself. (2) waiting requests that have arrived are
// admitted in order while seats (max_num_seqs), budget and blocks last, keeping a watermark of
// free blocks for the running requests' growth to their end (see SchedulerConfig::watermark); a request
// that does not fit first drops the prefix cache.  With nothing running the watermark is
// waived, so an admissible request always starts.  Requests that cannot fit even alone in an
// empty cache are rejected at construction (state Rejected, with the reason) and every other
// request is served.  Nothing is lost: every preempted request resumes later and recomputes.
//
// Early finishes (vLLM's finish_requests): finish_request(id) ends a request before its
// output_len — the model layer's EOS or stop string, or an abort — whether it runs, waits or has
// not arrived yet.  Its blocks return to the pool at once (a shared-prefix block keeps the
// prefix cache's reference, as when a request finishes normally), so its seat, blocks and
// budget serve the next requests from the following step.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "kvattn/engine/block_pool.h"
#include "kvattn/engine/trace.h"

namespace kvattn::engine {

enum class KVGroupKind { full_attention, sliding_window, state };

// One KV cache group as the scheduler allocates for it.
struct SchedulerGroup {
  KVGroupKind kind = KVGroupKind::full_attention;
  int32_t sliding_window = 0;  // tokens a query attends back to (sliding_window kind only)
};

struct SchedulerConfig {
  int32_t block_size = 16;
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 8192;
  bool enable_prefix_sharing = true;
  // The model's KV cache groups, all served from one pool (one full-attention group by default).
  std::vector<SchedulerGroup> groups = {SchedulerGroup{}};
  // Admission keeps free, besides the new request's first blocks, every block the running
  // requests and the new one may still allocate before they finish (output_len is known), plus
  // watermark * capacity blocks (vLLM's block-manager watermark, 0.01).  So an admission never
  // forces a later preemption of work already running; preemption remains the fallback when
  // the prefix cache or an estimate falls short.  Waived when nothing runs.
  double watermark = 0.01;
  // false: admit on the first chunk's blocks and the watermark alone (optimistic, as vLLM V1;
  // decode growth then preempts).  Tests use it to exercise preemption.
  bool reserve_to_finish = true;
};

enum class RequestState { Waiting, Running, Finished, Rejected };

struct EngineRequest {
  TraceRequest spec;
  RequestState state = RequestState::Waiting;
  int32_t num_computed_tokens = 0;
  int32_t num_output_tokens = 0;
  // [group][logical block]: the blocks of each KV cache group, in token order; 0 (the null
  // block) for sliding-window blocks that fell out of the window.
  std::vector<std::vector<int32_t>> block_ids;
  int32_t num_preemptions = 0;
  int32_t num_shared_prefix_blocks = 0;  // leading blocks shared through the prefix cache
  int64_t admitted_order = -1;           // increases with every admission (preemption victim order)
  int32_t computed_high_water = 0;       // highest token count ever computed (recompute accounting)
  std::string reject_reason;             // state Rejected: why it can never run

  int32_t num_known_tokens() const { return spec.prompt_len + num_output_tokens; }
  bool is_prefilling() const { return num_computed_tokens < spec.prompt_len; }
  // Blocks of the given group (empty before admission).
  const std::vector<int32_t>& group_blocks(size_t group) const { return block_ids.at(group); }
};

struct ScheduledRequest {
  int64_t request_id = 0;
  int32_t num_computed_before = 0;  // tokens already in the KV cache
  int32_t num_new_tokens = 0;       // tokens this step computes (query length)
};

struct SchedulerOutput {
  int64_t step = 0;
  std::vector<ScheduledRequest> scheduled;  // running order (not yet reordered)
  std::vector<int32_t> new_block_ids;       // allocated this step (any group): to be zeroed before use
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
  // Ends request `id` now, before its output_len (see above): it leaves the running or waiting
  // requests (or will be skipped when it arrives), frees its blocks and counts as finished,
  // keeping the tokens it has.  Returns true if it ended it, false if the request had already
  // finished or was rejected (idempotent).  An id that is not a request is InvalidArgument.
  // Call it between steps: after update_after_step, before the next schedule.
  bool finish_request(int64_t id);

  // Every request finished or rejected.
  bool all_finished() const noexcept { return num_finished_ + num_rejected_ == static_cast<int64_t>(requests_.size()); }
  bool has_pending_work() const noexcept { return !all_finished(); }
  // The first step at or after `step` at which there is something to do: `step` while requests
  // run or wait, else the next arrival (so idle stretches are skipped, not stepped).
  int64_t next_busy_step(int64_t step) const;
  const EngineRequest& request(int64_t id) const { return requests_.at(static_cast<size_t>(id)); }
  const std::vector<EngineRequest>& requests() const noexcept { return requests_; }
  const BlockPool& pool() const noexcept { return pool_; }
  const SchedulerConfig& config() const noexcept { return config_; }
  int64_t num_preemptions() const noexcept { return num_preemptions_; }
  int64_t num_rejected() const noexcept { return num_rejected_; }
  // Requests ended by finish_request (included in the finished ones).
  int64_t num_finished_early() const noexcept { return num_finished_early_; }
  // Tokens computed by all steps so far, and those of them computed before (lost to a preemption).
  int64_t num_computed_tokens_total() const noexcept { return computed_total_; }
  int64_t num_recomputed_tokens() const noexcept { return recomputed_total_; }
  // Most blocks (all groups) one request can hold at once when it runs alone: its peak need.
  int64_t peak_blocks_of(const TraceRequest& t) const;
  // Every invariant of the pool and of the requests' block ownership (InternalError if broken).
  void check_invariants() const;

 private:
  size_t G() const noexcept { return config_.groups.size(); }
  // New blocks (all groups) the request needs to hold `end` tokens, given its computed tokens.
  int32_t blocks_needed(const EngineRequest& r, int32_t end) const;
  void allocate_blocks(EngineRequest& r, int32_t end, SchedulerOutput& out);
  void free_skipped_blocks(EngineRequest& r);
  bool ensure_blocks(EngineRequest& r, int32_t num_tokens, SchedulerOutput& out);
  void release_all(EngineRequest& r);
  // Blocks the request may still allocate before it finishes (its peak need minus what it holds).
  int64_t outstanding_blocks(const EngineRequest& r) const;
  void preempt(EngineRequest& r, SchedulerOutput& out);
  void drop_prefix_cache();
  void reuse_shared_prefix(EngineRequest& r);
  void maybe_publish_shared_prefix(EngineRequest& r);
  int32_t first_needed_block(const EngineRequest& r, size_t g) const;

  SchedulerConfig config_;
  BlockPool pool_;
  std::vector<EngineRequest> requests_;
  size_t next_arrival_ = 0;        // requests_[next_arrival_..] have not arrived yet
  std::deque<int64_t> waiting_;    // arrived, not running (preempted ones at the front)
  std::vector<int64_t> running_;   // admission order
  // prefix id -> [group][block] of its full blocks (one ref each; 0 entries own nothing)
  std::map<int32_t, std::vector<std::vector<int32_t>>> prefix_cache_;
  int32_t watermark_blocks_ = 0;
  int64_t admissions_ = 0;
  int64_t num_finished_ = 0;
  int64_t num_finished_early_ = 0;
  int64_t num_rejected_ = 0;
  int64_t num_preemptions_ = 0;
  int64_t computed_total_ = 0;
  int64_t recomputed_total_ = 0;
};

}  // namespace kvattn::engine
