// EXL3 tile kernel, AVX2 + FMA + F16C: 8 trellis positions (one lane of the tensor-core order) per
// vector. This file alone is built with -mavx2 -mfma -mf16c; it runs only after cpu_isa_detect() saw
// AVX2. Per vector: states by broadcast 16-byte chunk + vpshufb + shift (Exl3Lanes), codebook values by
// arithmetic (fp16-exact) or by gather from the fp32 table; per column group of 4 vectors, every token
// accumulates at once. exl3_gemm_avx512.cpp has the same structure with 16 positions per vector.
// Contract: cpu/exl3_gemm.h (detail::).
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
inline __m256 round_f16(__m256 v) {
  const __m256 c = _mm256_mul_ps(v, _mm256_set1_ps(8193.0f));
  return _mm256_add_ps(_mm256_sub_ps(v, c), c);
}


// CB: 0 = 3INST, 1 = MCG, 2 = MUL1 (spec §2.1). st: 16-bit states in 32-bit elements.
template <int CB>
inline __m256 codebook(__m256i st) {
  if constexpr (CB == 2) {
    // b = bytesum(s·M) by two multiply-adds with ones; (1024 + b)·k_inv + k_bias = b·k_inv − 3.453125,
    // exact in fp32 (|b·1774| < 2^21 units of 2^-18), then one fp16 rounding.
    __m256i x = _mm256_mullo_epi32(st, _mm256_set1_epi32(static_cast<int>(kExl3Mul1Mult)));
    __m256i b = _mm256_madd_epi16(_mm256_maddubs_epi16(x, _mm256_set1_epi8(1)), _mm256_set1_epi16(1));
    return round_f16(_mm256_fmadd_ps(_mm256_cvtepi32_ps(b), _mm256_set1_ps(0.00676727294921875f), _mm256_set1_ps(-3.453125f)));
  } else {
    // Two fp16 halves with exponents 12..15: shifted into fp32 bit positions they are the halves·2^-112
    // (normal fp32), so their fp32 sum is exact; ·2^112 restores the scale, then one fp16 rounding.
    __m256i x = CB == 1 ? _mm256_mullo_epi32(st, _mm256_set1_epi32(static_cast<int>(kExl3McgMult)))
                        : _mm256_add_epi32(_mm256_mullo_epi32(st, _mm256_set1_epi32(89226354)), _mm256_set1_epi32(64248484));
    x = _mm256_xor_si256(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0x8FFF8FFFu))), _mm256_set1_epi32(0x3B603B60));
    const __m256i keep = _mm256_set1_epi32(static_cast<int>(0x8FFFE000u));
    __m256 hi = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(x, 3), keep));
    __m256 lo = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(_mm256_slli_epi32(x, 16), 3), keep));
    return round_f16(_mm256_mul_ps(_mm256_add_ps(hi, lo), _mm256_set1_ps(0x1p112f)));
  }
}

// Ring-wrap chunk of a tile: its last word, then words 0..2 (both halves).
inline __m256i ring_edge(const uint32_t* w, int nw) {
  return _mm256_broadcastsi128_si256(_mm_alignr_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)),
                                                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + nw - 4)), 12));
}

// Vectors q = 4c .. 4c + 3 of a tile (lane q, rows by q mod 4, columns c and c + 8) as fp32 values.
template <int CB, bool kLut>
inline void decode_group(const uint32_t* w, __m256i edge, const Exl3Lanes& L, const float* lut, int c, __m256 v[4]) {
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
    const int q = 4 * c + r;
    const __m256i chunk = q < L.n_edge8 ? edge
                                        : _mm256_broadcastsi128_si256(
                                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + L.base8[q])));
    const __m256i bytes = _mm256_shuffle_epi8(chunk, _mm256_load_si256(reinterpret_cast<const __m256i*>(L.shuf8[q])));
    const __m256i st =
        _mm256_srli_epi32(_mm256_sllv_epi32(bytes, _mm256_load_si256(reinterpret_cast<const __m256i*>(L.shl8[q]))), 16);
    if constexpr (kLut) v[r] = _mm256_i32gather_ps(lut, st, 4);
    else v[r] = codebook<CB>(st);
  }
}

