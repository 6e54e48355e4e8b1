// kvattn/ops/paged_attention.h — batched attention over a paged KV cache.
//
// One op covers FlashInfer's BatchPrefillWithPagedKVCacheWrapper and
// BatchDecodeWithPagedKVCacheWrapper (`run` after `plan`), as vLLM's FlashInfer backend uses
// them: prefill, chunked prefill (query after cached context), decode and multi-token decode.
//
// Batch: request r owns query rows [qo_indptr[r], qo_indptr[r+1]) and kv_len[r] keys, read
// from pages given either as FlashInfer paged indices (paged_kv_indptr / paged_kv_indices /
// paged_kv_last_page_len) or as a vLLM block table (block_table / seq_lens).  Key j of
// request r is at  page = pages_r[j / page_size], slot j % page_size.
//
// Positions: the query is the *last* q_len tokens of the sequence, so query row i (0-based
// within its request) sits at position  qpos = kv_len - q_len + i  (FlashInfer's convention).
// Key j is visible to row i when all of these hold:
//   * j < kv_len;
//   * causal:  j <= qpos;  or, when the row has a PrefixLM range [s, e] (mm_prefix_ranges),
//              s <= j <= e also makes it visible (bidirectional image/video span);
//   * window_left >= 0:  j >= qpos - window_left  (left window, inclusive; vLLM passes
//              sliding_window - 1);
//   * xqa_draft_mask given (speculative decode): for the last q_len keys (the draft tokens,
//              j >= kv_len - q_len) bit (j - (kv_len - q_len)) of the row's mask decides
//              instead of the causal rule; earlier keys stay visible.
// Scores:   s = (q . k) * sm_scale * q_scale * k_scale   (k is the cache value; for fp8 caches
//           the scales dequantise),  then if logits_soft_cap > 0:  s = cap * tanh(s / cap).
// Softmax:  p_j = exp(s_j - m) / (sum_j exp(s_j - m) + [sinks] exp(sink_h - m)),
//           out = v_scale * sum_j p_j v_j.
// LSE:      log(sum_j exp(s_j) [+ exp(sink_h)]) in base 2 (FlashInfer, default) or natural log.
// A row that sees no key (empty request, window/causal masking) gets out = 0 and
// lse = -inf (or log of the sink term when sinks are given).  Query rows of no request
// (>= qo_indptr[batch]) and the outputs of zero-length queries are not touched.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kvattn/core/tensor.h"

