#include "kvattn/batch/batch_preparer.h"

#include <algorithm>
#include <climits>

#include "kvattn/batch/fast_div.h"
#include "kvattn/batch/tensor_access.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define KVATTN_PREPARE_AVX2 1
#endif

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

namespace {

// The slow path of prepare()'s row check: names the row and the first condition it breaks.
[[noreturn, gnu::noinline, gnu::cold]] void throw_bad_row(const InputBatch& b, const BatchPreparerConfig& cfg,
                                                          const BlockDiv& bdiv, int64_t r,
                                                          int64_t tokens_before) {
  const int64_t q = b.num_scheduled_tokens()[r], c = b.num_computed_tokens_cpu()[r];
  if (q < 0 || c < 0 || c + q > cfg.max_model_len) {
    throw InvalidArgument(fmt::format(
        "request row {} ({}): num_computed_tokens = {}, num_scheduled_tokens = {}; both must be "
        ">= 0 and their sum (the sequence length) at most max_model_len = {}",
        r, b.req_id(r), c, q, cfg.max_model_len));
  }
  if (tokens_before + q > cfg.max_num_batched_tokens) {
    throw InvalidArgument(fmt::format(
        "request row {} ({}): the batch reaches {} scheduled tokens, more than "
        "max_num_batched_tokens = {}; schedule fewer tokens or raise the limit",
        r, b.req_id(r), tokens_before + q, cfg.max_num_batched_tokens));
  }
  throw InvalidArgument(fmt::format(
      "request row {} ({}): sequence length {} needs {} blocks of {} tokens on this rank but "
      "its block-table row holds {}; allocate blocks before scheduling the tokens",
      r, b.req_id(r), c + q, bdiv.cdiv(c + q), cfg.block_size, b.num_blocks_per_row()[r]));
}

// The slow path of the block-id check: the first id outside the pool among the columns read.
[[noreturn, gnu::noinline, gnu::cold]] void throw_bad_block(const InputBatch& b, const BatchPreparerConfig& cfg,
                                                            const BlockDiv& bdiv) {
  const uint32_t limit = block_id_limit(cfg.num_blocks);
  for (int64_t r = 0; r < b.num_reqs(); ++r) {
    const int64_t c = b.num_computed_tokens_cpu()[r], end = c + b.num_scheduled_tokens()[r];
    const auto row = b.block_row(r);
    for (int64_t col = bdiv.div(c); col < bdiv.cdiv(end); ++col) {
      if (static_cast<uint32_t>(row[col]) >= limit) {
        throw InvalidArgument(fmt::format(
            "request row {}: block id {} at block-table column {} is outside the pool [0, {}); "
            "the block table must hold ids the KV cache allocated", r, row[col], col,
            cfg.num_blocks > 0 ? cfg.num_blocks : int64_t{INT32_MAX}));
      }
    }
  }
  KVATTN_ASSERT(false, "prepare: a bad block id was reported but not found");
  throw InvalidArgument("unreachable");
}

// prepare()'s per-row inputs and outputs, passed by value so the loop holds them in registers
// (stores through the int64 outputs cannot alias them).
struct StepRows {
  const int32_t *sched, *computed, *prompt, *nblocks, *bt_rows;
  int32_t *qsl, *seq;
  uint8_t* prefilling;
  int64_t *pos, *slots;
  int64_t width, bs, max_len, max_tokens;
  bool dcp;
};
struct RowTotals {
  int64_t tokens = 0, max_q = 0, max_s = 0;
  uint32_t max_id = 0;  // largest block id read, as uint32 (a negative id reads as >= 2^31)
};

// One pass over the rows: query start locations, sequence lengths, is_prefilling, maxima,
// positions and (without DCP) the slot mapping.  The row checks are one branch per row (counts
// >= 0, seq_len <= max_model_len, the running token total within max_num_batched_tokens, and
// without DCP a block-table row covering the sequence, so every column read is <
// num_blocks_per_row[r] <= the row width); the block ids read are max-reduced for one pool check
// after the loop.  Div is ShiftDiv or PlainDiv (no per-element branch on the block size).
template <typename Div>
[[gnu::always_inline]] inline RowTotals fill_step_rows(const StepRows in, const Div div,
                                                       const InputBatch& batch,
                                                       const BatchPreparerConfig& cfg,
                                                       const BlockDiv& bdiv, int64_t r = 0,
                                                       RowTotals from = RowTotals{}) {
  // Rows [0, r) are done (leading decodes, `from` their totals).
  int64_t total = from.tokens, max_q = from.max_q, max_s = from.max_s;
  uint32_t max_id = from.max_id;
  const int64_t bs = in.bs, n = batch.num_reqs();
  if (!in.dcp) {
    // The leading decodes (one token each; the reorder puts them first): the same work with
    // the query length fixed at 1.
    for (; r < n && in.sched[r] == 1; ++r) {
      const int64_t c = in.computed[r], s = c + 1;
      const bool ok = (c >= 0) & (s <= in.max_len) & (total < in.max_tokens) &
                      (div.cdiv(s) <= in.nblocks[r]);
      if (!ok) [[unlikely]] throw_bad_row(batch, cfg, bdiv, r, total);
      in.qsl[r + 1] = static_cast<int32_t>(total + 1);
      in.seq[r] = static_cast<int32_t>(s);
      in.prefilling[r] = c < in.prompt[r] ? 1 : 0;
      max_s = std::max(max_s, s);
      in.pos[total] = c;
      const int32_t id = in.bt_rows[r * in.width + div.div(c)];
      max_id = std::max(max_id, static_cast<uint32_t>(id));
      in.slots[total] = static_cast<int64_t>(id) * bs + div.mod(c);
      ++total;
    }
    if (r > 0) max_q = std::max<int64_t>(max_q, 1);
  }
  for (; r < n; ++r) {
    const int64_t q = in.sched[r], c = in.computed[r], s = c + q, next = total + q;
    const bool ok = (q >= 0) & (c >= 0) & (s <= in.max_len) & (next <= in.max_tokens) &
                    (in.dcp || div.cdiv(s) <= in.nblocks[r]);
    if (!ok) [[unlikely]] throw_bad_row(batch, cfg, bdiv, r, total);
    in.qsl[r + 1] = static_cast<int32_t>(next);
    in.seq[r] = static_cast<int32_t>(s);
    in.prefilling[r] = c < in.prompt[r] ? 1 : 0;
    max_q = std::max(max_q, q);
    max_s = std::max(max_s, s);
    int64_t* p = in.pos + total;
    if (!in.dcp) {
      const int32_t* row = in.bt_rows + r * in.width;
      int64_t* o = in.slots + total;
      if (q == 1) {  // a decode: one position, one slot
        p[0] = c;
        const int32_t id = row[div.div(c)];
        max_id = std::max(max_id, static_cast<uint32_t>(id));
        o[0] = static_cast<int64_t>(id) * bs + div.mod(c);
      } else {
        for (int64_t i = 0; i < q; ++i) p[i] = c + i;
        // Consecutive positions: one block-table read per block, then a run of slots.
        for (int64_t at = c; at < s;) {
          const int64_t off = div.mod(at);
          const int64_t run = std::min<int64_t>(bs - off, s - at);
          const int32_t id = row[div.div(at)];
          max_id = std::max(max_id, static_cast<uint32_t>(id));
          const int64_t base = static_cast<int64_t>(id) * bs + off;
          for (int64_t k = 0; k < run; ++k) o[k] = base + k;
          o += run;
          at += run;
        }
      }
    } else {
      for (int64_t i = 0; i < q; ++i) p[i] = c + i;
    }
    total = next;
  }
  return RowTotals{total, max_q, max_s, max_id};
}

// The loop compiled twice: for the baseline ISA and (x86-64) for AVX2 (below).
RowTotals fill_step_rows_any(const StepRows& in, const BlockDiv& bdiv, const InputBatch& batch,
                             const BatchPreparerConfig& cfg) {
  return bdiv.visit([&](auto div) { return fill_step_rows(in, div, batch, cfg, bdiv); });
}
#ifdef KVATTN_PREPARE_AVX2
// The leading decodes eight rows at a time (power-of-two block size, no DCP): the row checks as
// lane compares, the eight block ids by one gather, positions and slots widened to int64.  Stops
// at the first group holding a row that is not a decode or fails a check; the scalar loop takes
// over there (and names the row).  Returns the number of rows done (= tokens written).
[[gnu::target("avx2")]] int64_t leading_decodes_avx2(const StepRows& in, int shift, int64_t n,
                                                     RowTotals& acc) {
  const int64_t limit = std::min(n, in.max_tokens);  // tokens == rows here
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i zero = _mm256_setzero_si256();
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i last_ok = _mm256_set1_epi32(static_cast<int32_t>(in.max_len - 1));  // c <= max_len - 1
  const __m256i bs_m1 = _mm256_set1_epi32(static_cast<int32_t>(in.bs - 1));
  const __m256i row_off = _mm256_mullo_epi32(iota, _mm256_set1_epi32(static_cast<int32_t>(in.width)));
  const __m128i sh = _mm_cvtsi32_si128(shift);
  __m256i max_s = zero, max_id = zero;
  int64_t r = 0;
  for (; r + 8 <= limit; r += 8) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.sched + r));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.computed + r));
    const __m256i nb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.nblocks + r));
    // Bad lane: not a decode, c < 0, c + 1 > max_len, or cdiv(c + 1, bs) > the row's blocks.
    const __m256i s = _mm256_add_epi32(c, one);
    __m256i bad = _mm256_xor_si256(_mm256_cmpeq_epi32(q, one), _mm256_set1_epi32(-1));
    bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(zero, c));
    bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(c, last_ok));
    bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(_mm256_sra_epi32(_mm256_add_epi32(s, bs_m1), sh), nb));
    if (_mm256_movemask_epi8(bad) != 0) break;
    const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.prompt + r));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(in.qsl + r + 1),
                        _mm256_add_epi32(iota, _mm256_set1_epi32(static_cast<int32_t>(r + 1))));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(in.seq + r), s);
    // is_prefilling = c < prompt, as bytes 0/1.
    const __m256i pf = _mm256_cmpgt_epi32(p, c);
    __m128i pf16 = _mm_packs_epi32(_mm256_castsi256_si128(pf), _mm256_extracti128_si256(pf, 1));
    pf16 = _mm_and_si128(_mm_packs_epi16(pf16, pf16), _mm_set1_epi8(1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(in.prefilling + r), pf16);
    max_s = _mm256_max_epi32(max_s, s);
    // Positions (= c) and slots (= id * bs + c % bs) as int64.
    const __m256i c_lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(c));
    const __m256i c_hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(c, 1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(in.pos + r), c_lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(in.pos + r + 4), c_hi);
    const __m256i col = _mm256_add_epi32(row_off, _mm256_sra_epi32(c, sh));
    const __m256i ids = _mm256_i32gather_epi32(in.bt_rows + r * in.width, col, 4);
    max_id = _mm256_max_epu32(max_id, ids);
    const __m256i off = _mm256_and_si256(c, bs_m1);
    const __m256i s_lo = _mm256_add_epi64(_mm256_sll_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(ids)), sh),
                                          _mm256_cvtepi32_epi64(_mm256_castsi256_si128(off)));
    const __m256i s_hi = _mm256_add_epi64(_mm256_sll_epi64(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(ids, 1)), sh),
                                          _mm256_cvtepi32_epi64(_mm256_extracti128_si256(off, 1)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(in.slots + r), s_lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(in.slots + r + 4), s_hi);
  }
  if (r > 0) {
    alignas(32) int32_t ms[8];
    alignas(32) uint32_t mi[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(ms), max_s);
    _mm256_store_si256(reinterpret_cast<__m256i*>(mi), max_id);
    for (int k = 0; k < 8; ++k) {
      acc.max_s = std::max<int64_t>(acc.max_s, ms[k]);
      acc.max_id = std::max(acc.max_id, mi[k]);
    }
    acc.tokens = r;
    acc.max_q = 1;
  }
  return r;
}

