// Number formats of the released checkpoints and of the reference's simulated low-precision steps:
// bf16, fp8 e4m3fn, ue8m0 scales, fp4 e2m1 — scalar encode/decode, each the obvious reference.
// Contract: every decode is exact; every encode rounds to nearest, ties to even (the reference's
// casts), after the caller has clamped to the format's range where the reference clamps.
// Tests: tests/unit/test_dtypes.cpp (exhaustive over the 8-bit and 4-bit codes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace spw {

enum class DType { BF16, F16, F32, F64, I8, U8, I16, I32, I64, BOOL, F8_E4M3, F8_E8M0 };

// Bytes per element.
size_t dtype_nbytes(DType dtype);
// The safetensors spelling ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType dtype);
std::optional<DType> dtype_from_name(std::string_view name);

// bf16 <-> f32. f32_to_bf16 rounds to nearest even; NaN stays NaN.
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float value);
// Round an f32 to the nearest bf16 value, returned as f32.
float round_bf16(float value);

float f16_to_f32(uint16_t bits);
// n values at once, through F16C where the CPU has it (exact either way; NaNs stay NaN). The EXL3 CPU
// kernels convert every tensor's suh/svh on each call: 35–40 µs per V4.1 expert tensor one value at a time,
// 0.4–0.5 µs here (bench_exl3_cpu, dev box).
void f16_to_f32_n(const uint16_t* in, float* out, size_t n);

// fp8 e4m3fn: bias 7, max 448, no infinities, 0x7f/0xff are NaN.
float e4m3_to_f32(uint8_t code);
// Round to nearest even; |value| > 448 saturates to ±448 (callers clamp first, as the reference does).
uint8_t f32_to_e4m3(float value);

// ue8m0 scale: 2^(code-127); code 255 is NaN.
float e8m0_to_f32(uint8_t code);

// fp4 e2m1 nibble: bit 3 sign, bits 0-2 index into {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
float e2m1_to_f32(uint8_t nibble);
// Round to nearest even code (0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4); saturates at 6.
uint8_t f32_to_e2m1(float value);

// The reference's fast_round_scale: 2^ceil(log2(v)) from the f32 bit pattern of v
// (exponent − 127, plus one if the mantissa is non-zero). v > 0.
float pow2_ceil(float v);

}  // namespace spw
