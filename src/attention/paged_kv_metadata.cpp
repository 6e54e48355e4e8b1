#include "kvattn/attention/paged_kv_metadata.h"

#include <algorithm>

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

namespace {

// Copies n ids and reports whether any is outside [0, limit) (unsigned compare: negatives are
// huge).  One pass, OR-reduced; vectorises with baseline SSE2.
uint32_t copy_ids_checked(int32_t* __restrict dst, const int32_t* __restrict src, int64_t n,
                          uint32_t limit) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t v = src[i];
    dst[i] = v;
    bad |= static_cast<uint32_t>(static_cast<uint32_t>(v) >= limit);
  }
  return bad;
}

}  // namespace

void copy_page_indices(std::span<int32_t> page_indices, const BlockTableView& bt,
                       std::span<const int32_t> cu, int64_t col_offset, int64_t num_blocks) {
  KVATTN_CHECK(!cu.empty(), "copy_page_indices: cu_num_blocks is empty (it has num_reqs + 1 entries)");
  const int64_t num_reqs = static_cast<int64_t>(cu.size()) - 1;
  KVATTN_CHECK(col_offset >= 0, "copy_page_indices: col_offset = {} is negative", col_offset);
  KVATTN_CHECK(num_reqs == 0 || bt.num_rows >= num_reqs,
               "copy_page_indices: block table has {} rows, {} requests", bt.num_rows, num_reqs);
  // Valid ids are [0, num_blocks), or [0, 2^31) when the pool size is not given.
  const uint32_t limit = num_blocks > 0 && num_blocks <= INT32_MAX ? static_cast<uint32_t>(num_blocks)
                                                                   : uint32_t{0x80000000u};
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
    int32_t* __restrict dst = page_indices.data() + start;
    const int32_t* __restrict src = bt.row_ptr(r) + col_offset * bt.col_stride;
    // Copy and range-check in one pass: one unsigned compare per id, OR-reduced (vectorises with
    // plain SSE2; a negative id is a huge unsigned value).  The culprit is located only on failure.
    uint32_t bad = 0;
    if (bt.col_stride == 1) {
      bad = copy_ids_checked(dst, src, n, limit);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const int32_t v = src[i * bt.col_stride];
        dst[i] = v;
        bad |= static_cast<uint32_t>(static_cast<uint32_t>(v) >= limit);
      }
    }
    if (bad != 0) [[unlikely]] {
      for (int64_t i = 0; i < n; ++i) {
        KVATTN_CHECK(dst[i] >= 0 && (num_blocks <= 0 || dst[i] < num_blocks),
                     "request row {}: block id {} at block-table column {} is outside the pool "
                     "[0, {}); the block table must hold ids the KV cache allocated",
                     r, dst[i], col_offset + i, num_blocks > 0 ? num_blocks : INT32_MAX);
      }
    }
  }
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
  const auto qsl = host_i32_span(cm.query_start_loc_cpu, "query_start_loc_cpu");
  KVATTN_CHECK(static_cast<int64_t>(qsl.size()) >= num_reqs + 1,
               "query_start_loc_cpu has {} entries, num_reqs + 1 = {} needed", qsl.size(),
               num_reqs + 1);

  // Phase 1: host sequence lengths into scratch (the exact upper bound when no speculative
  // tokens are in flight, else seq_lens itself).
  int32_t* seq = seq_lens_.data_ptr<int32_t>();
  if (cfg_.num_speculative_tokens == 0 && cm.seq_lens_cpu_upper_bound.defined()) {
    const auto ub = host_i32_span(cm.seq_lens_cpu_upper_bound, "seq_lens_cpu_upper_bound");
    KVATTN_CHECK(static_cast<int64_t>(ub.size()) >= num_reqs,
                 "seq_lens_cpu_upper_bound has {} entries, num_reqs = {}", ub.size(), num_reqs);
    std::copy_n(ub.data(), num_reqs, seq);
  } else {
    KVATTN_CHECK(cm.seq_lens.defined() && cm.seq_lens.dim() == 1 && cm.seq_lens.size(0) >= num_reqs,
                 "seq_lens must be a [num_reqs = {}] int32 tensor", num_reqs);
    seq_lens_.slice(0, 0, num_reqs).copy_from(cm.seq_lens.slice(0, 0, num_reqs));
  }
  for (int64_t r = 0; r < num_reqs; ++r) {
    KVATTN_CHECK(seq[r] >= 0, "request row {}: sequence length {} is negative", r, seq[r]);
  }

  // Phase 2: DCP — prefill rows keep only their context, then every row its local share.
  if (cfg_.dcp_world_size > 1) {
    for (int64_t r = num_decodes; r < num_reqs; ++r) {
      const int64_t q = static_cast<int64_t>(qsl[r + 1]) - qsl[r];
      KVATTN_CHECK(q >= 0 && q <= seq[r],
                   "request row {}: query length {} is outside [0, {}] (its sequence length)", r,
                   q, seq[r]);
      seq[r] = static_cast<int32_t>(seq[r] - q);
    }
    for (int64_t r = 0; r < num_reqs; ++r)
      seq[r] = dcp_local_seq_len(seq[r], cfg_.dcp_world_size, cfg_.dcp_rank,
                                 cfg_.cp_kv_cache_interleave_size);
  }

  // Phase 3: pages per request (minus the shared prefix under cascade) and their offsets.
  int64_t ncb = 0;
  if (common_prefix_len > 0) {
    KVATTN_CHECK(common_prefix_len % page == 0,
                 "common_prefix_len = {} is not a multiple of page_size = {}; cascade shares whole "
                 "pages only", common_prefix_len, page);
    KVATTN_CHECK(num_reqs >= 1, "cascade attention needs at least one request");
    ncb = common_prefix_len / page;
  }
  KVATTN_CHECK(common_prefix_len >= 0, "common_prefix_len = {} is negative", common_prefix_len);
  int32_t* indptr = indptr_.np<int32_t>();
  int32_t* last = last_page_len_.np<int32_t>();
  indptr[0] = 0;
  int64_t total = 0;
  const int64_t capacity = indices_.capacity();
  const BlockDiv pdiv(page);
  for (int64_t r = 0; r < num_reqs; ++r) {
    const int64_t s = seq[r];
    const int64_t pages = pdiv.cdiv(s) - ncb;
    KVATTN_CHECK(pages >= 0,
                 "request row {}: {} pages cannot drop the {} shared-prefix pages; "
                 "common_prefix_len = {} must not exceed any request's length", r, pages + ncb,
                 ncb, common_prefix_len);
    total += pages;
    KVATTN_CHECK(total <= capacity,
                 "paged KV metadata: {} pages exceed the {} the builder was sized for "
                 "(max_num_reqs * ceil(max_model_len / page_size))", total, capacity);
    indptr[r + 1] = static_cast<int32_t>(total);
    const int64_t rem = pdiv.mod(s);
    last[r] = static_cast<int32_t>(rem == 0 && s != 0 ? page : rem);
  }

  // Phase 4: the page-index gather.
  const BlockTableView bt = host_block_table(cm.block_table_tensor, "block_table_tensor");
  KVATTN_CHECK(ncb <= bt.width, "common_prefix_len = {} needs {} block-table columns, the table "
               "has {}", common_prefix_len, ncb, bt.width);
  copy_page_indices(std::span<int32_t>(indices_.np<int32_t>(), static_cast<size_t>(total)), bt,
                    std::span<const int32_t>(indptr, static_cast<size_t>(num_reqs + 1)), ncb,
                    cfg_.num_blocks);

  // Phase 5: device copies and the result.
  md_.num_reqs = num_reqs;
  md_.num_actual_pages = total;
  md_.paged_kv_indptr_cpu = indptr_.cpu_rows(num_reqs + 1);
  md_.paged_kv_indptr = indptr_.copy_to_gpu(num_reqs + 1);
  md_.paged_kv_indices_cpu = indices_.cpu_rows(total);
  md_.paged_kv_indices = indices_.copy_to_gpu(total);
  md_.paged_kv_last_page_len_cpu = last_page_len_.cpu_rows(num_reqs);
  md_.paged_kv_last_page_len = last_page_len_.copy_to_gpu(num_reqs);
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
