// The AVX-512 VBMI EXL3 decode shared by the tile kernels (exl3_avx512vbmi_tiles.h, built twice: with FP16
// arithmetic in exl3_gemm_avx512fp16.cpp, without it in exl3_gemm_avx512vbmi.cpp) and the AMX kernel
// (exl3_gemm_amx.cpp): state extraction tables, the 16-bit-lane hash, the codebooks, a tile group's 32
// states and values. Include only from files built with -mavx512f -mavx512bw -mavx512vl -mavx512vbmi (and
// -mavx512fp16 for the FP16 forms), run only where cpu_isa_detect() reaches that ISA. The functions are in an
// unnamed namespace on purpose: each including file gets the variant its flags select (__AVX512FP16__).
// See exl3_gemm_avx512fp16.cpp for the method.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/exl3_gemm.h"

namespace spw::detail::vbmi {

// Where the 16-bit states of a tile come from, for one bit width. A tile is T = 16·k_x2 bytes: 32-bit
// words, each an MSB-first chunk of the ring stream stored little-endian (spec §1.4). Group g (positions
// 32g .. 32g + 31, ≤ 4K + 3 bytes of stream) is gathered by vpermb from the 64 bytes of the tile at s0[g];
// group 0, whose first states wrap around the ring, by vpermt2b from the last 64 bytes and the first 64
// (vpermt2b has half vpermb's throughput, so only the wrap pays for it). Tiles under 64 bytes (K < 2) are
// loaded once, masked, and every group gathers from that.
struct ExtractTables {
  int tile_bytes = 0;
  bool small_tile = false;  // T < 64
  int32_t s0[8] = {};
  alignas(64) uint8_t gather[8][64];  // vperm(t2)b index: qword j's byte i ← stream byte b0(j) + 7 − i
  alignas(64) uint8_t shift[8][64];   // vpmultishiftqb control: lane e's low and high byte
};

// Built once per k_x2 (2..16) on first use, thread-safe (exl3_gemm_avx512fp16.cpp).
const ExtractTables& extract_tables(Exl3Bits bits);

namespace {

constexpr uint32_t k3InstMult = 89226354u, k3InstAdd = 64248484u;

inline __m512i lo16(uint32_t v) { return _mm512_set1_epi16(static_cast<short>(v & 0xFFFF)); }
inline __m512i hi16(uint32_t v) { return _mm512_set1_epi16(static_cast<short>(v >> 16)); }

// The 32-bit hash x = st·M (+ A for 3INST) of 32 16-bit states, as its low and high 16-bit halves
// (CB: 0 = 3INST, 1 = MCG, 2 = MUL1; spec §2.1); for MCG/3INST already masked to two fp16 bit patterns.
template <int CB>
inline void hash16(__m512i st, __m512i& x_lo, __m512i& x_hi) {
  constexpr uint32_t M = CB == 2 ? kExl3Mul1Mult : CB == 1 ? kExl3McgMult : k3InstMult;
  x_lo = _mm512_mullo_epi16(st, lo16(M));
  x_hi = _mm512_add_epi16(_mm512_mulhi_epu16(st, lo16(M)), _mm512_mullo_epi16(st, hi16(M)));
  if constexpr (CB == 0) {  // + k3InstAdd with the carry out of the low half
    x_lo = _mm512_add_epi16(x_lo, lo16(k3InstAdd));
    const __mmask32 carry = _mm512_cmplt_epu16_mask(x_lo, lo16(k3InstAdd));
    x_hi = _mm512_add_epi16(x_hi, hi16(k3InstAdd));
    x_hi = _mm512_mask_add_epi16(x_hi, carry, x_hi, _mm512_set1_epi16(1));
  }
  if constexpr (CB != 2) {  // (x & 0x8FFF) ^ 0x3B60 in each half: ternary-logic function (A & B) ^ C = 0x6A
    const __m512i keep = _mm512_set1_epi16(static_cast<short>(0x8FFF)), flip = _mm512_set1_epi16(0x3B60);
    x_lo = _mm512_ternarylogic_epi32(x_lo, keep, flip, 0x6A);
    x_hi = _mm512_ternarylogic_epi32(x_hi, keep, flip, 0x6A);
  }
}

// MUL1: the fp16 bit pattern of 1024 + (sum of x's four bytes), exact (the sum is < 1024).
inline __m512i mul1_h(__m512i x_lo, __m512i x_hi) {
  const __m512i ones = _mm512_set1_epi8(1);
  const __m512i sum = _mm512_add_epi16(_mm512_maddubs_epi16(x_lo, ones), _mm512_maddubs_epi16(x_hi, ones));
  return _mm512_or_si512(sum, _mm512_set1_epi16(0x6400));
}

#if defined(__AVX512FP16__)
// fp16 codebook values: mul1 by one fp16 FMA ((1024 + sum)·k_inv + k_bias, the definition's single rounding),
// MCG/3INST by one fp16 add of the two halves (exact sum, one rounding).
template <int CB>
inline __m512h codebook(__m512i st) {
  __m512i x_lo, x_hi;
  hash16<CB>(st, x_lo, x_hi);
  if constexpr (CB == 2)
    return _mm512_fmadd_ph(_mm512_castsi512_ph(mul1_h(x_lo, x_hi)), _mm512_castsi512_ph(_mm512_set1_epi16(0x1EEE)),
                           _mm512_castsi512_ph(_mm512_set1_epi16(static_cast<short>(0xC931))));
  else
    return _mm512_add_ph(_mm512_castsi512_ph(x_lo), _mm512_castsi512_ph(x_hi));
}
#endif

// Rounds fp32 values to fp16 precision (11 significant bits), as fp32, by a Veltkamp split: c = v·(2¹³ + 1),
// hi = (v − c) + c. For the codebooks' values (all normal in fp16) it equals the definition's round to
// nearest even for every one of the 65,536 states of each codebook (Exl3Cpu.Avx512VbmiCodebook... tests it)
// and costs three FP ops instead of vcvtps2ph + vcvtph2ps (4 µops): 6–9 % of the VBMI kernel at m = 1 here.
// It needs each operation rounded on its own: the including file must be built with -ffp-contract=off, or
// GCC fuses v − v·C into one FMA (intrinsics are plain vector expressions to it).
inline __m512 round_f16(__m512 v) {
  const __m512 c = _mm512_mul_ps(v, _mm512_set1_ps(8193.0f));  // Veltkamp: keep 24 − 13 = 11 bits
  return _mm512_add_ps(_mm512_sub_ps(v, c), c);
}

// Without FP16 arithmetic: the same values computed exactly in fp32, then rounded once to fp16 precision.
// lo: positions 0..15 of the group, hi: 16..31.
template <int CB>
inline void codebook_f32(__m512i st, __m512& lo, __m512& hi) {
  __m512i x_lo, x_hi;
  hash16<CB>(st, x_lo, x_hi);
  if constexpr (CB == 2) {
    const __m512i h = mul1_h(x_lo, x_hi);
    const __m512 k_inv = _mm512_set1_ps(0.00676727294921875f), k_bias = _mm512_set1_ps(-10.3828125f);  // f16 0x1EEE, 0xC931
    lo = round_f16(_mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), k_inv, k_bias));
    hi = round_f16(_mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), k_inv, k_bias));
  } else {
    lo = round_f16(_mm512_add_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(x_lo)), _mm512_cvtph_ps(_mm512_castsi512_si256(x_hi))));
    hi = round_f16(_mm512_add_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(x_lo, 1)),
                                 _mm512_cvtph_ps(_mm512_extracti64x4_epi64(x_hi, 1))));
  }
}

