// EXL3 tile kernel, AVX-512 (F+BW+VL): 16 trellis positions per vector. This file alone is built with
// -mavx512f -mavx512bw -mavx512vl -mfma -mf16c; it runs only after cpu_isa_detect() saw AVX-512.
// Per tile: states from the ring (vpermt2d over the in-register ring when it fits 32 words, i.e. K ≤ 3,
// else two gathers), codebook values computed in SIMD (fp16-exact: vcvtps2ph round-to-nearest-even),
// then 16 FMAs per token into 8 per-column accumulators. Contract: cpu/exl3_gemm.h (detail::).
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "cpu/exl3_gemm.h"

namespace spw::detail {
namespace {

inline __m512 round_f16(__m512 v) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

template <int CB>
inline __m512 codebook(__m512i st) {
  if constexpr (CB == 2) {  // MUL1: f16((1024 + bytesum(s·M))·k_inv + k_bias)
    __m512i x = _mm512_mullo_epi32(st, _mm512_set1_epi32(static_cast<int>(kExl3Mul1Mult)));
    const __m512i m8 = _mm512_set1_epi32(0x00FF00FF);
    __m512i s2 = _mm512_add_epi32(_mm512_and_si512(x, m8), _mm512_and_si512(_mm512_srli_epi32(x, 8), m8));
    __m512i b = _mm512_add_epi32(_mm512_and_si512(s2, _mm512_set1_epi32(0xFFFF)), _mm512_srli_epi32(s2, 16));
    __m512 h = _mm512_cvtepi32_ps(_mm512_add_epi32(b, _mm512_set1_epi32(1024)));
    return round_f16(_mm512_fmadd_ps(h, _mm512_set1_ps(0.00676727294921875f), _mm512_set1_ps(-10.3828125f)));
  } else {  // 3INST / MCG: two fp16 halves of a hashed word, summed once
    __m512i x = CB == 1 ? _mm512_mullo_epi32(st, _mm512_set1_epi32(static_cast<int>(kExl3McgMult)))
                        : _mm512_add_epi32(_mm512_mullo_epi32(st, _mm512_set1_epi32(89226354)), _mm512_set1_epi32(64248484));
    x = _mm512_xor_si512(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0x8FFF8FFFu))), _mm512_set1_epi32(0x3B603B60));
    __m512 lo = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(x));
    __m512 hi = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(x, 16)));
    return round_f16(_mm512_add_ps(lo, hi));
  }
}

template <int CB, bool kInRegisters>
void tiles(const Exl3Tensor& t, const float* xe, int64_t m, int64_t tn0, int64_t tn1, const int32_t* starts, float* u) {
  const int nw = t.words_per_tile() / 2;
  const int64_t n_tk = t.k / 16;
  alignas(64) uint32_t buf[80] = {};
  __m512i widx[16], off[16], roff[16];
  for (int q = 0; q < 16; ++q) {
    __m512i s = _mm512_loadu_si512(starts + 16 * q);
    widx[q] = _mm512_srli_epi32(s, 5);
    off[q] = _mm512_and_si512(s, _mm512_set1_epi32(31));
    roff[q] = _mm512_sub_epi32(_mm512_set1_epi32(32), off[q]);
  }
  const __m512i one = _mm512_set1_epi32(1);
  std::vector<float, std::allocator<float>> accv(static_cast<size_t>(m) * 128 + 16);
  float* acc = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(accv.data()) + 63) & ~uintptr_t(63));
  __m512 v[16];
  for (int64_t tn = tn0; tn < tn1; ++tn) {
    std::memset(acc, 0, sizeof(float) * 128 * m);
    for (int64_t tk = 0; tk < n_tk; ++tk) {
      const uint16_t* tile = t.tile(tk, tn);
      std::memcpy(buf + 1, tile, 4 * nw);  // little-endian uint32 view (spec §1.4)
      buf[0] = buf[nw];
      buf[nw + 1] = buf[1];
      if constexpr (kInRegisters) {
        __m512i r0 = _mm512_load_si512(buf), r1 = _mm512_load_si512(buf + 16);
        for (int q = 0; q < 16; ++q) {
          __m512i hi = _mm512_permutex2var_epi32(r0, widx[q], r1);
          __m512i lo = _mm512_permutex2var_epi32(r0, _mm512_add_epi32(widx[q], one), r1);
          __m512i st = _mm512_srli_epi32(_mm512_or_si512(_mm512_sllv_epi32(hi, off[q]), _mm512_srlv_epi32(lo, roff[q])), 16);
          v[q] = codebook<CB>(st);
        }
      } else {
        for (int q = 0; q < 16; ++q) {
          __m512i hi = _mm512_i32gather_epi32(widx[q], buf, 4);
          __m512i lo = _mm512_i32gather_epi32(_mm512_add_epi32(widx[q], one), buf, 4);
          __m512i st = _mm512_srli_epi32(_mm512_or_si512(_mm512_sllv_epi32(hi, off[q]), _mm512_srlv_epi32(lo, roff[q])), 16);
          v[q] = codebook<CB>(st);
        }
      }
      for (int64_t i = 0; i < m; ++i) {
        const float* x = xe + (i * n_tk + tk) * 32;
        const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        float* a = acc + i * 128;
        for (int c = 0; c < 8; ++c) {
          __m512 s = _mm512_load_ps(a + 16 * c);
          s = _mm512_fmadd_ps(v[2 * c], x0, s);
          s = _mm512_fmadd_ps(v[2 * c + 1], x1, s);
          _mm512_store_ps(a + 16 * c, s);
        }
      }
    }
    // Lane L of accumulator c holds column c (L mod 8 < 4) or c + 8 (otherwise).
    for (int64_t i = 0; i < m; ++i)
      for (int c = 0; c < 8; ++c) {
        __m512 s = _mm512_load_ps(acc + i * 128 + 16 * c);
        u[i * t.n + tn * 16 + c] = _mm512_mask_reduce_add_ps(0x0F0F, s);
        u[i * t.n + tn * 16 + c + 8] = _mm512_mask_reduce_add_ps(0xF0F0, s);
      }
  }
}

template <int CB>
void tiles_cb(const Exl3Tensor& t, const float* xe, int64_t m, int64_t tn0, int64_t tn1, const int32_t* starts, float* u) {
  if (t.words_per_tile() / 2 + 2 <= 32) tiles<CB, true>(t, xe, m, tn0, tn1, starts, u);
  else tiles<CB, false>(t, xe, m, tn0, tn1, starts, u);
}

}  // namespace

void exl3_tiles_avx512(const Exl3Tensor& t, const float* xe, int64_t m, int64_t tn0, int64_t tn1,
                       const int32_t* starts, float* u) {
  switch (t.codebook) {
    case Exl3Codebook::k3Inst: return tiles_cb<0>(t, xe, m, tn0, tn1, starts, u);
    case Exl3Codebook::kMcg: return tiles_cb<1>(t, xe, m, tn0, tn1, starts, u);
    case Exl3Codebook::kMul1: return tiles_cb<2>(t, xe, m, tn0, tn1, starts, u);
  }
}

}  // namespace spw::detail
