// EXL3 MUL1 tile kernel with int16 activations (Exl3Activations::kInt16: a separate, approximate option; see
// exl3_gemm.h) for AVX-512 VBMI + VNNI. This file alone is built with those flags; it runs only where
// exl3_int16_ready().
//
// Why: the exact FP16 kernel spends ~17 port-0/5 micro-ops per 32 weights (counted from the instruction sequences), 7 of them turning each byte sum
// into an fp16 weight and multiplying it in fp32 (fp16 FMA, two vcvtph2ps, two fp32 FMAs). MUL1's weight is
// affine in the byte sum b of its hash: ŵ = fp16(k_inv·(1024 + b) + k_bias). Without that fp16 rounding,
//   Σ_k x_k ŵ_kn ≈ k_inv · Σ_k x_k b_kn + c · Σ_k x_k,   c = 1024·k_inv + k_bias = −3.453125,
// and with x_k ≈ s·q_k (q: 15-bit integers, one scale s per token and 128-row block of xr — the Hadamard
// block, so an outlier spreads over its block and coarsens only that block's step), Σ q·b is one vpdpwssd
// per 32 weights on the 16-bit byte sums: ~10 micro-ops per 32 weights. vpdpwssd adds lanes 2d and 2d + 1 into dword d; the
// lanes of one pair are two rows of the same column (column g for lane mod 8 < 4, g + 8 otherwise: dwords
// 0x3333 and 0xCCCC), so the pair sums stay in their column. The error has two sources, both ~1e-4 relative:
// the skipped fp16 rounding of ŵ (≤ 2^-12 relative per weight) and x's quantization (≤ s/2 per element).
// Integer sums are exact within a block; at each block's end they are scaled into fp32 (≤ 8 k-tile rows:
// per dword and row ≤ 2 · 1020 · 16383 = 33.4 M, × 8 = 267 M < 2^31).
// Layout, work split and strip walk are the VBMI kernel's (exl3_avx512vbmi_tiles.h, exl3_strips.h).
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "cpu/exl3_avx512vbmi_decode.h"
#include "cpu/exl3_gemm.h"
#include "cpu/exl3_strips.h"

namespace spw::detail {
namespace {

constexpr int kStrip = 16;
constexpr int64_t kBlockTiles = 128 / 16;      // k-tile rows per scale block
constexpr int64_t kAccBytes = 32 << 10;        // both accumulator sets of a strip, for m ≥ 4 (as tiles_many)
constexpr float kInv = 0.00676727294921875f;   // fp16 0x1EEE
constexpr float kAffine = -3.453125f;          // 1024·kInv + fp16 0xC931 (−10.3828125), exact in fp32

// Group g's 32 byte sums (16-bit lanes, ≤ 1020) of a MUL1 tile.
template <bool kSmall>
inline __m512i group_sums(const uint8_t* w, __m512i small, const vbmi::ExtractTables& X, int g) {
  __m512i lo, hi;
  vbmi::hash16<2>(vbmi::group_states<kSmall>(w, small, X, g), lo, hi);
  const __m512i ones = _mm512_set1_epi8(1);
  return _mm512_add_epi16(_mm512_maddubs_epi16(lo, ones), _mm512_maddubs_epi16(hi, ones));
}

// accf += acc32 · scale[i] for each token's n dwords (a multiple of 16), acc32 = 0.
inline void flush(float* accf, int32_t* acc32, int64_t m, size_t n, const float* scale) {
  for (int64_t i = 0; i < m; ++i) {
    const __m512 s = _mm512_set1_ps(scale[i]);
    for (size_t o = static_cast<size_t>(i) * n; o < static_cast<size_t>(i + 1) * n; o += 16) {
      __m512i* a = reinterpret_cast<__m512i*>(acc32 + o);
      _mm512_store_ps(accf + o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(a)), s, _mm512_load_ps(accf + o)));
      _mm512_store_si512(a, _mm512_setzero_si512());
    }
  }
}

