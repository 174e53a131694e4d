// Tests for formats/dtypes.h: exhaustive over the 8-bit and 4-bit codes; expected values come from
// the format definitions (spec §2.1, §3), computed here independently of the code under test.
#include "formats/dtypes.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

namespace spw {
namespace {

// e4m3fn by definition: sign, 4-bit exponent (bias 7), 3-bit mantissa; exponent 0 is subnormal.
double e4m3_definition(int code) {
  int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  double mag = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -mag : mag;
}

bool is_e4m3_nan(int code) { return (code & 0x7f) == 0x7f; }

TEST(DTypes, NamesSizesRoundTrip) {
  const std::vector<std::pair<DType, size_t>> all = {
      {DType::BF16, 2}, {DType::F16, 2}, {DType::F32, 4}, {DType::F64, 8}, {DType::I8, 1}, {DType::U8, 1},
      {DType::I16, 2}, {DType::I32, 4}, {DType::I64, 8}, {DType::BOOL, 1}, {DType::F8_E4M3, 1}, {DType::F8_E8M0, 1}};
  for (auto [dtype, nbytes] : all) {
    EXPECT_EQ(dtype_nbytes(dtype), nbytes);
    EXPECT_EQ(dtype_from_name(dtype_name(dtype)), dtype);
  }
  EXPECT_EQ(dtype_name(DType::F8_E4M3), "F8_E4M3");
  EXPECT_EQ(dtype_name(DType::F8_E8M0), "F8_E8M0");
  EXPECT_FALSE(dtype_from_name("F8_E5M2").has_value());
  EXPECT_FALSE(dtype_from_name("bf16").has_value());
  EXPECT_FALSE(dtype_from_name("").has_value());
}

// The batch conversion (F16C where present) against the scalar one, on every fp16 code, at lengths that
// exercise the 8-wide body and the scalar tail, from unaligned starts.
TEST(DTypes, F16BatchMatchesScalarOnEveryCode) {
  std::vector<uint16_t> codes(65536 + 7);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint16_t>(i);
  for (size_t offset : {0, 1, 5}) {
    const size_t n = 65536 + 7 - offset - (offset ? 1 : 0);
    std::vector<float> out(n + 1, 12345.0f);
    f16_to_f32_n(codes.data() + offset, out.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const float want = f16_to_f32(codes[offset + i]);
      if (std::isnan(want))
        ASSERT_TRUE(std::isnan(out[i])) << "code " << codes[offset + i];
      else
        ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(want)) << "code " << codes[offset + i];
    }
    EXPECT_EQ(out[n], 12345.0f) << "wrote past n";
  }
  f16_to_f32_n(nullptr, nullptr, 0);  // empty is fine
}

TEST(DTypes, E4m3DecodeAllCodes) {
  for (int c = 0; c < 256; ++c) {
    float v = e4m3_to_f32(static_cast<uint8_t>(c));
    if (is_e4m3_nan(c)) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(v, static_cast<float>(e4m3_definition(c))) << c;
  }
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0.001953125f);  // 2^-9, smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), 0.015625f);     // 2^-6, smallest normal
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
}

TEST(DTypes, E4m3EncodeRoundTripsEveryCode) {
  for (int c = 0; c < 256; ++c) {
    if (is_e4m3_nan(c)) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(c))), c) << c;
  }
  EXPECT_TRUE(std::isnan(e4m3_to_f32(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()))));
}

// Between every pair of adjacent non-negative codes: the midpoint goes to the even code, and one
// f32 ulp either side goes to the nearer code.
TEST(DTypes, E4m3RoundsToNearestEvenBetweenAdjacentCodes) {
  for (int c = 0; c < 0x7e; ++c) {
    for (float sign : {1.0f, -1.0f}) {
      float lo = static_cast<float>(e4m3_definition(c)), hi = static_cast<float>(e4m3_definition(c + 1));
      float mid = (lo + hi) / 2;  // exact: both have few mantissa bits
      int even = (c % 2 == 0) ? c : c + 1;
      int sign_bit = sign < 0 ? 0x80 : 0;
      EXPECT_EQ(f32_to_e4m3(sign * mid), even | sign_bit) << c;
      EXPECT_EQ(f32_to_e4m3(sign * std::nextafter(mid, 0.0f)), c | sign_bit) << c;
      EXPECT_EQ(f32_to_e4m3(sign * std::nextafter(mid, 1e9f)), (c + 1) | sign_bit) << c;
    }
  }
}

TEST(DTypes, E4m3Saturates) {
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(449.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7e);  // would be the tie toward the (NaN) code 0x7f
  EXPECT_EQ(f32_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-500.0f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
}

TEST(DTypes, E4m3Underflow) {
  EXPECT_EQ(f32_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);                          // half of 2^-9: tie → 0
  EXPECT_EQ(f32_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);   // just above → 2^-9
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);      // f32 denormal input
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::denorm_min()), 0x80);
  EXPECT_EQ(f32_to_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);                     // 1.5 steps: tie → even 2
}

