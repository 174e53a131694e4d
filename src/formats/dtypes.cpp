// Scalar encode/decode for the checkpoint number formats (contract in dtypes.h).
// The minifloat encoders share one rounding routine, round_minifloat(): it scales |v| so that the
// target format's representable values in v's binade are consecutive integers and rounds that with
// nearbyint() in the default round-to-nearest-even mode. Scaling by powers of two is exact, so the
// only rounding is the one the format itself performs.
#include "formats/dtypes.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace spw {

namespace {

struct DTypeRow {
  DType dtype;
  std::string_view name;
  size_t nbytes;
};

constexpr std::array<DTypeRow, 12> kDTypes = {{
    {DType::BF16, "BF16", 2},
    {DType::F16, "F16", 2},
    {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},
    {DType::I8, "I8", 1},
    {DType::U8, "U8", 1},
    {DType::I16, "I16", 2},
    {DType::I32, "I32", 4},
    {DType::I64, "I64", 8},
    {DType::BOOL, "BOOL", 1},
    {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::F8_E8M0, "F8_E8M0", 1},
}};

const DTypeRow& dtype_row(DType dtype) {
  for (const DTypeRow& row : kDTypes) {
    if (row.dtype == dtype) return row;
  }
  std::abort();  // unreachable: every enumerator has a row
}

// Rounds a = |v| (finite, non-negative) to a minifloat with `mant_bits` explicit mantissa bits whose
// smallest normal value is 2^min_exp (below that: subnormals with step 2^(min_exp − mant_bits)).
// Returns the magnitude code: (biased exponent << mant_bits) | mantissa, where biased exponent 0
// means subnormal. The code grid is monotonic, so a mantissa carry into the next binade is just +1.
// No saturation here: callers clamp.
uint32_t round_minifloat(float a, int mant_bits, int min_exp) {
  int exp = 0;
  std::frexp(a, &exp);  // a = f · 2^exp, f in [0.5, 1)
  int e = exp - 1;      // a in [2^e, 2^(e+1))
  if (a == 0.0f || e < min_exp) e = min_exp;  // subnormal range shares the step of the first binade
  // Units of the last place in binade e: 2^(e − mant_bits).
  float units = std::nearbyint(std::ldexp(a, mant_bits - e));  // exact scaling, then RNE
  uint32_t q = static_cast<uint32_t>(units);
  if (a < std::ldexp(1.0f, min_exp)) return q;  // subnormal: q in [0, 2^mant_bits]; 2^mant_bits = min normal
  // Normal: q in [2^mant_bits, 2^(mant_bits+1)]; the upper end carries into the next binade.
  uint32_t biased = static_cast<uint32_t>(e - min_exp + 1);
  return (biased << mant_bits) + (q - (1u << mant_bits));
}

}  // namespace

size_t dtype_nbytes(DType dtype) { return dtype_row(dtype).nbytes; }

std::string_view dtype_name(DType dtype) { return dtype_row(dtype).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const DTypeRow& row : kDTypes) {
    if (row.name == name) return row.dtype;
  }
  return std::nullopt;
}

float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t f32_to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x0040);  // keep sign, force quiet
  // Round to nearest even on the 16 dropped bits; a carry into the exponent is the correct result
  // (including overflow of the largest finite values to infinity).
  uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

float round_bf16(float value) { return bf16_to_f32(f32_to_bf16(value)); }

float f16_to_f32(uint16_t bits) {
  float sign = (bits & 0x8000) ? -1.0f : 1.0f;
  int exp = (bits >> 10) & 0x1f;
  int mant = bits & 0x3ff;
  if (exp == 0x1f) return mant ? std::numeric_limits<float>::quiet_NaN() * sign : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -24);
  return sign * std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
}

#if defined(__x86_64__)
namespace {
__attribute__((target("avx,f16c"))) void f16_to_f32_n_f16c(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < n; ++i) out[i] = f16_to_f32(in[i]);
}
}  // namespace
#endif

void f16_to_f32_n(const uint16_t* in, float* out, size_t n) {
#if defined(__x86_64__)
  static const bool f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  if (f16c) return f16_to_f32_n_f16c(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = f16_to_f32(in[i]);
}

float e4m3_to_f32(uint8_t code) {
  float sign = (code & 0x80) ? -1.0f : 1.0f;
  int exp = (code >> 3) & 0xf;
  int mant = code & 0x7;
  if (exp == 0xf && mant == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);
  return sign * std::ldexp(static_cast<float>(mant | 0x8), exp - 10);
}

uint8_t f32_to_e4m3(float value) {
  if (std::isnan(value)) return 0x7f;
  uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  float a = std::fabs(value);
  if (a > 448.0f) return sign | 0x7e;
  // Nothing in (448, 464] can round up to the NaN code: 448 has the even mantissa 6.
  return sign | static_cast<uint8_t>(round_minifloat(a, 3, -6));
}

float e8m0_to_f32(uint8_t code) {
  if (code == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(code) - 127);  // code 0 is the f32 subnormal 2^-127
}

float e2m1_to_f32(uint8_t nibble) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float m = kMagnitude[nibble & 0x7];
  return (nibble & 0x8) ? -m : m;
}

uint8_t f32_to_e2m1(float value) {
  // e2m1 has no NaN; NaN maps to +6 (the callers' clamp never produces one).
  if (std::isnan(value)) return 0x7;
  uint8_t sign = std::signbit(value) ? 0x8 : 0x0;
  float a = std::fabs(value);
  if (a >= 6.0f) return sign | 0x7;
  return sign | static_cast<uint8_t>(round_minifloat(a, 1, 0));
}

float pow2_ceil(float v) {
  uint32_t bits = std::bit_cast<uint32_t>(v);
  int exp = static_cast<int>((bits >> 23) & 0xff) - 127;
  if (bits & 0x7fffffu) exp += 1;
  return std::ldexp(1.0f, exp);
}

}  // namespace spw
