#include "kvattn/batch/slot_mapping.h"

#include <algorithm>

#include "kvattn/batch/common_attention_metadata.h"
#include "kvattn/batch/fast_div.h"

namespace kvattn {
namespace {

// Validates request boundaries and the block table's row count; returns num_reqs.
int64_t check_request_bounds(std::span<const int32_t> qsl, const BlockTableView& bt,
                             int64_t num_token_slots, const char* fn) {
  KVATTN_CHECK(!qsl.empty(), "{}: query_start_loc_cpu is empty; it holds num_reqs + 1 >= 1 entries",
               fn);
  const int64_t num_reqs = static_cast<int64_t>(qsl.size()) - 1;
  KVATTN_CHECK(qsl[0] == 0, "{}: query_start_loc_cpu[0] = {}, must be 0", fn, qsl[0]);
  for (int64_t r = 0; r < num_reqs; ++r) {
    KVATTN_CHECK(qsl[r + 1] >= qsl[r],
                 "{}: request row {} has a negative query length ({} -> {}); query_start_loc must "
                 "be non-decreasing", fn, r, qsl[r], qsl[r + 1]);
  }
  KVATTN_CHECK(qsl[num_reqs] <= num_token_slots,
               "{}: {} scheduled tokens but only {} token entries (positions/output); size the "
               "buffers from max_num_batched_tokens", fn, qsl[num_reqs], num_token_slots);
  KVATTN_CHECK(bt.num_rows >= num_reqs || num_reqs == 0 || qsl[num_reqs] == 0,
               "{}: block table has {} rows, the batch has {} requests", fn, bt.num_rows, num_reqs);
  return num_reqs;
}

[[noreturn]] void throw_column(int64_t row, int64_t pos, int64_t col, int64_t width) {
  throw InvalidArgument(fmt::format(
      "request row {}: position {} needs block-table column {} but the row holds {} columns; the "
      "block table is narrower than the sequence needs (allocate more blocks or raise "
      "max_model_len)", row, pos, col, width));
}

[[noreturn]] void throw_block(int64_t row, int64_t col, int64_t id, int64_t num_blocks) {
  throw InvalidArgument(fmt::format(
      "request row {}: block id {} at block-table column {} is outside the pool [0, {}); the "
      "block table must hold ids the KV cache allocated", row, id, col, num_blocks));
}

inline int64_t checked_block(const BlockTableView& bt, int64_t row, int64_t col, int64_t pos,
                             int64_t num_blocks) {
  if (col >= bt.width) [[unlikely]] throw_column(row, pos, col, bt.width);
  const int64_t id = bt.at(row, col);
  if (id < 0 || (num_blocks > 0 && id >= num_blocks)) [[unlikely]] throw_block(row, col, id, num_blocks);
  return id;
}

// Slot of one position under DCP (or not); PAD_SLOT_ID when not stored on this rank.
inline int64_t slot_of(const BlockTableView& bt, int64_t row, int64_t pos, const SlotMappingParams& p) {
  const int64_t W = p.dcp_world_size, I = p.cp_kv_cache_interleave_size;
  const int64_t virtual_block = p.block_size * p.blocks_per_kv_block * W;
  const int64_t vb = pos / virtual_block;
  const int64_t vo = pos - vb * virtual_block;
  if ((vo / I) % W != p.dcp_rank) return PAD_SLOT_ID;
  const int64_t lo = (vo / (W * I)) * I + vo % I;
  const int64_t col = vb * p.blocks_per_kv_block + lo / p.block_size;
  return checked_block(bt, row, col, pos, p.num_blocks) * p.block_size + lo % p.block_size;
}

}  // namespace

void SlotMappingParams::validate() const {
  KVATTN_CHECK(block_size > 0 && block_size <= (int64_t{1} << 20),
               "slot mapping: block_size = {} must be in [1, 2^20]", block_size);
  KVATTN_CHECK(blocks_per_kv_block > 0 && blocks_per_kv_block <= 4096,
               "slot mapping: blocks_per_kv_block = {} must be in [1, 4096] (manager block size / "
               "kernel block size)", blocks_per_kv_block);
  KVATTN_CHECK(dcp_world_size >= 1 && dcp_world_size <= 1024,
               "slot mapping: dcp_world_size = {} must be in [1, 1024]", dcp_world_size);
  KVATTN_CHECK(dcp_rank >= 0 && dcp_rank < dcp_world_size,
               "slot mapping: dcp_rank = {} is outside [0, {}) (dcp_world_size)", dcp_rank,
               dcp_world_size);
  KVATTN_CHECK(cp_kv_cache_interleave_size >= 1 &&
                   cp_kv_cache_interleave_size <= block_size * blocks_per_kv_block,
               "slot mapping: cp_kv_cache_interleave_size = {} must be in [1, {}] (the manager "
               "block size)", cp_kv_cache_interleave_size, block_size * blocks_per_kv_block);
}

void compute_slot_mapping(std::span<const int32_t> qsl, std::span<const int64_t> positions,
                          const BlockTableView& bt, const SlotMappingParams& p,
                          std::span<int64_t> out) {
  p.validate();
  const int64_t slots = std::min<int64_t>(static_cast<int64_t>(positions.size()),
                                          static_cast<int64_t>(out.size()));
  const int64_t num_reqs = check_request_bounds(qsl, bt, slots, "compute_slot_mapping");
  const int64_t num_tokens = qsl[num_reqs];
  const bool plain = p.dcp_world_size == 1;
  const BlockDiv bdiv(p.block_size);
  for (int64_t r = 0; r < num_reqs; ++r) {
    for (int64_t t = qsl[r]; t < qsl[r + 1]; ++t) {
      const int64_t pos = positions[t];
      if (pos < 0) [[unlikely]] {
        throw InvalidArgument(fmt::format(
            "request row {}: token {} has position {}; positions must be >= 0", r, t, pos));
      }
      if (plain) {
        const int64_t col = bdiv.div(pos);
        const int64_t off = bdiv.mod(pos);
        out[t] = checked_block(bt, r, col, pos, p.num_blocks) * p.block_size + off;
      } else {
        out[t] = slot_of(bt, r, pos, p);
      }
    }
  }
  std::fill(out.begin() + num_tokens, out.end(), PAD_SLOT_ID);
}

void compute_slot_mapping_from_seq_lens(std::span<const int32_t> qsl, std::span<const int32_t> seq_lens,
                                        const BlockTableView& bt, const SlotMappingParams& p,
                                        std::span<int64_t> out, int64_t pad_to) {
  p.validate();
  const int64_t num_reqs =
      check_request_bounds(qsl, bt, static_cast<int64_t>(out.size()), "compute_slot_mapping");
  KVATTN_CHECK(static_cast<int64_t>(seq_lens.size()) >= num_reqs,
               "compute_slot_mapping: seq_lens has {} entries, num_reqs = {}", seq_lens.size(),
               num_reqs);
  const int64_t num_tokens = qsl[num_reqs];
  KVATTN_CHECK(pad_to >= num_tokens && pad_to <= static_cast<int64_t>(out.size()),
               "compute_slot_mapping: pad_to = {} is outside [{}, {}] (num_tokens, buffer size)",
               pad_to, num_tokens, out.size());
  const int64_t bs = p.block_size;
  const BlockDiv bdiv(bs);
  for (int64_t r = 0; r < num_reqs; ++r) {
    const int64_t q = static_cast<int64_t>(qsl[r + 1]) - qsl[r];
    const int64_t seq = seq_lens[r];
    if (q > seq) [[unlikely]] {
      throw InvalidArgument(fmt::format(
          "request row {}: query length {} exceeds sequence length {}; seq_len counts the "
          "context plus this step's query (num_computed + num_scheduled)", r, q, seq));
    }
    int64_t t = qsl[r];
    int64_t pos = seq - q;
    if (p.dcp_world_size == 1) {
      // Consecutive positions: one block-table read per block, then a run of slots.
      while (pos < seq) {
        const int64_t col = bdiv.div(pos);
        const int64_t off = bdiv.mod(pos);
        const int64_t run = std::min<int64_t>(bs - off, seq - pos);
        const int64_t base = checked_block(bt, r, col, pos, p.num_blocks) * bs + off;
        int64_t* o = out.data() + t;
        for (int64_t k = 0; k < run; ++k) o[k] = base + k;
        t += run;
        pos += run;
      }
    } else {
      for (; pos < seq; ++pos, ++t) out[t] = slot_of(bt, r, pos, p);
    }
  }
  std::fill(out.begin() + num_tokens, out.begin() + pad_to, PAD_SLOT_ID);
}

Tensor compute_slot_mapping(const Tensor& query_start_loc_cpu, const Tensor& positions,
                            const Tensor& block_table, const SlotMappingParams& params,
                            int64_t pad_to) {
  const auto qsl = host_i32_span(query_start_loc_cpu, "query_start_loc_cpu");
  const auto pos = host_i64_span(positions, "positions");
  const auto bt = host_block_table(block_table);
  KVATTN_CHECK(!qsl.empty(), "query_start_loc_cpu is empty; it holds num_reqs + 1 >= 1 entries");
  const int64_t num_tokens = qsl.back();
  KVATTN_CHECK(num_tokens >= 0, "query_start_loc_cpu[-1] = {} is negative", num_tokens);
  if (pad_to < 0) pad_to = num_tokens;
  KVATTN_CHECK(pad_to >= num_tokens, "pad_to = {} is smaller than num_tokens = {}", pad_to,
               num_tokens);
  KVATTN_CHECK(static_cast<int64_t>(pos.size()) >= num_tokens,
               "positions has {} entries, {} tokens are scheduled", pos.size(), num_tokens);
  Tensor out = Tensor::empty({pad_to}, DType::i64);
  compute_slot_mapping(qsl, pos.first(static_cast<size_t>(num_tokens)), bt, params,
                       std::span<int64_t>(out.data_ptr<int64_t>(), static_cast<size_t>(pad_to)));
  return out;
}

// ---- DCP --------------------------------------------------------------------------------

int32_t dcp_local_seq_len(int32_t seq_len, int64_t dcp_size, int64_t rank, int64_t interleave) noexcept {
  const int64_t s = seq_len;
  const int64_t base = s / interleave / dcp_size * interleave;
  const int64_t rem = std::clamp<int64_t>(s - base * dcp_size - rank * interleave, 0, interleave);
  return static_cast<int32_t>(base + rem);
}

namespace {
void check_dcp(int64_t dcp_size, int64_t interleave) {
  KVATTN_CHECK(dcp_size >= 1 && dcp_size <= 1024, "get_dcp_local_seq_lens: dcp_size = {} must be "
               "in [1, 1024]", dcp_size);
  KVATTN_CHECK(interleave >= 1 && interleave <= (int64_t{1} << 20),
               "get_dcp_local_seq_lens: cp_kv_cache_interleave_size = {} must be in [1, 2^20]",
               interleave);
}
void check_rank(int64_t rank, int64_t dcp_size) {
  KVATTN_CHECK(rank >= 0 && rank < dcp_size,
               "get_dcp_local_seq_lens: dcp_rank = {} is outside [0, {}) (dcp_size)", rank, dcp_size);
}
std::vector<int64_t> seq_values(const Tensor& seq_lens) {
  KVATTN_CHECK(seq_lens.defined(), "get_dcp_local_seq_lens: seq_lens is undefined");
  KVATTN_CHECK(seq_lens.device().is_cpu(),
               "get_dcp_local_seq_lens on {} is not implemented on the host path; pass the CPU "
               "copy", seq_lens.device().str());
  KVATTN_CHECK(seq_lens.dtype() == DType::i32 || seq_lens.dtype() == DType::i64,
               "get_dcp_local_seq_lens: seq_lens dtype {} must be int32 or int64",
               dtype_name(seq_lens.dtype()));
  std::vector<int64_t> v;
  if (seq_lens.dtype() == DType::i32) {
    for (int32_t x : seq_lens.to_vector<int32_t>()) v.push_back(x);
  } else {
    v = seq_lens.to_vector<int64_t>();
  }
  for (size_t i = 0; i < v.size(); ++i) {
    KVATTN_CHECK(v[i] >= 0 && v[i] <= INT32_MAX,
                 "get_dcp_local_seq_lens: request row {} has sequence length {}, outside [0, 2^31)",
                 i, v[i]);
  }
  return v;
}
}  // namespace

void get_dcp_local_seq_lens(std::span<const int32_t> seq_lens, int64_t dcp_size, int64_t dcp_rank,
                            int64_t interleave, std::span<int32_t> out) {
  check_dcp(dcp_size, interleave);
  check_rank(dcp_rank, dcp_size);
  KVATTN_CHECK(out.size() >= seq_lens.size(), "get_dcp_local_seq_lens: output holds {} entries, "
               "{} needed", out.size(), seq_lens.size());
  for (size_t i = 0; i < seq_lens.size(); ++i) {
    KVATTN_CHECK(seq_lens[i] >= 0, "get_dcp_local_seq_lens: request row {} has negative sequence "
                 "length {}", i, seq_lens[i]);
    out[i] = dcp_local_seq_len(seq_lens[i], dcp_size, dcp_rank, interleave);
  }
}

Tensor get_dcp_local_seq_lens(const Tensor& seq_lens, int64_t dcp_size,
                              std::optional<int64_t> dcp_rank, int64_t interleave) {
  check_dcp(dcp_size, interleave);
  const auto v = seq_values(seq_lens);
  if (dcp_rank.has_value()) {
    check_rank(*dcp_rank, dcp_size);
    Tensor out = Tensor::empty(seq_lens.shape(), DType::i32);
    int32_t* o = out.data_ptr<int32_t>();
    for (size_t i = 0; i < v.size(); ++i)
      o[i] = dcp_local_seq_len(static_cast<int32_t>(v[i]), dcp_size, *dcp_rank, interleave);
    return out;
  }
  Dims shape = seq_lens.shape();
  KVATTN_CHECK(shape.size() < kMaxDims, "get_dcp_local_seq_lens: seq_lens has too many dims ({})",
               shape.size());
  shape.push_back(dcp_size);
  Tensor out = Tensor::empty(shape, DType::i32);
  int32_t* o = out.data_ptr<int32_t>();
  for (size_t i = 0; i < v.size(); ++i)
    for (int64_t k = 0; k < dcp_size; ++k)
      o[static_cast<int64_t>(i) * dcp_size + k] =
          dcp_local_seq_len(static_cast<int32_t>(v[i]), dcp_size, k, interleave);
  return out;
}

Tensor get_dcp_local_seq_lens(const Tensor& seq_lens, int64_t dcp_size, const Tensor& dcp_rank,
                              int64_t interleave) {
  KVATTN_CHECK(dcp_rank.defined() && dcp_rank.dtype() == DType::i32 && dcp_rank.numel() == 1,
               "get_dcp_local_seq_lens: a tensor dcp_rank must be a one-element int32 tensor, got {}",
               dcp_rank.defined() ? dcp_rank.str() : std::string("undefined"));
  KVATTN_CHECK(seq_lens.defined() && dcp_rank.device() == seq_lens.device(),
               "get_dcp_local_seq_lens: dcp_rank is on {} but seq_lens on {}; keep them on one "
               "device", dcp_rank.device().str(),
               seq_lens.defined() ? seq_lens.device().str() : std::string("?"));
  KVATTN_CHECK(dcp_rank.device().is_cpu(),
               "get_dcp_local_seq_lens: device tensors are handled by the ops layer, not here");
  const int64_t rank = dcp_rank.to_vector<int32_t>()[0];
  return get_dcp_local_seq_lens(seq_lens, dcp_size, std::optional<int64_t>(rank), interleave);
}

// ---- Mamba ------------------------------------------------------------------------------

Tensor mamba_get_block_table_tensor(const Tensor& block_table, const Tensor& seq_lens,
                                    const MambaBlockTableSpec& spec,
                                    std::string_view mamba_cache_mode) {
  if (mamba_cache_mode == "none") return block_table;
  KVATTN_CHECK(mamba_cache_mode == "align" || mamba_cache_mode == "all",
               "mamba_cache_mode '{}' is not one of none, align, all", mamba_cache_mode);
  KVATTN_CHECK(spec.block_size > 0, "mamba_get_block_table_tensor: block_size = {} must be > 0",
               spec.block_size);
  KVATTN_CHECK(spec.num_speculative_blocks >= 0 && spec.num_speculative_blocks < 4096,
               "mamba_get_block_table_tensor: num_speculative_blocks = {} must be in [0, 4096)",
               spec.num_speculative_blocks);
  const auto bt = host_block_table(block_table);
  const auto seq = host_i32_span(seq_lens, "seq_lens");
  KVATTN_CHECK(static_cast<int64_t>(seq.size()) == bt.num_rows,
               "seq_lens has {} rows, block_table has {}; pass one sequence length per row",
               seq.size(), bt.num_rows);
  const int64_t n_out = 1 + spec.num_speculative_blocks;
  Tensor out = Tensor::empty({bt.num_rows, n_out}, DType::i32);
  int32_t* o = out.data_ptr<int32_t>();
  for (int64_t r = 0; r < bt.num_rows; ++r) {
    const int64_t s = seq[r];
    // Floor division, then clamp: zero-length CUDA-graph padding rows read column 0.
    int64_t start = s - 1 >= 0 ? (s - 1) / spec.block_size : -1;
    start = std::max<int64_t>(start, 0);
    KVATTN_CHECK(start + n_out <= bt.width,
                 "request row {}: sequence length {} needs block-table columns [{}, {}) but the "
                 "row holds {}; the Mamba block table is narrower than the sequence needs",
                 r, s, start, start + n_out, bt.width);
    for (int64_t j = 0; j < n_out; ++j) o[r * n_out + j] = bt.at(r, start + j);
  }
  return out;
}

}  // namespace kvattn