// m ≥ kBlockedMinTokens: decode kBlock tiles down one column into an L1 buffer, then each token runs over
// them with its 8 accumulators in registers (4 x loads + 32 FMAs per tile, no accumulator traffic).
constexpr int kBlock = 4, kBlockedMinTokens = 4;

template <int CB, bool kLut>
void tiles_blocked(const Exl3Part& P) {
  const Exl3Tensor& t = *P.t;
  const Exl3Lanes& L = exl3_lanes(t.bits);
  const int nw = L.n_words;
  const int64_t n_tn = t.n / 16, m = P.m;
  const float* lut = exl3_codebook_lut_f32(t.codebook);
  float* acc = acc_scratch(static_cast<size_t>(m) * 64);
  const int64_t tile_nbytes = 4 * nw, row_nwords = n_tn * nw;
  constexpr int kPrefetchTiles = 4;
  alignas(32) float vb[kBlock][256];
  for (int64_t tn = P.tn0; tn < P.tn1; ++tn) {
    std::memset(acc, 0, sizeof(float) * 64 * m);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(t.tile(P.tk0, tn));
    for (int64_t tkb = P.tk0; tkb < P.tk1; tkb += kBlock) {
      const int nb = static_cast<int>(std::min<int64_t>(kBlock, P.tk1 - tkb));
      for (int b = 0; b < nb; ++b, w += row_nwords) {
        const int64_t tk = tkb + b;
        if (tk + kPrefetchTiles < P.tk1) {  // tiles of one column are a row of tiles apart
          const char* pf = reinterpret_cast<const char*>(w + kPrefetchTiles * row_nwords);
          for (int64_t o = 0; o < tile_nbytes + 63; o += 64) _mm_prefetch(pf + std::min(o, tile_nbytes - 1), _MM_HINT_T0);
        }
        const __m256i edge = ring_edge(w, nw);
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) {  // vector q = 4c + r: lane q, rows by r = q mod 4, columns c and c + 8
          __m256 v[4];
          decode_group<CB, kLut>(w, edge, L, lut, c, v);
          for (int r = 0; r < 4; ++r) _mm256_store_ps(vb[b] + 8 * (4 * c + r), v[r]);
        }
      }
      for (int64_t i = 0; i < m; ++i) {
        float* a = acc + i * 64;
        __m256 s[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) s[c] = _mm256_load_ps(a + 8 * c);
        for (int b = 0; b < nb; ++b) {
          const float* x = P.xe + ((tkb + b) * m + i) * 32;
          const __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8), x2 = _mm256_loadu_ps(x + 16),
                       x3 = _mm256_loadu_ps(x + 24);
          const float* vq = vb[b];
#pragma GCC unroll 8
          for (int c = 0; c < 8; ++c) {
            s[c] = _mm256_fmadd_ps(_mm256_load_ps(vq + 32 * c), x0, s[c]);
            s[c] = _mm256_fmadd_ps(_mm256_load_ps(vq + 32 * c + 8), x1, s[c]);
            s[c] = _mm256_fmadd_ps(_mm256_load_ps(vq + 32 * c + 16), x2, s[c]);
            s[c] = _mm256_fmadd_ps(_mm256_load_ps(vq + 32 * c + 24), x3, s[c]);
          }
        }
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) _mm256_store_ps(a + 8 * c, s[c]);
      }
    }
    for (int64_t i = 0; i < m; ++i)
      for (int c = 0; c < 8; ++c) {
        const float* s = acc + i * 64 + 8 * c;  // lanes 0..3: column c, lanes 4..7: column c + 8
        P.u[i * P.ldu + tn * 16 + c] = (s[0] + s[1]) + (s[2] + s[3]);
        P.u[i * P.ldu + tn * 16 + c + 8] = (s[4] + s[5]) + (s[6] + s[7]);
      }
  }
}

