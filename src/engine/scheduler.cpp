#include "kvattn/engine/scheduler.h"

#include <fmt/format.h>

#include <algorithm>

#include "kvattn/core/error.h"

namespace kvattn::engine {
namespace {
int32_t cdiv(int64_t a, int64_t b) { return static_cast<int32_t>((a + b - 1) / b); }
}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, int32_t num_blocks, const std::vector<TraceRequest>& requests)
    : config_(config), pool_(num_blocks) {
  KVATTN_CHECK(config.block_size >= 1, "block_size must be >= 1, got {}", config.block_size);
  KVATTN_CHECK(config.max_num_seqs >= 1, "max_num_seqs must be >= 1, got {}", config.max_num_seqs);
  KVATTN_CHECK(config.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1, got {}",
               config.max_num_batched_tokens);
  const int32_t blocks_per_max_request = cdiv(config.max_model_len, config.block_size);
  KVATTN_CHECK(pool_.capacity() >= 1, "the KV cache has no usable block");
  requests_.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& t = requests[i];
    KVATTN_CHECK(t.id == static_cast<int64_t>(i), "request ids must be 0..n-1 in order; request {} has id {}", i, t.id);
    KVATTN_CHECK(i == 0 || requests[i - 1].arrival_step <= t.arrival_step, "requests must be sorted by arrival_step");
    const int64_t need = cdiv(t.prompt_len + t.output_len - 1, config.block_size);
    KVATTN_CHECK(need <= pool_.capacity(),
                 "request {} (prompt {}, output {}) needs {} blocks but the KV cache has only {}; give the cache "
                 "more memory or shorten the request",
                 t.id, t.prompt_len, t.output_len, need, pool_.capacity());
    (void)blocks_per_max_request;
    EngineRequest r;
    r.spec = t;
    requests_.push_back(std::move(r));
  }
}

void Scheduler::drop_prefix_cache() {
  for (auto& [id, blocks] : prefix_cache_) pool_.release(blocks);
  prefix_cache_.clear();
}

void Scheduler::preempt(EngineRequest& r, SchedulerOutput& out) {
  pool_.release(r.block_ids);
  r.block_ids.clear();
  r.num_computed_tokens = 0;
  r.num_shared_prefix_blocks = 0;
  r.state = RequestState::Waiting;
  ++r.num_preemptions;
  ++num_preemptions_;
  running_.erase(std::find(running_.begin(), running_.end(), r.spec.id));
  waiting_.push_front(r.spec.id);
  out.preempted.push_back(r.spec.id);
  // A preempted request may already be in this step's plan; take it out.
  auto it = std::find_if(out.scheduled.begin(), out.scheduled.end(),
                         [&](const ScheduledRequest& s) { return s.request_id == r.spec.id; });
  if (it != out.scheduled.end()) {
    out.total_tokens -= it->num_new_tokens;
    out.scheduled.erase(it);
  }
}

bool Scheduler::ensure_blocks(EngineRequest& r, int32_t num_tokens, SchedulerOutput& out) {
  const int32_t need = cdiv(num_tokens, config_.block_size) - static_cast<int32_t>(r.block_ids.size());
  if (need <= 0) return true;
  while (true) {
    const size_t before = r.block_ids.size();
    if (pool_.allocate(need, r.block_ids)) {
      out.new_block_ids.insert(out.new_block_ids.end(), r.block_ids.begin() + static_cast<long>(before),
                               r.block_ids.end());
      return true;
    }
    if (!prefix_cache_.empty()) {
      drop_prefix_cache();
      continue;
    }
    // Preempt the most recently admitted running request.
    if (running_.empty()) return false;
    auto victim_it = std::max_element(running_.begin(), running_.end(), [&](int64_t a, int64_t b) {
      return requests_[static_cast<size_t>(a)].admitted_order < requests_[static_cast<size_t>(b)].admitted_order;
    });
    EngineRequest& victim = requests_[static_cast<size_t>(*victim_it)];
    const bool self = victim.spec.id == r.spec.id;
    preempt(victim, out);
    if (self) return false;
  }
}

void Scheduler::reuse_shared_prefix(EngineRequest& r) {
  if (!config_.enable_prefix_sharing || r.spec.shared_prefix_id < 0 || r.num_computed_tokens != 0) return;
  auto it = prefix_cache_.find(r.spec.shared_prefix_id);
  if (it == prefix_cache_.end()) return;
  // Keep at least one prompt token to compute, so the step produces this request's output.
  const int32_t usable = std::min<int32_t>(r.spec.shared_prefix_len, r.spec.prompt_len - 1) / config_.block_size;
  const int32_t n = std::min<int32_t>(usable, static_cast<int32_t>(it->second.size()));
  for (int32_t i = 0; i < n; ++i) {
    pool_.incref(it->second[static_cast<size_t>(i)]);
    r.block_ids.push_back(it->second[static_cast<size_t>(i)]);
  }
  r.num_shared_prefix_blocks = n;
  r.num_computed_tokens = n * config_.block_size;
}

void Scheduler::maybe_publish_shared_prefix(EngineRequest& r) {
  if (!config_.enable_prefix_sharing || r.spec.shared_prefix_id < 0) return;
  if (prefix_cache_.count(r.spec.shared_prefix_id)) return;
  const int32_t full = std::min<int32_t>(r.spec.shared_prefix_len, r.spec.prompt_len - 1) / config_.block_size;
  if (full == 0 || r.num_computed_tokens < full * config_.block_size) return;
  std::vector<int32_t> blocks(r.block_ids.begin(), r.block_ids.begin() + full);
  for (int32_t b : blocks) pool_.incref(b);
  prefix_cache_.emplace(r.spec.shared_prefix_id, std::move(blocks));
}

