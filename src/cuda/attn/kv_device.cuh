// Device building blocks of the attention kernels: the number formats of the compact KV rows
// (kv_pages.h) and the row quantize/dequantize steps.
//
// Bit-exactness with formats/dtypes.cpp and formats/quant.cpp is the contract: the encoders follow
// the same steps (frexp, exact power-of-two scaling, rint in round-to-nearest-even mode), divisions
// are IEEE (nvcc's default -prec-div=true; never build these with --use_fast_math), and every
// product here is of a code value and a scale, which is exact. Tested through
// tests/gpu/test_cuda_attn_kv.cpp (read(write(x)) == fake_quant(x)).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attn/kv_pages.h"

namespace spw::cuda::kvdev {

// 1/448 and 1/6 rounded to f32 once, as formats/quant.cpp (the reference kernel's literals).
constexpr float kInvE4m3Max = float(1.0 / 448.0);
constexpr float kInvE2m1Max = float(1.0 / 6.0);

__device__ __forceinline__ float bf16_round(float v) {
  uint32_t bits = __float_as_uint(v);
  if (isnan(v)) return __uint_as_float(((bits >> 16) | 0x0040u) << 16);
  uint32_t lsb = (bits >> 16) & 1u;
  return __uint_as_float(((bits + 0x7fffu + lsb) >> 16) << 16);
}

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float v) { return uint16_t(__float_as_uint(bf16_round(v)) >> 16); }

// formats/dtypes.cpp round_minifloat(): magnitude code of a ≥ 0 (finite) with mant_bits explicit
// mantissa bits and smallest normal 2^min_exp; no saturation.
__device__ __forceinline__ uint32_t round_minifloat(float a, int mant_bits, int min_exp) {
  int exp = 0;
  frexpf(a, &exp);
  int e = exp - 1;
  if (a == 0.0f || e < min_exp) e = min_exp;
  uint32_t q = uint32_t(rintf(ldexpf(a, mant_bits - e)));
  if (a < ldexpf(1.0f, min_exp)) return q;
  uint32_t biased = uint32_t(e - min_exp + 1);
  return (biased << mant_bits) + (q - (1u << mant_bits));
}

// Exact decode by bit assembly (no ldexpf: these run per channel in the attention kernels). A normal
// code e·8 + m (e ≥ 1) is 2^(e−7)·(1 + m/8), i.e. f32 bits ((e + 120) << 23) | (m << 20) = (a + 960) << 20;
// a subnormal one is m·2^−9 (exact); 0x7f / 0xff are NaN.
__device__ __forceinline__ float e4m3_to_f32(uint32_t code) {
  const uint32_t a = code & 0x7fu;
  if (a == 0x7fu) return __uint_as_float(0x7fc00000u);
  const float mag = a >= 8u ? __uint_as_float((a + 960u) << 20) : float(a) * 0x1p-9f;
  return (code & 0x80u) ? -mag : mag;
}

__device__ __forceinline__ uint32_t f32_to_e4m3(float v) {
  if (isnan(v)) return 0x7fu;
  uint32_t sign = signbit(v) ? 0x80u : 0u;
  float a = fabsf(v);
  if (a > 448.0f) return sign | 0x7eu;
  return sign | round_minifloat(a, 3, -6);
}

__device__ __forceinline__ float e2m1_to_f32(uint32_t nibble) {
  const uint32_t m = nibble & 7u;
  // {0, 0.5, 1, 1.5, 2, 3, 4, 6}
  float mag = m < 4 ? 0.5f * float(m) : (m == 7 ? 6.0f : float(m - 2));
  return (nibble & 8u) ? -mag : mag;
}

__device__ __forceinline__ uint32_t f32_to_e2m1(float v) {
  if (isnan(v)) return 0x7u;
  uint32_t sign = signbit(v) ? 0x8u : 0u;
  float a = fabsf(v);
  if (a >= 6.0f) return sign | 0x7u;
  return sign | round_minifloat(a, 1, 0);
}

// 2^(code − 127): the exponent field itself, except code 0 (2^−127, an f32 subnormal) and 0xff (NaN).
__device__ __forceinline__ float e8m0_to_f32(uint32_t code) {
  if (code == 0xffu) return __uint_as_float(0x7fc00000u);
  return code == 0u ? __uint_as_float(0x00400000u) : __uint_as_float(code << 23);
}

// formats/dtypes.cpp pow2_ceil() as a ue8m0 code: exponent of 2^ceil(log2(v)) + 127.
__device__ __forceinline__ uint32_t pow2_ceil_e8m0(float v) {
  uint32_t bits = __float_as_uint(v);
  int exp = int((bits >> 23) & 0xffu) - 127;
  if (bits & 0x7fffffu) exp += 1;
  return uint32_t(exp + 127);
}

