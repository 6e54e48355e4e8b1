#include "kvattn/batch/batch_preparer.h"

#include "kvattn/batch/fast_div.h"

#include <algorithm>
#include <climits>

namespace kvattn {

int64_t BatchPreparerConfig::max_num_blocks_per_req() const {
  // A rank stores at most cdiv(max_model_len, dcp_world_size) tokens, rounded up to whole
  // manager blocks.
  const int64_t manager = block_size * blocks_per_kv_block;
  const int64_t per_rank = (max_model_len + dcp_world_size - 1) / dcp_world_size;
  return (per_rank + manager - 1) / manager * blocks_per_kv_block;
}

void BatchPreparerConfig::validate() const {
  KVATTN_CHECK(max_num_reqs >= 1 && max_num_reqs <= (int64_t{1} << 20),
               "BatchPreparer: max_num_reqs = {} must be in [1, 2^20]", max_num_reqs);
  KVATTN_CHECK(max_num_batched_tokens >= 1 && max_num_batched_tokens <= (int64_t{1} << 26),
               "BatchPreparer: max_num_batched_tokens = {} must be in [1, 2^26]",
               max_num_batched_tokens);
  KVATTN_CHECK(max_model_len >= 1 && max_model_len <= (int64_t{1} << 30),
               "BatchPreparer: max_model_len = {} must be in [1, 2^30]", max_model_len);
  SlotMappingParams p{block_size, blocks_per_kv_block, dcp_world_size, dcp_rank,
                      cp_kv_cache_interleave_size, num_blocks};
  p.validate();
}

BatchPreparer::BatchPreparer(const BatchPreparerConfig& config) : cfg_(config) {
  cfg_.validate();
  slot_params_ = SlotMappingParams{cfg_.block_size, cfg_.blocks_per_kv_block, cfg_.dcp_world_size,
                                   cfg_.dcp_rank, cfg_.cp_kv_cache_interleave_size, cfg_.num_blocks};
  const Device d = cfg_.device;
  query_start_loc_ = CpuGpuBuffer({cfg_.max_num_reqs + 1}, DType::i32, d);
  seq_lens_ = CpuGpuBuffer({cfg_.max_num_reqs}, DType::i32, d);
  positions_ = CpuGpuBuffer({cfg_.max_num_batched_tokens}, DType::i64, d);
  slot_mapping_ = CpuGpuBuffer({cfg_.max_num_batched_tokens}, DType::i64, d);
  std::fill_n(slot_mapping_.np<int64_t>(), cfg_.max_num_batched_tokens, PAD_SLOT_ID);
  slot_mapping_.copy_to_gpu(cfg_.max_num_batched_tokens);
  slot_high_water_ = 0;
  dcp_local_seq_lens_ = CpuGpuBuffer({cfg_.max_num_reqs}, DType::i32, d);
  if (!d.is_cpu()) {
    block_table_ = CpuGpuBuffer({cfg_.max_num_reqs, cfg_.max_num_blocks_per_req()}, DType::i32, d);
  }
  is_prefilling_ = Tensor::zeros({cfg_.max_num_reqs}, DType::u8);
}

const CommonAttentionMetadata& BatchPreparer::prepare(const InputBatch& batch,
                                                      int64_t num_reqs_padded,
                                                      int64_t num_tokens_padded) {
  const int64_t num_reqs = batch.num_reqs();
  if (num_reqs_padded < 0) num_reqs_padded = num_reqs;
  KVATTN_CHECK(num_reqs_padded >= num_reqs && num_reqs_padded <= cfg_.max_num_reqs &&
                   num_reqs_padded <= batch.max_num_reqs(),
               "prepare: num_reqs_padded = {} is outside [{}, {}] (num_reqs, max_num_reqs)",
               num_reqs_padded, num_reqs, std::min(cfg_.max_num_reqs, batch.max_num_reqs()));
  const auto sched = batch.num_scheduled_tokens();
  const auto computed = batch.num_computed_tokens_cpu();
  const auto prompt = batch.num_prompt_tokens();
  const auto nblocks = batch.num_blocks_per_row();

  const bool dcp = cfg_.dcp_world_size > 1;
  const BlockDiv bdiv(cfg_.block_size);
  // A block-table row with fewer blocks than the (rank-local) sequence needs.
  auto throw_narrow = [&](const InputBatch& b, int64_t r, int64_t seq_len, int64_t local_len) {
    throw InvalidArgument(fmt::format(
        "request row {} ({}): sequence length {} needs {} blocks of {} tokens on this rank but "
        "its block-table row holds {}; allocate blocks before scheduling the tokens",
        r, b.req_id(r), seq_len, bdiv.cdiv(local_len), cfg_.block_size, nblocks[r]));
  };

  // Phase 1: query start locations, sequence lengths and their maxima, with row checks.
  int32_t* qsl = query_start_loc_.np<int32_t>();
  int32_t* seq = seq_lens_.np<int32_t>();
  uint8_t* prefilling = is_prefilling_.data_ptr<uint8_t>();
  int64_t total = 0, max_q = 0, max_s = 0;
  qsl[0] = 0;
  for (int64_t r = 0; r < num_reqs; ++r) {
    const int64_t q = sched[r], c = computed[r];
    if (q < 0 || c < 0 || c + q > cfg_.max_model_len) [[unlikely]] {
      throw InvalidArgument(fmt::format(
          "request row {} ({}): num_computed_tokens = {}, num_scheduled_tokens = {}; both must be "
          ">= 0 and their sum (the sequence length) at most max_model_len = {}",
          r, batch.req_id(r), c, q, cfg_.max_model_len));
    }
    total += q;
    if (total > cfg_.max_num_batched_tokens) [[unlikely]] {
      throw InvalidArgument(fmt::format(
          "request row {} ({}): the batch reaches {} scheduled tokens, more than "
          "max_num_batched_tokens = {}; schedule fewer tokens or raise the limit",
          r, batch.req_id(r), total, cfg_.max_num_batched_tokens));
    }
    qsl[r + 1] = static_cast<int32_t>(total);
    seq[r] = static_cast<int32_t>(c + q);
    prefilling[r] = c < prompt[r] ? 1 : 0;
    max_q = std::max(max_q, q);
    max_s = std::max(max_s, c + q);
    if (!dcp && bdiv.cdiv(c + q) > nblocks[r]) [[unlikely]] throw_narrow(batch, r, c + q, c + q);
  }
  for (int64_t r = num_reqs; r < num_reqs_padded; ++r) {
    qsl[r + 1] = static_cast<int32_t>(total);
    seq[r] = 0;
    prefilling[r] = 0;
  }
  const int64_t num_tokens = total;
  if (num_tokens_padded < 0) num_tokens_padded = num_tokens;
  KVATTN_CHECK(num_tokens_padded >= num_tokens && num_tokens_padded <= cfg_.max_num_batched_tokens,
               "prepare: num_tokens_padded = {} is outside [{}, {}] (num_tokens, "
               "max_num_batched_tokens)", num_tokens_padded, num_tokens, cfg_.max_num_batched_tokens);

  // Phase 2 (DCP): rank-local lengths and the block-table coverage check on this rank (without
  // DCP the check ran in phase 1).
  if (dcp) {
    int32_t* local = dcp_local_seq_lens_.np<int32_t>();
    for (int64_t r = 0; r < num_reqs_padded; ++r) {
      local[r] = dcp_local_seq_len(seq[r], cfg_.dcp_world_size, cfg_.dcp_rank,
                                   cfg_.cp_kv_cache_interleave_size);
      if (r < num_reqs && bdiv.cdiv(local[r]) > nblocks[r]) [[unlikely]]
        throw_narrow(batch, r, seq[r], local[r]);
    }
  }

  // Phase 3: positions (consecutive per request) and the slot mapping.
  int64_t* pos = positions_.np<int64_t>();
  int64_t* slots = slot_mapping_.np<int64_t>();
  const int64_t pad_to = std::max<int64_t>(num_tokens_padded, slot_high_water_);
  // If the mapping throws half-way, [0, num_tokens) may hold stale slots: widen first.
  slot_high_water_ = std::max<int64_t>(slot_high_water_, num_tokens);
  if (!dcp) {
    // One pass per request: positions, then one block-table read per block and a run of slots.
    // Phase 2 proved every column used here is < num_blocks_per_row[r] <= the row width.
    const int32_t* bt_rows = batch.block_table().data_ptr<int32_t>();
    const int64_t width = batch.max_num_blocks_per_req();
    const int64_t bs = cfg_.block_size;
    const uint32_t limit = cfg_.num_blocks > 0 && cfg_.num_blocks <= INT32_MAX
                               ? static_cast<uint32_t>(cfg_.num_blocks)
                               : uint32_t{0x80000000u};
    for (int64_t r = 0; r < num_reqs; ++r) {
      const int64_t c = computed[r], end = c + sched[r];
      int64_t* p = pos + qsl[r];
      int64_t* o = slots + qsl[r];
      for (int64_t i = 0; i < end - c; ++i) p[i] = c + i;
      const int32_t* row = bt_rows + r * width;
      for (int64_t at = c; at < end;) {
        const int64_t col = bdiv.div(at), off = bdiv.mod(at);
        const int64_t run = std::min<int64_t>(bs - off, end - at);
        const int32_t id = row[col];
        if (static_cast<uint32_t>(id) >= limit) [[unlikely]] {
          throw InvalidArgument(fmt::format(
              "request row {}: block id {} at block-table column {} is outside the pool [0, {}); "
              "the block table must hold ids the KV cache allocated", r, id, col,
              cfg_.num_blocks > 0 ? cfg_.num_blocks : int64_t{INT32_MAX}));
        }
        const int64_t base = static_cast<int64_t>(id) * bs + off;
        for (int64_t k = 0; k < run; ++k) o[k] = base + k;
        o += run;
        at += run;
      }
    }
    std::fill(slots + num_tokens, slots + pad_to, PAD_SLOT_ID);
  } else {
    for (int64_t r = 0; r < num_reqs; ++r) {
      const int64_t c = computed[r];
      int64_t* p = pos + qsl[r];
      const int64_t q = sched[r];
      for (int64_t i = 0; i < q; ++i) p[i] = c + i;
    }
    compute_slot_mapping_from_seq_lens(
        std::span<const int32_t>(qsl, static_cast<size_t>(num_reqs + 1)),
        std::span<const int32_t>(seq, static_cast<size_t>(num_reqs)),
        host_block_table(batch.block_table()), slot_params_,
        std::span<int64_t>(slots, static_cast<size_t>(cfg_.max_num_batched_tokens)), pad_to);
  }
  // Entries past num_tokens are PAD_SLOT_ID again, so the next step pads less.
  slot_high_water_ = num_tokens;

  // Phase 4: device copies (views only when the device is the CPU).
  cm_ = CommonAttentionMetadata{};
  cm_.query_start_loc_cpu = query_start_loc_.cpu_rows(num_reqs_padded + 1);
  cm_.query_start_loc = query_start_loc_.copy_to_gpu(num_reqs_padded + 1);
  cm_.seq_lens_cpu_upper_bound = seq_lens_.cpu_rows(num_reqs_padded);
  cm_.seq_lens = seq_lens_.copy_to_gpu(num_reqs_padded);
  cm_.positions = positions_.copy_to_gpu(num_tokens);
  cm_.slot_mapping = slot_mapping_.copy_to_gpu(num_tokens_padded).slice(0, 0, num_tokens);
  cm_.is_prefilling = is_prefilling_.slice(0, 0, num_reqs_padded);
  if (dcp) {
    cm_.dcp_local_seq_lens_cpu = dcp_local_seq_lens_.cpu_rows(num_reqs_padded);
    cm_.dcp_local_seq_lens = dcp_local_seq_lens_.copy_to_gpu(num_reqs_padded);
  }
  if (cfg_.device.is_cpu()) {
    cm_.block_table_tensor = batch.block_table().slice(0, 0, num_reqs_padded);
  } else {
    KVATTN_CHECK(batch.max_num_blocks_per_req() == block_table_.cpu().size(1),
                 "prepare: the batch's block table has {} columns, the preparer's device copy {}; "
                 "build both from the same max_model_len", batch.max_num_blocks_per_req(),
                 block_table_.cpu().size(1));
    block_table_.cpu_rows(num_reqs_padded).copy_from(batch.block_table().slice(0, 0, num_reqs_padded));
    cm_.block_table_tensor = block_table_.copy_to_gpu(num_reqs_padded);
  }
  cm_.num_reqs = num_reqs_padded;
  cm_.num_actual_tokens = num_tokens;
  cm_.max_query_len = max_q;
  cm_.max_seq_len = max_s;
  cm_.causal = cfg_.causal;
  return cm_;
}

}  // namespace kvattn
