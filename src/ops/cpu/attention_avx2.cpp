// The attention kernel compiled for AVX2 + FMA + F16C (chosen at run time when the CPU has
// them).  Every header is included before the target pragma, so only this file's own
// (internal-linkage) functions carry AVX2 code.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#if defined(__clang__)
#include <cpuid.h>
#endif

#include <cmath>

#include "ops/cpu/cpu_ops.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace kvattn::ops::cpu {

#define KVATTN_KERNEL_ENTRY attention_items_avx2
#define KVATTN_MERGE_ENTRY attention_merge_avx2
// bf16 -> f32 is a 16-bit left shift of the zero-extended bits (one vpmovzxwd + one vpslld)
#define kvattn_cvt_bf16_8(p) \
  ((v8f)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16))
#define kvattn_zext_u8_8(p) ((v8u32)_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))))
#define kvattn_hadd8(a, b) ((v8f)_mm256_hadd_ps((__m256)(a), (__m256)(b)))
#define kvattn_fma8(a, b, c) ((v8f)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#define kvattn_cvt_f16_8(p) ((v8f)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))
#include "ops/cpu/attention_kernel_impl.h"

}  // namespace kvattn::ops::cpu
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace kvattn::ops::cpu {
bool cpu_has_avx2_fma() {
  __builtin_cpu_init();
#if defined(__clang__)
  // clang 14's __builtin_cpu_supports does not know "f16c": read CPUID leaf 1 (ECX bit 29).
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
#else
  const bool f16c = __builtin_cpu_supports("f16c");
#endif
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}
}  // namespace kvattn::ops::cpu
#endif
