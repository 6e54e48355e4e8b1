// Argument checks shared by every device (see common.h).
#include <algorithm>

#include "ops/common.h"

namespace kvattn::ops::detail {

void check_defined(const Tensor& t, const char* op, const char* name) {
  KVATTN_CHECK(t.defined(), "{}: `{}` is required but was not given (an undefined Tensor)", op, name);
}

void check_dim(const Tensor& t, int dims, const char* op, const char* name, const char* shape_doc) {
  check_defined(t, op, name);
  KVATTN_CHECK(t.dim() == dims, "{}: `{}` must be {}-D {}, got shape {}", op, name, dims, shape_doc,
               t.shape().str());
}

void check_dtype_in(const Tensor& t, std::initializer_list<DType> allowed, const char* op,
                    const char* name) {
  for (DType d : allowed)
    if (t.dtype() == d) return;
  std::string names;
  for (DType d : allowed) names += fmt::format("{}{}", names.empty() ? "" : ", ", dtype_name(d));
  KVATTN_CHECK(false, "{}: `{}` has dtype {}; valid dtypes: {}", op, name, dtype_name(t.dtype()), names);
}

void check_index_dtype(const Tensor& t, const char* op, const char* name) {
  KVATTN_CHECK(t.dtype() == DType::i32 || t.dtype() == DType::i64,
               "{}: `{}` has dtype {}; index tensors must be int32 or int64", op, name,
               dtype_name(t.dtype()));
}

void check_same_device(const Tensor& ref, const Tensor& t, const char* op, const char* name) {
  if (!t.defined()) return;
  KVATTN_CHECK(t.device() == ref.device(),
               "{}: `{}` is on {} but the other tensors are on {}; move it with .to(Device)", op,
               name, t.device().str(), ref.device().str());
}

void check_size(const Tensor& t, int d, int64_t want, const char* op, const char* name,
                const char* what) {
  KVATTN_CHECK(t.size(d) == want, "{}: `{}` has shape {}, but dimension {} must be {} = {}", op, name,
               t.shape().str(), d, what, want);
}

IndexView::IndexView(const Tensor& t) {
  KVATTN_ASSERT(t.device().is_cpu(), "IndexView of a non-CPU tensor");
  base = static_cast<const char*>(t.data());
  is64 = t.dtype() == DType::i64;
  const int64_t es = t.element_size();
  if (t.dim() >= 1) { s0 = t.stride(0) * es; n0 = t.size(0); }
  if (t.dim() >= 2) { s1 = t.stride(1) * es; n1 = t.size(1); }
}

// ---------------------------------------------------------------------------------------------
CacheWriteDims validate_reshape_and_cache(const ReshapeAndCacheArgs& a) {
  static constexpr const char* op = "reshape_and_cache_flash";
  check_dim(a.key, 3, op, "key", "[num_tokens, num_kv_heads, head_size]");
  check_dim(a.value, 3, op, "value", "[num_tokens, num_kv_heads, head_size]");
  check_dim(a.key_cache, 4, op, "key_cache", "[num_blocks, block_size, num_kv_heads, head_size]");
  check_dim(a.value_cache, 4, op, "value_cache", "[num_blocks, block_size, num_kv_heads, head_size]");
  check_dim(a.slot_mapping, 1, op, "slot_mapping", "[num_tokens]");
  check_index_dtype(a.slot_mapping, op, "slot_mapping");
  for (const Tensor* t : {&a.value, &a.key_cache, &a.value_cache, &a.slot_mapping, &a.k_scale, &a.v_scale})
    check_same_device(a.key, *t, op, "tensor");
  check_dtype_in(a.key, {DType::f32, DType::f16, DType::bf16}, op, "key");
  KVATTN_CHECK(a.value.dtype() == a.key.dtype(), "{}: value dtype {} differs from key dtype {}", op,
               dtype_name(a.value.dtype()), dtype_name(a.key.dtype()));
  KVATTN_CHECK(a.value.shape() == a.key.shape(), "{}: value shape {} differs from key shape {}", op,
               a.value.shape().str(), a.key.shape().str());
  CacheWriteDims d{};
  d.num_tokens = a.slot_mapping.size(0);
  d.num_heads = a.key.size(1);
  d.head_size = a.key.size(2);
  d.num_blocks = a.key_cache.size(0);
  d.block_size = a.key_cache.size(1);
  KVATTN_CHECK(d.num_tokens <= a.key.size(0),
               "{}: slot_mapping has {} tokens but key has only {} rows; key may be longer (padding) "
               "but not shorter", op, d.num_tokens, a.key.size(0));
  KVATTN_CHECK(a.value_cache.shape() == a.key_cache.shape(),
               "{}: value_cache shape {} differs from key_cache shape {}", op,
               a.value_cache.shape().str(), a.key_cache.shape().str());
  KVATTN_CHECK(a.key_cache.dtype() == a.value_cache.dtype(),
               "{}: value_cache dtype {} differs from key_cache dtype {}", op,
               dtype_name(a.value_cache.dtype()), dtype_name(a.key_cache.dtype()));
  KVATTN_CHECK(a.key_cache.size(2) == d.num_heads && a.key_cache.size(3) == d.head_size,
               "{}: key_cache shape {} does not match key's heads x head_size = {} x {}; the cache "
               "view must be [num_blocks, block_size, num_kv_heads, head_size]", op,
               a.key_cache.shape().str(), d.num_heads, d.head_size);
  KVATTN_CHECK(d.block_size > 0, "{}: key_cache block_size (dim 1) must be > 0, got shape {}", op,
               a.key_cache.shape().str());
  if (is_nvfp4(a.kv_cache_dtype))
    throw Unsupported(fmt::format("{}: kv_cache_dtype \"{}\" has no kvattn kernel; use one of auto, bfloat16, "
                                  "float16, fp8, fp8_e4m3, fp8_e5m2", op, kv_cache_dtype_name(a.kv_cache_dtype)));
  const DType want = kv_cache_storage_dtype(a.kv_cache_dtype, a.key.dtype());
  if (!is_fp8(a.kv_cache_dtype)) {
    KVATTN_CHECK(a.key_cache.dtype() == want,
                 "{}: kv_cache_dtype \"{}\" stores {}, but key_cache is {}; pass the cache's own kv_cache_dtype "
                 "(\"fp8_e4m3\"/\"fp8_e5m2\" for a quantised cache)", op, kv_cache_dtype_name(a.kv_cache_dtype),
                 dtype_name(want), dtype_name(a.key_cache.dtype()));
    KVATTN_CHECK(want == a.key.dtype(),
                 "{}: kv_cache_dtype \"{}\" stores {}, but key is {}; an unquantised cache takes key/value of "
                 "its own dtype (convert them first, or use kv_cache_dtype \"auto\")", op,
                 kv_cache_dtype_name(a.kv_cache_dtype), dtype_name(want), dtype_name(a.key.dtype()));
    d.cache_dtype = want;
  } else {
    KVATTN_CHECK(a.key_cache.dtype() == want || a.key_cache.dtype() == DType::u8,
                 "{}: kv_cache_dtype \"{}\" needs a {} (or uint8) cache, got {}", op,
                 kv_cache_dtype_name(a.kv_cache_dtype), dtype_name(want), dtype_name(a.key_cache.dtype()));
    d.cache_dtype = want;
    for (const auto& [t, name] : {std::pair{&a.k_scale, "k_scale"}, std::pair{&a.v_scale, "v_scale"}}) {
      KVATTN_CHECK(t->defined(), "{}: fp8 kv_cache_dtype \"{}\" needs `{}` ([1] or [num_kv_heads] float32)",
                   op, kv_cache_dtype_name(a.kv_cache_dtype), name);
      check_dtype_in(*t, {DType::f32}, op, name);
      KVATTN_CHECK(t->numel() == 1 || (t->dim() == 1 && t->size(0) == d.num_heads),
                   "{}: `{}` has shape {}; it must hold 1 value (per tensor) or num_kv_heads = {} "
                   "values (per head)", op, name, t->shape().str(), d.num_heads);
    }
    KVATTN_CHECK(a.k_scale.numel() == a.v_scale.numel(),
                 "{}: k_scale has {} values and v_scale {}; both must be per tensor or per head", op,
                 a.k_scale.numel(), a.v_scale.numel());
    d.per_head_scale = a.k_scale.numel() > 1;
  }
  if (a.slot_mapping.device().is_cpu()) {
    const IndexView slots(a.slot_mapping);
    const int64_t num_slots = checked_mul(d.num_blocks, d.block_size, "reshape_and_cache_flash: cache slots");
    for (int64_t t = 0; t < d.num_tokens; ++t) {
      const int64_t s = slots[t];
      KVATTN_CHECK(s < num_slots,
                   "{}: slot_mapping[{}] = {} is beyond the cache ({} blocks x {} tokens = {} slots); "
                   "valid slots are [0, {}) or negative to skip the token", op, t, s, d.num_blocks,
                   d.block_size, num_slots, num_slots);
    }
    if (is_fp8(a.kv_cache_dtype)) {
      for (const auto& [t, name] : {std::pair{&a.k_scale, "k_scale"}, std::pair{&a.v_scale, "v_scale"}}) {
        const Tensor c = t->contiguous();
        for (int64_t i = 0; i < c.numel(); ++i) {
          const float v = c.data_ptr<float>()[i];
          KVATTN_CHECK(std::isfinite(v) && v > 0.f, "{}: {}[{}] = {} must be a positive finite scale",
                       op, name, i, v);
        }
      }
    }
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
AttnDims validate_paged_attention(const PagedAttentionArgs& a) {
  static constexpr const char* op = "paged_attention";
  check_dim(a.query, 3, op, "query", "[num_tokens, num_qo_heads, head_dim]");
  check_dim(a.k_cache, 4, op, "k_cache", "[num_pages, page_size, num_kv_heads, head_dim]");
  check_dim(a.v_cache, 4, op, "v_cache", "[num_pages, page_size, num_kv_heads, head_dim]");
  check_dim(a.out, 3, op, "out", "[num_tokens, num_qo_heads, head_dim]");
  check_dim(a.qo_indptr, 1, op, "qo_indptr", "[batch + 1]");
  check_index_dtype(a.qo_indptr, op, "qo_indptr");
  for (const Tensor* t : {&a.k_cache, &a.v_cache, &a.out, &a.qo_indptr, &a.paged_kv_indptr,
                          &a.paged_kv_indices, &a.paged_kv_last_page_len, &a.block_table, &a.seq_lens,
                          &a.lse, &a.sinks, &a.mm_prefix_ranges, &a.xqa_draft_mask})
    check_same_device(a.query, *t, op, "tensor");
  check_dtype_in(a.query, {DType::f32, DType::f16, DType::bf16}, op, "query");
  check_dtype_in(a.out, {DType::f32, DType::f16, DType::bf16}, op, "out");
  KVATTN_CHECK(a.k_cache.dtype() != DType::u8,
               "{}: k_cache is uint8; view an fp8 cache as its element type first "
               "(cache.view_as(DType::fp8_e4m3) or fp8_e5m2)", op);
  check_dtype_in(a.k_cache, {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2}, op,
                 "k_cache");
  KVATTN_CHECK(a.v_cache.dtype() == a.k_cache.dtype(), "{}: v_cache dtype {} differs from k_cache dtype {}",
               op, dtype_name(a.v_cache.dtype()), dtype_name(a.k_cache.dtype()));
  KVATTN_CHECK(a.v_cache.shape() == a.k_cache.shape(), "{}: v_cache shape {} differs from k_cache shape {}",
               op, a.v_cache.shape().str(), a.k_cache.shape().str());
  AttnDims d{};
  d.num_tokens = a.query.size(0);
  d.num_qo_heads = a.query.size(1);
  d.head_dim = a.query.size(2);
  d.num_pages = a.k_cache.size(0);
  d.page_size = a.k_cache.size(1);
  d.num_kv_heads = a.k_cache.size(2);
  d.batch = a.qo_indptr.size(0) - 1;
  KVATTN_CHECK(d.batch >= 0, "{}: qo_indptr must have batch + 1 >= 1 entries, got shape {}", op,
               a.qo_indptr.shape().str());
  KVATTN_CHECK(a.k_cache.size(3) == d.head_dim,
               "{}: k_cache head_dim {} differs from query head_dim {} (shape {}); the cache view must "
               "be [num_pages, page_size, num_kv_heads, head_dim]", op, a.k_cache.size(3), d.head_dim,
               a.k_cache.shape().str());
  KVATTN_CHECK(d.num_kv_heads > 0 && d.num_qo_heads > 0 && d.num_qo_heads % d.num_kv_heads == 0,
               "{}: num_qo_heads = {} is not a multiple of num_kv_heads = {}; GQA/MQA needs "
               "num_qo_heads % num_kv_heads == 0", op, d.num_qo_heads, d.num_kv_heads);
  if (!(d.head_dim % 8 == 0 && d.head_dim >= 8 && d.head_dim <= 512))
    throw Unsupported(fmt::format("{}: head_dim = {} is not supported; valid head sizes are multiples of 8 "
                                  "in [8, 512] (64, 128, 256, 512, ...)", op, d.head_dim));
  KVATTN_CHECK(d.page_size > 0, "{}: page_size (k_cache dim 1) must be > 0, got shape {}", op,
               a.k_cache.shape().str());
  KVATTN_CHECK(a.out.shape() == a.query.shape(), "{}: out shape {} differs from query shape {}", op,
               a.out.shape().str(), a.query.shape().str());
  const bool paged = a.paged_kv_indptr.defined() || a.paged_kv_indices.defined() ||
                     a.paged_kv_last_page_len.defined();
  const bool table = a.block_table.defined() || a.seq_lens.defined();
  KVATTN_CHECK(paged != table,
               "{}: give the pages either as paged_kv_indptr/paged_kv_indices/paged_kv_last_page_len "
               "or as block_table/seq_lens ({} given)", op, paged ? "both" : "neither");
  d.paged_form = paged;
  if (paged) {
    check_dim(a.paged_kv_indptr, 1, op, "paged_kv_indptr", "[batch + 1]");
    check_dim(a.paged_kv_indices, 1, op, "paged_kv_indices", "[nnz_pages]");
    check_dim(a.paged_kv_last_page_len, 1, op, "paged_kv_last_page_len", "[batch]");
    check_index_dtype(a.paged_kv_indptr, op, "paged_kv_indptr");
    check_index_dtype(a.paged_kv_indices, op, "paged_kv_indices");
    check_index_dtype(a.paged_kv_last_page_len, op, "paged_kv_last_page_len");
    check_size(a.paged_kv_indptr, 0, d.batch + 1, op, "paged_kv_indptr", "batch + 1");
    check_size(a.paged_kv_last_page_len, 0, d.batch, op, "paged_kv_last_page_len", "batch");
  } else {
    check_dim(a.block_table, 2, op, "block_table", "[batch, max_blocks]");
    check_dim(a.seq_lens, 1, op, "seq_lens", "[batch]");
    check_index_dtype(a.block_table, op, "block_table");
    check_index_dtype(a.seq_lens, op, "seq_lens");
    check_size(a.block_table, 0, d.batch, op, "block_table", "batch");
    check_size(a.seq_lens, 0, d.batch, op, "seq_lens", "batch");
  }
  if (a.lse.defined()) {
    check_dim(a.lse, 2, op, "lse", "[num_tokens, num_qo_heads]");
    check_dtype_in(a.lse, {DType::f32}, op, "lse");
    KVATTN_CHECK(a.lse.size(0) == d.num_tokens && a.lse.size(1) == d.num_qo_heads,
                 "{}: lse shape {} must be [num_tokens, num_qo_heads] = [{}, {}] (for an [H, T] buffer "
                 "pass its transpose(0, 1))", op, a.lse.shape().str(), d.num_tokens, d.num_qo_heads);
  }
  if (a.sinks.defined()) {
    check_dim(a.sinks, 1, op, "sinks", "[num_qo_heads]");
    check_dtype_in(a.sinks, {DType::f32}, op, "sinks");
    check_size(a.sinks, 0, d.num_qo_heads, op, "sinks", "num_qo_heads");
  }
  if (a.mm_prefix_ranges.defined()) {
    check_dim(a.mm_prefix_ranges, 2, op, "mm_prefix_ranges", "[num_tokens, 2]");
    check_index_dtype(a.mm_prefix_ranges, op, "mm_prefix_ranges");
    KVATTN_CHECK(a.mm_prefix_ranges.size(0) >= d.num_tokens && a.mm_prefix_ranges.size(1) == 2,
                 "{}: mm_prefix_ranges shape {} must be [num_tokens = {}, 2]", op,
                 a.mm_prefix_ranges.shape().str(), d.num_tokens);
  }
  if (a.xqa_draft_mask.defined()) {
    check_dim(a.xqa_draft_mask, 2, op, "xqa_draft_mask", "[num_tokens, P]");
    check_dtype_in(a.xqa_draft_mask, {DType::i32}, op, "xqa_draft_mask");
    KVATTN_CHECK(a.xqa_draft_mask.size(0) >= d.num_tokens,
                 "{}: xqa_draft_mask has {} rows but there are {} query tokens", op,
                 a.xqa_draft_mask.size(0), d.num_tokens);
  }
  KVATTN_CHECK(a.window_left >= -1, "{}: window_left = {} must be -1 (off) or >= 0", op, a.window_left);
  KVATTN_CHECK(a.max_query_len >= -1, "{}: max_query_len = {} must be -1 (unknown) or >= 0", op, a.max_query_len);
  KVATTN_CHECK(std::isfinite(a.logits_soft_cap) && a.logits_soft_cap >= 0,
               "{}: logits_soft_cap = {} must be finite and >= 0 (0 = off)", op, a.logits_soft_cap);
  d.sm_scale = a.sm_scale.value_or(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
  for (const auto& [v, name] : {std::pair{d.sm_scale, "sm_scale"}, std::pair{a.q_scale, "q_scale"},
                                std::pair{a.k_scale, "k_scale"}, std::pair{a.v_scale, "v_scale"}})
    KVATTN_CHECK(std::isfinite(v) && v > 0, "{}: {} = {} must be a positive finite number", op, name, v);
  return d;
}

ResolvedBatch resolve_batch(const PagedAttentionArgs& a, const AttnDims& d) {
  static constexpr const char* op = "paged_attention";
  ResolvedBatch b;
  const IndexView qo(a.qo_indptr);
  b.q_begin.resize(static_cast<size_t>(d.batch + 1));
  b.kv_len.resize(static_cast<size_t>(d.batch));
  b.page_begin.resize(static_cast<size_t>(d.batch + 1));
  for (int64_t r = 0; r <= d.batch; ++r) b.q_begin[r] = qo[r];
  KVATTN_CHECK(b.q_begin[0] == 0, "{}: qo_indptr[0] = {} must be 0", op, b.q_begin[0]);
  for (int64_t r = 0; r < d.batch; ++r)
    KVATTN_CHECK(b.q_begin[r + 1] >= b.q_begin[r], "{}: qo_indptr must be non-decreasing, got [{}] = {} > [{}] = {}",
                 op, r, b.q_begin[r], r + 1, b.q_begin[r + 1]);
  KVATTN_CHECK(b.q_begin[d.batch] <= d.num_tokens,
               "{}: qo_indptr[batch] = {} exceeds the query's {} tokens", op, b.q_begin[d.batch], d.num_tokens);
  if (a.max_query_len >= 0)
    for (int64_t r = 0; r < d.batch; ++r)
      KVATTN_CHECK(b.q_begin[r + 1] - b.q_begin[r] <= a.max_query_len,
                   "{}: request {} has {} query rows but max_query_len = {}; pass the batch's longest query "
                   "length (or -1 = unknown)", op, r, b.q_begin[r + 1] - b.q_begin[r], a.max_query_len);
  const auto check_page = [&](int64_t r, int64_t i, int64_t p) {
    KVATTN_CHECK(p >= 0 && p < d.num_pages,
                 "{}: request {} page {} has id {}, outside the cache's [0, {}) pages; check the block "
                 "table / paged_kv_indices", op, r, i, p, d.num_pages);
  };
  if (d.paged_form) {
    const IndexView ip(a.paged_kv_indptr), idx(a.paged_kv_indices), last(a.paged_kv_last_page_len);
    KVATTN_CHECK(ip[0] == 0, "{}: paged_kv_indptr[0] = {} must be 0", op, ip[0]);
    for (int64_t r = 0; r < d.batch; ++r) {
      const int64_t n = ip[r + 1] - ip[r];
      KVATTN_CHECK(n >= 0, "{}: paged_kv_indptr must be non-decreasing, got [{}] = {} > [{}] = {}", op, r,
                   ip[r], r + 1, ip[r + 1]);
      KVATTN_CHECK(ip[r + 1] <= idx.n0, "{}: paged_kv_indptr[{}] = {} exceeds paged_kv_indices' {} entries", op,
                   r + 1, ip[r + 1], idx.n0);
      const int64_t l = last[r];
      KVATTN_CHECK((n == 0 && l == 0) || (n > 0 && l >= 1 && l <= d.page_size),
                   "{}: paged_kv_last_page_len[{}] = {} with {} pages; it must be in [1, page_size = {}] "
                   "(0 when the request has no pages)", op, r, l, n, d.page_size);
      b.kv_len[r] = n == 0 ? 0 : (n - 1) * d.page_size + l;
    }
    KVATTN_CHECK(ip[d.batch] <= idx.n0, "{}: paged_kv_indptr[batch] = {} exceeds paged_kv_indices' {} entries",
                 op, ip[d.batch], idx.n0);
    b.pages.resize(static_cast<size_t>(ip[d.batch]));
    for (int64_t r = 0; r < d.batch; ++r) {
      b.page_begin[r] = ip[r];
      for (int64_t i = ip[r]; i < ip[r + 1]; ++i) {
        const int64_t p = idx[i];
        check_page(r, i - ip[r], p);
        b.pages[i] = p;
      }
    }
    b.page_begin[d.batch] = ip[d.batch];
  } else {
    const IndexView bt(a.block_table), sl(a.seq_lens);
    int64_t total = 0;
    for (int64_t r = 0; r < d.batch; ++r) {
      const int64_t len = sl[r];
      KVATTN_CHECK(len >= 0 && len <= checked_mul(bt.n1, d.page_size, "paged_attention: block-table capacity in tokens"),
                   "{}: seq_lens[{}] = {} must be in [0, max_blocks * page_size = {} * {}]", op, r, len,
                   bt.n1, d.page_size);
      b.kv_len[r] = len;
      b.page_begin[r] = total;
      total += (len + d.page_size - 1) / d.page_size;
    }
    b.page_begin[d.batch] = total;
    b.pages.resize(static_cast<size_t>(total));
    for (int64_t r = 0; r < d.batch; ++r)
      for (int64_t i = 0; i < b.page_begin[r + 1] - b.page_begin[r]; ++i) {
        const int64_t p = bt.at(r, i);
        check_page(r, i, p);
        b.pages[b.page_begin[r] + i] = p;
      }
  }
  if (a.xqa_draft_mask.defined()) {
    for (int64_t r = 0; r < d.batch; ++r) {
      const int64_t ql = b.q_begin[r + 1] - b.q_begin[r];
      KVATTN_CHECK(a.xqa_draft_mask.size(1) * 32 >= ql,
                   "{}: xqa_draft_mask holds {} words (= {} keys) per row but request {} has {} draft tokens",
                   op, a.xqa_draft_mask.size(1), a.xqa_draft_mask.size(1) * 32, r, ql);
    }
  }
  return b;
}

RowMask make_row_mask(const PagedAttentionArgs& a, const ResolvedBatch& b, int64_t r, int64_t token) {
  RowMask m;
  m.kv_len = b.kv_len[r];
  m.q_len = b.q_begin[r + 1] - b.q_begin[r];
  m.qpos = m.kv_len - m.q_len + (token - b.q_begin[r]);
  m.causal = a.causal;
  m.window_left = a.window_left;
  if (a.mm_prefix_ranges.defined()) {
    const IndexView mm(a.mm_prefix_ranges);
    const int64_t s = mm.at(token, 0), e = mm.at(token, 1);
    if (s >= 0 && e >= s) { m.mm_start = s; m.mm_end = e; }
  }
  if (a.xqa_draft_mask.defined()) {
    m.xqa_row = static_cast<const char*>(a.xqa_draft_mask.data()) +
                token * a.xqa_draft_mask.stride(0) * 4;
    m.xqa_stride = a.xqa_draft_mask.stride(1) * 4;
  }
  return m;
}

// ---------------------------------------------------------------------------------------------
MergeDims validate_merge(const MergeAttnStatesArgs& a) {
  static constexpr const char* op = "merge_attn_states";
  check_dim(a.output, 3, op, "output", "[num_tokens, num_heads, head_dim]");
  check_dim(a.prefix_output, 3, op, "prefix_output", "[num_tokens, num_heads, head_dim]");
  check_dim(a.suffix_output, 3, op, "suffix_output", "[num_tokens, num_heads, head_dim]");
  check_dim(a.prefix_lse, 2, op, "prefix_lse", "[num_heads, num_tokens]");
  check_dim(a.suffix_lse, 2, op, "suffix_lse", "[num_heads, num_tokens]");
  for (const Tensor* t : {&a.prefix_output, &a.suffix_output, &a.prefix_lse, &a.suffix_lse, &a.output_lse,
                          &a.output_scale})
    check_same_device(a.output, *t, op, "tensor");
  MergeDims d{a.output.size(0), a.output.size(1), a.output.size(2)};
  check_dtype_in(a.prefix_output, {DType::f32, DType::f16, DType::bf16}, op, "prefix_output");
  KVATTN_CHECK(a.suffix_output.dtype() == a.prefix_output.dtype(),
               "{}: suffix_output dtype {} differs from prefix_output dtype {}", op,
               dtype_name(a.suffix_output.dtype()), dtype_name(a.prefix_output.dtype()));
  check_dtype_in(a.output, {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2}, op, "output");
  KVATTN_CHECK(a.prefix_output.shape() == a.output.shape() && a.suffix_output.shape() == a.output.shape(),
               "{}: prefix_output {} / suffix_output {} must have output's shape {}", op,
               a.prefix_output.shape().str(), a.suffix_output.shape().str(), a.output.shape().str());
  for (const auto& [t, name] : {std::pair{&a.prefix_lse, "prefix_lse"}, std::pair{&a.suffix_lse, "suffix_lse"},
                                std::pair{&a.output_lse, "output_lse"}}) {
    if (!t->defined()) continue;
    check_dim(*t, 2, op, name, "[num_heads, num_tokens]");
    check_dtype_in(*t, {DType::f32}, op, name);
    KVATTN_CHECK(t->size(0) == d.num_heads && t->size(1) == d.num_tokens,
                 "{}: `{}` has shape {}, expected [num_heads, num_tokens] = [{}, {}]", op, name,
                 t->shape().str(), d.num_heads, d.num_tokens);
  }
  if (dtype_is_fp8(a.output.dtype())) {
    KVATTN_CHECK(a.output_scale.defined(), "{}: an fp8 output ({}) needs output_scale ([1] float32)", op,
                 dtype_name(a.output.dtype()));
  }
  if (a.output_scale.defined()) {
    check_dtype_in(a.output_scale, {DType::f32}, op, "output_scale");
    KVATTN_CHECK(a.output_scale.numel() == 1, "{}: output_scale must hold 1 value, got shape {}", op,
                 a.output_scale.shape().str());
    KVATTN_CHECK(dtype_is_fp8(a.output.dtype()),
                 "{}: output_scale is only valid with an fp8 output, but output is {}", op,
                 dtype_name(a.output.dtype()));
    if (a.output_scale.device().is_cpu()) {
      const double s = a.output_scale.contiguous().get({0});
      KVATTN_CHECK(std::isfinite(s) && s > 0, "{}: output_scale = {} must be positive and finite", op, s);
    }
  }
  if (a.prefill_tokens_with_context)
    KVATTN_CHECK(*a.prefill_tokens_with_context >= 0, "{}: prefill_tokens_with_context = {} must be >= 0", op,
                 *a.prefill_tokens_with_context);
  return d;
}

void validate_mask_empty_context_lse(const Tensor& lse, const Tensor& qsl, const Tensor& csl) {
  static constexpr const char* op = "mask_empty_context_lse";
  check_dim(lse, 2, op, "lse", "[num_heads, num_tokens]");
  check_dtype_in(lse, {DType::f32}, op, "lse");
  check_dim(qsl, 1, op, "query_start_loc", "[num_reqs + 1]");
  check_dim(csl, 1, op, "context_start_loc", "[num_reqs + 1]");
  check_index_dtype(qsl, op, "query_start_loc");
  check_index_dtype(csl, op, "context_start_loc");
  check_same_device(lse, qsl, op, "query_start_loc");
  check_same_device(lse, csl, op, "context_start_loc");
  KVATTN_CHECK(qsl.size(0) == csl.size(0) && qsl.size(0) >= 1,
               "{}: query_start_loc ({} entries) and context_start_loc ({}) must both be [num_reqs + 1]", op,
               qsl.size(0), csl.size(0));
  if (qsl.device().is_cpu()) {
    const IndexView q(qsl);
    for (int64_t r = 0; r + 1 < qsl.size(0); ++r)
      KVATTN_CHECK(q[r] >= 0 && q[r] <= q[r + 1] && q[r + 1] <= lse.size(1),
                   "{}: query_start_loc[{}..{}] = [{}, {}] must be non-decreasing within [0, num_tokens = {}]",
                   op, r, r + 1, q[r], q[r + 1], lse.size(1));
  }
}

}  // namespace kvattn::ops::detail