namespace kvattn::ops {

enum class LseBase { Two, E };

// What the caller knows on the host about the batch's KV lengths (the CUDA kernels see them only
// on the device).  unknown / uniform: decode calls hand out work with a counter (default);
// mixed: decode calls of bf16 / f16 caches with at least one (request, KV head) pair per CTA run
// the stream-K schedule (every CTA an equal share of the tiles), measured 2 % faster on
// 128 x U[256, 8192] and 1.5 % slower on uniform 128 x 4096 (H200).  fp8 caches
// take stream-K by that size rule anyway.  CPU tensors ignore it, and so do the calls the
// whole-page decode path takes (max_query_len below; its equal chunk ranges need no hint).
enum class KvLengthsHint { unknown, uniform, mixed };
// mixed when the longest non-empty request is at least twice the shortest, else uniform
// (unknown for no non-empty request): what the native decode wrapper passes.
KvLengthsHint classify_kv_lengths(std::span<const int32_t> kv_lens) noexcept;

// A work plan kept across paged_attention calls: the CUDA kernels' partition of a batch (request
// bounds read from the index tensors, split chunk, work items, token map) is computed by a plan
// kernel at the start of a call; with a PagedAttentionPlan in the args, the calls after the first
// skip that kernel and run on the kept tables, as FlashInfer's wrappers plan() once per step and
// run() once per layer.  The attention of every layer of one engine step reads the same batch,
// so one plan serves them all.
//
// Contract: call invalidate() whenever the *contents* of the batch's index tensors change (once per
// step, where the step's metadata is built).  Everything else a plan depends on is checked on
// every call and re-plans by itself when it differs: the index tensors' addresses and strides,
// batch, tokens, heads, head_dim, page size, dtypes, causal / window / draft-mask / PrefixLM
// presence, the kernel knobs, the device.  The K/V caches, query, output, scales, soft cap and
// sinks may differ from call to call (they are not part of the plan).  CUDA graphs: whether a
// call plans or reuses is decided when it is enqueued, and a captured graph replays that
// decision; invalidate() before capturing, so the captured first call holds the plan kernel and
// every replay plans again from the index buffers' current contents.  The plan's device buffer is
// allocated (grown, never shrunk) by a planning call: as for the kernels' workspace, run one step
// of the largest shape before capturing.
//
// Copies share one plan (a handle).  Thread-safe; a plan is for one stream of calls (kvattn's
// kernels run on the device's default stream).  CPU tensors ignore it (the CPU kernels plan
// inline, at no cost worth keeping); so do the one-launch small-batch decode path (it plans
// inside its attention launch), calls over float32 caches (one SIMT launch, nothing to plan) and
// builds without CUDA.
class PagedAttentionPlan {
 public:
  PagedAttentionPlan();
  void invalidate() noexcept;       // the next call plans again
  int64_t plans() const noexcept;   // calls that ran the plan kernel into this plan
  int64_t reuses() const noexcept;  // calls that skipped it and ran on the kept tables
  struct State;                     // internal (src/ops/plan_state.h; used by the CUDA dispatch)
  State& state() const noexcept { return *state_; }

 private:
  std::shared_ptr<State> state_;
};

// The paged KV cache one attention call reads: the caches, where each request's pages are, and
// the scales that dequantise an fp8 cache.  Shared by PagedAttentionArgs, CascadeAttentionArgs and
// DcpPrefillArgs (kvattn/ops/cascade.h), so one description of the pages reaches every op.
struct PagedKVCache {
  Tensor k_cache;  // [num_pages, page_size, num_kv_heads, head_dim] strided view (NHD order of
                   //   the logical axes; HND / packed-C / layer-major layouts through strides)
                   //   f32/f16/bf16/fp8_e4m3/fp8_e5m2 (a u8 cache must be view_as(fp8) first)
  Tensor v_cache;  // same shape and dtype as k_cache, independent strides
  // Page form A — FlashInfer paged indices:
  Tensor paged_kv_indptr;         // [batch + 1] int32/int64, non-decreasing, [0] == 0
  Tensor paged_kv_indices;        // [>= indptr[batch]] int32/int64 page ids in [0, num_pages)
  Tensor paged_kv_last_page_len;  // [batch] int32/int64 in [1, page_size] (0 when no pages)
  //   kv_len[r] = max(npages - 1, 0) * page_size + last_page_len[r]   (flashinfer.get_seq_lens)
  // Page form B — vLLM block table:
  Tensor block_table;  // [batch, max_blocks] int32/int64; the first ceil(kv_len/page_size)
                       //   entries of each row are page ids in [0, num_pages)
  Tensor seq_lens;     // [batch] int32/int64 kv lengths, <= max_blocks * page_size
  double k_scale = 1.0;  // folded into sm_scale (1 unless the cache is fp8)
  double v_scale = 1.0;  // multiplies the output

  PagedKVCache& paged_kv() noexcept { return *this; }
  const PagedKVCache& paged_kv() const noexcept { return *this; }
};

// How scores become probabilities: the options every attention op takes.
struct AttentionOptions {
  bool causal = true;
  int64_t window_left = -1;           // -1 = no sliding window
  double logits_soft_cap = 0.0;       // <= 0 = off
  std::optional<double> sm_scale;     // default 1 / sqrt(head_dim)
  double q_scale = 1.0;               // folded into sm_scale (FlashInfer run(q_scale=...))
  Tensor sinks;                       // optional [num_qo_heads] f32 attention-sink logits

