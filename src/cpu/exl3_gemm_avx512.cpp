// EXL3 tile kernel, AVX-512 (F+BW+VL): 16 trellis positions (two lanes of the tensor-core order) per
// vector. This file alone is built with -mavx512f -mavx512bw -mavx512vl -mfma -mf16c; it runs only after
// cpu_isa_detect() saw AVX-512. Same structure as exl3_gemm_avx2.cpp: per vector, states by an 8-word
// window + vpermd into four 16-byte chunks + vpshufb + shift (Exl3Lanes), codebook values by arithmetic
// (fp16-exact) or by gather from the fp32 table; per column group of 2 vectors, every token accumulates
// at once (m < 4, over strips of contiguous tiles) or kBlock tiles are decoded first (m ≥ 4). Used on
// AVX-512 machines without VBMI (Skylake-X, Cascade Lake); newer ones take exl3_gemm_avx512vbmi.cpp or
// _avx512fp16.cpp. Contract: cpu/exl3_gemm.h (detail::).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/exl3_gemm.h"
#include "cpu/exl3_strips.h"

namespace spw::detail {
namespace {

// fp32 → fp16 precision (11 significant bits, round to nearest even) by a Veltkamp split, as the VBMI kernel
// does (exl3_avx512vbmi_decode.h: equal to vcvtps2ph + vcvtph2ps for every codebook value, tested exhaustively
// there on the same exact values; three FP ops instead of four µops). This file is built with -ffp-contract=off
// so that GCC keeps the split's roundings apart.
inline __m512 round_f16(__m512 v) {
  const __m512 c = _mm512_mul_ps(v, _mm512_set1_ps(8193.0f));
  return _mm512_add_ps(_mm512_sub_ps(v, c), c);
}

// CB: 0 = 3INST, 1 = MCG, 2 = MUL1 (spec §2.1); the same exact arithmetic as the AVX2 kernel.
template <int CB>
inline __m512 codebook(__m512i st) {
  if constexpr (CB == 2) {
    __m512i x = _mm512_mullo_epi32(st, _mm512_set1_epi32(static_cast<int>(kExl3Mul1Mult)));
    __m512i b = _mm512_madd_epi16(_mm512_maddubs_epi16(x, _mm512_set1_epi8(1)), _mm512_set1_epi16(1));
    return round_f16(_mm512_fmadd_ps(_mm512_cvtepi32_ps(b), _mm512_set1_ps(0.00676727294921875f), _mm512_set1_ps(-3.453125f)));
  } else {
    __m512i x = CB == 1 ? _mm512_mullo_epi32(st, _mm512_set1_epi32(static_cast<int>(kExl3McgMult)))
                        : _mm512_add_epi32(_mm512_mullo_epi32(st, _mm512_set1_epi32(89226354)), _mm512_set1_epi32(64248484));
    x = _mm512_xor_si512(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0x8FFF8FFFu))), _mm512_set1_epi32(0x3B603B60));
    const __m512i keep = _mm512_set1_epi32(static_cast<int>(0x8FFFE000u));
    __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(_mm512_srai_epi32(x, 3), keep));
    __m512 lo = _mm512_castsi512_ps(_mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(x, 16), 3), keep));
    return round_f16(_mm512_mul_ps(_mm512_add_ps(hi, lo), _mm512_set1_ps(0x1p112f)));
  }
}

// Ring-wrap window of a tile: its last word, then words 0..6.
inline __m512i ring_edge(const uint32_t* w, int nw) {
  return _mm512_castsi256_si512(_mm256_alignr_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)),
                                                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + nw - 8)), 7));
}

// Vectors q = 2c, 2c + 1 of a tile (lanes 2q, 2q + 1; rows by q mod 2, columns c and c + 8) as fp32 values.
template <int CB, bool kLut>
inline void decode_pair(const uint32_t* w, __m512i edge, const Exl3Lanes& L, const float* lut, int c, __m512 v[2]) {
#pragma GCC unroll 2
  for (int r = 0; r < 2; ++r) {
    const int q = 2 * c + r;
    const __m512i window = q < L.n_edge16
                               ? edge
                               : _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + L.base16[q])));
    const __m512i chunks = _mm512_permutexvar_epi32(_mm512_load_si512(L.perm16[q]), window);
    const __m512i bytes = _mm512_shuffle_epi8(chunks, _mm512_load_si512(L.shuf16[q]));
    const __m512i st = _mm512_srli_epi32(_mm512_sllv_epi32(bytes, _mm512_load_si512(L.shl16[q])), 16);
    if constexpr (kLut) v[r] = _mm512_i32gather_ps(st, lut, 4);
    else v[r] = codebook<CB>(st);
  }
}

// Lane l of accumulator c holds column c (l mod 8 < 4) or c + 8 (otherwise).
inline void store_columns(const float* acc, float* u) {
  for (int c = 0; c < 8; ++c) {
    const __m512 s = _mm512_load_ps(acc + 16 * c);
    u[c] = _mm512_mask_reduce_add_ps(0x0F0F, s);
    u[c + 8] = _mm512_mask_reduce_add_ps(0xF0F0, s);
  }
}

// m ≥ kBlockedMinTokens: as in the AVX2 kernel, kBlock decoded tiles down one column in an L1 buffer,
// then each token with its 8 accumulators in registers (2 x loads + 16 FMAs per tile).
constexpr int kBlock = 4, kBlockedMinTokens = 4;