// Byte offsets inside a row (layout in kv_pages.h).
__host__ __device__ __forceinline__ int code_offset(const KvRowFormat& f) { return 2 * f.n_bf16; }
__host__ __device__ __forceinline__ int scale_offset(const KvRowFormat& f) {
  const int code_bytes = f.elem == KvElem::kF32 ? 4 * f.n_quant : f.elem == KvElem::kFp8E4m3 ? f.n_quant : f.n_quant / 2;
  return 2 * f.n_bf16 + code_bytes;
}
// Scale codes of a row (none for f32 rows).
__host__ __device__ __forceinline__ int n_scales(const KvRowFormat& f) {
  return f.elem == KvElem::kF32 ? 0 : f.n_quant / f.block;
}

__device__ __forceinline__ float scale_value(const KvRowFormat& f, uint32_t code) {
  return f.scale == KvScale::kUe8m0 ? e8m0_to_f32(code) : e4m3_to_f32(code);
}

// Address of logical row `row` of sequence `seq`.
__device__ __forceinline__ const uint8_t* row_ptr(const KvPages& kv, size_t row_nbytes, int32_t seq, int64_t row) {
  const int32_t page = kv.page_table[int64_t(seq) * kv.max_pages_per_seq + row / kKvPageRows];
  return kv.pool + (int64_t(page) * kKvPageRows + row % kKvPageRows) * int64_t(row_nbytes);
}

// A row format's offsets resolved once per kernel (not per channel): what the attention kernels' inner
// loops need. A plain f32 array (this step's new rows) is elem kF32 with n_quant = d.
struct RowLayout {
  KvElem elem;
  int n_quant, code_off, scale_off;
  int block, block_shift;  // block_shift = log2(block) when block is a power of two (all model formats), else −1
  bool e4m3_scale;
};

__host__ __device__ inline RowLayout row_layout(const KvRowFormat& f) {
  RowLayout l;
  l.elem = f.elem;
  l.n_quant = f.n_quant;
  l.code_off = code_offset(f);
  l.scale_off = scale_offset(f);
  l.block = f.block;
  l.block_shift = -1;
  for (int s = 0; s < 31; ++s)
    if ((1 << s) == f.block) l.block_shift = s;
  l.e4m3_scale = f.scale == KvScale::kE4m3;
  return l;
}

__host__ __device__ inline RowLayout plain_f32_layout(int d) {
  RowLayout l{};
  l.elem = KvElem::kF32;
  l.n_quant = d;
  l.block = 1;
  l.block_shift = 0;
  return l;
}

// Channel c of a row in layout l whose element type is E (== l.elem): the same value as load_channel.
template <KvElem E>
__device__ __forceinline__ float layout_channel(const RowLayout& l, const uint8_t* row, int c) {
  if (c >= l.n_quant) return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(row)[c - l.n_quant]);
  if constexpr (E == KvElem::kF32) {
    return reinterpret_cast<const float*>(row + l.code_off)[c];
  } else {
    const int b = l.block_shift >= 0 ? c >> l.block_shift : c / l.block;
    const uint32_t sc = row[l.scale_off + b];
    const float s = l.e4m3_scale ? e4m3_to_f32(sc) : e8m0_to_f32(sc);
    if constexpr (E == KvElem::kFp8E4m3) {
      return e4m3_to_f32(row[l.code_off + c]) * s;
    } else {
      const uint32_t byte = row[l.code_off + (c >> 1)];
      return e2m1_to_f32((c & 1) ? (byte >> 4) : (byte & 0xfu)) * s;
    }
  }
}

// Channel c of a stored row, dequantized.
__device__ __forceinline__ float load_channel(const KvRowFormat& f, const uint8_t* row, int c) {
  if (c >= f.n_quant) {
    const uint8_t* p = row + 2 * (c - f.n_quant);
    return bf16_bits_to_f32(uint16_t(p[0] | (uint32_t(p[1]) << 8)));
  }
  if (f.elem == KvElem::kF32) return reinterpret_cast<const float*>(row + code_offset(f))[c];  // 4-aligned: n_bf16 = 0
  const float s = scale_value(f, row[scale_offset(f) + c / f.block]);
  if (f.elem == KvElem::kFp8E4m3) return e4m3_to_f32(row[code_offset(f) + c]) * s;
  const uint32_t byte = row[code_offset(f) + c / 2];
  return e2m1_to_f32((c & 1) ? (byte >> 4) : (byte & 0xfu)) * s;
}

// A quantized block's scale from its amax: the stored code, its value s, and the clamp of x / s.
struct BlockScale {
  uint32_t code;
  float s, lim;
};
__device__ __forceinline__ BlockScale block_scale(const KvRowFormat& f, float amax) {
  BlockScale b;
  if (f.elem == KvElem::kFp8E4m3) {  // fp8, ue8m0 (the only fp8 combination of the model)
    b.code = pow2_ceil_e8m0(fmaxf(amax, 1e-4f) * kInvE4m3Max);
    b.s = e8m0_to_f32(b.code);
    b.lim = 448.0f;
  } else if (f.scale == KvScale::kUe8m0) {
    b.code = pow2_ceil_e8m0(fmaxf(amax, 6.0f * ldexpf(1.0f, -126)) * kInvE2m1Max);
    b.s = e8m0_to_f32(b.code);
    b.lim = 6.0f;
  } else {
    b.code = f32_to_e4m3(fmaxf(amax, 6.0f * ldexpf(1.0f, -9)) / 6.0f);
    b.s = e4m3_to_f32(b.code);
    b.lim = 6.0f;
  }
  return b;
}

