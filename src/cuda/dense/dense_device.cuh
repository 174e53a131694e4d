// Device helpers of the dense linears (dense_linear.h): exact decoders of the checkpoint formats,
// 16 elements at a time (one lane's chunk), and the reference's fp8 activation fake quant.
// Each decoder reproduces formats/dtypes.cpp bit for bit on finite codes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/dense/dense_kernels.h"
#include "cuda/dense/dense_linear.h"

namespace spw::densedev {

// ue8m0 → 2^(code−127); code 0 is the f32 subnormal 2^−127, 255 is NaN (formats/dtypes.cpp).
__device__ __forceinline__ float e8m0_to_float(uint32_t code) {
  if (code == 0) return __uint_as_float(0x00400000u);
  if (code == 255) return __uint_as_float(0x7fc00000u);
  return __uint_as_float(code << 23);
}

// 2^ceil(log2 v) from v's bits (fast_round_scale, spec §3); v is a positive normal float here.
__device__ __forceinline__ float pow2_ceil_dev(float v) {
  const uint32_t bits = __float_as_uint(v);
  const uint32_t e = ((bits >> 23) & 0xffu) + ((bits & 0x7fffffu) ? 1u : 0u);
  return __uint_as_float(e << 23);
}

__device__ __forceinline__ float round_bf16_dev(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// e4m3 → f32 via the exact fp8→fp16 conversion (every e4m3 value is an fp16 value).
__device__ __forceinline__ void e4m3x4_to_float(uint32_t word, float* out) {
  const __half2 lo = __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xffffu), __NV_E4M3));
  const __half2 hi = __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3));
  const float2 a = __half22float2(lo), b = __half22float2(hi);
  out[0] = a.x, out[1] = a.y, out[2] = b.x, out[3] = b.y;
}

// Nibble J of a word of eight e2m1 codes as the f32 e2m1(n)·2^−126, in four integer instructions: the
// code's exponent and mantissa bits (e1 e0 m) land on f32 bits 24..22 — exponent field e, top mantissa
// bit m, so e ≥ 1 is 2^(e−127)·(1 + m/2) and e = 0 the subnormal m·2^−127 — and its sign on bit 31.
// Times 2^126 this is exactly e2m1(n) ({0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign; the product only
// moves the exponent). Decoding the magnitude with branches per value cost ~15 SASS instructions per
// value, ~250 per MXFP4 chunk in the grouped expert GEMV (now ~100).
template <int J>
__device__ __forceinline__ float e2m1_times_2pow_m126(uint32_t word) {
  constexpr int kMag = 22 - 4 * J, kSign = 28 - 4 * J;  // left shifts (kMag < 0: right)
  const uint32_t mag = kMag >= 0 ? word << kMag : word >> -kMag;
  return __uint_as_float((mag & 0x01C00000u) | ((word << kSign) & 0x80000000u));
}

// The eight values e2m1(n_j)·s of a word (n_j = bits 4j..4j+3), exactly. For s ≤ 2 (every real weight
// scale) 2^126·s is one exact multiplier; larger or NaN scales take the two products apart.
__device__ __forceinline__ void e2m1x8_scaled(uint32_t word, float s, float* v) {
  float f[8];
  f[0] = e2m1_times_2pow_m126<0>(word), f[1] = e2m1_times_2pow_m126<1>(word);
  f[2] = e2m1_times_2pow_m126<2>(word), f[3] = e2m1_times_2pow_m126<3>(word);
  f[4] = e2m1_times_2pow_m126<4>(word), f[5] = e2m1_times_2pow_m126<5>(word);
  f[6] = e2m1_times_2pow_m126<6>(word), f[7] = e2m1_times_2pow_m126<7>(word);
  if (s <= 2.0f) {
    const float s126 = s * 0x1p126f;
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = f[j] * s126;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = (f[j] * 0x1p126f) * s;
  }
}

// The raw bytes of one lane's 16-element chunk of one weight row.
template <DenseFormat F>
struct Chunk;
template <>
struct Chunk<DenseFormat::kFp8> { uint4 q; float s; };
template <>
struct Chunk<DenseFormat::kFp4> { uint2 q; float s; };
template <>
struct Chunk<DenseFormat::kBf16> { uint4 q[2]; };
template <>
struct Chunk<DenseFormat::kF32> { float4 q[4]; };

