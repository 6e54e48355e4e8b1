// The device-neutral entry points: check once, then dispatch on the tensors' device.
#include "kvattn/ops/ops.h"

#include <algorithm>
#include <cmath>

#include "ops/common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/thread_pool.h"
#include "ops/cuda_dispatch.h"
#include "ops/plan_state.h"

namespace kvattn::ops {
using namespace detail;

void set_cpu_num_threads(int n) { cpu::ThreadPool::instance().set_num_threads(n); }
int cpu_num_threads() { return cpu::ThreadPool::instance().num_threads(); }
bool cuda_ops_available() noexcept { return cuda_impl::available(); }

KVCacheDType parse_kv_cache_dtype(std::string_view name) {
  if (name == "auto" || name == "bfloat16" || name == "float16" || name == "float32" || name == "bf16" ||
      name == "fp16" || name == "half")
    return KVCacheDType::Auto;
  if (name == "fp8" || name == "fp8_e4m3") return KVCacheDType::Fp8E4M3;
  if (name == "fp8_e5m2") return KVCacheDType::Fp8E5M2;
  throw InvalidArgument(fmt::format("unknown kv_cache_dtype \"{}\"; valid: auto, fp8, fp8_e4m3, fp8_e5m2 "
                                    "(a model dtype name means auto)", name));
}

const char* kv_cache_dtype_name(KVCacheDType t) noexcept {
  switch (t) {
    case KVCacheDType::Auto: return "auto";
    case KVCacheDType::Fp8E4M3: return "fp8_e4m3";
    case KVCacheDType::Fp8E5M2: return "fp8_e5m2";
  }
  return "?";
}

// ---- reshape_and_cache_flash -------------------------------------------------------------------
void reshape_and_cache_flash(const ReshapeAndCacheArgs& args) {
  const CacheWriteDims d = validate_reshape_and_cache(args);
  if (args.key.device().is_cuda()) return cuda_impl::reshape_and_cache_flash(args);
  cpu::reshape_and_cache_flash(args, d);
}

void reshape_and_cache_flash(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                             const Tensor& value_cache, const Tensor& slot_mapping, std::string_view kv_cache_dtype,
                             const Tensor& k_scale, const Tensor& v_scale) {
  ReshapeAndCacheArgs a;
  a.key = key; a.value = value; a.key_cache = key_cache; a.value_cache = value_cache;
  a.slot_mapping = slot_mapping; a.kv_cache_dtype = parse_kv_cache_dtype(kv_cache_dtype);
  a.k_scale = k_scale; a.v_scale = v_scale;
  reshape_and_cache_flash(a);
}

// ---- paged_attention ---------------------------------------------------------------------------
KvLengthsHint classify_kv_lengths(std::span<const int32_t> kv_lens) noexcept {
  int32_t lo = 0, hi = 0;
  for (int32_t l : kv_lens) {
    if (l <= 0) continue;
    lo = lo == 0 ? l : std::min(lo, l);
    hi = std::max(hi, l);
  }
  if (hi == 0) return KvLengthsHint::unknown;
  return int64_t(hi) >= 2 * int64_t(lo) ? KvLengthsHint::mixed : KvLengthsHint::uniform;
}

PagedAttentionPlan::PagedAttentionPlan() : state_(std::make_shared<State>()) {}
void PagedAttentionPlan::invalidate() noexcept { state_->valid.store(false, std::memory_order_relaxed); }
int64_t PagedAttentionPlan::plans() const noexcept { return state_->plans.load(std::memory_order_relaxed); }
int64_t PagedAttentionPlan::reuses() const noexcept { return state_->reuses.load(std::memory_order_relaxed); }

void paged_attention(const PagedAttentionArgs& args) {
  const AttnDims d = validate_paged_attention(args);
  if (args.query.device().is_cuda()) {
    PagedAttentionArgs a = args;
    a.sm_scale = d.sm_scale;
    return cuda_impl::paged_attention(a);
  }
  cpu::paged_attention(args, d);
}

std::pair<Tensor, Tensor> split_kv_cache_layer_view(const Tensor& layer_view, int64_t head_size) {
  KVATTN_CHECK(layer_view.dim() == 4,
               "split_kv_cache_layer_view: expected the per-layer view [num_blocks, num_heads, block_size, "
               "2 * head_size], got shape {}", layer_view.shape().str());
  KVATTN_CHECK(head_size > 0 && layer_view.size(3) == 2 * head_size,
               "split_kv_cache_layer_view: the content dim C = {} must be 2 * head_size = {} (K and V "
               "concatenated); view the byte cache as its element dtype first", layer_view.size(3), 2 * head_size);
  const Tensor nhd = layer_view.transpose(1, 2);  // [B, N, H, C]
  auto parts = nhd.split(head_size, 3);
  return {parts[0], parts[1]};
}

Tensor make_xqa_draft_block_mask(const std::vector<int64_t>& q_lens, bool causal) {
  int64_t total = 0, max_q = 0;
  for (int64_t q : q_lens) {
    KVATTN_CHECK(q >= 0, "make_xqa_draft_block_mask: query length {} must be >= 0", q);
    total += q;
    max_q = std::max(max_q, q);
  }
  const int64_t words = std::max<int64_t>(1, (max_q + 31) / 32);
  std::vector<int32_t> bits(static_cast<size_t>(total * words), 0);
  int64_t row = 0;
  for (int64_t q : q_lens)
    for (int64_t i = 0; i < q; ++i, ++row)
      for (int64_t j = 0; j < q; ++j)
        if (!causal || j <= i) {
          uint32_t w = static_cast<uint32_t>(bits[static_cast<size_t>(row * words + j / 32)]);
          w |= 1u << (j % 32);
          bits[static_cast<size_t>(row * words + j / 32)] = static_cast<int32_t>(w);
        }
  return Tensor::from_vector(bits, Dims{total, words});
}

void log2_lse_to_ln(const Tensor& lse) {
  KVATTN_CHECK(lse.device().is_cpu() && lse.dtype() == DType::f32,
               "log2_lse_to_ln: expects a float32 CPU tensor, got {} on {}", dtype_name(lse.dtype()),
               lse.device().str());
  Tensor c = lse.contiguous();
  float* p = c.data_ptr<float>();
  for (int64_t i = 0; i < c.numel(); ++i) p[i] *= 0.6931471805599453f;
  if (c.data() != lse.data()) {
    Tensor dst = lse;
    dst.copy_from(c);
  }
}

// ---- merge -------------------------------------------------------------------------------------
void merge_attn_states(const MergeAttnStatesArgs& args) {
  const MergeDims d = validate_merge(args);
  if (args.output.device().is_cuda()) return cuda_impl::merge_attn_states(args);
  cpu::merge_attn_states(args, d);
}

void merge_attn_states(const Tensor& output, const Tensor& prefix_output, const Tensor& prefix_lse,
                       const Tensor& suffix_output, const Tensor& suffix_lse, const Tensor& output_lse,
                       std::optional<int64_t> prefill_tokens_with_context, const Tensor& output_scale) {
  MergeAttnStatesArgs a;
  a.output = output; a.prefix_output = prefix_output; a.prefix_lse = prefix_lse;
  a.suffix_output = suffix_output; a.suffix_lse = suffix_lse; a.output_lse = output_lse;
  a.prefill_tokens_with_context = prefill_tokens_with_context; a.output_scale = output_scale;
  merge_attn_states(a);
}

void mask_empty_context_lse(const Tensor& lse, const Tensor& query_start_loc, const Tensor& context_start_loc) {
  validate_mask_empty_context_lse(lse, query_start_loc, context_start_loc);
  if (lse.device().is_cuda()) return cuda_impl::mask_empty_context_lse(lse, query_start_loc, context_start_loc);
  cpu::mask_empty_context_lse(lse, query_start_loc, context_start_loc);
}

// ---- zero_kv_blocks ----------------------------------------------------------------------------
void zero_kv_blocks(const Tensor& seg_addrs, const Tensor& seg_block_strides, const Tensor& seg_page_sizes,
                    const Tensor& block_ids) {
  static constexpr const char* op = "zero_kv_blocks";
  check_dim(seg_addrs, 1, op, "seg_addrs", "[num_segments]");
  check_dim(seg_block_strides, 1, op, "seg_block_strides", "[num_segments]");
  check_dim(seg_page_sizes, 1, op, "seg_page_sizes", "[num_segments]");
  check_dim(block_ids, 1, op, "block_ids", "[num_blocks_to_zero]");
  for (const auto& [t, name] : {std::pair{&seg_addrs, "seg_addrs"}, std::pair{&seg_block_strides, "seg_block_strides"},
                                std::pair{&seg_page_sizes, "seg_page_sizes"}}) {
    check_dtype_in(*t, {DType::i64}, op, name);
    check_size(*t, 0, seg_addrs.size(0), op, name, "num_segments (seg_addrs.size(0))");
    check_same_device(block_ids, *t, op, name);
  }
  check_index_dtype(block_ids, op, "block_ids");
  if (block_ids.device().is_cuda()) return cuda_impl::zero_kv_blocks(seg_addrs, seg_block_strides, seg_page_sizes, block_ids);
  const IndexView addr(seg_addrs), stride(seg_block_strides), page(seg_page_sizes), ids(block_ids);
  for (int64_t s = 0; s < seg_addrs.size(0); ++s) {
    KVATTN_CHECK(addr[s] != 0 && addr[s] % 4 == 0, "{}: seg_addrs[{}] = {:#x} must be a non-null 4-byte aligned address",
                 op, s, static_cast<uint64_t>(addr[s]));
    KVATTN_CHECK(stride[s] >= 0 && page[s] >= 0,
                 "{}: segment {} has block stride {} and page size {} (4-byte words); both must be >= 0", op, s,
                 stride[s], page[s]);
  }
  for (int64_t i = 0; i < block_ids.size(0); ++i)
    KVATTN_CHECK(ids[i] >= 0, "{}: block_ids[{}] = {} must be >= 0", op, i, ids[i]);
  cpu::zero_kv_blocks(seg_addrs, seg_block_strides, seg_page_sizes, block_ids);
}

// ---- page utilities ----------------------------------------------------------------------------
void copy_page_indices(const Tensor& paged_kv_indices, const Tensor& block_table, const Tensor& paged_kv_indptr) {
  static constexpr const char* op = "copy_page_indices";
  check_dim(paged_kv_indices, 1, op, "paged_kv_indices", "[nnz]");
  check_dim(block_table, 2, op, "block_table", "[num_reqs, max_blocks]");
  check_dim(paged_kv_indptr, 1, op, "paged_kv_indptr", "[num_reqs + 1]");
  check_index_dtype(paged_kv_indices, op, "paged_kv_indices");
  check_index_dtype(block_table, op, "block_table");
  check_index_dtype(paged_kv_indptr, op, "paged_kv_indptr");
  check_same_device(paged_kv_indices, block_table, op, "block_table");
  check_same_device(paged_kv_indices, paged_kv_indptr, op, "paged_kv_indptr");
  KVATTN_CHECK(paged_kv_indptr.size(0) == block_table.size(0) + 1,
               "{}: paged_kv_indptr has {} entries but block_table has {} rows; need num_reqs + 1", op,
               paged_kv_indptr.size(0), block_table.size(0));
  if (paged_kv_indices.device().is_cuda()) return cuda_impl::copy_page_indices(paged_kv_indices, block_table, paged_kv_indptr);
  const IndexView ip(paged_kv_indptr);
  KVATTN_CHECK(ip[0] == 0, "{}: paged_kv_indptr[0] = {} must be 0", op, ip[0]);
  for (int64_t r = 0; r < block_table.size(0); ++r) {
    const int64_t n = ip[r + 1] - ip[r];
    KVATTN_CHECK(n >= 0 && n <= block_table.size(1),
                 "{}: request {} has {} pages (paged_kv_indptr[{}] - [{}]); must be in [0, max_blocks = {}]", op, r, n,
                 r + 1, r, block_table.size(1));
  }
  KVATTN_CHECK(ip[block_table.size(0)] <= paged_kv_indices.size(0),
               "{}: paged_kv_indptr[-1] = {} exceeds paged_kv_indices' {} entries", op, ip[block_table.size(0)],
               paged_kv_indices.size(0));
  cpu::copy_page_indices(paged_kv_indices, block_table, paged_kv_indptr);
}

void mamba_align_block_table(const Tensor& out, const Tensor& block_table, const Tensor& seq_lens, int64_t block_size) {
  static constexpr const char* op = "mamba_align_block_table";
  check_dim(out, 2, op, "out", "[num_reqs, n_out]");
  check_dim(block_table, 2, op, "block_table", "[num_reqs, width]");
  check_dim(seq_lens, 1, op, "seq_lens", "[num_reqs]");
  check_index_dtype(block_table, op, "block_table");
  check_index_dtype(seq_lens, op, "seq_lens");
  KVATTN_CHECK(out.dtype() == block_table.dtype(), "{}: out dtype {} must equal block_table dtype {}", op,
               dtype_name(out.dtype()), dtype_name(block_table.dtype()));
  check_same_device(out, block_table, op, "block_table");
  check_same_device(out, seq_lens, op, "seq_lens");
  KVATTN_CHECK(seq_lens.size(0) == block_table.size(0) && out.size(0) == block_table.size(0),
               "{}: seq_lens has {} rows, block_table {} and out {}; they must agree", op, seq_lens.size(0),
               block_table.size(0), out.size(0));
  KVATTN_CHECK(block_size > 0, "{}: block_size = {} must be > 0", op, block_size);
  if (out.device().is_cuda()) return cuda_impl::mamba_align_block_table(out, block_table, seq_lens, block_size);
  const IndexView sl(seq_lens);
  for (int64_t r = 0; r < seq_lens.size(0); ++r) {
    const int64_t start = std::max<int64_t>((sl[r] - 1) / block_size, 0);
    KVATTN_CHECK(start + out.size(1) <= block_table.size(1),
                 "{}: request {} (seq_len {}) needs block-table columns [{}, {}) but the table has {}; widen the "
                 "table or lower n_out", op, r, sl[r], start, start + out.size(1), block_table.size(1));
  }
  cpu::mamba_align_block_table(out, block_table, seq_lens, block_size);
}

void kvfp8_dequant(const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables, const Tensor& k_scale,
                   const Tensor& v_scale, const Tensor& out_k_cache, const Tensor& out_v_cache) {
  static constexpr const char* op = "kvfp8_dequant";
  check_dim(k_cache, 4, op, "k_cache", "[num_pages, page_size, num_kv_heads, head_dim]");
  check_dim(v_cache, 4, op, "v_cache", "[num_pages, page_size, num_kv_heads, head_dim]");
  check_dim(block_tables, 2, op, "block_tables", "[num_reqs, pages_per_req]");
  check_dim(out_k_cache, 4, op, "out_k_cache", "[num_reqs * pages_per_req + 1, page_size, num_kv_heads, head_dim]");
  check_dim(out_v_cache, 4, op, "out_v_cache", "[num_reqs * pages_per_req + 1, page_size, num_kv_heads, head_dim]");
  check_index_dtype(block_tables, op, "block_tables");
  for (const Tensor* t : {&v_cache, &block_tables, &k_scale, &v_scale, &out_k_cache, &out_v_cache})
    check_same_device(k_cache, *t, op, "tensor");
  check_dtype_in(k_cache, {DType::fp8_e4m3, DType::fp8_e5m2}, op, "k_cache");
  KVATTN_CHECK(v_cache.dtype() == k_cache.dtype() && v_cache.shape() == k_cache.shape(),
               "{}: v_cache ({}, {}) must match k_cache ({}, {})", op, dtype_name(v_cache.dtype()),
               v_cache.shape().str(), dtype_name(k_cache.dtype()), k_cache.shape().str());
  check_dtype_in(out_k_cache, {DType::bf16, DType::f16}, op, "out_k_cache");
  KVATTN_CHECK(out_v_cache.dtype() == out_k_cache.dtype(), "{}: out_v_cache dtype differs from out_k_cache", op);
  const int64_t need = block_tables.size(0) * block_tables.size(1) + 1;
  for (const Tensor* t : {&out_k_cache, &out_v_cache})
    KVATTN_CHECK(t->size(0) >= need && t->size(1) == k_cache.size(1) && t->size(2) == k_cache.size(2) &&
                     t->size(3) == k_cache.size(3),
                 "{}: scratch cache shape {} must be [>= num_reqs * pages_per_req + 1 = {}, {}, {}, {}]", op,
                 t->shape().str(), need, k_cache.size(1), k_cache.size(2), k_cache.size(3));
  for (const auto& [t, name] : {std::pair{&k_scale, "k_scale"}, std::pair{&v_scale, "v_scale"}}) {
    check_defined(*t, op, name);
    check_dtype_in(*t, {DType::f32}, op, name);
    KVATTN_CHECK(t->numel() == 1, "{}: `{}` must hold 1 value (per-tensor scale), got shape {}", op, name,
                 t->shape().str());
  }
  if (k_cache.device().is_cuda())
    return cuda_impl::kvfp8_dequant(k_cache, v_cache, block_tables, k_scale, v_scale, out_k_cache, out_v_cache);
  const IndexView bt(block_tables);
  for (int64_t r = 0; r < block_tables.size(0); ++r)
    for (int64_t c = 0; c < block_tables.size(1); ++c)
      KVATTN_CHECK(bt.at(r, c) < k_cache.size(0), "{}: block_tables[{}, {}] = {} is outside the cache's {} pages", op,
                   r, c, bt.at(r, c), k_cache.size(0));
  cpu::kvfp8_dequant(k_cache, v_cache, block_tables, k_scale, v_scale, out_k_cache, out_v_cache);
}

Tensor make_mock_block_table(int64_t num_reqs, int64_t pages_per_req) {
  KVATTN_CHECK(num_reqs >= 0 && pages_per_req >= 0, "make_mock_block_table: sizes must be >= 0, got {} x {}",
               num_reqs, pages_per_req);
  std::vector<int32_t> v(static_cast<size_t>(num_reqs * pages_per_req));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i + 1);
  return Tensor::from_vector(v, Dims{num_reqs, pages_per_req});
}

}  // namespace kvattn::ops
