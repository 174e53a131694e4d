// The AVX-512 FP16 + VBMI EXL3 decode shared by the tile kernels (exl3_gemm_avx512fp16.cpp) and the AMX
// kernel (exl3_gemm_amx.cpp): state extraction tables, the 16-bit-lane codebooks, a tile group's 32 states
// and values. Include only from files built with -mavx512f -mavx512bw -mavx512vl -mavx512vbmi
// -mavx512fp16, and run only where cpu_isa_detect() ≥ CpuIsa::kAvx512Fp16. See exl3_gemm_avx512fp16.cpp.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/exl3_gemm.h"

namespace spw::detail::fp16 {

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

constexpr uint32_t k3InstMult = 89226354u, k3InstAdd = 64248484u;

inline __m512i lo16(uint32_t v) { return _mm512_set1_epi16(static_cast<short>(v & 0xFFFF)); }
inline __m512i hi16(uint32_t v) { return _mm512_set1_epi16(static_cast<short>(v >> 16)); }

// fp16 codebook values of 32 16-bit states (CB: 0 = 3INST, 1 = MCG, 2 = MUL1; spec §2.1).
template <int CB>
inline __m512h codebook(__m512i st) {
  constexpr uint32_t M = CB == 2 ? kExl3Mul1Mult : CB == 1 ? kExl3McgMult : k3InstMult;
  __m512i x_lo = _mm512_mullo_epi16(st, lo16(M));
  __m512i x_hi = _mm512_add_epi16(_mm512_mulhi_epu16(st, lo16(M)), _mm512_mullo_epi16(st, hi16(M)));
  if constexpr (CB == 2) {
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512i sum = _mm512_add_epi16(_mm512_maddubs_epi16(x_lo, ones), _mm512_maddubs_epi16(x_hi, ones));
    const __m512h h = _mm512_castsi512_ph(_mm512_or_si512(sum, _mm512_set1_epi16(0x6400)));  // fp16 1024 + sum
    return _mm512_fmadd_ph(h, _mm512_castsi512_ph(_mm512_set1_epi16(0x1EEE)),
                           _mm512_castsi512_ph(_mm512_set1_epi16(static_cast<short>(0xC931))));
  } else {
    if constexpr (CB == 0) {  // + k3InstAdd with the carry out of the low half
      x_lo = _mm512_add_epi16(x_lo, lo16(k3InstAdd));
      const __mmask32 carry = _mm512_cmplt_epu16_mask(x_lo, lo16(k3InstAdd));
      x_hi = _mm512_add_epi16(x_hi, hi16(k3InstAdd));
      x_hi = _mm512_mask_add_epi16(x_hi, carry, x_hi, _mm512_set1_epi16(1));
    }
    // (x & 0x8FFF) ^ 0x3B60 in each half: ternary-logic function (A & B) ^ C = 0x6A.
    const __m512i keep = _mm512_set1_epi16(static_cast<short>(0x8FFF)), flip = _mm512_set1_epi16(0x3B60);
    x_lo = _mm512_ternarylogic_epi32(x_lo, keep, flip, 0x6A);
    x_hi = _mm512_ternarylogic_epi32(x_hi, keep, flip, 0x6A);
    return _mm512_add_ph(_mm512_castsi512_ph(x_lo), _mm512_castsi512_ph(x_hi));  // exact sum, one rounding
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
  const __m512i v = _mm512_castph_si512(codebook<CB>(group_states<kSmall>(tile, small, X, g)));
  lo = _mm512_cvtph_ps(_mm512_castsi512_si256(v));
  hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1));
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

}  // namespace spw::detail::fp16
