// kvattn/attention/paged_kv_metadata.h — the paged-KV description a FlashInfer-style kernel
// plans from (vllm-facts §7.5; seed 004 _compute_flashinfer_kv_metadata and build()):
//
//   num_pages[r]         = ceil(seq_len[r] / page_size)  (- num_common_kv_blocks under cascade)
//   paged_kv_indptr      = [0, cumsum(num_pages)]                       [num_reqs + 1] int32
//   paged_kv_indices     = block_table[r, ncb : ncb + num_pages[r]] concatenated   [indptr[-1]]
//   paged_kv_last_page_len[r] = seq_len % page_size, or page_size when that is 0 and seq_len != 0
//
// Under DCP, prefill rows (r >= num_decodes) first drop this step's query (context only) and all
// lengths become this rank's local lengths (get_dcp_local_seq_lens) before pages are counted.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "kvattn/batch/common_attention_metadata.h"
#include "kvattn/batch/cpu_gpu_buffer.h"
#include "kvattn/batch/tensor_access.h"

namespace kvattn {

// flashinfer.get_seq_lens: clamp(indptr[r+1] - indptr[r] - 1, min 0) * page_size + last[r].
void get_seq_lens(std::span<const int32_t> kv_indptr, std::span<const int32_t> kv_last_page_len,
                  int64_t page_size, std::span<int32_t> out);
Tensor get_seq_lens(const Tensor& kv_indptr, const Tensor& kv_last_page_len, int64_t page_size);

// The _copy_page_indices gather: page_indices[cu[r] + i] = block_table[r, col_offset + i] for
// i < cu[r+1] - cu[r].  Checks the row width (naming the row) and, when num_blocks > 0, that
// every copied id is in [0, num_blocks).
void copy_page_indices(std::span<int32_t> page_indices, const BlockTableView& block_table,
                       std::span<const int32_t> cu_num_blocks, int64_t col_offset = 0,
                       int64_t num_blocks = 0);

// ---- The steps of the paged-KV description, shared by PagedKVMetadataBuilder and the native
// backend's FlashInferMetadataBuilder (one implementation; each is allocation-free). ----------

// Host sequence lengths of cm's rows [0, num_reqs): seq_lens_cpu_upper_bound when
// `upper_bound_exact` (no speculative tokens in flight) and it is defined, else seq_lens itself
// (its CPU memory, or a copy into `scratch`, a [>= num_reqs] int32 host tensor, when it lives on
// a device).  Checks
// 0 <= query_len[r] <= seq_len[r] for every row (query lengths from `qsl`, [num_reqs + 1]).
const int32_t* paged_kv_host_seq_lens(const CommonAttentionMetadata& cm,
                                      std::span<const int32_t> qsl, int64_t num_reqs,
                                      bool upper_bound_exact, const Tensor& scratch);

// DCP: rows >= num_decodes (prefills) keep only their context (seq_len - query_len), then every
// row becomes this rank's local length.  out may alias seq.  Query lengths must be checked.
void dcp_paged_kv_seq_lens(const int32_t* seq, std::span<const int32_t> qsl, int64_t num_reqs,
                           int64_t num_decodes, int64_t dcp_world_size, int64_t dcp_rank,
                           int64_t interleave, int32_t* out);

// Pages per request minus the num_common_kv_blocks shared-prefix pages, as
// indptr[0..num_reqs] (indptr[0] = 0) and last_page_len[0..num_reqs) (vLLM's rule: seq % page,
// page when that is 0 and seq != 0).  Checks in one pass, naming the row on failure: every
// seq_len >= 0, no request shorter than the shared prefix, every row's columns
// [ncb, ncb + pages) inside `table_width`, and at most `capacity` pages in all.  Returns the
// number of pages.
int64_t compute_paged_kv_indptr(const int32_t* seq, int64_t num_reqs, int64_t page_size,
                                int64_t num_common_kv_blocks, int64_t table_width,
                                int64_t capacity, int32_t* indptr, int32_t* last_page_len);

// The page-index gather for an indptr from compute_paged_kv_indptr (rows already checked
// against the table width): page_indices[indptr[r] + i] = block_table[r, col_offset + i].
// Every copied id must be in [0, num_blocks) (num_blocks <= 0: [0, 2^31)); the first bad one is
// reported by row, column and value.  Contiguous rows are copied at memcpy speed.
void gather_page_indices(int32_t* page_indices, const BlockTableView& block_table,
                         const int32_t* indptr, int64_t num_reqs, int64_t col_offset,
                         int64_t num_blocks);

struct PagedKVMetadataConfig {
  int64_t max_num_reqs = 256;
  int64_t max_model_len = 8192;
  int64_t page_size = 16;  // kernel block size
  int64_t dcp_world_size = 1;
  int64_t dcp_rank = 0;
  int64_t cp_kv_cache_interleave_size = 1;
  int64_t num_blocks = 0;  // pool size for block-id checks (<= 0: unchecked)
  // > 0: seq_lens_cpu_upper_bound is not exact, read seq_lens instead (it must be on the CPU).
  int64_t num_speculative_tokens = 0;
  Device device = Device::cpu();

