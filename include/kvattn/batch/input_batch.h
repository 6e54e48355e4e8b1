// kvattn/batch/input_batch.h — the persistent per-request rows of the running batch (vLLM's
// InputBatch, reduced to what attention metadata needs) and the 4-region reorder.
//
// Row r holds one request: its id, prompt length, computed tokens, this step's scheduled
// tokens, its block-table row and multimodal features.  Every per-request field lives in a
// buffer sized max_num_reqs at construction; rows move only through swap_states (swap_rows) and
// the reorder's cycle rotation (rotate_cycles), so a field added here must be moved in both.  Counts and block-table rows
// are stored by row (kernels read them in batch order); the id and features sit in slots the
// row points at (slot_), so a swap exchanges two integers instead of strings and vectors.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvattn/batch/mm_prefix.h"
#include "kvattn/core/tensor.h"

namespace kvattn {

// What add_request copies into a fresh row.
struct RequestState {
  std::string req_id;
  int32_t num_prompt_tokens = 0;
  int32_t num_computed_tokens = 0;
  int32_t num_scheduled_tokens = 0;  // this step's scheduler decision
  std::vector<int32_t> block_ids;    // block-table row (kernel-block ids)
  std::vector<MultiModalFeature> mm_features;
};

class InputBatch {
 public:
  InputBatch(int64_t max_num_reqs, int64_t max_num_blocks_per_req);

  int64_t num_reqs() const noexcept { return num_reqs_; }
  int64_t max_num_reqs() const noexcept { return max_num_reqs_; }
  int64_t max_num_blocks_per_req() const noexcept { return max_num_blocks_per_req_; }

  // Appends a row (validated: counts >= 0, block ids >= 0 and fit the row).  Returns its index.
  int64_t add_request(const RequestState& req);
  // Removes row `row` by moving the last row into it (vLLM condenses the same way).
  void remove_request(int64_t row);
  void clear() noexcept { num_reqs_ = 0; }

  // Per-row scalars (spans over [0, num_reqs)); writable between steps.
  std::span<int32_t> num_prompt_tokens() noexcept { return {prompt_, size()}; }
  std::span<int32_t> num_computed_tokens_cpu() noexcept { return {computed_, size()}; }
  std::span<int32_t> num_scheduled_tokens() noexcept { return {scheduled_, size()}; }
  std::span<int32_t> num_blocks_per_row() noexcept { return {num_blocks_, size()}; }
  std::span<const int32_t> num_prompt_tokens() const noexcept { return {prompt_, size()}; }
  std::span<const int32_t> num_computed_tokens_cpu() const noexcept { return {computed_, size()}; }
  std::span<const int32_t> num_scheduled_tokens() const noexcept { return {scheduled_, size()}; }
  std::span<const int32_t> num_blocks_per_row() const noexcept { return {num_blocks_, size()}; }
  // Request id and multimodal features of a row.  They live in per-request slots that never
  // move; rows point at slots, so swapping rows swaps two slot numbers, not strings.
  const std::string& req_id(int64_t row) const;
  const std::vector<MultiModalFeature>& mm_features(int64_t row) const;
  // Ids / features of rows 0..num_reqs-1 in row order (fresh copies, for tests and tools).
  std::vector<std::string> req_ids() const;
  std::vector<std::vector<MultiModalFeature>> mm_features() const;

  // Block table: [max_num_reqs, max_num_blocks_per_req] int32.  Columns at or past
  // num_blocks_per_row()[r] of row r are unspecified.
  const Tensor& block_table() const noexcept { return block_table_; }
  std::span<const int32_t> block_row(int64_t row) const;
  // Appends block ids to a row (the scheduler allocated new blocks).
  void append_block_ids(int64_t row, std::span<const int32_t> ids);

  // Exchanges every per-request field of rows i1 and i2.
  void swap_states(int64_t i1, int64_t i2);
  // Number of swap_states calls since construction (for tests and benchmarks).
  int64_t num_swaps() const noexcept { return num_swaps_; }

  // Scratch for the reorder ([max_num_reqs] each), allocated here so it never allocates.
  std::span<int32_t> scratch_a() noexcept { return {scratch_a_.data(), scratch_a_.size()}; }
  std::span<int32_t> scratch_b() noexcept { return {scratch_b_.data(), scratch_b_.size()}; }
  std::span<int32_t> scratch_c() noexcept { return {scratch_c_.data(), scratch_c_.size()}; }

 private:
  size_t size() const noexcept { return static_cast<size_t>(num_reqs_); }
  void check_row(int64_t row, const char* what) const;
  // swap_states without the row checks.
  inline void swap_rows(int64_t i1, int64_t i2) noexcept;
  // The reorder's permutation applied by rotating its cycles (input_batch.cpp).
  void apply_reorder(int32_t* from, const int32_t* rows, int64_t num_rows) noexcept;
  void apply_reorder_avx2(int32_t* from, const int32_t* rows, int64_t num_rows) noexcept;
  inline void rotate_cycles(int32_t* from, const int32_t* rows, int64_t num_rows) noexcept;
  friend bool reorder_batch_to_split_decodes_and_prefills(InputBatch& batch, int32_t decode_threshold);

  int64_t max_num_reqs_;
  int64_t max_num_blocks_per_req_;
  int64_t num_reqs_ = 0;
  int64_t num_swaps_ = 0;
  std::vector<int32_t> slot_;  // [max_num_reqs]: row -> slot, always a permutation
  std::vector<std::string> ids_;                        // [max_num_reqs] by slot
  std::vector<std::vector<MultiModalFeature>> mm_;      // [max_num_reqs] by slot
  Tensor prompt_t_, computed_t_, scheduled_t_, num_blocks_t_;  // [max_num_reqs] int32
  Tensor block_table_;                                        // [max_num_reqs, max_blocks] int32
  int32_t* prompt_ = nullptr;
  int32_t* computed_ = nullptr;
  int32_t* scheduled_ = nullptr;
  int32_t* num_blocks_ = nullptr;
  int32_t* bt_ = nullptr;
  std::vector<int32_t> scratch_a_, scratch_b_, scratch_c_;
  std::vector<int32_t> spare_row_;  // [max_num_blocks_per_req rounded up to 8]: the reorder's spare row
};

// Batch regions in the order the reorder produces.
enum class BatchRegion : int32_t { kDecode = 0, kShortExtend = 1, kLongExtend = 2, kPrefill = 3 };

// The region of one request: prefill when it has no context (num_computed == 0); else long
// extend when num_scheduled > decode_threshold; else short extend while num_computed <
// num_prompt_tokens (still prefilling); else decode.
BatchRegion classify_request(int32_t num_scheduled, int32_t num_computed, int32_t num_prompt,
                             int32_t decode_threshold) noexcept;

// Reorders `batch` into decode → short_extend → long_extend → prefill.  Only rows sitting in the
// wrong region move: the displaced rows, taken in region order (stable), are assigned to the
// displaced positions in ascending order (the seed's permutation).  Each cycle of it is rotated
// once through a spare row — the state the seed's walk of len - 1 swap_states calls leaves, with
// about half the row copies; num_swaps() counts len - 1 per cycle.  Returns whether anything moved.
bool reorder_batch_to_split_decodes_and_prefills(InputBatch& batch, int32_t decode_threshold = 1);

}  // namespace kvattn
