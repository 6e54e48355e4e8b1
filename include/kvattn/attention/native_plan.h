// kvattn/attention/native_plan.h — the native backend's "wrappers": host-side plans and the
// kernel calls that consume them (kvattn's counterparts of FlashInfer's
// BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
// BatchPrefillWithRaggedKVCacheWrapper, MultiLevelCascadeAttentionWrapper(2), and vLLM's
// BatchDCPPrefillWrapper / fast_plan_decode).
//
// A *plan* is the work partition the kernels consume, computed on the host into persistent
// buffers by `plan()`:
//   * work items (request, query tile, KV chunk): split-KV chunking per request for decode,
//     query tiles (16/64/128 packed rows) for prefill;
//   * merge targets: o_indptr[r] = first partial-output row of request r (chunks_r * q_len_r
//     rows when split, q_len_r otherwise); a split request's partial rows are merged by LSE.
// `run()` hands the plan's paged metadata to kvattn's ops (ops::paged_attention and friends);
// the CPU ops tile internally and read only the paged metadata.  On CUDA the decode, prefill and
// ragged-prefill wrappers also keep the kernels' own plan (ops::PagedAttentionPlan): the first
// run() after plan() runs the plan kernel, the later runs of the step (the other layers) skip it.
// The cascade wrapper's two passes plan on every run.  Wrappers keep *views* of the builder's persistent buffers: a plan is valid until
// the builder's next build().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "kvattn/batch/cpu_gpu_buffer.h"
#include "kvattn/core/tensor.h"
#include "kvattn/kv/kv_cache_layout.h"
#include "kvattn/ops/paged_attention.h"

namespace kvattn {

class DcpCommunicator;  // communicator.h

// Everything a plan fixes besides the batch (FlashInfer plan() keyword arguments).
struct AttentionPlanParams {
  int64_t num_qo_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t page_size = 0;
  bool causal = true;
  double sm_scale = 0.0;
  int64_t window_left = -1;
  double logits_soft_cap = 0.0;  // 0 = off (vLLM passes None -> 0)
  DType q_data_type = DType::bf16;
  DType kv_data_type = DType::bf16;
  DType o_data_type = DType::bf16;
  int64_t fixed_split_size = -1;  // tokens per KV chunk; -1 = chosen by the planner
  bool disable_split_kv = false;

  // InvalidArgument on non-positive sizes, heads not divisible, unsupported head_dim.
  void validate(const char* who) const;
};

// The work partition (persistent buffers, see the header comment).
class WorkPlan {
 public:
  WorkPlan() = default;
  // `max_batch` requests, `capacity` work items.
  WorkPlan(int64_t max_batch, int64_t capacity);

  // Partition `batch` = kv_lens.size() requests.  qo_indptr [batch + 1] host values (empty:
  // one query row per request); cta_tile_q packed query rows (q rows * GQA group) per tile;
  // max_ctas the concurrent work items the device runs.  No allocation.
  void plan(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_lens, int64_t page_size,
            int64_t num_kv_heads, int64_t gqa_group_size, int64_t cta_tile_q, int64_t max_ctas,
            int64_t fixed_split_size, bool disable_split_kv);

  int64_t num_work_items() const noexcept { return num_work_items_; }
  int64_t batch_size() const noexcept { return batch_; }
  bool split_kv() const noexcept { return split_kv_; }
  int64_t kv_chunk_size_pages() const noexcept { return kv_chunk_size_pages_; }
  int64_t cta_tile_q() const noexcept { return cta_tile_q_; }
  int64_t num_partial_rows() const noexcept { return num_partial_rows_; }
  int64_t capacity() const noexcept { return request_indices_.defined() ? request_indices_.size(0) : 0; }

  Tensor request_indices() const;  // [num_work_items] int32: request of each work item
  Tensor qo_tile_indices() const;  // [num_work_items] int32: query tile within the request
  Tensor kv_tile_indices() const;  // [num_work_items] int32: KV chunk within the request
  Tensor o_indptr() const;         // [batch + 1] int32: merge targets (partial-output rows)

