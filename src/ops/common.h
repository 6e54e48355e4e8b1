// src/ops/common.h — argument checking shared by every device, and small CPU helpers.
//
// The entry points (src/ops/<header>.cpp) call validate_*() once; the CPU reference, the
// optimised CPU path and the CUDA dispatch all rely on what those checks guarantee.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kvattn/core/tensor.h"
#include "kvattn/ops/merge_attn_states.h"
#include "kvattn/ops/paged_attention.h"
#include "kvattn/ops/reshape_and_cache.h"

namespace kvattn::ops::detail {

inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// ---- generic checks -------------------------------------------------------------------------
void check_defined(const Tensor& t, const char* op, const char* name);
void check_dim(const Tensor& t, int dims, const char* op, const char* name, const char* shape_doc);
void check_dtype_in(const Tensor& t, std::initializer_list<DType> allowed, const char* op,
                    const char* name);
void check_index_dtype(const Tensor& t, const char* op, const char* name);  // int32/int64
void check_same_device(const Tensor& ref, const Tensor& t, const char* op, const char* name);
void check_size(const Tensor& t, int d, int64_t want, const char* op, const char* name,
                const char* what);

// Reads element i of a 1-D or element (r, c) of a 2-D int32/int64 CPU tensor.
struct IndexView {
  const char* base = nullptr;
  int64_t s0 = 0, s1 = 0;  // byte strides
  int64_t n0 = 0, n1 = 0;
  bool is64 = false;
  IndexView() = default;
  explicit IndexView(const Tensor& t);
  int64_t operator[](int64_t i) const {
    const char* p = base + i * s0;
    if (is64) { int64_t v; std::memcpy(&v, p, 8); return v; }
    int32_t v; std::memcpy(&v, p, 4); return v;
  }
  int64_t at(int64_t r, int64_t c) const {
    const char* p = base + r * s0 + c * s1;
    if (is64) { int64_t v; std::memcpy(&v, p, 8); return v; }
    int32_t v; std::memcpy(&v, p, 4); return v;
  }
};

// Byte address of a strided element (CPU tensors).
inline char* elem_ptr(const Tensor& t, std::initializer_list<int64_t> idx) {
  int64_t off = 0;
  int d = 0;
  for (int64_t i : idx) off += i * t.stride(d++);
  return static_cast<char*>(t.data()) + off * t.element_size();
}

// ---- reshape_and_cache_flash ------------------------------------------------------------------
struct CacheWriteDims {
  int64_t num_tokens, num_heads, head_size, num_blocks, block_size;
  DType cache_dtype;       // fp8 element dtype for fp8 (u8 caches resolved), key dtype for auto
  bool per_head_scale;
};
CacheWriteDims validate_reshape_and_cache(const ReshapeAndCacheArgs& a);

// ---- paged_attention ---------------------------------------------------------------------------
struct AttnDims {
  int64_t num_tokens, num_qo_heads, num_kv_heads, head_dim, num_pages, page_size, batch;
  double sm_scale;  // resolved default, before q_scale * k_scale
  bool paged_form;  // true: paged indices; false: block table
};
AttnDims validate_paged_attention(const PagedAttentionArgs& a);

// The batch as the CPU reads it, with every id checked.  CPU index tensors only.
struct ResolvedBatch {
  std::vector<int64_t> q_begin;     // [batch + 1]
  std::vector<int64_t> kv_len;      // [batch]
  std::vector<int64_t> page_begin;  // [batch + 1] offsets into pages
  std::vector<int64_t> pages;       // flattened page ids, each in [0, num_pages)
};
ResolvedBatch resolve_batch(const PagedAttentionArgs& a, const AttnDims& d);

// The visibility rule of paged_attention.h for one (row, key) pair.
struct RowMask {
  int64_t qpos = 0;          // position of the query row
  int64_t kv_len = 0;
  int64_t q_len = 0;
  bool causal = true;
  int64_t window_left = -1;
  int64_t mm_start = -1, mm_end = -1;  // PrefixLM range, -1 = none
  const char* xqa_row = nullptr;       // packed mask row (int32 words), or null
  int64_t xqa_stride = 0;              // byte stride between words
  bool visible(int64_t j) const {
    if (j < 0 || j >= kv_len) return false;
    if (window_left >= 0 && j < qpos - window_left) return false;
    if (xqa_row != nullptr && j >= kv_len - q_len) {
      const int64_t k = j - (kv_len - q_len);
      uint32_t w;
      std::memcpy(&w, xqa_row + (k >> 5) * xqa_stride, 4);
      return ((w >> (k & 31)) & 1u) != 0;
    }
    if (!causal || j <= qpos) return true;
    return mm_start >= 0 && j >= mm_start && j <= mm_end;
  }
  // Keys outside [lo, hi) are never visible.
  int64_t lo() const { return window_left >= 0 ? std::max<int64_t>(0, qpos - window_left) : 0; }
  int64_t hi() const {
    if (xqa_row != nullptr || !causal) return kv_len;
    int64_t h = qpos + 1;
    if (mm_start >= 0 && mm_end + 1 > h) h = mm_end + 1;
    return std::max<int64_t>(0, std::min(h, kv_len));
  }
};
RowMask make_row_mask(const PagedAttentionArgs& a, const ResolvedBatch& b, int64_t r,
                      int64_t token);

// ---- merge_attn_states ------------------------------------------------------------------------
struct MergeDims { int64_t num_tokens, num_heads, head_dim; };
MergeDims validate_merge(const MergeAttnStatesArgs& a);
void validate_mask_empty_context_lse(const Tensor& lse, const Tensor& qsl, const Tensor& csl);

}  // namespace kvattn::ops::detail