template <int CB, bool kLut>
void tiles_blocked(const Exl3Part& P) {
  const Exl3Tensor& t = *P.t;
  const Exl3Lanes& L = exl3_lanes(t.bits);
  const int nw = L.n_words;
  const int64_t n_tn = t.n / 16, m = P.m;
  const float* lut = exl3_codebook_lut_f32(t.codebook);
  float* acc = acc_scratch(static_cast<size_t>(m) * 128);
  const int64_t tile_nbytes = 4 * nw, row_nwords = n_tn * nw;
  constexpr int kPrefetchTiles = 4;
  alignas(64) float vb[kBlock][256];
  for (int64_t tn = P.tn0; tn < P.tn1; ++tn) {
    std::memset(acc, 0, sizeof(float) * 128 * m);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(t.tile(P.tk0, tn));
    for (int64_t tkb = P.tk0; tkb < P.tk1; tkb += kBlock) {
      const int nb = static_cast<int>(std::min<int64_t>(kBlock, P.tk1 - tkb));
      for (int b = 0; b < nb; ++b, w += row_nwords) {
        const int64_t tk = tkb + b;
        if (tk + kPrefetchTiles < P.tk1) {  // tiles of one column are a row of tiles apart
          const char* pf = reinterpret_cast<const char*>(w + kPrefetchTiles * row_nwords);
          for (int64_t o = 0; o < tile_nbytes + 63; o += 64) _mm_prefetch(pf + std::min(o, tile_nbytes - 1), _MM_HINT_T0);
        }
        const __m512i edge = ring_edge(w, nw);
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) {
          __m512 v[2];
          decode_pair<CB, kLut>(w, edge, L, lut, c, v);
          _mm512_store_ps(vb[b] + 32 * c, v[0]);
          _mm512_store_ps(vb[b] + 32 * c + 16, v[1]);
        }
      }
      for (int64_t i = 0; i < m; ++i) {
        float* a = acc + i * 128;
        __m512 s[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) s[c] = _mm512_load_ps(a + 16 * c);
        for (int b = 0; b < nb; ++b) {
          const float* x = P.xe + ((tkb + b) * m + i) * 32;
          const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
          const float* vq = vb[b];
#pragma GCC unroll 8
          for (int c = 0; c < 8; ++c) {
            s[c] = _mm512_fmadd_ps(_mm512_load_ps(vq + 32 * c), x0, s[c]);
            s[c] = _mm512_fmadd_ps(_mm512_load_ps(vq + 32 * c + 16), x1, s[c]);
          }
        }
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) _mm512_store_ps(a + 16 * c, s[c]);
      }
    }
    for (int64_t i = 0; i < m; ++i) store_columns(acc + i * 128, P.u + i * P.ldu + tn * 16);
  }
}

// m < kBlockedMinTokens: strips of kStrip contiguous column tiles (exl3_strips.h), accumulators
// (m × kStrip × 8 vectors) in L1.
constexpr int kStrip = 16;

template <int CB, bool kLut>
void tiles_strips(const Exl3Part& P) {
  const Exl3Lanes& L = exl3_lanes(P.t->bits);
  const int nw = L.n_words;
  const int64_t m = P.m;
  const float* lut = exl3_codebook_lut_f32(P.t->codebook);
  const size_t acc_floats = static_cast<size_t>(m) * kStrip * 128;
  float* acc = acc_scratch(acc_floats);
  walk_strips(
      P, 4 * nw, kStrip, acc, acc_floats,
      [&](const uint8_t* bytes, int j, const float* xt) {
        const auto* w = reinterpret_cast<const uint32_t*>(bytes);
        const __m512i edge = ring_edge(w, nw);
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) {
          __m512 v[2];
          decode_pair<CB, kLut>(w, edge, L, lut, c, v);
          for (int64_t i = 0; i < m; ++i) {
            const float* x = xt + i * 32;
            float* a = acc + (i * kStrip + j) * 128 + 16 * c;
            __m512 s = _mm512_fmadd_ps(v[0], _mm512_loadu_ps(x), _mm512_load_ps(a));
            _mm512_store_ps(a, _mm512_fmadd_ps(v[1], _mm512_loadu_ps(x + 16), s));
          }
        }
      },
      [&](int64_t s0, int ns) {
        for (int64_t i = 0; i < m; ++i)
          for (int j = 0; j < ns; ++j) store_columns(acc + (i * kStrip + j) * 128, P.u + i * P.ldu + (s0 + j) * 16);
      });
}

template <bool kLut, bool kBlocked>
void tiles_cb(const Exl3Part& P) {
  switch (P.t->codebook) {
    case Exl3Codebook::k3Inst: return kBlocked ? tiles_blocked<0, kLut>(P) : tiles_strips<0, kLut>(P);
    case Exl3Codebook::kMcg: return kBlocked ? tiles_blocked<1, kLut>(P) : tiles_strips<1, kLut>(P);
    case Exl3Codebook::kMul1: return kBlocked ? tiles_blocked<2, kLut>(P) : tiles_strips<2, kLut>(P);
  }
}

}  // namespace

void exl3_tiles_avx512(const Exl3Part& P, Exl3Decode decode) {
  const bool blocked = P.m >= kBlockedMinTokens;
  if (decode == Exl3Decode::kLut) blocked ? tiles_cb<true, true>(P) : tiles_cb<true, false>(P);
  else blocked ? tiles_cb<false, true>(P) : tiles_cb<false, false>(P);
}

}  // namespace spw::detail
