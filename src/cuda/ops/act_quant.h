// Activation fake quantization on the GPU (formats/quant.h twins) and the compact codes the KV cache
// stores: fp8 e4m3 bytes + ue8m0 scale bytes, fp4 e2m1 nibbles + ue8m0 or e4m3 scale bytes.
//
// Fake quant, in place over rows x[r·row_stride + i], i < n, blocks of `block` along the row:
//   fake_quant_fp8:       s = pow2_ceil(max(amax, 1e-4)·fp32(1/448)), x ← e4m3(clamp(x/s, ±448))·s
//   fake_quant_fp4_ue8m0: s = pow2_ceil(max(amax, 6·2^-126)·fp32(1/6)), x ← e2m1(clamp(x/s, ±6))·s
//   fake_quant_fp4_e4m3:  s = e4m3(max(amax, 6·2^-9)/6),               x ← e2m1(clamp(x/s, ±6))·s
// Each is identical bit for bit to the reference applied row by row (same operations, IEEE division).
//
// Compact codes, per row r (strides in elements of each array):
//   pack_fp8:  q[r·q_stride + i] = e4m3 code, scale[r·scale_stride + b] = ue8m0 code of block b's s
//   pack_fp4:  q[r·q_stride + i/2] = e2m1 codes, low nibble = even i (the MXFP4 order);
//              scale[r·scale_stride + b] = ue8m0 code of s (Fp4Scale::kUe8m0) or e4m3 code (kE4m3)
//   unpack_*:  y[r·y_stride + i] = code value · scale value.
// unpack(pack(x)) equals the matching fake_quant(x) bit for bit; both are exact in bf16.
// Contract: device pointers; x is only read by pack; no aliasing between codes, scales and f32 rows.
// Limits: block > 0 and n % block == 0 (fp4: block even); the ue8m0 scale of a finite block is a
// normal power of two (code 1..254).
// Tests: tests/gpu/test_cuda_ops_quant.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace spw::cuda {

Status fake_quant_fp8(float* x, int64_t n_rows, int64_t n, int64_t row_stride, int block, cudaStream_t stream);
Status fake_quant_fp4_ue8m0(float* x, int64_t n_rows, int64_t n, int64_t row_stride, int block, cudaStream_t stream);
Status fake_quant_fp4_e4m3(float* x, int64_t n_rows, int64_t n, int64_t row_stride, int block, cudaStream_t stream);

Status pack_fp8(const float* x, int64_t x_stride, int64_t n_rows, int64_t n, int block, uint8_t* q, int64_t q_stride,
                uint8_t* scale, int64_t scale_stride, cudaStream_t stream);
Status unpack_fp8(const uint8_t* q, int64_t q_stride, const uint8_t* scale, int64_t scale_stride, int64_t n_rows,
                  int64_t n, int block, float* y, int64_t y_stride, cudaStream_t stream);

enum class Fp4Scale { kUe8m0, kE4m3 };

Status pack_fp4(Fp4Scale kind, const float* x, int64_t x_stride, int64_t n_rows, int64_t n, int block, uint8_t* q,
                int64_t q_stride, uint8_t* scale, int64_t scale_stride, cudaStream_t stream);
Status unpack_fp4(Fp4Scale kind, const uint8_t* q, int64_t q_stride, const uint8_t* scale, int64_t scale_stride,
                  int64_t n_rows, int64_t n, int block, float* y, int64_t y_stride, cudaStream_t stream);

}  // namespace spw::cuda
