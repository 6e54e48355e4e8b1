#include "kvattn/attention/paged_kv_metadata.h"

#include <algorithm>
#include <bit>
#include <climits>

#include "kvattn/batch/fast_div.h"
#include "kvattn/batch/slot_mapping.h"

namespace kvattn {

void get_seq_lens(std::span<const int32_t> indptr, std::span<const int32_t> last,
                  int64_t page_size, std::span<int32_t> out) {
  KVATTN_CHECK(page_size > 0, "get_seq_lens: page_size = {} must be > 0", page_size);
  KVATTN_CHECK(!indptr.empty() && last.size() + 1 == indptr.size() && out.size() >= last.size(),
               "get_seq_lens: kv_indptr has {} entries, kv_last_page_len {} (must be one fewer), "
               "output {}", indptr.size(), last.size(), out.size());
  for (size_t r = 0; r < last.size(); ++r) {
    const int64_t pages = static_cast<int64_t>(indptr[r + 1]) - indptr[r];
    out[r] = static_cast<int32_t>(std::max<int64_t>(pages - 1, 0) * page_size + last[r]);
  }
}

Tensor get_seq_lens(const Tensor& kv_indptr, const Tensor& kv_last_page_len, int64_t page_size) {
  const auto indptr = host_i32_span(kv_indptr, "kv_indptr");
  const auto last = host_i32_span(kv_last_page_len, "kv_last_page_len");
  Tensor out = Tensor::empty({static_cast<int64_t>(last.size())}, DType::i32);
  get_seq_lens(indptr, last, page_size,
               std::span<int32_t>(out.data_ptr<int32_t>(), static_cast<size_t>(out.numel())));
  return out;
}

// ---- Shared steps ----------------------------------------------------------------------

const int32_t* paged_kv_host_seq_lens(const CommonAttentionMetadata& cm, std::span<const int32_t> qsl,
                                      int64_t num_reqs, bool upper_bound_exact, const Tensor& scratch) {
  KVATTN_CHECK(static_cast<int64_t>(qsl.size()) >= num_reqs + 1,
               "query_start_loc_cpu has {} entries, num_reqs + 1 = {} needed", qsl.size(), num_reqs + 1);
  const int32_t* seq = nullptr;
  if (upper_bound_exact && cm.seq_lens_cpu_upper_bound.defined()) {
    const auto ub = host_i32_span(cm.seq_lens_cpu_upper_bound, "seq_lens_cpu_upper_bound");
    KVATTN_CHECK(static_cast<int64_t>(ub.size()) >= num_reqs,
                 "seq_lens_cpu_upper_bound has {} entries, num_reqs = {}", ub.size(), num_reqs);
    seq = ub.data();
  } else {
    KVATTN_CHECK(cm.seq_lens.defined() && cm.seq_lens.dim() == 1 && cm.seq_lens.dtype() == DType::i32 &&
                     cm.seq_lens.size(0) >= num_reqs,
                 "seq_lens must be a [num_reqs = {}] int32 tensor, got {}", num_reqs,
                 cm.seq_lens.defined() ? cm.seq_lens.str() : std::string("undefined"));
    if (cm.seq_lens.device().is_cpu() && (num_reqs <= 1 || cm.seq_lens.stride(0) == 1)) {
      seq = cm.seq_lens.data_ptr<int32_t>();
    } else {  // a device tensor (or a strided view): one copy (a device sync)
      KVATTN_ASSERT(scratch.defined() && scratch.size(0) >= num_reqs, "seq_lens scratch too small");
      scratch.slice(0, 0, num_reqs).copy_from(cm.seq_lens.slice(0, 0, num_reqs));
      seq = scratch.data_ptr<int32_t>();
    }
  }
  // 0 <= query_len <= seq_len for every row: one branch-free pass, the culprit located on failure.
  bool bad = false;
  for (int64_t r = 0; r < num_reqs; ++r) {
    const int64_t q = static_cast<int64_t>(qsl[r + 1]) - qsl[r];  // no int32 overflow on any input
    bad |= (q < 0) | (q > seq[r]);
  }
  if (bad) [[unlikely]] {
    for (int64_t r = 0; r < num_reqs; ++r) {
      const int64_t q = static_cast<int64_t>(qsl[r + 1]) - qsl[r];
      KVATTN_CHECK(seq[r] >= 0, "request row {}: sequence length {} is negative", r, seq[r]);
      KVATTN_CHECK(q >= 0, "request row {}: query length {} is negative; query_start_loc_cpu must be "
                   "non-decreasing", r, q);
      KVATTN_CHECK(q <= seq[r], "request row {}: query length {} exceeds its sequence length {}: seq_len "
                   "is shorter than its query (seq_len counts the context plus this step's query)",
                   r, q, seq[r]);
    }
  }
  return seq;
}

void dcp_paged_kv_seq_lens(const int32_t* seq, std::span<const int32_t> qsl, int64_t num_reqs,
                           int64_t num_decodes, int64_t dcp_world_size, int64_t dcp_rank,
                           int64_t interleave, int32_t* out) {
  for (int64_t r = 0; r < num_reqs; ++r) {
    // Prefill rows attend to their new tokens directly: the paged part is the context only.
    const int32_t s = r >= num_decodes ? seq[r] - (qsl[r + 1] - qsl[r]) : seq[r];
    out[r] = dcp_local_seq_len(s, dcp_world_size, dcp_rank, interleave);
  }
}

int64_t compute_paged_kv_indptr(const int32_t* seq, int64_t num_reqs, int64_t page_size,
                                int64_t ncb, int64_t table_width, int64_t capacity, int32_t* indptr,
                                int32_t* last) {
  KVATTN_CHECK(page_size >= 1, "paged KV metadata: page_size = {} must be >= 1", page_size);
  KVATTN_CHECK(ncb >= 0, "paged KV metadata: num_common_kv_blocks = {} is negative", ncb);
  const BlockDiv pdiv(page_size);
  const int32_t page = static_cast<int32_t>(page_size);
  // Branch-free over rows.  A row is valid iff lo <= seq <= hi: seq >= 0, cdiv(seq, page) >= ncb
  // (seq > (ncb - 1) * page) and cdiv(seq, page) <= table_width (seq <= table_width * page); one
  // unsigned compare per row, OR-reduced, the culprit located only on failure.  Everything is
  // 32-bit so the pass vectorises (seq <= INT32_MAX and page <= 2^20 keep it in range); the page
  // counts land in indptr[1..] and a second pass turns them into offsets.
  const int64_t lo64 = ncb > 0 ? (ncb - 1) * page_size + 1 : 0;
  const int64_t hi64 = std::min<int64_t>(std::max<int64_t>(table_width, 0) * page_size, INT32_MAX);
  bool bad = num_reqs > 0 && (lo64 > hi64 || ncb > INT32_MAX);
  const uint32_t lo = static_cast<uint32_t>(std::min<int64_t>(lo64, INT32_MAX));
  const uint32_t span = lo64 <= hi64 ? static_cast<uint32_t>(hi64 - lo64) : 0;
  const uint32_t ncb32 = static_cast<uint32_t>(std::min<int64_t>(ncb, INT32_MAX));
  const uint32_t mask = static_cast<uint32_t>(page_size - 1);
  uint32_t any_bad = 0;
  if (pdiv.pow2()) {
    const int shift = std::countr_zero(static_cast<uint64_t>(page_size));
    for (int64_t r = 0; r < num_reqs; ++r) {
      const int32_t s = seq[r];
      any_bad |= static_cast<uint32_t>(static_cast<uint32_t>(s) - lo > span);
      const uint32_t c = s > 0 ? static_cast<uint32_t>(s) : 0u;
      indptr[r + 1] = static_cast<int32_t>(((c + mask) >> shift) - ncb32);
      const uint32_t rem = c & mask;
      last[r] = static_cast<int32_t>(rem == 0 && s > 0 ? static_cast<uint32_t>(page) : rem);
    }
  } else {
    for (int64_t r = 0; r < num_reqs; ++r) {
      const int32_t s = seq[r];
      any_bad |= static_cast<uint32_t>(static_cast<uint32_t>(s) - lo > span);
      const int64_t c = std::max<int32_t>(s, 0);
      indptr[r + 1] = static_cast<int32_t>(pdiv.cdiv(c) - ncb);
      const int32_t rem = static_cast<int32_t>(pdiv.mod(c));
      last[r] = rem == 0 && s > 0 ? page : rem;
    }
  }
  bad |= any_bad != 0;
  // Offsets (a valid row has 0 <= pages <= 2^27: the int64 total cannot overflow).
  int64_t total = 0;
  indptr[0] = 0;
  for (int64_t r = 1; r <= num_reqs; ++r) {
    total += indptr[r];
    indptr[r] = static_cast<int32_t>(total);
  }
  if (bad) [[unlikely]] {
    for (int64_t r = 0; r < num_reqs; ++r) {
      KVATTN_CHECK(seq[r] >= 0, "request row {}: sequence length {} is negative", r, seq[r]);
      const int64_t pages = pdiv.cdiv(seq[r]);
      KVATTN_CHECK(pages >= ncb,
                   "request row {}: {} pages, fewer than the {} shared prefix pages; the common prefix "
                   "({} tokens) must not exceed any request's length", r, pages, ncb, ncb * page_size);
      KVATTN_CHECK(pages <= table_width,
                   "request row {}: needs block-table columns [{}, {}) but the row holds {}; the block "
                   "table is narrower than the sequence needs", r, ncb, pages, table_width);
    }
  }
  KVATTN_CHECK(total <= capacity,
               "paged KV metadata: the batch needs {} pages but the builder holds {} (max_num_reqs * "
               "cdiv(max_model_len, page_size))", total, capacity);
  return total;
}

namespace {

[[noreturn]] void throw_bad_id(const BlockTableView& bt, int64_t r, int64_t col0, int64_t n,
                               int64_t num_blocks) {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = bt.at(r, col0 + i);
    KVATTN_CHECK(id >= 0 && (num_blocks <= 0 || id < num_blocks),
                 "request row {}: block id {} at block-table column {} is outside the pool [0, {}); the "
                 "block table must hold ids the KV cache allocated",
                 r, id, col0 + i, num_blocks > 0 ? num_blocks : int64_t{INT32_MAX});
  }
  KVATTN_ASSERT(false, "gather_page_indices: a bad block id was reported but not found");
  throw InvalidArgument("unreachable");
}

}  // namespace

