// kvattn/engine/runner.h — `kvattn run`: a serving trace driven through the whole attention
// layer, step after step.
//
// Under DCP (RunConfig::dcp = W > 1) every rank runs the step in its own thread with its own
// KV cache shard, native layers (num_attention_heads / W query heads) and metadata; the
// scheduler's blocks span block_size * W tokens; checks read a host shadow of the whole KV.
//
// Setup: model geometry -> KV cache plan (the `kvattn plan` logic) -> allocate_kv_cache ->
// per attention group: the native backend's AttentionGroupBuilders and impls, the reference
// backend's (the oracle), an InputBatch and a BatchPreparer -> KVBlockZeroer.
// Each step: Scheduler::schedule -> zero the new blocks -> InputBatch update and reorder ->
// CommonAttentionMetadata (BatchPreparer) -> native build() -> for every layer: deterministic
// pseudo-random Q/K/V for the step's tokens, do_kv_cache_update, forward -> on the sampled
// layer (one per checked step, rotating) the reference backend recomputes every request's
// last query tokens from the same cache and the outputs are compared; a mismatch stops the
// run (RunMismatch) with a report.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kvattn/core/device.h"
#include "kvattn/core/error.h"
#include "kvattn/engine/scheduler.h"
#include "kvattn/engine/trace.h"
#include "kvattn/kv/model_config.h"

namespace kvattn::engine {

struct RunConfig {
  std::string model = "tiny-llama";     // preset name or config.json path
  std::optional<int64_t> num_layers;    // serve only the first N layers of the model
  Device device = Device::cpu();
  std::optional<KVCacheLayout> layout;  // nullopt = automatic (the planner's resolution)
  std::optional<int64_t> block_size;   // default: the plan's (16; larger for hybrid models)
  KVCacheDType kv_cache_dtype = KVCacheDType::Auto;
  int32_t max_num_seqs = 32;
  int32_t max_num_batched_tokens = 1024;
  std::optional<int64_t> max_model_len;
  int64_t gpu_memory = 16LL << 20;      // bytes for the KV cache
  std::string backend = "FLASHINFER";
  // "rule": FlashAttention's use_cascade_attention decides (vllm-facts §7.4);
  // "backend": the backend's own hook (vLLM's FlashInfer backend never cascades); "off".
  std::string cascade = "rule";
  bool prefix_sharing = true;
  // Admission: "reserve" keeps free every block the running requests may still need to finish
  // (no preemption thrash); "optimistic" admits on the first chunk's blocks (vLLM V1's way;
  // decode growth then preempts the latest-admitted request).  See SchedulerConfig.
  std::string admission = "reserve";
  int32_t check_every = 1;              // check one layer every N steps (0: never)
  uint64_t seed = 1;
  // Decode context parallelism: ranks (1 = off).  CUDA: one GPU per rank from `device` on, over
  // NCCL; CPU: ranks as threads of this process (in-process group).
  int32_t dcp = 1;
  std::string dcp_comm_backend = "ag_rs";  // "ag_rs" | "a2a"
  int32_t dcp_interleave = 1;              // cp_kv_cache_interleave_size (tokens)
  // "auto" (NCCL on CUDA, in-process on CPU), "nccl", or "in-process" (every rank a thread on
  // `device`: DCP's math and data flow on one GPU, without NCCL).
  std::string dcp_transport = "auto";
  // Test hook: add 1.0 to one native output element at this step, so the reference check must
  // fail (-1: off).
  int64_t corrupt_output_at_step = -1;
};

struct StepTiming {
  double host_us = 0;       // schedule + batch update/reorder + metadata + build
  double attention_us = 0;  // KV-cache writes + forwards, all layers
  int32_t tokens = 0;
};

struct RunStats {
  std::string model;
  std::string device;
  std::string layout;          // layout_name of the plan's layout
  std::string kv_cache_dtype;  // dtype_name of the cache's element dtype
  std::string backend;
  int64_t dcp = 1;
  std::string dcp_transport;  // empty without DCP
  int64_t num_layers = 0;
  int64_t num_requests = 0;
  int64_t trace_errors = 0;
  int64_t steps = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t output_tokens = 0;
  int64_t num_blocks = 0;        // physical blocks in the KV cache
  int64_t peak_blocks_used = 0;  // physical
  int64_t preemptions = 0;
  int64_t computed_tokens = 0;    // tokens the steps computed, recomputations included
  int64_t recomputed_tokens = 0;  // of those, tokens computed before (lost to a preemption)
  int64_t cascade_steps = 0;
  std::string cascade_reason;     // why cascade ran on the steps it did, or never did
  int64_t checks_passed = 0;
  int64_t checked_tokens = 0;    // query tokens recomputed by the reference
  double max_check_error = 0;
  double wall_s = 0;
  std::vector<StepTiming> timings;
  bool all_outputs_correct = false;  // every served request produced exactly output_len tokens
  // Requests that can never run (they need more blocks than the whole cache), with the reason
  // naming their trace line; every other request was served.
  std::vector<std::string> rejected;
  // The plan the run serves with (as `kvattn plan` prints it, shortened).
  int64_t block_size = 0;            // tokens per KV cache block (per rank under DCP)
  int64_t gpu_memory = 0;            // the KV cache budget in bytes
  std::vector<std::string> groups;   // one line per KV cache group
  std::string layout_reason;
  double check_tolerance = 0;        // max |native - reference| a check accepts
  // Tokens computed over tokens needed: computed_tokens / (computed_tokens - recomputed_tokens).
  double recompute_ratio() const {
    const int64_t needed = computed_tokens - recomputed_tokens;
    return needed > 0 ? static_cast<double>(computed_tokens) / static_cast<double>(needed) : 1.0;
  }
};

// Progress after each step: requests finished, tokens so far, KV blocks used / total.
struct RunProgress {
  int64_t step = 0;
  int64_t finished = 0;
  int64_t total = 0;
  int64_t tokens = 0;
  double elapsed_s = 0;
  double busy_s = 0;       // attention + host time so far (the summary's throughput denominator)
  int64_t blocks_used = 0;
  int64_t blocks_total = 0;
};

// Thrown when the native backend disagrees with the reference: what, where, by how much.
class RunMismatch : public InternalError {
 public:
  using InternalError::InternalError;
};

// The scheduler configuration `kvattn run` uses for a plan: one scheduler group per KV cache
// group of the plan (full attention, sliding window, or a Mamba state), all drawing from the
// plan's pool of num_blocks blocks, so a request that `plan` says fits can run.  Under DCP
// (dcp = W > 1) a scheduler block spans block_size * W tokens (one block per rank).
SchedulerConfig make_scheduler_config(const KVPlan& plan, int32_t max_num_seqs, int32_t max_num_batched_tokens,
                                      int64_t dcp = 1, bool prefix_sharing = true);

RunStats run_trace(const RunConfig& config, const Trace& trace,
                   const std::function<void(const RunProgress&)>& on_step = {});

}  // namespace kvattn::engine
