// Reference quantize/dequantize for the checkpoint formats and the reference's simulated
// ("fake") quantization of activations and caches (specs/deepseek-v4.md §2.1, §3).
// All functions are plain scalar references; fast paths elsewhere are tested against them.
// Fake-quant results are exactly representable in bf16 (see the spec), so no extra rounding is done.
// Tests: tests/unit/test_quant.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace spw {

// FP8 activation quant (block along the row, ue8m0 pow2 scale, e4m3 RNE):
// per block a = max(max|x|, 1e-4), s = pow2_ceil(a/448), x ← e4m3(clamp(x/s, ±448))·s.
// n must be a multiple of block.
void fake_quant_fp8(float* x, size_t n, size_t block);

// FP4 with ue8m0 scales: a = max(max|x|, 6·2^−126), s = pow2_ceil(a/6), x ← e2m1(clamp(x/s, ±6))·s.
void fake_quant_fp4_ue8m0(float* x, size_t n, size_t block);

// FP4 with e4m3 scales (V4.1 compressed KV, block 16): a = max(max|x|, 6·2^−9),
// s = e4m3(a/6) (round to nearest, saturating at 448), x ← e2m1(clamp(x/s, ±6))·s.
void fake_quant_fp4_e4m3(float* x, size_t n, size_t block);

// Dequantize an FP8 e4m3 weight [rows, cols] with one ue8m0 scale per block×block tile
// (scale shape [ceil(rows/block), ceil(cols/block)]) into bf16 bits. Exact.
void dequant_fp8_blocks(const uint8_t* q, const uint8_t* scale, size_t rows, size_t cols, size_t block,
                        uint16_t* out_bf16);

// Dequantize an MXFP4 weight: packed I8 [rows, cols/2] (low nibble = even element), ue8m0 scale
// [rows, cols/32]. Exact in bf16.
void dequant_mxfp4(const uint8_t* packed, const uint8_t* scale, size_t rows, size_t cols, uint16_t* out_bf16);

// Dequantize fp8 rows with 1×block ue8m0 scales (Engram tables): q [rows, cols], scale [rows, cols/block].
void dequant_fp8_rows(const uint8_t* q, const uint8_t* scale, size_t rows, size_t cols, size_t block,
                      float* out);

}  // namespace spw
