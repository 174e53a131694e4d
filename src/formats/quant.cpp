// Reference (fake) quantization and checkpoint dequantization (contract in quant.h; math in
// specs/deepseek-v4.md §2.1 and §3). Scalar and obvious on purpose: fast paths are tested against it. The
// checkpoint dequantizers look their values up in tables made by the same scalar conversions (every weight of a
// model goes through them at load).
//
// Hazard: the pow2 scale is fast_round_scale(amax · fp32(1/max)), a product with the rounded
// reciprocal, as in the reference kernel, not amax / max. The two differ when amax / max is within
// an ulp of a power of two (e.g. amax = 448·2^k), and the product is what the reference computes.
#include "formats/quant.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "base/status.h"
#include "formats/dtypes.h"

namespace spw {

namespace {

// The reference's constants: 1/448 and 1/6 evaluated in double, stored as fp32 kernel literals.
const float kInvE4m3Max = static_cast<float>(1.0 / 448.0);
const float kInvE2m1Max = static_cast<float>(1.0 / 6.0);

float block_amax(const float* x, size_t n) {
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

// x ← e2m1(clamp(x / s, ±6)) · s over one block.
void fake_quant_e2m1_block(float* x, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) {
    float v = std::clamp(x[i] / s, -6.0f, 6.0f);
    x[i] = e2m1_to_f32(f32_to_e2m1(v)) * s;
  }
}

}  // namespace

void fake_quant_fp8(float* x, size_t n, size_t block) {
  SPW_CHECK(block > 0 && n % block == 0);
  for (size_t b = 0; b < n; b += block) {
    float a = std::max(block_amax(x + b, block), 1e-4f);
    float s = pow2_ceil(a * kInvE4m3Max);
    for (size_t i = b; i < b + block; ++i) {
      float v = std::clamp(x[i] / s, -448.0f, 448.0f);
      x[i] = e4m3_to_f32(f32_to_e4m3(v)) * s;
    }
  }
}

void fake_quant_fp4_ue8m0(float* x, size_t n, size_t block) {
  SPW_CHECK(block > 0 && n % block == 0);
  const float floor = 6.0f * std::ldexp(1.0f, -126);
  for (size_t b = 0; b < n; b += block) {
    float a = std::max(block_amax(x + b, block), floor);
    fake_quant_e2m1_block(x + b, block, pow2_ceil(a * kInvE2m1Max));
  }
}

void fake_quant_fp4_e4m3(float* x, size_t n, size_t block) {
  SPW_CHECK(block > 0 && n % block == 0);
  const float floor = 6.0f * std::ldexp(1.0f, -9);
  for (size_t b = 0; b < n; b += block) {
    float a = std::max(block_amax(x + b, block), floor);
    // Spec §3 writes a/6 here (three transcriptions agree); a ≥ 2^-8 keeps s ≥ the smallest e4m3.
    float s = e4m3_to_f32(f32_to_e4m3(a / 6.0f));
    fake_quant_e2m1_block(x + b, block, s);
  }
}

namespace {

// Every e4m3 code as f32 (e4m3_to_f32 goes through ldexp; the loaders call it for every weight).
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[size_t(c)] = e4m3_to_f32(uint8_t(c));
    return t;
  }();
  return table;
}

}  // namespace

void dequant_fp8_blocks(const uint8_t* q, const uint8_t* scale, size_t rows, size_t cols, size_t block,
                        uint16_t* out_bf16) {
  SPW_CHECK(block > 0);
  const size_t scale_cols = (cols + block - 1) / block;
  const std::array<float, 256>& e4m3 = e4m3_table();
  for (size_t i = 0; i < rows; ++i) {
    const uint8_t* scale_row = scale + (i / block) * scale_cols;
    for (size_t j0 = 0; j0 < cols; j0 += block) {
      const float s = e8m0_to_f32(scale_row[j0 / block]);
      for (size_t j = j0; j < std::min(cols, j0 + block); ++j) out_bf16[i * cols + j] = f32_to_bf16(e4m3[q[i * cols + j]] * s);
    }
  }
}

void dequant_mxfp4(const uint8_t* packed, const uint8_t* scale, size_t rows, size_t cols, uint16_t* out_bf16) {
  SPW_CHECK(cols % 32 == 0);
  // One scale per 32 values, so each block's 16 possible outputs are computed once and looked up.
  uint16_t lut[16];
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j0 = 0; j0 < cols; j0 += 32) {
      const float s = e8m0_to_f32(scale[i * (cols / 32) + j0 / 32]);
      for (uint8_t n = 0; n < 16; ++n) lut[n] = f32_to_bf16(e2m1_to_f32(n) * s);
      const uint8_t* bytes = packed + i * (cols / 2) + j0 / 2;
      uint16_t* out = out_bf16 + i * cols + j0;
      for (size_t k = 0; k < 16; ++k) {
        out[2 * k] = lut[bytes[k] & 0x0f];
        out[2 * k + 1] = lut[bytes[k] >> 4];
      }
    }
  }
}

void dequant_fp8_rows(const uint8_t* q, const uint8_t* scale, size_t rows, size_t cols, size_t block,
                      float* out) {
  SPW_CHECK(block > 0 && cols % block == 0);
  const std::array<float, 256>& e4m3 = e4m3_table();
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) {
      out[i * cols + j] = e4m3[q[i * cols + j]] * e8m0_to_f32(scale[i * (cols / block) + j / block]);
    }
  }
}

}  // namespace spw