// A tile under 64 bytes, loaded once (masked: the tile may end the tensor).
inline __m512i small_tile_bytes(const uint8_t* tile, const ExtractTables& X) {
  return _mm512_maskz_loadu_epi8((__mmask64(1) << X.tile_bytes) - 1, tile);
}

// Group g's 32 states of a tile (small: the tile's bytes when kSmall, else unused).
template <bool kSmall>
inline __m512i group_states(const uint8_t* tile, __m512i small, const ExtractTables& X, int g) {
  __m512i bytes;
  if (kSmall) bytes = _mm512_permutexvar_epi8(_mm512_load_si512(X.gather[g]), small);
  else if (g == 0)
    bytes = _mm512_permutex2var_epi8(_mm512_loadu_si512(tile + X.s0[0]), _mm512_load_si512(X.gather[0]),
                                     _mm512_loadu_si512(tile));
  else bytes = _mm512_permutexvar_epi8(_mm512_load_si512(X.gather[g]), _mm512_loadu_si512(tile + X.s0[g]));
  return _mm512_multishift_epi64_epi8(_mm512_load_si512(X.shift[g]), bytes);
}

// Group g's weights as fp32: positions 32g .. 32g + 15 and 32g + 16 .. 32g + 31.
template <int CB, bool kSmall>
inline void group_values(const uint8_t* tile, __m512i small, const ExtractTables& X, int g, __m512& lo,
                         __m512& hi) {
#if defined(__AVX512FP16__)
  const __m512i v = _mm512_castph_si512(codebook<CB>(group_states<kSmall>(tile, small, X, g)));
  lo = _mm512_cvtph_ps(_mm512_castsi512_si256(v));
  hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1));
#else
  codebook_f32<CB>(group_states<kSmall>(tile, small, X, g), lo, hi);
#endif
}

constexpr int kPrefetchTiles = 4;  // tiles ahead down a column (2–8 measured equal from L3)

// Every cache line of a tile (≤ 256 bytes). Forced inline: GCC 12 at -O2 left a helper that only prefetches
// out of line, found it free of side effects and deleted every call (no prefetch instruction in the object;
// the kernel ran 2× slower from L3).
[[gnu::always_inline]] inline void prefetch_tile(const uint8_t* tile, int tile_bytes) {
  const char* p = reinterpret_cast<const char*>(tile);
  __builtin_prefetch(p, 0, 3);
  if (tile_bytes > 64) __builtin_prefetch(p + 64, 0, 3);
  if (tile_bytes > 128) __builtin_prefetch(p + 128, 0, 3);
  if (tile_bytes > 192) __builtin_prefetch(p + 192, 0, 3);
  __builtin_prefetch(p + tile_bytes - 1, 0, 3);
}

}  // namespace
}  // namespace spw::detail::vbmi
