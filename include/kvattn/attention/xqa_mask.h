// kvattn/attention/xqa_mask.h — packed draft-token masks for XQA speculative decode
// (vllm-facts §7.8, seed 004 _pack_draft_block_bool_mask and kin).
//
// A mask row covers 32 * P key positions, P = ceil(max_q_len / 32).  Word w of a row holds
// bit j = mask[32 w + j]; XQA reads the row as 2P uint16 halves (little-endian: low half
// first).  kvattn stores the words as int32 [rows, P] (same bytes as vLLM's uint16 [rows, 2P]);
// xqa_mask_u16 views them as halves.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kvattn/core/tensor.h"

namespace kvattn {

// The one mask-row writer every XQA mask is built from (the free functions below, the cache, and
// the native backend's persistent masks): the `len` rows of one request of `len` draft tokens,
// `num_words` words each; row qi sees keys [0, causal ? qi + 1 : len).
void fill_xqa_draft_mask_rows(uint32_t* out, int64_t num_words, int64_t len, bool causal) noexcept;

// Packs a row-major bool mask [num_rows, 32 * num_packed] (one byte per entry, nonzero = true)
// into int32 words [num_rows, num_packed].
Tensor pack_draft_block_bool_mask(std::span<const uint8_t> bool_mask, int64_t num_rows,
                                  int64_t num_packed);

// Uniform request of q_len draft tokens: mask[qi, kj] = kj <= qi (causal) or kj < q_len.
// Shape [q_len, ceil(q_len / 32)].
Tensor make_xqa_draft_block_mask(int64_t q_len, bool causal);

// Ragged batch: one row per draft token of every request; row of token qi of a request of
// length L: mask[kj] = kj < L and (kj <= qi if causal).  Shape [sum(q_lens), ceil(max_q_len/32)].
// Every q_len must be in [0, max_q_len].
Tensor make_xqa_ragged_draft_block_mask(std::span<const int32_t> q_lens, int64_t max_q_len,
                                        bool causal);

// The mask's words as uint16 halves, row-major [rows, 2P] (host tensors only).
std::span<const uint16_t> xqa_mask_u16(const Tensor& mask);

// How the decode rows of a batch are described to XQA / trtllm-gen decode (seed 004
// _compute_decode_query_lens): the query width per request, whether the device qo_indptr must
// be passed (ragged / padded), and for XQA the per-request lengths of a ragged batch.
struct DecodeQueryLens {
  int64_t q_len_per_req = 1;
  bool use_qo_indptr = false;              // pass qo_indptr[: num_decodes + 1]
  std::optional<std::vector<int32_t>> ragged_q_lens;  // XQA ragged only
};
DecodeQueryLens compute_decode_query_lens(std::span<const int32_t> qo_indptr_cpu,
                                          int64_t num_decodes, int64_t num_decode_tokens,
                                          bool use_xqa);
// The same decision without the ragged length list (no allocation): {q_len_per_req, use_qo_indptr}.
struct DecodeQueryWidth {
  int64_t q_len_per_req = 1;
  bool use_qo_indptr = false;
};
DecodeQueryWidth decode_query_width(std::span<const int32_t> qo_indptr_cpu, int64_t num_decodes,
                                    int64_t num_decode_tokens, bool use_xqa);

// Persistent uniform masks, one per (q_len, causal), expanded to max_num_reqs requests so their
// address stays fixed for CUDA graphs; built on first use (on the host, copied once to `device`).
// Each is a [max_num_reqs, q_len, P] int32 buffer: P = num_words when that is > 0 (a row width
// fixed for every q_len, as the native backend's builder plans it), else ceil(q_len / 32).
class XqaDecodeMaskCache {
 public:
  explicit XqaDecodeMaskCache(int64_t max_num_reqs, int64_t num_words = 0,
                              Device device = Device::cpu());
  // The packed mask for this step's decodes: nullopt when q_len_per_req <= 1; the cached
  // uniform mask's first num_decodes requests ([num_decodes, q_len, P]) when ragged_q_lens is
  // empty; else a fresh ragged mask (host only).
  std::optional<Tensor> get_decode_mask(int64_t q_len_per_req,
                                        const std::optional<std::vector<int32_t>>& ragged_q_lens,
                                        int64_t num_decodes, bool causal);
  // The cached uniform mask's first num_decodes requests as mask rows, [num_decodes * q_len, P]
  // (the layout XQA reads; same memory as get_decode_mask's view).  q_len_per_req >= 1.
  Tensor uniform_rows(int64_t q_len_per_req, int64_t num_decodes, bool causal);
  size_t num_cached() const noexcept { return cache_.size(); }

 private:
  const Tensor& uniform(int64_t q_len_per_req, int64_t num_decodes, bool causal);

  int64_t max_num_reqs_;
  int64_t num_words_;
  Device device_;
  std::map<std::pair<int64_t, bool>, Tensor> cache_;
};

}  // namespace kvattn
