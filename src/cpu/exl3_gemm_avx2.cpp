// EXL3 tile kernel, AVX2 + FMA + F16C: 8 trellis positions (one lane of the tensor-core order) per
// vector. This file alone is built with -mavx2 -mfma -mf16c; it runs only after cpu_isa_detect()
// saw AVX2. States by two gathers per 8 positions, codebook values in SIMD (fp16-exact), 8 per-column
// accumulators per token. Contract: cpu/exl3_gemm.h (detail::).
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "cpu/exl3_gemm.h"

namespace spw::detail {
namespace {

inline __m256 round_f16(__m256 v) { return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }

// The low (or high) 16 bits of each 32-bit lane, as 8 fp16 → fp32.
inline __m256 halves_to_f32(__m256i x, bool high) {
  const __m256i pick = high ? _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1,
                                               2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1)
                            : _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                               0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  __m256i p = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(x, pick), 0x08);
  return _mm256_cvtph_ps(_mm256_castsi256_si128(p));
}

template <int CB>
inline __m256 codebook(__m256i st) {
  if constexpr (CB == 2) {
    __m256i x = _mm256_mullo_epi32(st, _mm256_set1_epi32(static_cast<int>(kExl3Mul1Mult)));
    const __m256i m8 = _mm256_set1_epi32(0x00FF00FF);
    __m256i s2 = _mm256_add_epi32(_mm256_and_si256(x, m8), _mm256_and_si256(_mm256_srli_epi32(x, 8), m8));
    __m256i b = _mm256_add_epi32(_mm256_and_si256(s2, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(s2, 16));
    __m256 h = _mm256_cvtepi32_ps(_mm256_add_epi32(b, _mm256_set1_epi32(1024)));
    return round_f16(_mm256_fmadd_ps(h, _mm256_set1_ps(0.00676727294921875f), _mm256_set1_ps(-10.3828125f)));
  } else {
    __m256i x = CB == 1 ? _mm256_mullo_epi32(st, _mm256_set1_epi32(static_cast<int>(kExl3McgMult)))
                        : _mm256_add_epi32(_mm256_mullo_epi32(st, _mm256_set1_epi32(89226354)), _mm256_set1_epi32(64248484));
    x = _mm256_xor_si256(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0x8FFF8FFFu))), _mm256_set1_epi32(0x3B603B60));
    return round_f16(_mm256_add_ps(halves_to_f32(x, false), halves_to_f32(x, true)));
  }
}

template <int CB>
void tiles(const Exl3Tensor& t, const float* xe, int64_t m, int64_t tn0, int64_t tn1, const int32_t* starts, float* u) {
  const int nw = t.words_per_tile() / 2;
  const int64_t n_tk = t.k / 16;
  alignas(32) uint32_t buf[80] = {};
  const __m256i one = _mm256_set1_epi32(1);
  std::vector<float> accv(static_cast<size_t>(m) * 64 + 8);
  float* acc = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(accv.data()) + 31) & ~uintptr_t(31));
  __m256 v[32];
  for (int64_t tn = tn0; tn < tn1; ++tn) {
    std::memset(acc, 0, sizeof(float) * 64 * m);
    for (int64_t tk = 0; tk < n_tk; ++tk) {
      std::memcpy(buf + 1, t.tile(tk, tn), 4 * nw);
      buf[0] = buf[nw];
      buf[nw + 1] = buf[1];
      for (int q = 0; q < 32; ++q) {
        __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(starts + 8 * q));
        __m256i w = _mm256_srli_epi32(s, 5), off = _mm256_and_si256(s, _mm256_set1_epi32(31));
        __m256i hi = _mm256_i32gather_epi32(reinterpret_cast<const int*>(buf), w, 4);
        __m256i lo = _mm256_i32gather_epi32(reinterpret_cast<const int*>(buf), _mm256_add_epi32(w, one), 4);
        __m256i st = _mm256_srli_epi32(
            _mm256_or_si256(_mm256_sllv_epi32(hi, off), _mm256_srlv_epi32(lo, _mm256_sub_epi32(_mm256_set1_epi32(32), off))), 16);
        v[q] = codebook<CB>(st);
      }
      for (int64_t i = 0; i < m; ++i) {
        const float* x = xe + (i * n_tk + tk) * 32;
        const __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8), x2 = _mm256_loadu_ps(x + 16), x3 = _mm256_loadu_ps(x + 24);
        float* a = acc + i * 64;
        for (int c = 0; c < 8; ++c) {  // chunk q = 4c + pattern: rows follow q mod 4, column group q / 4
          __m256 s = _mm256_load_ps(a + 8 * c);
          s = _mm256_fmadd_ps(v[4 * c], x0, s);
          s = _mm256_fmadd_ps(v[4 * c + 1], x1, s);
          s = _mm256_fmadd_ps(v[4 * c + 2], x2, s);
          s = _mm256_fmadd_ps(v[4 * c + 3], x3, s);
          _mm256_store_ps(a + 8 * c, s);
        }
      }
    }
    for (int64_t i = 0; i < m; ++i)
      for (int c = 0; c < 8; ++c) {
        const float* s = acc + i * 64 + 8 * c;  // lanes 0..3: column c, lanes 4..7: column c + 8
        u[i * t.n + tn * 16 + c] = (s[0] + s[1]) + (s[2] + s[3]);
        u[i * t.n + tn * 16 + c + 8] = (s[4] + s[5]) + (s[6] + s[7]);
      }
  }
}

}  // namespace

void exl3_tiles_avx2(const Exl3Tensor& t, const float* xe, int64_t m, int64_t tn0, int64_t tn1,
                     const int32_t* starts, float* u) {
  switch (t.codebook) {
    case Exl3Codebook::k3Inst: return tiles<0>(t, xe, m, tn0, tn1, starts, u);
    case Exl3Codebook::kMcg: return tiles<1>(t, xe, m, tn0, tn1, starts, u);
    case Exl3Codebook::kMul1: return tiles<2>(t, xe, m, tn0, tn1, starts, u);
  }
}

}  // namespace spw::detail