  int64_t max_num_pages() const;  // max_num_reqs * ceil(max_model_len / page_size)
  void validate() const;
};

// Views into the builder's persistent buffers (valid until its next build()).
struct PagedKVMetadata {
  Tensor paged_kv_indptr;             // [num_reqs + 1] int32, device
  Tensor paged_kv_indptr_cpu;         // [num_reqs + 1] int32, host
  Tensor paged_kv_indices;            // [indptr[num_reqs]] int32, device
  Tensor paged_kv_indices_cpu;        // [indptr[num_reqs]] int32, host
  Tensor paged_kv_last_page_len;      // [num_reqs] int32, device
  Tensor paged_kv_last_page_len_cpu;  // [num_reqs] int32, host
  Tensor seq_lens_cpu;  // [num_reqs] int32, host: the (DCP-local, context-only) lengths used
  int64_t num_reqs = 0;
  int64_t num_actual_pages = 0;

  // Cascade (common_prefix_len > 0): the shared level covers every query token against the
  // first request's first num_common_kv_blocks blocks; the unique level is the fields above.
  bool use_cascade = false;
  int64_t num_common_kv_blocks = 0;
  std::array<int32_t, 2> shared_qo_indptr{0, 0};       // [0, num_actual_tokens]
  std::array<int32_t, 2> shared_kv_page_indptr{0, 0};  // [0, num_common_kv_blocks]
  Tensor shared_kv_page_indices;                        // block_table[0, :ncb] (host view)
  int32_t shared_kv_last_page_len = 0;                  // page_size
};

class PagedKVMetadataBuilder {
 public:
  explicit PagedKVMetadataBuilder(const PagedKVMetadataConfig& config);
  const PagedKVMetadataConfig& config() const noexcept { return cfg_; }

  // Builds the metadata for `cm`, whose first num_decodes rows are decodes (from
  // split_decodes_and_prefills).  common_prefix_len > 0 selects cascade and must be a multiple
  // of page_size no longer than any request's pages.  No allocation.
  const PagedKVMetadata& build(const CommonAttentionMetadata& cm, int64_t num_decodes,
                               int64_t common_prefix_len = 0);

 private:
  PagedKVMetadataConfig cfg_;
  CpuGpuBuffer indptr_;         // [max_num_reqs + 1] int32
  CpuGpuBuffer last_page_len_;  // [max_num_reqs] int32
  CpuGpuBuffer indices_;        // [max_num_pages] int32
  Tensor seq_lens_;             // [max_num_reqs] int32 host scratch (adjusted lengths)
  PagedKVMetadata md_;
};

// FlashAttention's cascade decision (vllm-facts §7.4); FlashInfer's own builder always declines.
struct CascadeAttentionQuery {
  int64_t common_prefix_len = 0;
  std::span<const int32_t> query_lens;
  int64_t num_query_heads = 0;
  int64_t num_kv_heads = 0;
  bool use_alibi = false;
  bool use_sliding_window = false;
  bool use_local_attention = false;
  int64_t num_sms = 0;
  int64_t dcp_world_size = 1;
};
bool use_cascade_attention(const CascadeAttentionQuery& q);

}  // namespace kvattn
