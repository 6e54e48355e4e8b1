#include "kvattn/engine/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kvattn/core/error.h"

namespace kvattn::engine {
namespace {
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, int32_t num_blocks, const std::vector<TraceRequest>& requests)
    : config_(config), pool_(num_blocks) {
  KVATTN_CHECK(config.block_size >= 1, "block_size must be >= 1, got {}", config.block_size);
  KVATTN_CHECK(config.max_num_seqs >= 1, "max_num_seqs must be >= 1, got {}", config.max_num_seqs);
  KVATTN_CHECK(config.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1, got {}",
               config.max_num_batched_tokens);
  KVATTN_CHECK(!config.groups.empty(), "the scheduler needs at least one KV cache group");
  for (const auto& g : config.groups)
    KVATTN_CHECK(g.kind != KVGroupKind::sliding_window || g.sliding_window >= 1,
                 "a sliding-window KV cache group needs sliding_window >= 1, got {}", g.sliding_window);
  KVATTN_CHECK(config.watermark >= 0 && config.watermark < 1, "watermark must be in [0, 1), got {}", config.watermark);
  KVATTN_CHECK(pool_.capacity() >= 1, "the KV cache has no usable block");
  watermark_blocks_ = static_cast<int32_t>(std::ceil(config.watermark * pool_.capacity()));
  requests_.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& t = requests[i];
    KVATTN_CHECK(t.id == static_cast<int64_t>(i), "request ids must be 0..n-1 in order; request {} has id {}", i, t.id);
    KVATTN_CHECK(i == 0 || requests[i - 1].arrival_step <= t.arrival_step, "requests must be sorted by arrival_step");
    KVATTN_CHECK(t.prompt_len >= 1 && t.output_len >= 1, "request {} needs prompt_len >= 1 and output_len >= 1, got {} "
                 "and {}", t.id, t.prompt_len, t.output_len);
    EngineRequest r;
    r.spec = t;
    const int64_t need = peak_blocks_of(t);
    if (need > pool_.capacity()) {
      // Rejected by itself: every other request is still served.
      r.state = RequestState::Rejected;
      r.reject_reason = fmt::format(
          "{}: prompt_len {} + output_len {} needs up to {} KV cache blocks of {} tokens at once (all cache groups), "
          "but the cache holds only {}; it can never run, even alone. Raise --gpu-memory or shorten the request",
          t.source_line > 0 ? fmt::format("trace line {}", t.source_line) : fmt::format("request {}", t.id),
          t.prompt_len, t.output_len, need, config.block_size, pool_.capacity());
      ++num_rejected_;
    }
    requests_.push_back(std::move(r));
  }
}

int64_t Scheduler::peak_blocks_of(const TraceRequest& t) const {
  const int64_t bs = config_.block_size;
  const int64_t tokens = int64_t{t.prompt_len} + t.output_len - 1;  // the most the cache ever holds
  int64_t total = 0;
  for (const auto& g : config_.groups) {
    switch (g.kind) {
      case KVGroupKind::full_attention:
        total += cdiv(tokens, bs);
        break;
      case KVGroupKind::sliding_window:
        // The window behind the first token of a step plus the step's chunk, across block edges.
        total += std::min(cdiv(tokens, bs),
                          cdiv(std::min<int64_t>(g.sliding_window - 1 + config_.max_num_batched_tokens, tokens), bs) + 1);
        break;
      case KVGroupKind::state:
        total += 1;
        break;
    }
  }
  return total;
}

int64_t Scheduler::next_busy_step(int64_t step) const {
  if (!running_.empty() || !waiting_.empty()) return step;
  for (size_t i = next_arrival_; i < requests_.size(); ++i)
    if (requests_[i].state == RequestState::Waiting) return std::max(step, requests_[i].spec.arrival_step);
  return step;
}

int32_t Scheduler::first_needed_block(const EngineRequest& r, size_t g) const {
  const SchedulerGroup& grp = config_.groups[g];
  if (grp.kind != KVGroupKind::sliding_window) return 0;
  const int64_t first_token = std::max<int64_t>(0, int64_t{r.num_computed_tokens} - grp.sliding_window + 1);
  return static_cast<int32_t>(first_token / config_.block_size);
}