 private:
  Tensor request_indices_, qo_tile_indices_, kv_tile_indices_, o_indptr_;
  int64_t num_work_items_ = 0, batch_ = 0, kv_chunk_size_pages_ = 0, cta_tile_q_ = 1, num_partial_rows_ = 0;
  bool split_kv_ = false;
};

// Paged-KV metadata of one plan: views into the builder's persistent buffers.
struct PagedKVView {
  Tensor indptr_cpu;         // [batch + 1] int32 host
  Tensor indptr;             // [batch + 1] int32 device
  Tensor indices;            // [>= indptr[batch]] int32 device
  Tensor last_page_len_cpu;  // [batch] int32 host
  Tensor last_page_len;      // [batch] int32 device
  Tensor kv_lens_cpu;        // [batch] int32 host (flashinfer.get_seq_lens of the above)
};

// Scales and extras of one run().
struct AttentionRunArgs {
  double q_scale = 1.0, k_scale = 1.0, v_scale = 1.0;
  Tensor sinks;                           // optional [num_qo_heads] f32
  Tensor lse;                             // optional [T, num_qo_heads] f32 (written)
  ops::LseBase lse_base = ops::LseBase::Two;
};

// ---------------------------------------------------------------------------------------
// Decode over paged KV, one query row per request.
class BatchDecodeWrapper {
 public:
  // use_cuda_graph: the batch size is fixed to the persistent buffers it is planned with
  // (one wrapper per graph batch size).  qo_arange: [max_batch + 1] int32 device 0..max_batch.
  BatchDecodeWrapper(std::string kv_layout, bool use_cuda_graph, int64_t max_batch, int64_t plan_capacity,
                     Tensor qo_arange);

  bool is_cuda_graph_enabled() const noexcept { return use_cuda_graph_; }
  bool first_call() const noexcept { return first_call_; }
  const std::string& kv_layout() const noexcept { return kv_layout_; }
  const AttentionPlanParams& params() const noexcept { return params_; }
  const PagedKVView& paged_kv() const noexcept { return kv_; }
  const WorkPlan& work_plan() const noexcept { return plan_; }

  // Full plan (validates params, records the views, partitions the work).
  void plan(const PagedKVView& kv, const AttentionPlanParams& params, int64_t num_sms);
  // Graph replay: same params as the first plan, only the per-step lengths change (FlashInfer
  // fast_decode_plan: host copies of indptr/last_page_len, no indices copy).
  void fast_plan(const PagedKVView& kv, int64_t num_sms);

  // query [batch, num_qo_heads, head_dim]; k/v_cache [pages, page, kv_heads, head_dim] views.
  void run(const Tensor& query, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
           const AttentionRunArgs& args) const;

 private:
  std::string kv_layout_;
  bool use_cuda_graph_;
  bool first_call_ = true;
  int64_t max_batch_;
  Tensor qo_arange_;
  AttentionPlanParams params_;
  PagedKVView kv_;
  WorkPlan plan_;
  // the CUDA kernels' plan, made by the first run() after plan() / fast_plan() and reused by the
  // later runs (the other layers of the step); invalidated by plan() / fast_plan()
  mutable ops::PagedAttentionPlan kept_;
  ops::KvLengthsHint kv_hint_ = ops::KvLengthsHint::unknown;  // of the planned lengths (run() passes it)
};

// vLLM fast_plan_decode: the full plan on the first call and whenever CUDA graphs are off; the
// cheap replay plan afterwards.
void fast_plan_decode(BatchDecodeWrapper& wrapper, const PagedKVView& kv, const AttentionPlanParams& params,
                      int64_t num_sms);

// ---------------------------------------------------------------------------------------
// Prefill (and chunked prefill / multi-token decode) over paged KV.
class BatchPrefillWrapper {
 public:
  BatchPrefillWrapper(std::string kv_layout, int64_t max_batch, int64_t plan_capacity);

  const AttentionPlanParams& params() const noexcept { return params_; }
  const PagedKVView& paged_kv() const noexcept { return kv_; }
  const WorkPlan& work_plan() const noexcept { return plan_; }
  const Tensor& qo_indptr() const noexcept { return qo_indptr_; }

  // qo_indptr_cpu / qo_indptr: [batch + 1] int32 host / device, starting at 0.
  void plan(const Tensor& qo_indptr_cpu, const Tensor& qo_indptr, const PagedKVView& kv,
            const AttentionPlanParams& params, int64_t num_sms);
  void run(const Tensor& query, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
           const AttentionRunArgs& args) const;