// m < kBlockedMinTokens: strips of kStrip contiguous column tiles (exl3_strips.h; ≈ 8 % at 8192², K3 mul1, m = 1
// on 2 threads, bench/results/exl3_cpu_ci_class.md), accumulators (m × kStrip × 8 vectors) in L1.
constexpr int kStrip = 16;

template <int CB, bool kLut>
void tiles_strips(const Exl3Part& P) {
  const Exl3Lanes& L = exl3_lanes(P.t->bits);
  const int nw = L.n_words;
  const int64_t m = P.m;
  const float* lut = exl3_codebook_lut_f32(P.t->codebook);
  const size_t acc_floats = static_cast<size_t>(m) * kStrip * 64;
  float* acc = acc_scratch(acc_floats);
  walk_strips(
      P, 4 * nw, kStrip, acc, acc_floats,
      [&](const uint8_t* bytes, int j, const float* xt) {
        const auto* w = reinterpret_cast<const uint32_t*>(bytes);
        const __m256i edge = ring_edge(w, nw);
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) {
          __m256 v[4];
          decode_group<CB, kLut>(w, edge, L, lut, c, v);
          for (int64_t i = 0; i < m; ++i) {
            const float* x = xt + i * 32;
            float* a = acc + (i * kStrip + j) * 64 + 8 * c;
            __m256 s = _mm256_load_ps(a);
            s = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x), s);
            s = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(x + 8), s);
            s = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(x + 16), s);
            s = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(x + 24), s);
            _mm256_store_ps(a, s);
          }
        }
      },
      [&](int64_t s0, int ns) {
        for (int64_t i = 0; i < m; ++i)
          for (int j = 0; j < ns; ++j)
            for (int c = 0; c < 8; ++c) {
              const float* sv = acc + (i * kStrip + j) * 64 + 8 * c;  // lanes 0..3: column c, 4..7: c + 8
              P.u[i * P.ldu + (s0 + j) * 16 + c] = (sv[0] + sv[1]) + (sv[2] + sv[3]);
              P.u[i * P.ldu + (s0 + j) * 16 + c + 8] = (sv[4] + sv[5]) + (sv[6] + sv[7]);
            }
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

void exl3_tiles_avx2(const Exl3Part& P, Exl3Decode decode) {
  const bool blocked = P.m >= kBlockedMinTokens;
  if (decode == Exl3Decode::kLut) blocked ? tiles_cb<true, true>(P) : tiles_cb<true, false>(P);
  else blocked ? tiles_cb<false, true>(P) : tiles_cb<false, false>(P);
}

// Same butterflies as had128_f32_scalar (a + b, a − b, then ·r), so results are bit-identical.
void had128_f32_avx2(float* v) {
  __m256 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm256_loadu_ps(v + 8 * i);
  const __m256 s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1), s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1),
               s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
  for (int i = 0; i < 16; ++i) {
    r[i] = _mm256_fmadd_ps(r[i], s1, _mm256_permute_ps(r[i], 0xB1));
    r[i] = _mm256_fmadd_ps(r[i], s2, _mm256_permute_ps(r[i], 0x4E));
    r[i] = _mm256_fmadd_ps(r[i], s4, _mm256_permute2f128_ps(r[i], r[i], 0x01));
  }
  for (int s = 1; s < 16; s <<= 1)
    for (int i = 0; i < 16; i += 2 * s)
      for (int j = i; j < i + s; ++j) {
        __m256 a = r[j], b = r[j + s];
        r[j] = _mm256_add_ps(a, b);
        r[j + s] = _mm256_sub_ps(a, b);
      }
  const __m256 scale = _mm256_set1_ps(0.08838834764831845f);
  for (int i = 0; i < 16; ++i) _mm256_storeu_ps(v + 8 * i, _mm256_mul_ps(r[i], scale));
}

}  // namespace spw::detail
