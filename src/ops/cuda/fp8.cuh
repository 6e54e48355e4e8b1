// src/ops/cuda/fp8.cuh — fp8 bytes -> f16 pairs in registers (e4m3 by bit placement or the sm_89+
// hardware cvt, e5m2 as the high byte of an f16), for the kernels that read fp8 pages (the fp8
// fast variant's softmax uses softmax.cuh's ex2_ftz: one MUFU.EX2, where exp2f is four
// instructions, the range check and two scalings that keep subnormal results).  Device code in the including file's anonymous namespace: each .cu that includes it
// gets its own copy, with the names it would have if written there.
#pragma once

#include <cstdint>

namespace kvattn::ops::cuda_impl::k {
namespace {

// ---------------------------------------------------------------------------------------------
// PTX wrappers (shared ones in ptx.cuh).
// Two fp8 bytes of x (chosen by `sel`, a __byte_perm selector that puts them in the high
// bytes of the two halves) -> f16x2.  e5m2 is exactly the high byte of an f16; e4m3 becomes
// value * 2^-8 (exact), which the caller folds into its scales.
// On sm_89+ e4m3 uses the hardware cvt (exact, no 2^-8 factor): kE4m3Factor says which.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define KVATTN_HW_E4M3 1
#endif
#ifdef KVATTN_HW_E4M3
constexpr float kE4m3Factor = 1.f;
#else
constexpr float kE4m3Factor = 256.f;
#endif
template <bool E4M3>
__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint32_t x, uint32_t sel) {
#ifdef KVATTN_HW_E4M3
  if constexpr (E4M3) {
    // gather the two bytes into the low 16 bits (byte order lo, hi), then cvt
    const uint32_t pair = __byte_perm(x, 0u, ((sel >> 4) & 0xf) | (((sel >> 12) & 0xf) << 4) | 0x4400u);
    uint32_t h;
    asm("{\n .reg .b16 lo;\n cvt.u16.u32 lo, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(h) : "r"(pair));
    return h;
  }
#endif
  uint32_t h = __byte_perm(x, 0u, sel);
  if constexpr (E4M3) h = ((h >> 1) & 0x3f803f80u) | (h & 0x80008000u);
  return h;
}
// fp8 fast variant (KVTraits::kFast, decode option kOptFp8Fast): the four bytes of x -> lo = f16x2(byte 0,
// byte 1), hi = f16x2(byte 2, byte 3), the same values as fp8x2_to_f16x2(x, 0x1404 / 0x3424).
// e4m3 on sm_89+: one cvt per half straight from the register's 16-bit halves (ptxas reads the
// high half in place: 2 instructions per word instead of byte_perm + cvt twice).
template <bool E4M3>
__device__ __forceinline__ void fp8x4_to_f16x2x2(uint32_t x, uint32_t& lo, uint32_t& hi) {
#ifdef KVATTN_HW_E4M3
  if constexpr (E4M3) {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(x));
    return;
  }
#endif
  lo = fp8x2_to_f16x2<E4M3>(x, 0x1404u);
  hi = fp8x2_to_f16x2<E4M3>(x, 0x3424u);
}
// fp8 fast variant, V fragments: even = f16x2(byte 0, byte 2), odd = f16x2(byte 1, byte 3) (the
// values of fp8x2_to_f16x2(x, 0x2404 / 0x3414)); e4m3 on sm_89+: one byte_perm to (0, 2, 1, 3),
// then a cvt per half (3 instructions per word instead of 4).
template <bool E4M3>
__device__ __forceinline__ void fp8x4_to_f16x2x2_eo(uint32_t x, uint32_t& even, uint32_t& odd) {
#ifdef KVATTN_HW_E4M3
  if constexpr (E4M3) {
    fp8x4_to_f16x2x2<true>(__byte_perm(x, 0u, 0x3120u), even, odd);
    return;
  }
#endif
  even = fp8x2_to_f16x2<E4M3>(x, 0x2404u);
  odd = fp8x2_to_f16x2<E4M3>(x, 0x3414u);
}

}  // namespace
}  // namespace kvattn::ops::cuda_impl::k