void gather_page_indices(int32_t* page_indices, const BlockTableView& bt, const int32_t* indptr,
                         int64_t num_reqs, int64_t col0, int64_t num_blocks) {
  const uint32_t limit = block_id_limit(num_blocks);
  int64_t bad_row = -1;
  if (bt.col_stride == 1) {
    bad_row = gather_block_rows(page_indices, bt.data, bt.row_stride, col0, indptr, num_reqs, limit);
  } else {
    for (int64_t r = 0; r < num_reqs && bad_row < 0; ++r) {
      const int32_t* src = bt.row_ptr(r) + col0 * bt.col_stride;
      int32_t* dst = page_indices + indptr[r];
      uint32_t max_id = 0;
      for (int64_t i = 0, n = indptr[r + 1] - indptr[r]; i < n; ++i) {
        const int32_t v = src[i * bt.col_stride];
        dst[i] = v;
        max_id = std::max(max_id, static_cast<uint32_t>(v));
      }
      if (max_id >= limit) bad_row = r;  // a negative id reads as >= 2^31 >= limit
    }
  }
  if (bad_row >= 0) [[unlikely]]
    throw_bad_id(bt, bad_row, col0, indptr[bad_row + 1] - indptr[bad_row], num_blocks);
}

void copy_page_indices(std::span<int32_t> page_indices, const BlockTableView& bt,
                       std::span<const int32_t> cu, int64_t col_offset, int64_t num_blocks) {
  KVATTN_CHECK(!cu.empty(), "copy_page_indices: cu_num_blocks is empty (it has num_reqs + 1 entries)");
  const int64_t num_reqs = static_cast<int64_t>(cu.size()) - 1;
  KVATTN_CHECK(col_offset >= 0, "copy_page_indices: col_offset = {} is negative", col_offset);
  KVATTN_CHECK(num_reqs == 0 || bt.num_rows >= num_reqs,
               "copy_page_indices: block table has {} rows, {} requests", bt.num_rows, num_reqs);
  for (int64_t r = 0; r < num_reqs; ++r) {
    const int64_t start = cu[r], end = cu[r + 1];
    const int64_t n = end - start;
    KVATTN_CHECK(start >= 0 && n >= 0 && end <= static_cast<int64_t>(page_indices.size()),
                 "copy_page_indices: request row {} covers pages [{}, {}), outside [0, {}); "
                 "cu_num_blocks must be non-decreasing and fit the indices buffer",
                 r, start, end, page_indices.size());
    KVATTN_CHECK(col_offset + n <= bt.width,
                 "request row {}: needs block-table columns [{}, {}) but the row holds {}; the "
                 "block table is narrower than the sequence needs", r, col_offset,
                 col_offset + n, bt.width);
  }
  gather_page_indices(page_indices.data(), bt, cu.data(), num_reqs, col_offset, num_blocks);
}