  AttentionOptions& options() noexcept { return *this; }
  const AttentionOptions& options() const noexcept { return *this; }
};

struct PagedAttentionArgs : PagedKVCache, AttentionOptions {
  // ---- inputs (the pages: PagedKVCache; the options: AttentionOptions) -----------------
  Tensor query;    // [num_tokens, num_qo_heads, head_dim] f32/f16/bf16, any strides
  Tensor qo_indptr;  // [batch + 1] int32/int64, non-decreasing, qo_indptr[0] == 0,
                     //   qo_indptr[batch] <= num_tokens (vLLM query_start_loc)
  // ---- outputs ------------------------------------------------------------------------
  Tensor out;  // [num_tokens, num_qo_heads, head_dim] f32/f16/bf16, any strides; may not
               //   alias the inputs
  Tensor lse;  // optional [num_tokens, num_qo_heads] f32, any strides (for vLLM's
               //   [num_qo_heads, num_tokens] layout pass lse_ht.transpose(0, 1))
  LseBase lse_base = LseBase::Two;
  // ---- further options ------------------------------------------------------------------
  Tensor mm_prefix_ranges;  // optional [num_tokens, 2] int32: absolute inclusive [start, end]
                            //   of the PrefixLM range holding each query row, (-1, -1) = none
                            //   (vLLM fill_mm_prefix_query_ranges)
  Tensor xqa_draft_mask;    // optional [num_tokens, P] int32: the packed XQA draft mask, word w
                            //   bit b = key (32 w + b) of the draft block (vLLM's uint16 [R, 2P]
                            //   reinterpreted as 32-bit words); P >= ceil(q_len / 32)
  // ---- plan reuse and schedule (CUDA) ------------------------------------------------------
  PagedAttentionPlan* plan = nullptr;  // optional: keep / reuse the work plan across calls (see above)
  KvLengthsHint kv_lengths = KvLengthsHint::unknown;  // see KvLengthsHint
  // The most query rows any request of the batch has (vLLM CommonAttentionMetadata.max_query_len;
  // -1 = unknown).  A promise, checked where the host can read qo_indptr (CPU tensors); on CUDA
  // it lets decode calls with max_query_len x GQA group <= 16 run the whole-page decode path
  // (1.4-5.6 % faster on an H200), and a request that breaks it gets NaN in its output rows.  The
  // native decode wrapper passes 1.
  int64_t max_query_len = -1;
};

// Validates every argument once (shared by all devices), then dispatches on query's device.
// Throws InvalidArgument (shapes, dtypes, heads not divisible, out-of-range page ids or
// lengths, bad scales/options) or Unsupported (head_dim not a multiple of 8 in [8, 512],
// CUDA tensors in a build without CUDA).
void paged_attention(const PagedAttentionArgs& args);

// ---- helpers -----------------------------------------------------------------------------

// vLLM's per-layer KV view [num_blocks, num_heads, block_size, 2 * head_size] (logical
// [B, H, N, C] with K and V concatenated in C, any physical layout through strides, element
// dtype) -> the (k_cache, v_cache) views [num_blocks, block_size, num_heads, head_size]
// this header takes (FlashInfer's `kv_cache.transpose(1, 2).split(head_size, -1)`).
std::pair<Tensor, Tensor> split_kv_cache_layer_view(const Tensor& layer_view, int64_t head_size);

// The packed XQA draft mask for a ragged batch of draft lengths (vLLM
// _make_xqa_ragged_draft_block_mask): [sum(q_lens), ceil(max_q_len / 32)] int32 on CPU; row
// of query i of a request of length L: bit j set iff j < L and (!causal or j <= i).
Tensor make_xqa_draft_block_mask(const std::vector<int64_t>& q_lens, bool causal);

// lse * ln(2): base-2 LSE (FlashInfer) to natural log, in place.  lse: any shape, f32, CPU.
void log2_lse_to_ln(const Tensor& lse);

}  // namespace kvattn::ops
