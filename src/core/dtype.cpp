#include "kvattn/core/dtype.h"

#include <fmt/format.h>

#include <cmath>

#include "kvattn/core/error.h"

namespace kvattn {

const char* dtype_name(DType t) noexcept {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::fp8_e5m2: return "fp8_e5m2";
    case DType::u8: return "uint8";
    case DType::i8: return "int8";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view n) noexcept {
  struct Alias { std::string_view name; DType t; };
  static constexpr Alias kAliases[] = {
      {"float32", DType::f32},       {"f32", DType::f32},           {"fp32", DType::f32},
      {"float", DType::f32},         {"float16", DType::f16},       {"f16", DType::f16},
      {"fp16", DType::f16},          {"half", DType::f16},          {"bfloat16", DType::bf16},
      {"bf16", DType::bf16},         {"fp8_e4m3", DType::fp8_e4m3}, {"e4m3", DType::fp8_e4m3},
      {"float8_e4m3fn", DType::fp8_e4m3}, {"fp8_e5m2", DType::fp8_e5m2}, {"e5m2", DType::fp8_e5m2},
      {"float8_e5m2", DType::fp8_e5m2}, {"uint8", DType::u8},       {"u8", DType::u8},
      {"int8", DType::i8},           {"i8", DType::i8},             {"int32", DType::i32},
      {"i32", DType::i32},           {"int", DType::i32},           {"int64", DType::i64},
      {"i64", DType::i64},           {"long", DType::i64},
  };
  for (const auto& a : kAliases)
    if (a.name == n) return a.t;
  return std::nullopt;
}

std::string valid_dtype_names() {
  std::string s;
  for (DType t : kAllDTypes) {
    if (!s.empty()) s += ", ";
    s += dtype_name(t);
  }
  return s;
}

DType parse_dtype(std::string_view name) {
  if (auto t = dtype_from_name(name)) return *t;
  throw InvalidArgument(fmt::format("unknown dtype '{}'; valid dtypes: {}", name, valid_dtype_names()));
}

double load_as_double(const void* p, DType t) noexcept {
  switch (t) {
    case DType::f32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::f16: { uint16_t v; std::memcpy(&v, p, 2); return f16_bits_to_f32(v); }
    case DType::bf16: { uint16_t v; std::memcpy(&v, p, 2); return bf16_bits_to_f32(v); }
    case DType::fp8_e4m3: return fp8_e4m3_bits_to_f32(*static_cast<const uint8_t*>(p));
    case DType::fp8_e5m2: return fp8_e5m2_bits_to_f32(*static_cast<const uint8_t*>(p));
    case DType::u8: return *static_cast<const uint8_t*>(p);
    case DType::i8: return *static_cast<const int8_t*>(p);
    case DType::i32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::i64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
  }
  return 0.0;
}

void store_from_double(void* p, DType t, double v) noexcept {
  switch (t) {
    case DType::f32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); return; }
    case DType::f16: { uint16_t h = f32_to_f16_bits(static_cast<float>(v)); std::memcpy(p, &h, 2); return; }
    case DType::bf16: { uint16_t h = f32_to_bf16_bits(static_cast<float>(v)); std::memcpy(p, &h, 2); return; }
    case DType::fp8_e4m3: *static_cast<uint8_t*>(p) = f32_to_fp8_e4m3_bits(static_cast<float>(v)); return;
    case DType::fp8_e5m2: *static_cast<uint8_t*>(p) = f32_to_fp8_e5m2_bits(static_cast<float>(v)); return;
    case DType::u8: *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v); return;
    case DType::i8: *static_cast<int8_t*>(p) = static_cast<int8_t>(v); return;
    case DType::i32: { int32_t i = static_cast<int32_t>(v); std::memcpy(p, &i, 4); return; }
    case DType::i64: { int64_t i = static_cast<int64_t>(v); std::memcpy(p, &i, 8); return; }
  }
}

}  // namespace kvattn