int64_t PagedKVMetadataConfig::max_num_pages() const {
  return max_num_reqs * ((max_model_len + page_size - 1) / page_size);
}

void PagedKVMetadataConfig::validate() const {
  KVATTN_CHECK(max_num_reqs >= 1 && max_num_reqs <= (int64_t{1} << 20),
               "PagedKVMetadataBuilder: max_num_reqs = {} must be in [1, 2^20]", max_num_reqs);
  KVATTN_CHECK(max_model_len >= 1 && max_model_len <= (int64_t{1} << 30),
               "PagedKVMetadataBuilder: max_model_len = {} must be in [1, 2^30]", max_model_len);
  KVATTN_CHECK(page_size >= 1 && page_size <= (int64_t{1} << 20),
               "PagedKVMetadataBuilder: page_size = {} must be in [1, 2^20]", page_size);
  KVATTN_CHECK(max_num_pages() <= (int64_t{1} << 31) - 1,
               "PagedKVMetadataBuilder: {} pages (max_num_reqs * ceil(max_model_len / page_size)) "
               "overflow int32 page indices", max_num_pages());
  KVATTN_CHECK(dcp_world_size >= 1 && dcp_world_size <= 1024,
               "PagedKVMetadataBuilder: dcp_world_size = {} must be in [1, 1024]", dcp_world_size);
  KVATTN_CHECK(dcp_rank >= 0 && dcp_rank < dcp_world_size,
               "PagedKVMetadataBuilder: dcp_rank = {} is outside [0, {})", dcp_rank, dcp_world_size);
  KVATTN_CHECK(cp_kv_cache_interleave_size >= 1,
               "PagedKVMetadataBuilder: cp_kv_cache_interleave_size = {} must be >= 1",
               cp_kv_cache_interleave_size);
  KVATTN_CHECK(num_speculative_tokens >= 0, "num_speculative_tokens = {} is negative",
               num_speculative_tokens);
}