int32_t Scheduler::blocks_needed(const EngineRequest& r, int32_t end) const {
  int64_t need = 0;
  const int64_t entries = cdiv(end, config_.block_size);
  for (size_t g = 0; g < G(); ++g) {
    const int64_t have = static_cast<int64_t>(r.block_ids[g].size());
    switch (config_.groups[g].kind) {
      case KVGroupKind::full_attention:
        need += std::max<int64_t>(0, entries - have);
        break;
      case KVGroupKind::sliding_window:
        need += std::max<int64_t>(0, entries - std::max<int64_t>(have, first_needed_block(r, g)));
        break;
      case KVGroupKind::state:
        need += have == 0 ? 1 : 0;
        break;
    }
  }
  return static_cast<int32_t>(need);
}

void Scheduler::allocate_blocks(EngineRequest& r, int32_t end, SchedulerOutput& out) {
  const int32_t entries = static_cast<int32_t>(cdiv(end, config_.block_size));
  for (size_t g = 0; g < G(); ++g) {
    auto& ids = r.block_ids[g];
    const size_t before = ids.size();
    const KVGroupKind kind = config_.groups[g].kind;
    if (kind == KVGroupKind::state) {
      if (ids.empty()) {
        const bool ok = pool_.allocate(1, ids);
        KVATTN_ASSERT(ok, "state block allocation failed with {} free", pool_.num_free());
      }
    } else {
      const int32_t first = first_needed_block(r, g);
      while (static_cast<int32_t>(ids.size()) < entries && static_cast<int32_t>(ids.size()) < first)
        ids.push_back(0);  // out of the window before it is ever written: the null block
      const int32_t n = entries - static_cast<int32_t>(ids.size());
      if (n > 0) {
        const bool ok = pool_.allocate(n, ids);
        KVATTN_ASSERT(ok, "allocation of {} blocks failed with {} free", n, pool_.num_free());
      }
    }
    for (size_t i = before; i < ids.size(); ++i)
      if (ids[i] != 0) out.new_block_ids.push_back(ids[i]);
  }
}

void Scheduler::free_skipped_blocks(EngineRequest& r) {
  for (size_t g = 0; g < G(); ++g) {
    if (config_.groups[g].kind != KVGroupKind::sliding_window) continue;
    auto& ids = r.block_ids[g];
    const size_t first = std::min(ids.size(), static_cast<size_t>(first_needed_block(r, g)));
    for (size_t i = first; i-- > 0;) {
      if (ids[i] == 0) break;  // the entries before were freed already (nulls are leading)
      pool_.release(std::span<const int32_t>(&ids[i], 1));
      ids[i] = 0;
    }
  }
}

int64_t Scheduler::outstanding_blocks(const EngineRequest& r) const {
  int64_t held = 0;
  for (const auto& ids : r.block_ids)
    for (int32_t b : ids) held += b != 0;
  return std::max<int64_t>(0, peak_blocks_of(r.spec) - held);
}

void Scheduler::release_all(EngineRequest& r) {
  for (auto& ids : r.block_ids) {
    for (int32_t b : ids)
      if (b != 0) pool_.release(std::span<const int32_t>(&b, 1));
    ids.clear();
  }
}

void Scheduler::drop_prefix_cache() {
  for (auto& [id, groups] : prefix_cache_)
    for (auto& ids : groups)
      for (int32_t b : ids)
        if (b != 0) pool_.release(std::span<const int32_t>(&b, 1));
  prefix_cache_.clear();
}