// One weight row's addresses, resolved once per row rather than per chunk: the divisions by the block
// size and the row products took ~65 instructions per 16-element chunk, more than its arithmetic.
template <DenseFormat F>
struct RowSource {
  const uint8_t* w;      // the row's first byte
  const uint8_t* scale;  // kFp8: the scale row of the row's block; kFp4: the row's scales; else unused
  int scale_shift;       // log2 of the elements per scale along k (kFp8: weight_block; kFp4: 32)
};

// `w` and `scale` as in DeviceLinear; `n_in` is the row length; weight_block a power of two (kFp8).
template <DenseFormat F>
__device__ __forceinline__ RowSource<F> row_source(const void* __restrict__ w, const uint8_t* __restrict__ scale,
                                                   int row, int n_in, int weight_block) {
  RowSource<F> s{};
  const size_t r = static_cast<size_t>(row);
  const uint8_t* base = static_cast<const uint8_t*>(w);
  if constexpr (F == DenseFormat::kFp8) {
    s.scale_shift = __ffs(weight_block) - 1;
    const int scale_cols = (n_in + weight_block - 1) >> s.scale_shift;
    s.w = base + r * n_in;
    s.scale = scale + static_cast<size_t>(row >> s.scale_shift) * scale_cols;
  } else if constexpr (F == DenseFormat::kFp4) {
    s.scale_shift = 5;
    s.w = base + r * (n_in / 2);
    s.scale = scale + r * (n_in / 32);
  } else if constexpr (F == DenseFormat::kBf16) {
    s.w = base + r * n_in * 2;
  } else {
    s.w = base + r * n_in * 4;
  }
  return s;
}

// Elements [k, k+16) of the row (k % 16 == 0).
template <DenseFormat F>
__device__ __forceinline__ Chunk<F> load_chunk(const RowSource<F>& s, int k) {
  Chunk<F> c;
  if constexpr (F == DenseFormat::kFp8) {
    c.q = __ldg(reinterpret_cast<const uint4*>(s.w + k));
    c.s = e8m0_to_float(__ldg(s.scale + (k >> s.scale_shift)));
  } else if constexpr (F == DenseFormat::kFp4) {
    c.q = __ldg(reinterpret_cast<const uint2*>(s.w + k / 2));
    c.s = e8m0_to_float(__ldg(s.scale + (k >> s.scale_shift)));
  } else if constexpr (F == DenseFormat::kBf16) {
    const uint4* p = reinterpret_cast<const uint4*>(s.w + static_cast<size_t>(k) * 2);
    c.q[0] = __ldg(p), c.q[1] = __ldg(p + 1);
  } else {
    const float4* p = reinterpret_cast<const float4*>(s.w + static_cast<size_t>(k) * 4);
    c.q[0] = __ldg(p), c.q[1] = __ldg(p + 1), c.q[2] = __ldg(p + 2), c.q[3] = __ldg(p + 3);
  }
  return c;
}

// Elements [k, k+16) of row `row`, resolving the row's addresses on the spot (cold paths).
template <DenseFormat F>
__device__ __forceinline__ Chunk<F> load_chunk(const void* __restrict__ w, const uint8_t* __restrict__ scale, int row,
                                               int k, int n_in, int weight_block) {
  return load_chunk<F>(row_source<F>(w, scale, row, n_in, weight_block), k);
}

// The 16 dequantized values of a chunk (exact: e4m3/e2m1 times a power of two, or bf16/f32 as is).
template <DenseFormat F>
__device__ __forceinline__ void dequant_chunk(const Chunk<F>& c, float* v) {
  if constexpr (F == DenseFormat::kFp8) {
    e4m3x4_to_float(c.q.x, v), e4m3x4_to_float(c.q.y, v + 4), e4m3x4_to_float(c.q.z, v + 8), e4m3x4_to_float(c.q.w, v + 12);
#pragma unroll
    for (int j = 0; j < 16; ++j) v[j] *= c.s;
  } else if constexpr (F == DenseFormat::kFp4) {
    e2m1x8_scaled(c.q.x, c.s, v);
    e2m1x8_scaled(c.q.y, c.s, v + 8);
  } else if constexpr (F == DenseFormat::kBf16) {
    const uint32_t words[8] = {c.q[0].x, c.q[0].y, c.q[0].z, c.q[0].w, c.q[1].x, c.q[1].y, c.q[1].z, c.q[1].w};
#pragma unroll
    for (int j = 0; j < 8; ++j) v[2 * j] = __uint_as_float(words[j] << 16), v[2 * j + 1] = __uint_as_float(words[j] & 0xffff0000u);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) v[4 * j] = c.q[j].x, v[4 * j + 1] = c.q[j].y, v[4 * j + 2] = c.q[j].z, v[4 * j + 3] = c.q[j].w;
  }
}