TEST(DTypes, E8m0AllCodes) {
  for (int c = 0; c < 255; ++c) {
    EXPECT_EQ(e8m0_to_f32(static_cast<uint8_t>(c)), static_cast<float>(std::pow(2.0, c - 127))) << c;
  }
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));  // an f32 denormal, still exact
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
}

TEST(DTypes, E2m1AllNibbles) {
  const float magnitudes[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int n = 0; n < 16; ++n) {
    float expected = (n & 8) ? -magnitudes[n & 7] : magnitudes[n & 7];
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(n)), expected) << n;
    EXPECT_EQ(f32_to_e2m1(expected), n == 8 ? 8 : n) << n;  // -0 keeps its sign bit
  }
}

TEST(DTypes, E2m1TieRules) {
  // The spec's list (§3): ties go to the even code.
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(0.25f)), 0.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(0.75f)), 1.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(1.25f)), 1.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(1.75f)), 2.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(2.5f)), 2.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(3.5f)), 4.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(5.0f)), 4.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(-5.0f)), -4.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(-0.75f)), -1.0f);
  // Just off the ties: nearest.
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(std::nextafter(0.25f, 1.0f))), 0.5f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(std::nextafter(5.0f, 9.0f))), 6.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(std::nextafter(2.5f, 9.0f))), 3.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(std::nextafter(2.5f, 0.0f))), 2.0f);
}

TEST(DTypes, E2m1Saturates) {
  EXPECT_EQ(f32_to_e2m1(6.0f), 0x7);
  EXPECT_EQ(f32_to_e2m1(7.0f), 0x7);
  EXPECT_EQ(f32_to_e2m1(1e30f), 0x7);
  EXPECT_EQ(f32_to_e2m1(-100.0f), 0xf);
  EXPECT_EQ(f32_to_e2m1(std::numeric_limits<float>::infinity()), 0x7);
  EXPECT_EQ(f32_to_e2m1(std::numeric_limits<float>::denorm_min()), 0x0);
}

TEST(DTypes, Bf16DecodeAndExactRoundTrip) {
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(bf16_to_f32(0x0001), std::bit_cast<float>(0x00010000u));  // bf16 denormal
  EXPECT_TRUE(std::isinf(bf16_to_f32(0x7f80)));
  // Every non-NaN bf16 value survives f32 → bf16 unchanged.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float v = bf16_to_f32(static_cast<uint16_t>(b));
    if (std::isnan(v)) continue;
    ASSERT_EQ(f32_to_bf16(v), b) << b;
  }
}

TEST(DTypes, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81): tie → even.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3·2^-8 is between 0x3f81 (odd) and 0x3f82 (even): tie → 0x3f82.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(-(1.0f + std::ldexp(1.0f, -8))), 0xbf80);
  // Largest finite f32 rounds up to infinity (RNE overflow), as a hardware cast does.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  // f32 denormal: rounds on the same bit pattern.
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x00008000u)), 0x0000);  // tie → even 0
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x00018000u)), 0x0002);  // tie → even 2
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x00008001u)), 0x0001);
  EXPECT_EQ(round_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
}

TEST(DTypes, Bf16NaNStaysNaN) {
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload lives only in the low 16 bits must not become infinity.
  float low_payload_nan = std::bit_cast<float>(0x7f800001u);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(low_payload_nan))));
  float neg_nan = std::bit_cast<float>(0xff800001u);
  EXPECT_TRUE(std::isnan(round_bf16(neg_nan)));
  EXPECT_EQ(f32_to_bf16(neg_nan) & 0x8000, 0x8000);
}

TEST(DTypes, F16Decode) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x03ff), 1023 * std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_LT(f16_to_f32(0xfc00), 0.0f);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
}

TEST(DTypes, Pow2CeilExactPowersAndJustAbove) {
  for (int e = -126; e <= 127; ++e) {
    float p = std::ldexp(1.0f, e);
    EXPECT_EQ(pow2_ceil(p), p) << e;
    if (e < 127) {
      EXPECT_EQ(pow2_ceil(std::nextafter(p, 1e38f)), 2 * p) << e;
    }
    if (e > -126) {
      EXPECT_EQ(pow2_ceil(std::nextafter(p, 0.0f)), p) << e;  // just below stays
    }
  }
  EXPECT_EQ(pow2_ceil(3.0f), 4.0f);
  EXPECT_EQ(pow2_ceil(0.3f), 0.5f);
  EXPECT_EQ(pow2_ceil(1e-4f / 448.0f), std::ldexp(1.0f, -22));
}

TEST(DTypes, Pow2CeilDenormalsFollowTheBitFormula) {
  // The reference reads the biased exponent (0 for denormals) as −127, +1 for a non-zero mantissa:
  // every positive denormal maps to 2^-126.
  EXPECT_EQ(pow2_ceil(std::numeric_limits<float>::denorm_min()), std::ldexp(1.0f, -126));
  EXPECT_EQ(pow2_ceil(std::ldexp(1.0f, -127)), std::ldexp(1.0f, -126));
}

}  // namespace
}  // namespace spw