void Scheduler::preempt(EngineRequest& r, SchedulerOutput& out) {
  release_all(r);
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
  free_skipped_blocks(r);
  while (true) {
    const int32_t need = blocks_needed(r, num_tokens);
    if (need <= pool_.num_free()) {
      allocate_blocks(r, num_tokens, out);
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
  const auto& cached = it->second;
  // Keep at least one prompt token to compute, so the step produces this request's output.
  int64_t n = std::min<int32_t>(r.spec.shared_prefix_len, r.spec.prompt_len - 1) / config_.block_size;
  for (size_t g = 0; g < G(); ++g)
    if (config_.groups[g].kind != KVGroupKind::state) n = std::min<int64_t>(n, static_cast<int64_t>(cached[g].size()));
  // A sliding-window group must hold real blocks for the window behind the first new token.
  for (size_t g = 0; g < G() && n > 0; ++g) {
    if (config_.groups[g].kind != KVGroupKind::sliding_window) continue;
    const int64_t window_start = std::max<int64_t>(0, n * config_.block_size - config_.groups[g].sliding_window + 1) /
                                 config_.block_size;
    for (int64_t i = window_start; i < n; ++i)
      if (cached[g][static_cast<size_t>(i)] == 0) n = 0;
  }
  if (n <= 0) return;
  for (size_t g = 0; g < G(); ++g) {
    if (config_.groups[g].kind == KVGroupKind::state) continue;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t b = cached[g][static_cast<size_t>(i)];
      if (b != 0) pool_.incref(b);
      r.block_ids[g].push_back(b);
    }
  }
  r.num_shared_prefix_blocks = static_cast<int32_t>(n);
  r.num_computed_tokens = static_cast<int32_t>(n * config_.block_size);
}

void Scheduler::maybe_publish_shared_prefix(EngineRequest& r) {
  if (!config_.enable_prefix_sharing || r.spec.shared_prefix_id < 0) return;
  if (prefix_cache_.count(r.spec.shared_prefix_id)) return;
  const int32_t full = std::min<int32_t>(r.spec.shared_prefix_len, r.spec.prompt_len - 1) / config_.block_size;
  if (full == 0 || r.num_computed_tokens < full * config_.block_size) return;
  std::vector<std::vector<int32_t>> groups(G());
  for (size_t g = 0; g < G(); ++g) {
    if (config_.groups[g].kind == KVGroupKind::state) continue;
    groups[g].assign(r.block_ids[g].begin(), r.block_ids[g].begin() + full);
    for (int32_t b : groups[g])
      if (b != 0) pool_.incref(b);
  }
  prefix_cache_.emplace(r.spec.shared_prefix_id, std::move(groups));
}

SchedulerOutput Scheduler::schedule(int64_t step) {
  SchedulerOutput out;
  out.step = step;
  while (next_arrival_ < requests_.size() && requests_[next_arrival_].spec.arrival_step <= step) {
    EngineRequest& r = requests_[next_arrival_++];
    if (r.state != RequestState::Waiting) continue;  // rejected, or finished before it arrived
    r.block_ids.assign(G(), {});
    waiting_.push_back(r.spec.id);
  }
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
  // fit stops admission (no skipping ahead), and never preempts anyone.  Admission keeps the
  // watermark free for the running requests' growth, except when nothing runs at all.
  while (!waiting_.empty() && budget > 0 && static_cast<int32_t>(running_.size()) < config_.max_num_seqs &&
         out.preempted.empty()) {
    EngineRequest& r = requests_[static_cast<size_t>(waiting_.front())];
    reuse_shared_prefix(r);
    free_skipped_blocks(r);
    const int32_t num_new = std::min(r.num_known_tokens() - r.num_computed_tokens, budget);
    const int32_t need = blocks_needed(r, r.num_computed_tokens + num_new);
    // The watermark: what every running request and this one may still need to finish.
    int64_t reserve = 0;
    if (!running_.empty()) {
      reserve = watermark_blocks_;
      if (config_.reserve_to_finish) {
        reserve += outstanding_blocks(r) - need;
        for (int64_t id : running_) reserve += outstanding_blocks(requests_[static_cast<size_t>(id)]);
      }
    }
    if (need + std::max<int64_t>(reserve, 0) > pool_.num_free()) {
      // Undo the prefix reuse; release the prefix cache and retry, or wait for blocks.
      release_all(r);
      r.num_computed_tokens = 0;
      r.num_shared_prefix_blocks = 0;
      if (!prefix_cache_.empty()) {
        drop_prefix_cache();
        continue;
      }
      break;
    }
    allocate_blocks(r, r.num_computed_tokens + num_new, out);
    waiting_.pop_front();
    r.state = RequestState::Running;
    r.admitted_order = admissions_++;
    running_.push_back(r.spec.id);
    out.scheduled.push_back({r.spec.id, r.num_computed_tokens, num_new});
    out.total_tokens += num_new;
    budget -= num_new;
  }
  // Liveness: with arrived work and nothing running, something must have started.
  KVATTN_ASSERT(!out.scheduled.empty() || !out.preempted.empty() || waiting_.empty() || !running_.empty(),
                "step {}: {} requests wait, none runs, and none could be admitted ({} of {} blocks free)", step,
                waiting_.size(), pool_.num_free(), pool_.capacity());
  return out;
}

std::vector<int64_t> Scheduler::update_after_step(const SchedulerOutput& out) {
  std::vector<int64_t> finished;
  for (const auto& s : out.scheduled) {
    EngineRequest& r = requests_[static_cast<size_t>(s.request_id)];
    KVATTN_ASSERT(r.state == RequestState::Running && r.num_computed_tokens == s.num_computed_before,
                  "request {} changed between schedule and update", s.request_id);
    const int32_t end = r.num_computed_tokens + s.num_new_tokens;
    computed_total_ += s.num_new_tokens;
    recomputed_total_ += std::max(0, std::min(end, r.computed_high_water) - r.num_computed_tokens);
    r.computed_high_water = std::max(r.computed_high_water, end);
    r.num_computed_tokens = end;
    maybe_publish_shared_prefix(r);
    if (r.num_computed_tokens == r.num_known_tokens()) {
      ++r.num_output_tokens;  // the step sampled one token
      if (r.num_output_tokens == r.spec.output_len) {
        r.state = RequestState::Finished;
        release_all(r);
        running_.erase(std::find(running_.begin(), running_.end(), r.spec.id));
        ++num_finished_;
        finished.push_back(r.spec.id);
      }
    }
  }
  if (all_finished()) drop_prefix_cache();
  return finished;
}

bool Scheduler::finish_request(int64_t id) {
  if (id < 0 || id >= static_cast<int64_t>(requests_.size()))
    throw InvalidArgument(fmt::format("finish_request: no request has id {}; the scheduler holds {} requests{}", id,
                                      requests_.size(),
                                      requests_.empty() ? "" : fmt::format(" (ids 0..{})", requests_.size() - 1)));
  EngineRequest& r = requests_[static_cast<size_t>(id)];
  if (r.state == RequestState::Finished || r.state == RequestState::Rejected) return false;
  if (r.state == RequestState::Running) {
    running_.erase(std::find(running_.begin(), running_.end(), id));
  } else if (auto it = std::find(waiting_.begin(), waiting_.end(), id); it != waiting_.end()) {
    waiting_.erase(it);  // not found: it has not arrived yet, and the arrival skips it
  }
  release_all(r);
  r.num_shared_prefix_blocks = 0;
  r.state = RequestState::Finished;
  ++num_finished_;
  ++num_finished_early_;
  if (all_finished()) drop_prefix_cache();
  return true;
}

void Scheduler::check_invariants() const {
  pool_.check_invariants();
  std::vector<int32_t> refs(static_cast<size_t>(pool_.num_blocks()), 0);
  const int64_t bs = config_.block_size;
  for (const auto& r : requests_) {
    if (r.state == RequestState::Running) {
      KVATTN_ASSERT(r.block_ids.size() == G(), "request {} has block lists for {} groups, the model {}", r.spec.id,
                    r.block_ids.size(), G());
      for (size_t g = 0; g < G(); ++g) {
        const auto& ids = r.block_ids[g];
        if (config_.groups[g].kind == KVGroupKind::state) {
          KVATTN_ASSERT(ids.size() == 1 && ids[0] != 0, "request {} holds {} state blocks, not one", r.spec.id,
                        ids.size());
          continue;
        }
        KVATTN_ASSERT(static_cast<int64_t>(ids.size()) * bs >= r.num_computed_tokens,
                      "request {} group {} has {} blocks for {} computed tokens", r.spec.id, g, ids.size(),
                      r.num_computed_tokens);
        // Every block a query can still attend to is real; nulls only lead.
        for (size_t i = static_cast<size_t>(first_needed_block(r, g)); i < ids.size(); ++i)
          KVATTN_ASSERT(ids[i] != 0, "request {} group {} block {} (inside the window) is the null block", r.spec.id,
                        g, i);
      }
    } else {
      bool empty = true;
      for (const auto& ids : r.block_ids) empty = empty && ids.empty();
      KVATTN_ASSERT(empty, "request {} is not running but holds blocks", r.spec.id);
    }
    for (const auto& ids : r.block_ids)
      for (int32_t b : ids) ++refs[static_cast<size_t>(b)];
  }
  for (const auto& [id, groups] : prefix_cache_)
    for (const auto& ids : groups)
      for (int32_t b : ids) ++refs[static_cast<size_t>(b)];
  for (int32_t b = 1; b < pool_.num_blocks(); ++b)
    KVATTN_ASSERT(refs[static_cast<size_t>(b)] == pool_.refcount(b),
                  "block {} has refcount {} but {} owners", b, pool_.refcount(b), refs[static_cast<size_t>(b)]);
}

}  // namespace kvattn::engine