PagedKVMetadataBuilder::PagedKVMetadataBuilder(const PagedKVMetadataConfig& config) : cfg_(config) {
  cfg_.validate();
  indptr_ = CpuGpuBuffer({cfg_.max_num_reqs + 1}, DType::i32, cfg_.device);
  last_page_len_ = CpuGpuBuffer({cfg_.max_num_reqs}, DType::i32, cfg_.device);
  indices_ = CpuGpuBuffer({cfg_.max_num_pages()}, DType::i32, cfg_.device);
  seq_lens_ = Tensor::zeros({cfg_.max_num_reqs}, DType::i32);
}

const PagedKVMetadata& PagedKVMetadataBuilder::build(const CommonAttentionMetadata& cm,
                                                     int64_t num_decodes,
                                                     int64_t common_prefix_len) {
  const int64_t num_reqs = cm.num_reqs;
  const int64_t page = cfg_.page_size;
  KVATTN_CHECK(num_reqs >= 0 && num_reqs <= cfg_.max_num_reqs,
               "paged KV metadata: num_reqs = {} is outside [0, {}] (max_num_reqs)", num_reqs,
               cfg_.max_num_reqs);
  KVATTN_CHECK(num_decodes >= 0 && num_decodes <= num_reqs,
               "paged KV metadata: num_decodes = {} is outside [0, {}] (num_reqs)", num_decodes,
               num_reqs);
  KVATTN_CHECK(common_prefix_len >= 0, "common_prefix_len = {} is negative", common_prefix_len);
  KVATTN_CHECK(common_prefix_len % page == 0,
               "common_prefix_len = {} must be a multiple of the page size {}; cascade shares whole "
               "pages only", common_prefix_len, page);
  KVATTN_CHECK(common_prefix_len == 0 || num_reqs >= 1, "cascade attention needs at least one request");
  const int64_t ncb = common_prefix_len / page;
  const auto qsl = host_i32_span(cm.query_start_loc_cpu, "query_start_loc_cpu");
  const BlockTableView bt = host_block_table(cm.block_table_tensor, "block_table_tensor");
  KVATTN_CHECK(num_reqs == 0 || bt.num_rows >= num_reqs,
               "block_table_tensor has {} rows, num_reqs = {}", bt.num_rows, num_reqs);

  // Host sequence lengths (checked against the queries); DCP: context-only prefills, local share.
  int32_t* scratch = seq_lens_.data_ptr<int32_t>();
  const int32_t* seq =
      paged_kv_host_seq_lens(cm, qsl, num_reqs, cfg_.num_speculative_tokens == 0, seq_lens_);
  if (cfg_.dcp_world_size > 1) {
    dcp_paged_kv_seq_lens(seq, qsl, num_reqs, num_decodes, cfg_.dcp_world_size, cfg_.dcp_rank,
                          cfg_.cp_kv_cache_interleave_size, scratch);
    seq = scratch;
  }

  // Pages, offsets and last-page lengths; then the page-index gather.
  int32_t* indptr = indptr_.np<int32_t>();
  const int64_t total = compute_paged_kv_indptr(seq, num_reqs, page, ncb, bt.width,
                                                indices_.capacity(), indptr,
                                                last_page_len_.np<int32_t>());
  gather_page_indices(indices_.np<int32_t>(), bt, indptr, num_reqs, ncb, cfg_.num_blocks);

  // Device copies and the result.
  md_.num_reqs = num_reqs;
  md_.num_actual_pages = total;
  md_.paged_kv_indptr_cpu = indptr_.cpu_rows(num_reqs + 1);
  md_.paged_kv_indptr = indptr_.copy_to_gpu(num_reqs + 1);
  md_.paged_kv_indices_cpu = indices_.cpu_rows(total);
  md_.paged_kv_indices = indices_.copy_to_gpu(total);
  md_.paged_kv_last_page_len_cpu = last_page_len_.cpu_rows(num_reqs);
  md_.paged_kv_last_page_len = last_page_len_.copy_to_gpu(num_reqs);
  if (seq != scratch) std::copy_n(seq, num_reqs, scratch);  // md_ owns what it shows
  md_.seq_lens_cpu = seq_lens_.slice(0, 0, num_reqs);
  md_.use_cascade = ncb > 0;
  md_.num_common_kv_blocks = ncb;
  if (ncb > 0) {
    md_.shared_qo_indptr = {0, static_cast<int32_t>(cm.num_actual_tokens)};
    md_.shared_kv_page_indptr = {0, static_cast<int32_t>(ncb)};
    md_.shared_kv_page_indices = cm.block_table_tensor.select(0, 0).slice(0, 0, ncb);
    md_.shared_kv_last_page_len = static_cast<int32_t>(page);
  } else {
    md_.shared_qo_indptr = {0, 0};
    md_.shared_kv_page_indptr = {0, 0};
    md_.shared_kv_page_indices = Tensor();
    md_.shared_kv_last_page_len = 0;
  }
  return md_;
}