SchedulerOutput Scheduler::schedule(int64_t step) {
  SchedulerOutput out;
  out.step = step;
  while (next_arrival_ < requests_.size() && requests_[next_arrival_].spec.arrival_step <= step)
    waiting_.push_back(static_cast<int64_t>(next_arrival_++));
  int32_t budget = config_.max_num_batched_tokens;

  // (1) Running requests, in admission order.  Iterate over a copy: preemption edits running_.
  const std::vector<int64_t> running_snapshot = running_;
  for (int64_t id : running_snapshot) {
    if (budget == 0) break;
    EngineRequest& r = requests_[static_cast<size_t>(id)];
    if (r.state != RequestState::Running) continue;  // preempted earlier in this loop
    const int32_t num_new = std::min(r.num_known_tokens() - r.num_computed_tokens, budget);
    if (num_new <= 0) continue;
    if (!ensure_blocks(r, r.num_computed_tokens + num_new, out)) continue;  // r itself was preempted
    out.scheduled.push_back({id, r.num_computed_tokens, num_new});
    out.total_tokens += num_new;
    budget -= num_new;
  }

  // (2) Waiting requests, FCFS, while seats, budget and blocks last.  A request that does not
  // fit stops admission (no skipping ahead), and never preempts anyone.
  while (!waiting_.empty() && budget > 0 && static_cast<int32_t>(running_.size()) < config_.max_num_seqs &&
         out.preempted.empty()) {
    EngineRequest& r = requests_[static_cast<size_t>(waiting_.front())];
    reuse_shared_prefix(r);
    const int32_t num_new = std::min(r.num_known_tokens() - r.num_computed_tokens, budget);
    const int32_t need = cdiv(r.num_computed_tokens + num_new, config_.block_size) - static_cast<int32_t>(r.block_ids.size());
    if (need > pool_.num_free()) {
      if (!prefix_cache_.empty() && r.num_shared_prefix_blocks == 0) {
        drop_prefix_cache();
        continue;
      }
      // Undo the prefix reuse; try again next step.
      pool_.release(r.block_ids);
      r.block_ids.clear();
      r.num_computed_tokens = 0;
      r.num_shared_prefix_blocks = 0;
      break;
    }
    const size_t before = r.block_ids.size();
    const bool ok = pool_.allocate(need, r.block_ids);
    KVATTN_ASSERT(ok, "allocation of {} blocks failed with {} free", need, pool_.num_free());
    out.new_block_ids.insert(out.new_block_ids.end(), r.block_ids.begin() + static_cast<long>(before), r.block_ids.end());
    waiting_.pop_front();
    r.state = RequestState::Running;
    r.admitted_order = admissions_++;
    running_.push_back(r.spec.id);
    out.scheduled.push_back({r.spec.id, r.num_computed_tokens, num_new});
    out.total_tokens += num_new;
    budget -= num_new;
  }
  return out;
}

std::vector<int64_t> Scheduler::update_after_step(const SchedulerOutput& out) {
  std::vector<int64_t> finished;
  for (const auto& s : out.scheduled) {
    EngineRequest& r = requests_[static_cast<size_t>(s.request_id)];
    KVATTN_ASSERT(r.state == RequestState::Running && r.num_computed_tokens == s.num_computed_before,
                  "request {} changed between schedule and update", s.request_id);
    r.num_computed_tokens += s.num_new_tokens;
    maybe_publish_shared_prefix(r);
    if (r.num_computed_tokens == r.num_known_tokens()) {
      ++r.num_output_tokens;  // the step sampled one token
      if (r.num_output_tokens == r.spec.output_len) {
        r.state = RequestState::Finished;
        pool_.release(r.block_ids);
        r.block_ids.clear();
        running_.erase(std::find(running_.begin(), running_.end(), r.spec.id));
        ++num_finished_;
        finished.push_back(r.spec.id);
      }
    }
  }
  if (all_finished()) drop_prefix_cache();
  return finished;
}

void Scheduler::check_invariants() const {
  pool_.check_invariants();
  std::vector<int32_t> refs(static_cast<size_t>(pool_.num_blocks()), 0);
  for (const auto& r : requests_) {
    if (r.state == RequestState::Running) {
      KVATTN_ASSERT(static_cast<int64_t>(r.block_ids.size()) * config_.block_size >= r.num_computed_tokens,
                    "request {} has {} blocks for {} computed tokens", r.spec.id, r.block_ids.size(),
                    r.num_computed_tokens);
    } else {
      KVATTN_ASSERT(r.state != RequestState::Finished || r.block_ids.empty(), "finished request {} holds blocks",
                    r.spec.id);
    }
    for (int32_t b : r.block_ids) ++refs[static_cast<size_t>(b)];
  }
  for (const auto& [id, blocks] : prefix_cache_)
    for (int32_t b : blocks) ++refs[static_cast<size_t>(b)];
  KVATTN_ASSERT(refs[0] == 0, "the null block is owned by a request");
  for (int32_t b = 1; b < pool_.num_blocks(); ++b)
    KVATTN_ASSERT(refs[static_cast<size_t>(b)] == pool_.refcount(b),
                  "block {} has refcount {} but {} owners", b, pool_.refcount(b), refs[static_cast<size_t>(b)]);
}

}  // namespace kvattn::engine