// Quantizes scale block `b` (channels b·block ... b·block+block−1 of x) into `row`, exactly as
// formats/quant.cpp's fake_quant_fp8 / fake_quant_fp4_ue8m0 / fake_quant_fp4_e4m3 on one block.
__device__ __forceinline__ void store_block(const KvRowFormat& f, const float* x, int b, uint8_t* row) {
  const int c0 = b * f.block;
  if (f.elem == KvElem::kF32) {  // unquantized rows: the values as given
    float* codes = reinterpret_cast<float*>(row + code_offset(f));
    for (int i = 0; i < f.block; ++i) codes[c0 + i] = x[c0 + i];
    return;
  }
  float amax = 0.0f;
  for (int i = 0; i < f.block; ++i) amax = fmaxf(amax, fabsf(x[c0 + i]));
  const BlockScale bs = block_scale(f, amax);
  const float s = bs.s, lim = bs.lim;
  const uint32_t scode = bs.code;
  row[scale_offset(f) + b] = uint8_t(scode);
  uint8_t* codes = row + code_offset(f);
  if (f.elem == KvElem::kFp8E4m3) {
    for (int i = 0; i < f.block; ++i) codes[c0 + i] = uint8_t(f32_to_e4m3(fminf(fmaxf(x[c0 + i] / s, -lim), lim)));
  } else {
    for (int i = 0; i < f.block; i += 2) {
      uint32_t lo = f32_to_e2m1(fminf(fmaxf(x[c0 + i] / s, -lim), lim));
      uint32_t hi = f32_to_e2m1(fminf(fmaxf(x[c0 + i + 1] / s, -lim), lim));
      codes[(c0 + i) / 2] = uint8_t(lo | (hi << 4));
    }
  }
}

// The same quantization by one warp over a 32·E-channel segment starting at channel seg0 (a multiple of
// 32·E, E = max(1, block / 32)): lane l takes channels seg0 + l + 32e. A block's lanes (min(block, 32) of
// them, aligned) share its amax by shuffles, so every value, scale and code equals store_block's; fp4
// pairs (c, c + 1) sit on lanes (l, l + 1), and the even lane writes their byte. n_quant % (32·E) == 0 or
// the lanes past n_quant are idle. Needs segment_warp_ok(f): a power-of-two block of 2..128 channels.
__host__ __device__ __forceinline__ bool segment_warp_ok(const KvRowFormat& f) {
  return f.elem == KvElem::kF32 || (f.block >= 2 && f.block <= 128 && (f.block & (f.block - 1)) == 0);
}
__device__ __forceinline__ void store_segment_warp(const KvRowFormat& f, const float* x, int seg0, uint8_t* row,
                                                   int lane) {
  if (f.elem == KvElem::kF32) {
    float* codes = reinterpret_cast<float*>(row + code_offset(f));
    for (int c = seg0 + lane; c < seg0 + 32 * (f.block > 32 ? f.block / 32 : 1) && c < f.n_quant; c += 32)
      codes[c] = x[c];
    return;
  }
  const int E = f.block > 32 ? f.block / 32 : 1, L = f.block < 32 ? f.block : 32;
  constexpr int kMaxE = 4;  // blocks up to 128 channels
  float v[kMaxE];
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < kMaxE; ++e) {
    const int c = seg0 + lane + 32 * e;
    v[e] = (e < E && c < f.n_quant) ? x[c] : 0.0f;
    amax = fmaxf(amax, fabsf(v[e]));
  }
  for (int o = L / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const BlockScale bs = block_scale(f, amax);
  const float s = bs.s, lim = bs.lim;
  const uint32_t scode = bs.code;
  const int c_lane = seg0 + lane;
  if (c_lane < f.n_quant && c_lane % f.block == 0) row[scale_offset(f) + c_lane / f.block] = uint8_t(scode);
  uint8_t* codes = row + code_offset(f);
#pragma unroll
  for (int e = 0; e < kMaxE; ++e) {
    if (e >= E) break;
    const int c = c_lane + 32 * e;
    if (f.elem == KvElem::kFp8E4m3) {
      if (c < f.n_quant) codes[c] = uint8_t(f32_to_e4m3(fminf(fmaxf(v[e] / s, -lim), lim)));
    } else {
      const uint32_t q = f32_to_e2m1(fminf(fmaxf(v[e] / s, -lim), lim));
      const uint32_t hi = __shfl_down_sync(0xffffffffu, q, 1);
      if (c < f.n_quant && (lane & 1) == 0) codes[c / 2] = uint8_t(q | (hi << 4));
    }
  }
}

}  // namespace spw::cuda::kvdev