 private:
  std::string kv_layout_;
  int64_t max_batch_;
  AttentionPlanParams params_;
  Tensor qo_indptr_;
  PagedKVView kv_;
  WorkPlan plan_;
  mutable ops::PagedAttentionPlan kept_;  // as BatchDecodeWrapper's
};

// Causal prefill over the new tokens' own K/V (not read back from the cache): the KV of
// request r are rows [qo_indptr[r], qo_indptr[r+1]) of key/value.
class BatchRaggedPrefillWrapper {
 public:
  // token_arange: [>= max_tokens] int32 device 0..max_tokens-1 (page ids of the 1-token pages).
  BatchRaggedPrefillWrapper(int64_t max_batch, int64_t max_tokens, int64_t plan_capacity, Tensor token_arange,
                            Device device);

  const AttentionPlanParams& params() const noexcept { return params_; }
  void plan(const Tensor& qo_indptr_cpu, const Tensor& qo_indptr, const AttentionPlanParams& params,
            int64_t num_sms);
  // key/value [>= tokens, num_kv_heads, head_dim], same dtype as query.
  void run(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& out,
           const AttentionRunArgs& args) const;

 private:
  int64_t max_batch_, max_tokens_;
  Tensor token_arange_;
  AttentionPlanParams params_;
  Tensor qo_indptr_;
  int64_t num_tokens_ = 0;
  CpuGpuBuffer last_page_len_;  // [max_batch] int32: 1 for non-empty requests, 0 otherwise
  Tensor kv_lens_cpu_;          // [max_batch] int32 host: the query lengths
  WorkPlan plan_;
  mutable ops::PagedAttentionPlan kept_;  // as BatchDecodeWrapper's
};

// ---------------------------------------------------------------------------------------
// Two-level cascade: a shared prefix (non-causal, every query row) + per-request suffixes
// (causal), merged by LSE.
class CascadeWrapper {
 public:
  explicit CascadeWrapper(std::string kv_layout);
  // shared_kv_page_indices [num_shared_pages] int32 device: the common prefix's pages;
  // kv: the per-request suffix pages (shared ones removed).
  void plan(const Tensor& qo_indptr, const Tensor& shared_kv_page_indices, const PagedKVView& kv,
            const AttentionPlanParams& params);
  const AttentionPlanParams& params() const noexcept { return params_; }
  const Tensor& shared_kv_page_indices() const noexcept { return shared_; }
  const PagedKVView& paged_kv() const noexcept { return kv_; }
  void run(const Tensor& query, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
           const AttentionRunArgs& args) const;

 private:
  std::string kv_layout_;
  AttentionPlanParams params_;
  Tensor qo_indptr_, shared_;
  PagedKVView kv_;
};

// ---------------------------------------------------------------------------------------
// vLLM BatchDCPPrefillWrapper: context pass (non-causal, paged, over this rank's shard of the
// context, query all-gathered over the DCP group's heads) -> cross-rank combine with LSE ->
// new-token pass (causal, ragged, this rank's heads) -> merge_attn_states.
class BatchDCPPrefillWrapper {
 public:
  BatchDCPPrefillWrapper(std::string kv_layout, bool dcp_a2a, int64_t max_batch, int64_t max_tokens,
                         int64_t plan_capacity, Tensor token_arange, Device device);

  // params.num_qo_heads is this rank's head count; the context pass plans it * dcp_world_size.
  void plan(const Tensor& qo_indptr_cpu, const Tensor& qo_indptr, const PagedKVView& kv,
            const AttentionPlanParams& params, int64_t dcp_world_size, int64_t num_sms);
  const BatchPrefillWrapper& context() const noexcept { return context_; }
  const BatchRaggedPrefillWrapper& new_tokens() const noexcept { return new_tokens_; }
  bool dcp_a2a() const noexcept { return dcp_a2a_; }

  // prefill_query [T, H, D]; key/value [T, kv_heads, D] this step's new tokens; out [T, H, D].
  void run(DcpCommunicator& group, const Tensor& prefill_query, const Tensor& k_cache, const Tensor& v_cache,
           const Tensor& key, const Tensor& value, const Tensor& out, const AttentionRunArgs& args) const;

 private:
  bool dcp_a2a_;
  int64_t dcp_world_size_ = 1;
  BatchPrefillWrapper context_;
  BatchRaggedPrefillWrapper new_tokens_;
};

// FlashInfer's prefill CTA tile (packed query rows) for an average packed query length.
int64_t prefill_cta_tile_q(int64_t avg_packed_qo_len) noexcept;

}  // namespace kvattn
