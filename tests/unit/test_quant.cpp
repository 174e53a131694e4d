// Tests for formats/quant.h. Expected values are worked out by hand from the spec's definitions
// (specs/deepseek-v4.md §2.1, §3); each block's derivation is written next to it.
#include "formats/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "formats/dtypes.h"

namespace spw {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed, float spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-spread, spread);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng) * std::exp2(exponent(rng));
  return x;
}

void expect_bf16_exact(const std::vector<float>& x) {
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(round_bf16(x[i]), x[i]) << i;
}

using FakeQuant = void (*)(float*, size_t, size_t);

void expect_idempotent_and_bf16(FakeQuant fq, size_t block, float spread) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::vector<float> once = random_values(block * 16, seed, spread);
    fq(once.data(), once.size(), block);
    expect_bf16_exact(once);
    std::vector<float> twice = once;
    fq(twice.data(), twice.size(), block);
    ASSERT_EQ(once, twice) << "seed " << seed;
  }
}

TEST(Quant, Fp8HandBlocks) {
  std::vector<float> x = {
      // amax 3.5: s = pow2ceil(3.5/448 = 2^-7) = 2^-7; x/s = 448, 128, -38.4, 8.96;
      // e4m3 (step 4 in [32,64), step 1 in [8,16)): 448, 128, -40, 9.
      3.5f, 1.0f, -0.3f, 0.07f,
      // amax 1000: 1000/448 ≈ 2.23 → s = 4; x/s = 250, -1.25, 0, 5e-4;
      // e4m3: 250 → 256 (step 16 in [128,256)), -1.25 exact, 5e-4 < 2^-10 → 0.
      1000.0f, -5.0f, 0.0f, 2e-3f,
      // amax 1e-6 < floor 1e-4: s = pow2ceil(1e-4/448 ≈ 2.2e-7) = 2^-22; x/s = 4.194304 → 4 (step 0.5).
      1e-6f, 0.0f, 0.0f, 0.0f,
  };
  fake_quant_fp8(x.data(), x.size(), 4);
  const float k = std::ldexp(1.0f, -7);
  std::vector<float> expected = {448 * k, 128 * k, -40 * k, 9 * k,  //
                                 1024.0f, -5.0f, 0.0f, 0.0f,         //
                                 4 * std::ldexp(1.0f, -22), 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(x, expected);
}

TEST(Quant, Fp8AmaxAt448TimesPowerOfTwoKeepsThatScale) {
  // a = 448·2^3: a·fp32(1/448) rounds to exactly 2^3 (checked by hand: 448·fp32(1/448) = 1 in fp32),
  // so s = 8 and 3584 maps to 448·8 with no clamp.
  std::vector<float> x = {3584.0f, -3584.0f, 8.0f, 12.0f};
  fake_quant_fp8(x.data(), x.size(), 4);
  EXPECT_EQ(x, (std::vector<float>{3584.0f, -3584.0f, 8.0f, 12.0f}));
}

TEST(Quant, Fp8IdempotentAndBf16) { expect_idempotent_and_bf16(fake_quant_fp8, 32, 20.0f); }

TEST(Quant, Fp4Ue8m0HandBlocks) {
  std::vector<float> x = {
      // amax 3: 3/6 = 0.5 → s = 0.5; x/s = 6, -2.2, 0.4, 1.5 → e2m1 6, -2, 0.5, 1.5.
      3.0f, -1.1f, 0.2f, 0.75f,
      // amax 7: 7/6 ≈ 1.17 → s = 2; x/s = 3.5, 0.5, -1.45, 0.15 → 4 (tie to even), 0.5, -1.5, 0.
      7.0f, 1.0f, -2.9f, 0.3f,
      // all zero: a = 6·2^-126 → s = 2^-126; stays zero.
      0.0f, 0.0f, 0.0f, 0.0f,
  };
  fake_quant_fp4_ue8m0(x.data(), x.size(), 4);
  std::vector<float> expected = {3.0f, -1.0f, 0.25f, 0.75f, 8.0f, 1.0f, -3.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(x, expected);
}

TEST(Quant, Fp4Ue8m0TinyBlockUsesFloor) {
  // amax 2^-130 < 6·2^-126: s = 2^-126; x/s = 2^-4 → e2m1 0; and 2^-127 → x/s = 0.5 → 0.5·2^-126.
  std::vector<float> x = {std::ldexp(1.0f, -130), std::ldexp(1.0f, -127)};
  fake_quant_fp4_ue8m0(x.data(), x.size(), 2);
  EXPECT_EQ(x[0], 0.0f);
  EXPECT_EQ(x[1], std::ldexp(1.0f, -127));
}

TEST(Quant, Fp4Ue8m0IdempotentAndBf16) { expect_idempotent_and_bf16(fake_quant_fp4_ue8m0, 32, 30.0f); }

TEST(Quant, Fp4E4m3HandBlocks) {
  std::vector<float> x = {
      // amax 3: 3/6 = 0.5 → e4m3 0.5 → s = 0.5; x/s = 6, -2, 1, 0.2 → 6, -2, 1, 0.
      3.0f, -1.0f, 0.5f, 0.1f,
      // amax 4.2: 4.2/6 = 0.7 → e4m3 (step 1/16 in [0.5,1)): 11.2 → 11/16 = 0.6875 = s;
      // x/s = 6.11 (clamped to 6), 1.4545, -2.909, 0.509 → 6, 1.5, -3, 0.5.
      4.2f, 1.0f, -2.0f, 0.35f,
      // amax 0.01 < 6·2^-9: a/6 = 2^-9 → s = 2^-9 (smallest e4m3 subnormal);
      // x/s = 5.12, 1.536, 0, -0.256 → 6, 1.5, 0, -0.5.
      0.01f, 0.003f, 0.0f, -0.0005f,
  };
  fake_quant_fp4_e4m3(x.data(), x.size(), 4);
  const float s = 0.6875f, t = std::ldexp(1.0f, -9);
  std::vector<float> expected = {3.0f, -1.0f, 0.5f, 0.0f,                 //
                                 6 * s, 1.5f * s, -3 * s, 0.5f * s,      //
                                 6 * t, 1.5f * t, 0.0f, -0.5f * t};
  EXPECT_EQ(x, expected);
}

TEST(Quant, Fp4E4m3IdempotentAndBf16) { expect_idempotent_and_bf16(fake_quant_fp4_e4m3, 16, 20.0f); }

TEST(Quant, DequantFp8BlocksRaggedShape) {
  // [3, 5] with block 2: scale shape [ceil(3/2), ceil(5/2)] = [2, 3].
  const size_t rows = 3, cols = 5, block = 2;
  // e4m3 codes: 0x38 = 1, 0x40 = 2, 0xb8 = -1, 0x3c = 1.5, 0x01 = 2^-9, 0x7e = 448.
  const std::vector<uint8_t> q = {0x38, 0x40, 0xb8, 0x3c, 0x01,  //
                                  0x40, 0x38, 0x3c, 0xb8, 0x7e,  //
                                  0x01, 0x7e, 0x38, 0x40, 0xb8};
  // e8m0 codes: 127 = 1, 128 = 2, 126 = 0.5, 130 = 8, 120 = 2^-7, 131 = 16.
  const std::vector<uint8_t> scale = {127, 128, 126,  //
                                      130, 120, 131};
  const std::vector<float> value = {1.0f, 2.0f, -1.0f, 1.5f, 0.001953125f,  //
                                    2.0f, 1.0f, 1.5f, -1.0f, 448.0f,        //
                                    0.001953125f, 448.0f, 1.0f, 2.0f, -1.0f};
  const std::vector<float> tile_scale = {1, 1, 2, 2, 0.5f,  //
                                         1, 1, 2, 2, 0.5f,  //
                                         8, 8, 0.0078125f, 0.0078125f, 16};
  std::vector<uint16_t> out(rows * cols, 0xffff);
  dequant_fp8_blocks(q.data(), scale.data(), rows, cols, block, out.data());
  for (size_t i = 0; i < rows * cols; ++i) {
    EXPECT_EQ(bf16_to_f32(out[i]), value[i] * tile_scale[i]) << i;
  }
  EXPECT_EQ(out[0], 0x3f80);  // 1.0 in bf16
}

TEST(Quant, DequantMxfp4NibbleOrder) {
  const size_t rows = 2, cols = 64;
  std::vector<uint8_t> packed(rows * cols / 2, 0x00);
  packed[0] = 0x72;   // element 0 = low nibble 2 (1.0), element 1 = high nibble 7 (6.0)
  packed[1] = 0x9d;   // element 2 = 0xd (-3.0), element 3 = 0x9 (-0.5)
  packed[16] = 0x15;  // element 32 = 5 (3.0), element 33 = 1 (0.5) — second scale block
  packed[32] = 0xf4;  // row 1, element 0 = 4 (2.0), element 1 = 0xf (-6.0)
  // scale [2, 2]: row 0 = {1, 4}, row 1 = {2^-3, 1}.
  const std::vector<uint8_t> scale = {127, 129, 124, 127};
  std::vector<uint16_t> out(rows * cols, 0xffff);
  dequant_mxfp4(packed.data(), scale.data(), rows, cols, out.data());
  auto at = [&](size_t i, size_t j) { return bf16_to_f32(out[i * cols + j]); };
  EXPECT_EQ(at(0, 0), 1.0f);
  EXPECT_EQ(at(0, 1), 6.0f);
  EXPECT_EQ(at(0, 2), -3.0f);
  EXPECT_EQ(at(0, 3), -0.5f);
  EXPECT_EQ(at(0, 4), 0.0f);
  EXPECT_EQ(at(0, 32), 12.0f);
  EXPECT_EQ(at(0, 33), 2.0f);
  EXPECT_EQ(at(1, 0), 0.25f);
  EXPECT_EQ(at(1, 1), -0.75f);
  EXPECT_EQ(at(1, 63), 0.0f);
}

// The loaders' table-driven dequantizers give, for every code and a spread of scales (including the subnormal
// 2^-127, overflow to infinity and the NaN scale), exactly the bf16 bits of the scalar per-element formula.
TEST(Quant, DequantTablesEqualTheScalarFormulaForEveryCode) {
  const std::vector<uint8_t> scale_codes = {0, 1, 100, 126, 127, 128, 200, 254, 255};
  // MXFP4: rows = scale codes, each row 256 bytes = every byte value (both nibble positions), 512 values.
  const size_t cols = 512, rows = scale_codes.size();
  std::vector<uint8_t> packed(rows * cols / 2), scale(rows * cols / 32);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t b = 0; b < 256; ++b) packed[i * 256 + b] = uint8_t(b);
    for (size_t j = 0; j < cols / 32; ++j) scale[i * (cols / 32) + j] = scale_codes[i];
  }
  std::vector<uint16_t> out(rows * cols);
  dequant_mxfp4(packed.data(), scale.data(), rows, cols, out.data());
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) {
      const uint8_t byte = packed[i * 256 + j / 2], nibble = j % 2 ? byte >> 4 : byte & 0x0f;
      ASSERT_EQ(out[i * cols + j], f32_to_bf16(e2m1_to_f32(nibble) * e8m0_to_f32(scale_codes[i])))
          << "scale " << int(scale_codes[i]) << " nibble " << int(nibble);
    }
  // FP8 blocks: every code in a row, 1×8 blocks of one scale code each (256 % 8 == 0), one row per scale code set.
  const size_t fcols = 256, block = 8;
  std::vector<uint8_t> q(fcols), fscale(fcols / block);
  for (size_t j = 0; j < fcols; ++j) q[j] = uint8_t(j);
  for (uint8_t sc : scale_codes) {
    std::fill(fscale.begin(), fscale.end(), sc);
    std::vector<uint16_t> fout(fcols);
    dequant_fp8_blocks(q.data(), fscale.data(), 1, fcols, block, fout.data());
    for (size_t j = 0; j < fcols; ++j)
      ASSERT_EQ(fout[j], f32_to_bf16(e4m3_to_f32(uint8_t(j)) * e8m0_to_f32(sc))) << "scale " << int(sc) << " code " << j;
  }
}

TEST(Quant, DequantFp8Rows) {
  // q [2, 8], 1×4 blocks → scale [2, 2].
  const std::vector<uint8_t> q = {0x38, 0x40, 0xb8, 0x3c, 0x38, 0x40, 0xb8, 0x3c,  //
                                  0x7e, 0x01, 0x00, 0x80, 0x38, 0x38, 0x38, 0x38};
  const std::vector<uint8_t> scale = {127, 129, 117, 137};  // 1, 4, 2^-10, 2^10
  std::vector<float> out(16, -1.0f);
  dequant_fp8_rows(q.data(), scale.data(), 2, 8, 4, out.data());
  const float m = std::ldexp(1.0f, -10);
  const std::vector<float> expected = {1, 2, -1, 1.5f, 4, 8, -4, 6,  //
                                       448 * m, std::ldexp(1.0f, -19), 0, -0.0f, 1024, 1024, 1024, 1024};
  EXPECT_EQ(out, expected);
}

}  // namespace
}  // namespace spw