bool use_cascade_attention(const CascadeAttentionQuery& q) {
  if (q.common_prefix_len < 256) return false;
  if (q.use_alibi || q.use_sliding_window || q.use_local_attention) return false;
  const int64_t num_reqs = static_cast<int64_t>(q.query_lens.size());
  if (num_reqs < 8) return false;
  if (q.dcp_world_size > 1) return false;
  KVATTN_CHECK(q.num_kv_heads > 0 && q.num_query_heads > 0 && q.num_sms > 0,
               "use_cascade_attention: num_query_heads = {}, num_kv_heads = {}, num_sms = {} must "
               "all be > 0", q.num_query_heads, q.num_kv_heads, q.num_sms);
  const int64_t qpk = q.num_query_heads / q.num_kv_heads;
  bool all_single = true;
  for (int32_t l : q.query_lens) all_single = all_single && l == 1;
  const bool use_flash_decoding = qpk > 1 && !q.use_sliding_window && !q.use_alibi && all_single;
  if (!use_flash_decoding) return true;
  auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  constexpr int64_t q_tile = 128, kv_tile = 128;
  const int64_t num_prefix_tiles = cdiv(q.common_prefix_len, kv_tile);
  const int64_t cascade_time =
      cdiv(q.num_query_heads * cdiv(num_reqs, q_tile), q.num_sms) * num_prefix_tiles;
  const int64_t flash_decoding_time =
      cdiv(num_reqs * q.num_kv_heads * cdiv(qpk, q_tile) * num_prefix_tiles, q.num_sms);
  return cascade_time < flash_decoding_time;
}

}  // namespace kvattn
