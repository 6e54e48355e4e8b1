// kvattn/core/dtype.h — element types and exact software conversions.
//
// DType names the element type of a Tensor.  The 16-bit and 8-bit floating formats are
// stored as raw bits (bf16_t, f16_t, fp8_e4m3_t, fp8_e5m2_t) and converted in software with
// round-to-nearest-even, so results are identical on every CPU and match the GPU's
// conversion instructions:
//   * f16  (IEEE binary16): overflow rounds to ±inf, as IEEE (and torch) do.
//   * bf16: overflow rounds to ±inf; NaN stays NaN (quiet).
//   * fp8 e4m3 (OCP "E4M3FN": bias 7, max 448, no inf, NaN = 0x7f/0xff) and
//     fp8 e5m2 (bias 15, max 57344, has inf): conversion *saturates*: any value of magnitude
//     >= max (including ±inf) becomes ±max; NaN stays NaN.  This is what vLLM's KV-cache
//     quantisation does (values are clamped to the format's range before conversion).
// The conversion functions are usable from CUDA device code (KVATTN_HD).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#if defined(__CUDACC__)
#define KVATTN_HD __host__ __device__ __forceinline__
#else
#define KVATTN_HD inline
#endif

namespace kvattn {

enum class DType : uint8_t { f32, f16, bf16, fp8_e4m3, fp8_e5m2, u8, i8, i32, i64 };

inline constexpr DType kAllDTypes[] = {DType::f32,      DType::f16,      DType::bf16,
                                       DType::fp8_e4m3, DType::fp8_e5m2, DType::u8,
                                       DType::i8,       DType::i32,      DType::i64};

constexpr int64_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::fp8_e4m3: return 1;
    case DType::fp8_e5m2: return 1;
    case DType::u8: return 1;
    case DType::i8: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

constexpr bool dtype_is_float(DType t) noexcept {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::fp8_e4m3 ||
         t == DType::fp8_e5m2;
}
constexpr bool dtype_is_fp8(DType t) noexcept {
  return t == DType::fp8_e4m3 || t == DType::fp8_e5m2;
}

// Canonical name: "float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "uint8", "int8",
// "int32", "int64".
const char* dtype_name(DType t) noexcept;
// Accepts canonical names and the common short forms (f32/fp32/float, f16/fp16/half, bf16,
// e4m3/float8_e4m3fn, e5m2/float8_e5m2, u8, i8, i32/int, i64/long).  nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view name) noexcept;
// Like dtype_from_name but throws InvalidArgument listing the valid names.
DType parse_dtype(std::string_view name);
// "float32, float16, ..." — for error messages.
std::string valid_dtype_names();

// ---------------------------------------------------------------------------------------
// Bit-level conversions.

KVATTN_HD uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
KVATTN_HD float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bf16 <-> f32
KVATTN_HD uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
KVATTN_HD float bf16_bits_to_f32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// f16 <-> f32
KVATTN_HD uint16_t f32_to_f16_bits(float f) {
  uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  if (u >= 0x7f800000u) return static_cast<uint16_t>(sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (u >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (u < 0x38800000u) {
    // Subnormal (or zero) in f16: let the FPU round by aligning the f16 ulp (2^-24) to the
    // float ulp of 0.5.
    const float t = bits_float(u) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(t) - 0x3f000000u));
  }
  const uint32_t odd = (u >> 13) & 1u;
  u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;
  return static_cast<uint16_t>(sign | (u >> 13));
}
KVATTN_HD float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: man * 2^-24
    const float v = static_cast<float>(man) * 5.9604644775390625e-08f;
    return bits_float(float_bits(v) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (man << 13));
  return bits_float(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

// Generic small float encoder: EXP exponent bits, MAN mantissa bits, bias 2^(EXP-1)-1,
// saturating to max_code; NaN -> nan_code.  Round-to-nearest-even.
template <int EXP, int MAN>
KVATTN_HD uint8_t f32_to_small_float(float f, uint32_t max_code, uint32_t nan_code, float max_value) {
  constexpr int kBias = (1 << (EXP - 1)) - 1;
  uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return static_cast<uint8_t>(sign | nan_code);
  const float a = bits_float(u);
  if (a >= max_value) return static_cast<uint8_t>(sign | max_code);
  // Smallest normal is 2^(1-bias).
  if (u < static_cast<uint32_t>(127 + 1 - kBias) << 23) {
    // Subnormal: value = q * 2^(1-bias-MAN).  Scaling by a power of two is exact; adding
    // the magic 2^23 makes the FPU round q to an integer with round-to-nearest-even.
    const float scaled = a * bits_float(static_cast<uint32_t>(127 - (1 - kBias - MAN)) << 23);
    const float r = (scaled + 8388608.0f) - 8388608.0f;
    return static_cast<uint8_t>(sign | static_cast<uint32_t>(r));
  }
  constexpr int kShift = 23 - MAN;
  const uint32_t odd = (u >> kShift) & 1u;
  u += ((1u << (kShift - 1)) - 1u) + odd;
  uint32_t code = (u >> kShift) - (static_cast<uint32_t>(127 - kBias) << MAN);
  if (code > max_code) code = max_code;
  return static_cast<uint8_t>(sign | code);
}

template <int EXP, int MAN>
KVATTN_HD float small_float_to_f32(uint8_t c, bool has_inf) {
  constexpr int kBias = (1 << (EXP - 1)) - 1;
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t exp = (c >> MAN) & ((1u << EXP) - 1u);
  const uint32_t man = c & ((1u << MAN) - 1u);
  if (exp == 0) {
    const float v = static_cast<float>(man) * bits_float(static_cast<uint32_t>(127 + 1 - kBias - MAN) << 23);
    return bits_float(float_bits(v) | sign);
  }
  if (exp == (1u << EXP) - 1u) {
    if (has_inf) return bits_float(sign | (man == 0 ? 0x7f800000u : 0x7fc00000u));
    if (man == (1u << MAN) - 1u) return bits_float(sign | 0x7fc00000u);
  }
  return bits_float(sign | ((exp + 127 - kBias) << 23) | (man << (23 - MAN)));
}

inline constexpr float kFp8E4m3Max = 448.0f;
inline constexpr float kFp8E5m2Max = 57344.0f;

KVATTN_HD uint8_t f32_to_fp8_e4m3_bits(float f) { return f32_to_small_float<4, 3>(f, 0x7eu, 0x7fu, kFp8E4m3Max); }
KVATTN_HD float fp8_e4m3_bits_to_f32(uint8_t c) { return small_float_to_f32<4, 3>(c, false); }
KVATTN_HD uint8_t f32_to_fp8_e5m2_bits(float f) { return f32_to_small_float<5, 2>(f, 0x7bu, 0x7fu, kFp8E5m2Max); }
KVATTN_HD float fp8_e5m2_bits_to_f32(uint8_t c) { return small_float_to_f32<5, 2>(c, true); }

// Storage types: raw bits with explicit conversions.
struct bf16_t {
  uint16_t bits;
  static KVATTN_HD bf16_t from_float(float f) { return bf16_t{f32_to_bf16_bits(f)}; }
  KVATTN_HD float to_float() const { return bf16_bits_to_f32(bits); }
};
struct f16_t {
  uint16_t bits;
  static KVATTN_HD f16_t from_float(float f) { return f16_t{f32_to_f16_bits(f)}; }
  KVATTN_HD float to_float() const { return f16_bits_to_f32(bits); }
};
struct fp8_e4m3_t {
  uint8_t bits;
  static KVATTN_HD fp8_e4m3_t from_float(float f) { return fp8_e4m3_t{f32_to_fp8_e4m3_bits(f)}; }
  KVATTN_HD float to_float() const { return fp8_e4m3_bits_to_f32(bits); }
};
struct fp8_e5m2_t {
  uint8_t bits;
  static KVATTN_HD fp8_e5m2_t from_float(float f) { return fp8_e5m2_t{f32_to_fp8_e5m2_bits(f)}; }
  KVATTN_HD float to_float() const { return fp8_e5m2_bits_to_f32(bits); }
};

// Map a C++ element type to its DType (for typed accessors).
template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<f16_t> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<bf16_t> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<fp8_e4m3_t> { static constexpr DType value = DType::fp8_e4m3; };
template <> struct dtype_of<fp8_e5m2_t> { static constexpr DType value = DType::fp8_e5m2; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::i8; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <typename T> inline constexpr DType dtype_of_v = dtype_of<T>::value;

// Read one element of dtype `t` at `p` as double / write a double with the dtype's rounding
// (integers: truncation toward zero after range clamp is *not* applied — callers pass exact
// integers).  Used by element access, copies and test oracles; not for hot loops.
double load_as_double(const void* p, DType t) noexcept;
void store_from_double(void* p, DType t, double v) noexcept;

}  // namespace kvattn