// The loop compiled for AVX2, where the position and slot runs store 4 int64 per instruction
// instead of 2 (the prefill rows are store-bound) and the leading decodes go 8 rows at a time.
[[gnu::target("avx2")]] RowTotals fill_step_rows_avx2(const StepRows& in, const BlockDiv& bdiv,
                                                      const InputBatch& batch,
                                                      const BatchPreparerConfig& cfg) {
  // No lambda here: the loop must be inlined into this AVX2 function itself.
  if (bdiv.pow2()) {
    RowTotals acc;
    int64_t r = 0;
    // 8 lanes of r * width + column stay below 2^31 (width <= 2^24).
    if (!in.dcp && in.width <= (int64_t{1} << 24))
      r = leading_decodes_avx2(in, bdiv.shift_form().shift, batch.num_reqs(), acc);
    return fill_step_rows(in, bdiv.shift_form(), batch, cfg, bdiv, r, acc);
  }
  return fill_step_rows(in, bdiv.plain_form(), batch, cfg, bdiv);
}
#endif

}  // namespace

const CommonAttentionMetadata& BatchPreparer::prepare(const InputBatch& batch,
                                                      int64_t num_reqs_padded,
                                                      int64_t num_tokens_padded) {
  const int64_t num_reqs = batch.num_reqs();
  if (num_reqs_padded < 0) num_reqs_padded = num_reqs;
  KVATTN_CHECK(num_reqs_padded >= num_reqs && num_reqs_padded <= cfg_.max_num_reqs &&
                   num_reqs_padded <= batch.max_num_reqs(),
               "prepare: num_reqs_padded = {} is outside [{}, {}] (num_reqs, max_num_reqs)",
               num_reqs_padded, num_reqs, std::min(cfg_.max_num_reqs, batch.max_num_reqs()));
  const int32_t* sched = batch.num_scheduled_tokens().data();
  const int32_t* computed = batch.num_computed_tokens_cpu().data();
  const int32_t* prompt = batch.num_prompt_tokens().data();
  const int32_t* nblocks = batch.num_blocks_per_row().data();
  const int32_t* bt_rows = batch.block_table().data_ptr<int32_t>();
  const int64_t width = batch.max_num_blocks_per_req();

  const bool dcp = cfg_.dcp_world_size > 1;
  const BlockDiv bdiv(cfg_.block_size);
  const int64_t bs = cfg_.block_size, max_len = cfg_.max_model_len;
  const int64_t max_tokens = cfg_.max_num_batched_tokens;

  int32_t* qsl = query_start_loc_.np<int32_t>();
  int32_t* seq = seq_lens_.np<int32_t>();
  uint8_t* prefilling = is_prefilling_.data_ptr<uint8_t>();
  int64_t* pos = positions_.np<int64_t>();
  int64_t* slots = slot_mapping_.np<int64_t>();
  // Slots [0, high) may hold stale values; if a row throws half-way the written prefix is
  // unknown, so the next step re-pads the whole buffer.
  const int64_t old_high = slot_high_water_;
  slot_high_water_ = max_tokens;

  qsl[0] = 0;
  const StepRows rows{sched, computed, prompt, nblocks, bt_rows, qsl, seq, prefilling, pos, slots,
                      width, bs, max_len, max_tokens, dcp};
#ifdef KVATTN_PREPARE_AVX2
  const RowTotals rt = host_has_avx2() ? fill_step_rows_avx2(rows, bdiv, batch, cfg_)
                                       : fill_step_rows_any(rows, bdiv, batch, cfg_);
#else
  const RowTotals rt = fill_step_rows_any(rows, bdiv, batch, cfg_);
#endif
  const int64_t total = rt.tokens, max_q = rt.max_q, max_s = rt.max_s;
  if (rt.max_id >= block_id_limit(cfg_.num_blocks)) [[unlikely]] throw_bad_block(batch, cfg_, bdiv);
  for (int64_t r = num_reqs; r < num_reqs_padded; ++r) {
    qsl[r + 1] = static_cast<int32_t>(total);
    seq[r] = 0;
    prefilling[r] = 0;
  }
  const int64_t num_tokens = total;
  if (num_tokens_padded < 0) num_tokens_padded = num_tokens;
  KVATTN_CHECK(num_tokens_padded >= num_tokens && num_tokens_padded <= max_tokens,
               "prepare: num_tokens_padded = {} is outside [{}, {}] (num_tokens, "
               "max_num_batched_tokens)", num_tokens_padded, num_tokens, max_tokens);
  const int64_t pad_to = std::max<int64_t>(num_tokens_padded, old_high);

  if (dcp) {
    // Rank-local lengths and the block-table coverage check on this rank, then the DCP slot
    // mapping (tokens stored on other ranks get PAD_SLOT_ID).
    int32_t* local = dcp_local_seq_lens_.np<int32_t>();
    for (int64_t r = 0; r < num_reqs_padded; ++r) {
      local[r] = dcp_local_seq_len(seq[r], cfg_.dcp_world_size, cfg_.dcp_rank,
                                   cfg_.cp_kv_cache_interleave_size);
      if (r < num_reqs && bdiv.cdiv(local[r]) > nblocks[r]) [[unlikely]] {
        throw InvalidArgument(fmt::format(
            "request row {} ({}): sequence length {} needs {} blocks of {} tokens on this rank "
            "but its block-table row holds {}; allocate blocks before scheduling the tokens",
            r, batch.req_id(r), seq[r], bdiv.cdiv(local[r]), bs, nblocks[r]));
      }
    }
    compute_slot_mapping_from_seq_lens(
        std::span<const int32_t>(qsl, static_cast<size_t>(num_reqs + 1)),
        std::span<const int32_t>(seq, static_cast<size_t>(num_reqs)),
        host_block_table(batch.block_table()), slot_params_,
        std::span<int64_t>(slots, static_cast<size_t>(max_tokens)), pad_to);
  } else {
    std::fill(slots + num_tokens, slots + pad_to, PAD_SLOT_ID);
  }
  // Entries past num_tokens are PAD_SLOT_ID again, so the next step pads less.
  slot_high_water_ = num_tokens;

  // Phase 4: device copies (views only when the device is the CPU).
  // Fields are overwritten in place (no reset): prepare() is the only writer of cm_, and the
  // fields it does not set keep their defaults.
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