// The GEMV kernels fold an FP8 chunk's scale into x̂ (16 products per token) instead of into the weights
// (16 per row): a warp's R rows lie in one weight block (R divides weight_block), so they share it.
// fmaf(code, x̂·s, acc) equals fmaf(code·s, x̂, acc) bit for bit while both products are exact, i.e.
// unless x̂·s falls below the f32 normal range with bits under 2^−149 (x̂ ~ 2^−31 and s ~ 2^−119).
template <DenseFormat F>
inline constexpr bool kFoldsScale = F == DenseFormat::kFp8;

// What the GEMV multiplies x̂ by: the chunk's codes as floats for kFp8 (kFoldsScale), else dequant_chunk.
template <DenseFormat F>
__device__ __forceinline__ void weight_values(const Chunk<F>& c, float* v) {
  if constexpr (kFoldsScale<F>) {
    e4m3x4_to_float(c.q.x, v), e4m3x4_to_float(c.q.y, v + 4), e4m3x4_to_float(c.q.z, v + 8), e4m3x4_to_float(c.q.w, v + 12);
  } else {
    dequant_chunk<F>(c, v);
  }
}

// x̂ values times the scale of the warp's chunk (kFoldsScale), in place; nothing for the other formats.
template <DenseFormat F>
__device__ __forceinline__ void scale_x(const Chunk<F>& c, float* xv) {
  if constexpr (kFoldsScale<F>) {
#pragma unroll
    for (int j = 0; j < 16; ++j) xv[j] *= c.s;
  }
}

// One element of fake_quant_fp8 given its block's amax: s = pow2_ceil(max(amax, 1e-4)·fp32(1/448)),
// x ← e4m3_rne(clamp(x/s, ±448))·s (formats/quant.cpp, including its product-with-reciprocal hazard).
__device__ __forceinline__ float fp8_scale_of(float amax) {
  return pow2_ceil_dev(fmaxf(amax, 1e-4f) * static_cast<float>(1.0 / 448.0));
}
// The e4m3 code of x/s as f16 bits (every e4m3 value is an f16 value): fake_quant_fp8_elem = f16(code)·s.
__device__ __forceinline__ uint16_t fake_quant_fp8_code(float x, float s) {
  const float v = fminf(fmaxf(__fdiv_rn(x, s), -448.0f), 448.0f);
  const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  return __nv_cvt_fp8_to_halfraw(q, __NV_E4M3).x;
}
__device__ __forceinline__ float fake_quant_fp8_elem(float x, float s) {
  return __half2float(__ushort_as_half(fake_quant_fp8_code(x, s))) * s;
}

// The fake-quant scale of x[base, base + act_block) (one warp: lanes stride the block, a butterfly max gives amax).
__device__ __forceinline__ float warp_block_scale(const float* __restrict__ x, size_t base, int act_block, int lane) {
  float amax = 0.0f;
  for (int i = lane; i < act_block; i += 32) amax = fmaxf(amax, fabsf(x[base + i]));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  return fp8_scale_of(amax);
}

// Output (row, token t) of a GEMV: rounded to bf16 when asked, into y [n_tokens, ldy] or, for a stacked weight,
// into the part holding the row — the last part starting at or before it (constant indices: a runtime index into
// the parameter arrays would copy them to local memory).
__device__ __forceinline__ void store_output(const GemvArgs& a, float* y, int row, int t, float v) {
  if (a.round_out) v = round_bf16_dev(v);
  float* out = y;
  int ld = a.ldy, base = 0;
#pragma unroll
  for (int p = 1; p < kMaxStackParts; ++p)
    if (p < a.n_parts && row >= a.part_row0[p]) out = a.part_y[p], ld = a.part_ld[p], base = a.part_row0[p];
  out[static_cast<size_t>(t) * ld + (row - base)] = v;
}

}  // namespace spw::densedev
