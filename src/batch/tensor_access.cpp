#include "kvattn/batch/tensor_access.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <utility>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define KVATTN_HAVE_AVX2_PATH 1
#endif

namespace kvattn {
namespace {

template <typename T>
std::span<T> host_span(const Tensor& t, const char* what) {
  KVATTN_CHECK(t.defined(), "{} is undefined; pass a 1-D {} CPU tensor", what,
               dtype_name(dtype_of_v<T>));
  KVATTN_CHECK(t.dtype() == dtype_of_v<T>, "{} has dtype {}, expected {}; convert it with .to()",
               what, dtype_name(t.dtype()), dtype_name(dtype_of_v<T>));
  KVATTN_CHECK(t.device().is_cpu(), "{} lives on {}; host batch helpers read CPU tensors (pass the "
               "_cpu copy)", what, t.device().str());
  KVATTN_CHECK(t.dim() == 1, "{} must be 1-D, got shape {}", what, t.shape().str());
  KVATTN_CHECK(t.numel() <= 1 || t.stride(0) == 1,
               "{} must be contiguous (stride 1), got stride {}; call .contiguous()", what,
               t.stride(0));
  return {t.data_ptr<T>(), static_cast<size_t>(t.numel())};
}

}  // namespace

std::span<int32_t> host_i32_span(const Tensor& t, const char* what) {
  return host_span<int32_t>(t, what);
}
std::span<int64_t> host_i64_span(const Tensor& t, const char* what) {
  return host_span<int64_t>(t, what);
}

BlockTableView host_block_table(const Tensor& t, const char* what) {
  KVATTN_CHECK(t.defined(), "{} is undefined; pass a [num_reqs, max_blocks] int32 CPU tensor", what);
  KVATTN_CHECK(t.dtype() == DType::i32, "{} has dtype {}, expected int32", what,
               dtype_name(t.dtype()));
  KVATTN_CHECK(t.device().is_cpu(), "{} lives on {}; host batch helpers read CPU tensors", what,
               t.device().str());
  KVATTN_CHECK(t.dim() == 2, "{} must be 2-D [num_reqs, max_blocks], got shape {}", what,
               t.shape().str());
  BlockTableView v;
  v.data = t.data_ptr<int32_t>();
  v.num_rows = t.size(0);
  v.width = t.size(1);
  v.row_stride = t.stride(0);
  v.col_stride = t.stride(1);
  return v;
}

uint32_t block_id_limit(int64_t num_blocks) noexcept {
  return num_blocks > 0 && num_blocks <= INT32_MAX ? static_cast<uint32_t>(num_blocks)
                                                   : uint32_t{0x80000000u};
}

namespace {

// Portable form: scalar compares with the baseline ISA.
inline uint32_t copy_row_max(int32_t* __restrict dst, const int32_t* __restrict src, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t v = static_cast<uint32_t>(src[i]);
    dst[i] = static_cast<int32_t>(v);
    m = std::max(m, v);
  }
  return m;
}

int64_t gather_generic(int32_t* __restrict dst, const int32_t* __restrict table, int64_t row_stride,
                       int64_t col0, const int32_t* indptr, int64_t num_rows, uint32_t limit) {
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t start = indptr[r];
    if (copy_row_max(dst + start, table + r * row_stride + col0, indptr[r + 1] - start) >=
        limit) [[unlikely]]
      return r;
  }
  return -1;
}

#ifdef KVATTN_HAVE_AVX2_PATH
// 8 ids per step; the ragged end is one more (overlapping) 8-wide step, so a row of 35 ids is
// five loads and stores, no scalar tail.  Rows shorter than 8 take the scalar loop.
__attribute__((target("avx2"))) inline uint32_t copy_row_max_avx2(int32_t* __restrict dst,
                                                                   const int32_t* __restrict src,
                                                                   int64_t n) {
  if (n < 8) {
    uint32_t m = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t v = static_cast<uint32_t>(src[i]);
      dst[i] = static_cast<int32_t>(v);
      m = m > v ? m : v;
    }
    return m;
  }
  __m256i m = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), v);
    m = _mm256_max_epu32(m, v);
  }
  if (i < n) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + n - 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + n - 8), v);
    m = _mm256_max_epu32(m, v);
  }
  __m128i x = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  x = _mm_max_epu32(x, _mm_shuffle_epi32(x, 0x4e));
  x = _mm_max_epu32(x, _mm_shuffle_epi32(x, 0xb1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(x));
}

__attribute__((target("avx2"))) int64_t gather_avx2(int32_t* __restrict dst,
                                                     const int32_t* __restrict table,
                                                     int64_t row_stride, int64_t col0,
                                                     const int32_t* indptr, int64_t num_rows,
                                                     uint32_t limit) {
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t start = indptr[r];
    if (copy_row_max_avx2(dst + start, table + r * row_stride + col0, indptr[r + 1] - start) >=
        limit) [[unlikely]]
      return r;
  }
  return -1;
}

__attribute__((target("avx2"))) void swap_avx2(int32_t* __restrict a, int32_t* __restrict b,
                                                int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i));
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a + i), y);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + i), x);
  }
  for (; i < n; ++i) std::swap(a[i], b[i]);
}

// Static-initialisation order: a call before this is set takes the portable path (still correct).
const bool kHasAvx2 = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") != 0;
}();
#endif

}  // namespace

bool host_has_avx2() noexcept {
#ifdef KVATTN_HAVE_AVX2_PATH
  return kHasAvx2;
#else
  return false;
#endif
}

void swap_block_ids(int32_t* __restrict a, int32_t* __restrict b, int64_t n) noexcept {
#ifdef KVATTN_HAVE_AVX2_PATH
  if (kHasAvx2) return swap_avx2(a, b, n);
#endif
  for (int64_t i = 0; i < n; ++i) std::swap(a[i], b[i]);
}

int64_t gather_block_rows(int32_t* __restrict dst, const int32_t* __restrict table,
                          int64_t row_stride, int64_t col0, const int32_t* indptr,
                          int64_t num_rows, uint32_t limit) noexcept {
#ifdef KVATTN_HAVE_AVX2_PATH
  if (kHasAvx2) return gather_avx2(dst, table, row_stride, col0, indptr, num_rows, limit);
#endif
  return gather_generic(dst, table, row_stride, col0, indptr, num_rows, limit);
}

}  // namespace kvattn
