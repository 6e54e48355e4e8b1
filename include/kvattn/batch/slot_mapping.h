// kvattn/batch/slot_mapping.h — which cache slot each scheduled token's K/V is written to
// (vllm-facts §7.1), DCP local sequence lengths and the Mamba block-table gather.
//
// Slot of a token at absolute position `pos` of request r, with manager block size M =
// block_size * blocks_per_kv_block (kernel blocks of `block_size` tokens), DCP world W, rank R and
// interleave I:
//   vb  = pos / (M * W)            virtual block (one manager block per rank)
//   vo  = pos % (M * W)            offset inside it
//   local iff (vo / I) % W == R    the token's K/V lives on this rank
//   lo  = (vo / (W * I)) * I + vo % I         offset inside this rank's manager block
//   col = vb * blocks_per_kv_block + lo / block_size   kernel-block column
//   slot = block_table[r, col] * block_size + lo % block_size   (PAD_SLOT_ID if not local)
// Without DCP (W = 1) this is block_table[r, pos / block_size] * block_size + pos % block_size.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "kvattn/batch/tensor_access.h"
#include "kvattn/core/tensor.h"

namespace kvattn {

struct SlotMappingParams {
  int64_t block_size = 16;          // kernel block size (tokens per block-table entry)
  int64_t blocks_per_kv_block = 1;  // manager block size / kernel block size
  int64_t dcp_world_size = 1;
  int64_t dcp_rank = 0;
  int64_t cp_kv_cache_interleave_size = 1;
  // Number of blocks in the pool: block ids must be in [0, num_blocks).  <= 0: unchecked.
  int64_t num_blocks = 0;

  void validate() const;  // throws InvalidArgument for out-of-range parameters
};

// Per-token form: token t (query_start_loc_cpu[r] <= t < query_start_loc_cpu[r + 1]) of request r
// at positions[t].  Writes out[0, num_tokens) and pads out[num_tokens, out.size()) with
// PAD_SLOT_ID.  Throws (naming row, token, value and limit) for a negative position, a column past
// the block table's width, or a block id outside the pool.
void compute_slot_mapping(std::span<const int32_t> query_start_loc_cpu,
                          std::span<const int64_t> positions, const BlockTableView& block_table,
                          const SlotMappingParams& params, std::span<int64_t> out);

// Range form used by the step preparer: request r's tokens are the consecutive positions
// [seq_lens[r] - query_len[r], seq_lens[r]).  Same result as the per-token form for those
// positions, a run of slots at a time.  Pads out[num_tokens, pad_to) with PAD_SLOT_ID.
void compute_slot_mapping_from_seq_lens(std::span<const int32_t> query_start_loc_cpu,
                                        std::span<const int32_t> seq_lens,
                                        const BlockTableView& block_table,
                                        const SlotMappingParams& params, std::span<int64_t> out,
                                        int64_t pad_to);

// Tensor convenience: [num_tokens] int64 CPU slot mapping (padded to pad_to >= num_tokens).
Tensor compute_slot_mapping(const Tensor& query_start_loc_cpu, const Tensor& positions,
                            const Tensor& block_table, const SlotMappingParams& params,
                            int64_t pad_to = -1);

// ---- DCP ------------------------------------------------------------------------------------
// Tokens of a length-`seq_len` sequence stored on rank `rank` of `dcp_size` ranks when tokens are
// dealt in runs of `interleave` (cp_kv_cache_interleave_size):
//   base = seq_len / interleave / dcp_size * interleave
//   rem  = clip(seq_len - base * dcp_size - rank * interleave, 0, interleave)
//   local = base + rem
int32_t dcp_local_seq_len(int32_t seq_len, int64_t dcp_size, int64_t rank, int64_t interleave) noexcept;

// Host form without allocation: out[i] = local length of seq_lens[i] on `dcp_rank`.
void get_dcp_local_seq_lens(std::span<const int32_t> seq_lens, int64_t dcp_size, int64_t dcp_rank,
                            int64_t cp_kv_cache_interleave_size, std::span<int32_t> out);

// vLLM's three dcp_rank forms over an int32 (or int64) CPU tensor of any shape; result int32:
//   rank nullopt   -> shape [..., dcp_size], entry k = rank k's local length;
//   integer rank   -> same shape as seq_lens;
//   tensor rank    -> one-element int32 tensor on the same device, same shape as seq_lens.
Tensor get_dcp_local_seq_lens(const Tensor& seq_lens, int64_t dcp_size = 1,
                              std::optional<int64_t> dcp_rank = std::nullopt,
                              int64_t cp_kv_cache_interleave_size = 1);
Tensor get_dcp_local_seq_lens(const Tensor& seq_lens, int64_t dcp_size, const Tensor& dcp_rank,
                              int64_t cp_kv_cache_interleave_size = 1);

// ---- Mamba ----------------------------------------------------------------------------------
struct MambaBlockTableSpec {
  int64_t block_size = 0;
  int64_t num_speculative_blocks = 0;
};

// "none": returns block_table unchanged.  "align" (and "all", which vLLM routes the same way):
// a fresh [num_reqs, 1 + num_speculative_blocks] int32 tensor, row r =
// block_table[r, s + j] with s = max((seq_lens[r] - 1) / block_size, 0) (floor division).
// seq_lens must have one entry per block-table row; a column past the row is an error.
Tensor mamba_get_block_table_tensor(const Tensor& block_table, const Tensor& seq_lens,
                                    const MambaBlockTableSpec& spec,
                                    std::string_view mamba_cache_mode);

}  // namespace kvattn