// M tokens (0: P.m at run time). Per tile: the 8 groups' byte sums once, then one vpdpwssd per group and token.
template <bool kSmall, int M>
void tiles(const Exl3Part& P) {
  const vbmi::ExtractTables& X = vbmi::extract_tables(P.t->bits);
  const int64_t m = M ? M : P.m;
  const int strip = M ? kStrip : static_cast<int>(std::clamp<int64_t>(kAccBytes / (m * 1024), 1, kStrip));
  const size_t per = static_cast<size_t>(m) * strip * 128;
  float* accf = acc_scratch(2 * per);
  int32_t* acc32 = reinterpret_cast<int32_t*>(accf + per);

  // The affine term per token: c · Σ s·q over the part's rows (each row once: the lanes of column g). Of the
  // quantized x, not x: the byte sums average 510, so k_inv·Σ(s·q − x)·b has a part common to every column,
  // k_inv·510·Σ(s·q − x), that the affine term over x would leave in (it lands on the first output of each
  // 128-column Hadamard block: 5e-3·RMS there, 20× the other columns' error). Over s·q it cancels: the error
  // becomes Σ(s·q − x)·ŵ, and ŵ averages ~0.
  thread_local std::vector<float> affine;
  affine.assign(static_cast<size_t>(m), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    double s = 0;
    for (int64_t tk = P.tk0; tk < P.tk1; ++tk) {
      const int16_t* q = P.xq + (tk * m + i) * 32;
      int64_t sq = 0;
      for (int l = 0; l < 32; ++l)
        if (l % 8 < 4) sq += q[l];
      s += double(P.xq_scale[tk / kBlockTiles * m + i]) * double(sq);
    }
    affine[static_cast<size_t>(i)] = static_cast<float>(kAffine * s);
  }

  const int16_t* xq_row = P.xq + P.tk0 * m * 32;
  const size_t per_token = static_cast<size_t>(strip) * 128;
  walk_strips(
      P, X.tile_bytes, strip, accf, 2 * per,
      [&](const uint8_t* w, int j, const float*) {
        const __m512i small = kSmall ? vbmi::small_tile_bytes(w, X) : _mm512_setzero_si512();
        __m512i b[8];
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) b[g] = group_sums<kSmall>(w, small, X, g);
        for (int64_t i = 0; i < m; ++i) {
          const __m512i xq = _mm512_loadu_si512(xq_row + 32 * i);
          __m512i* a = reinterpret_cast<__m512i*>(acc32 + (i * strip + j) * 128);
#pragma GCC unroll 8
          for (int g = 0; g < 8; ++g) _mm512_store_si512(a + g, _mm512_dpwssd_epi32(_mm512_load_si512(a + g), b[g], xq));
        }
      },
      [&](int64_t tk) {  // a block's last row (or the part's): its integer sums, scaled, into accf
        xq_row += m * 32;
        if ((tk + 1) % kBlockTiles == 0 || tk + 1 == P.tk1) flush(accf, acc32, m, per_token, P.xq_scale + tk / kBlockTiles * m);
      },
      [&](int64_t s0, int ns) {
        xq_row = P.xq + P.tk0 * m * 32;
        for (int64_t i = 0; i < m; ++i) {
          const float add = affine[static_cast<size_t>(i)];
          for (int j = 0; j < ns; ++j) {
            float* u = P.u + i * P.ldu + (s0 + j) * 16;
            const float* a = accf + (i * strip + j) * 128;
            for (int g = 0; g < 8; ++g) {
              const __m512 v = _mm512_load_ps(a + 16 * g);
              u[g] = _mm512_mask_reduce_add_ps(0x3333, v) * kInv + add;
              u[g + 8] = _mm512_mask_reduce_add_ps(0xCCCC, v) * kInv + add;
            }
          }
        }
      });
}

template <bool kSmall>
void tiles_m(const Exl3Part& P) {
  switch (P.m) {
    case 1: return tiles<kSmall, 1>(P);
    case 2: return tiles<kSmall, 2>(P);
    case 3: return tiles<kSmall, 3>(P);
    default: return tiles<kSmall, 0>(P);
  }
}

}  // namespace

void exl3_tiles_int16(const Exl3Part& P) {
  if (vbmi::extract_tables(P.t->bits).small_tile) tiles_m<true>(P);
  else tiles_m<false>(P);
}

}  // namespace spw::detail
