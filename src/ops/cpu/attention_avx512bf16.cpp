// The attention kernel compiled for AVX2 + FMA + F16C + AVX512-BF16 (VL): as the AVX2 build,
// except that the decode kernel's bf16 query x bf16 key dot products use vdpbf16ps (two exact
// bf16 products per f32 lane, f32 accumulation) straight from the cache rows.  Chosen at run
// time when the CPU has AVX512-BF16 (Zen 4, Sapphire Rapids and later).  Vectors stay 256-bit.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cmath>

#include "ops/cpu/cpu_ops.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512bf16"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512bf16")
#endif
namespace kvattn::ops::cpu {

#define KVATTN_KERNEL_ENTRY attention_items_avx512bf16
#define KVATTN_MERGE_ENTRY attention_merge_avx512bf16
#define kvattn_cvt_bf16_8(p) \
  ((v8f)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16))
#define kvattn_zext_u8_8(p) ((v8u32)_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))))
#define kvattn_hadd8(a, b) ((v8f)_mm256_hadd_ps((__m256)(a), (__m256)(b)))
#define kvattn_fma8(a, b, c) ((v8f)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#define kvattn_cvt_f16_8(p) ((v8f)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))
// acc + the pairwise sums of the products of 16 bf16 in a and 16 in b (raw bits in v8f)
#define kvattn_dpbf16_8(acc, a, b) ((v8f)_mm256_dpbf16_ps((__m256)(acc), (__m256bh)(a), (__m256bh)(b)))
#include "ops/cpu/attention_kernel_impl.h"

}  // namespace kvattn::ops::cpu
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace kvattn::ops::cpu {
bool cpu_has_avx512bf16() {
  __builtin_cpu_init();
  return cpu_has_avx2_fma() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
}
}  // namespace kvattn::ops::cpu
#endif
