#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "kvattn/core/dtype.h"
#include "kvattn/core/error.h"

using namespace kvattn;

namespace {

// Exact oracle for "round to nearest even among a finite sorted set of representable values".
template <typename Decode>
std::vector<std::pair<double, uint8_t>> finite_codes(Decode decode) {
  std::vector<std::pair<double, uint8_t>> v;
  for (int c = 0; c < 256; ++c) {
    float f = decode(static_cast<uint8_t>(c));
    if (std::isfinite(f) && !(f == 0 && std::signbit(f))) v.emplace_back(f, static_cast<uint8_t>(c));
  }
  std::sort(v.begin(), v.end());
  return v;
}

template <typename Decode>
uint8_t oracle_encode(float x, Decode decode, float max_value) {
  if (std::isnan(x)) return 0x7f | (std::signbit(x) ? 0x80 : 0);
  const double ax = std::fabs(static_cast<double>(x));
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (ax >= max_value) {  // saturation
    for (int c = 0; c < 128; ++c)
      if (decode(static_cast<uint8_t>(c)) == max_value) return static_cast<uint8_t>(c | sign);
  }
  auto codes = finite_codes(decode);
  // positive codes only
  double best_d = 1e300;
  uint8_t best = 0;
  for (auto [v, c] : codes) {
    if (v < 0) continue;
    const double d = std::fabs(v - ax);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best_d = d;
      best = c;
    }
  }
  return static_cast<uint8_t>(best | sign);
}

}  // namespace

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4);
  EXPECT_EQ(dtype_size(DType::bf16), 2);
  EXPECT_EQ(dtype_size(DType::fp8_e4m3), 1);
  EXPECT_EQ(dtype_size(DType::i64), 8);
  for (DType t : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("half"), DType::f16);
  try {
    parse_dtype("float64");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("float64"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos);
  }
}

TEST(DType, Fp8E4m3DecodeKnownValues) {
  EXPECT_EQ(fp8_e4m3_bits_to_f32(0x00), 0.0f);
  EXPECT_EQ(fp8_e4m3_bits_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_bits_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_bits_to_f32(0xfe), -448.0f);
  EXPECT_EQ(fp8_e4m3_bits_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_bits_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_TRUE(std::isnan(fp8_e4m3_bits_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_bits_to_f32(0xff)));
  EXPECT_EQ(fp8_e4m3_bits_to_f32(0x78), 256.0f);  // exponent 15 is finite in E4M3FN
}

TEST(DType, Fp8E5m2DecodeKnownValues) {
  EXPECT_EQ(fp8_e5m2_bits_to_f32(0x3c), 1.0f);
  EXPECT_EQ(fp8_e5m2_bits_to_f32(0x7b), 57344.0f);
  EXPECT_TRUE(std::isinf(fp8_e5m2_bits_to_f32(0x7c)));
  EXPECT_TRUE(std::isnan(fp8_e5m2_bits_to_f32(0x7d)));
  EXPECT_EQ(fp8_e5m2_bits_to_f32(0x01), std::ldexp(1.0f, -16));
}

TEST(DType, Fp8RoundTripEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const float a = fp8_e4m3_bits_to_f32(code);
    if (!std::isnan(a)) {

      EXPECT_EQ(f32_to_fp8_e4m3_bits(a), code) << c;

    }
    const float b = fp8_e5m2_bits_to_f32(code);
    if (std::isfinite(b)) {

      EXPECT_EQ(f32_to_fp8_e5m2_bits(b), code) << c;

    }
  }
}

TEST(DType, Fp8EncodeMatchesNearestEvenOracle) {
  std::mt19937 rng(7);
  std::vector<float> xs = {0.0f, 1.0f, 1.0625f, 1.1875f, 1e-3f, 0.0009765625f, 0.00146484375f, 447.0f,
                           448.0f, 460.0f, 464.0f, 480.0f, 1e9f, 3e-10f, -2.5f, 57344.0f, 61440.0f,
                           std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  std::uniform_real_distribution<float> e(-22, 18);
  for (int i = 0; i < 20000; ++i) {
    float x = std::ldexp(1.0f + static_cast<float>(rng() % 4096) / 4096.0f, static_cast<int>(e(rng)));
    xs.push_back(rng() % 2 ? x : -x);
  }
  // Exact midpoints between neighbouring codes (ties go to even).
  for (int c = 0; c < 0x7e; ++c) {
    xs.push_back(0.5f * (fp8_e4m3_bits_to_f32(static_cast<uint8_t>(c)) + fp8_e4m3_bits_to_f32(static_cast<uint8_t>(c + 1))));
  }
  for (int c = 0; c < 0x7b; ++c) {
    xs.push_back(0.5f * (fp8_e5m2_bits_to_f32(static_cast<uint8_t>(c)) + fp8_e5m2_bits_to_f32(static_cast<uint8_t>(c + 1))));
  }
  for (float x : xs) {
    EXPECT_EQ(f32_to_fp8_e4m3_bits(x), oracle_encode(x, fp8_e4m3_bits_to_f32, kFp8E4m3Max)) << x;
    EXPECT_EQ(f32_to_fp8_e5m2_bits(x), oracle_encode(x, fp8_e5m2_bits_to_f32, kFp8E5m2Max)) << x;
  }
  EXPECT_EQ(f32_to_fp8_e4m3_bits(std::nanf("")) & 0x7f, 0x7f);
  EXPECT_EQ(f32_to_fp8_e5m2_bits(std::nanf("")) & 0x7f, 0x7f);
}

TEST(DType, Bf16RoundToNearestEven) {
  EXPECT_EQ(f32_to_bf16_bits(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between 1 and 1+2^-7: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);  // overflow -> inf
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::nanf("")))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = bf16_bits_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {

      EXPECT_EQ(f32_to_bf16_bits(f), h);

    }
  }
}

TEST(DType, F16MatchesCompilerConversion) {
#if defined(__FLT16_MAX__)
  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i) {
    const float f = bits_float(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    _Float16 h = static_cast<_Float16>(f);
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    ASSERT_EQ(f32_to_f16_bits(f), hb) << f;
  }
#endif
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_bits_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {

      EXPECT_EQ(f32_to_f16_bits(f), h);

    }
  }
  EXPECT_EQ(f32_to_f16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (0)
}
