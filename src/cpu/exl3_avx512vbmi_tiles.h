// The AVX-512 VBMI tile loops (strips of contiguous tiles; m = 1..3 with accumulators per group, m ≥ 4 with
// each tile decoded once into registers), over the decode of exl3_avx512vbmi_decode.h. Included by
// exl3_gemm_avx512fp16.cpp (FP16 arithmetic) and exl3_gemm_avx512vbmi.cpp (without): the same loops, each file
// its own copy (unnamed namespace). Entry: tiles_vbmi(part).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/exl3_avx512vbmi_decode.h"
#include "cpu/exl3_gemm.h"
#include "cpu/exl3_strips.h"

namespace spw::detail::vbmi {
namespace {

// Lane l of accumulator g holds column g (l mod 8 < 4) or g + 8 (otherwise).
inline void store_columns(const __m512* acc, float* u) {
  for (int g = 0; g < 8; ++g) {
    u[g] = _mm512_mask_reduce_add_ps(0x0F0F, acc[g]);
    u[g + 8] = _mm512_mask_reduce_add_ps(0xF0F0, acc[g]);
  }
}

// The strip's accumulators to u: token i, tile j at acc + (i·strip + j)·128.
inline void store_strip(const Exl3Part& P, const float* acc, int strip, int64_t s0, int ns) {
  for (int64_t i = 0; i < P.m; ++i)
    for (int j = 0; j < ns; ++j) {
      __m512 v[8];
      for (int g = 0; g < 8; ++g) v[g] = _mm512_load_ps(acc + (i * strip + j) * 128 + 16 * g);
      store_columns(v, P.u + i * P.ldu + (s0 + j) * 16);
    }
}

// M = 1..3 tokens: each group's values are used at once by every token, over strips of kStrip contiguous
// column tiles (exl3_strips.h); the accumulators (kStrip × 8 vectors per token) stay in L1.
constexpr int kStrip = 16;

template <int CB, bool kSmall, int M>
void tiles_small(const Exl3Part& P) {
  const ExtractTables& X = extract_tables(P.t->bits);
  alignas(64) float acc[M * kStrip * 128];
  walk_strips(
      P, X.tile_bytes, kStrip, acc, M * kStrip * 128,
      [&](const uint8_t* w, int j, const float* xt) {
        const __m512i small = kSmall ? small_tile_bytes(w, X) : _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
          __m512 lo, hi;
          group_values<CB, kSmall>(w, small, X, g, lo, hi);
          for (int i = 0; i < M; ++i) {
            float* a = acc + (i * kStrip + j) * 128 + 16 * g;
            const __m512 sum = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xt + 32 * i), _mm512_load_ps(a));
            _mm512_store_ps(a, _mm512_fmadd_ps(hi, _mm512_loadu_ps(xt + 32 * i + 16), sum));
          }
        }
      },
      [&](int64_t s0, int ns) { store_strip(P, acc, kStrip, s0, ns); });
}

// m ≥ 4: the same strips, each tile decoded once into 16 registers and then applied to every token. The
// accumulators (m × strip × 8 vectors) are kept within kAccBytes of L1 by narrowing the strip as m grows
// (8 column tiles at m = 4, one from m = 32; 16 KB measured a little faster than 32 KB at m = 16 and far
// faster than 64 KB); per token and tile that is 16 FMAs against 8 accumulator loads and stores, so the
// FMA ports bound it rather than the decode. (Where AMX is ready, m ≥ kAmxMinTokens goes there instead.)
constexpr int64_t kAccBytes = 16 << 10;

template <int CB, bool kSmall>
void tiles_many(const Exl3Part& P) {
  const ExtractTables& X = extract_tables(P.t->bits);
  const int64_t m = P.m;
  const int strip = static_cast<int>(std::clamp<int64_t>(kAccBytes / (m * 512), 1, kStrip));
  const size_t acc_floats = static_cast<size_t>(m) * strip * 128;
  float* acc = acc_scratch(acc_floats);
  walk_strips(
      P, X.tile_bytes, strip, acc, acc_floats,
      [&](const uint8_t* w, int j, const float* xt) {
        const __m512i small = kSmall ? small_tile_bytes(w, X) : _mm512_setzero_si512();
        __m512 v[16];
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) group_values<CB, kSmall>(w, small, X, g, v[2 * g], v[2 * g + 1]);
        for (int64_t i = 0; i < m; ++i) {
          const __m512 x0 = _mm512_loadu_ps(xt + 32 * i), x1 = _mm512_loadu_ps(xt + 32 * i + 16);
          float* a = acc + (i * strip + j) * 128;
#pragma GCC unroll 8
          for (int g = 0; g < 8; ++g) {
            const __m512 sum = _mm512_fmadd_ps(v[2 * g], x0, _mm512_load_ps(a + 16 * g));
            _mm512_store_ps(a + 16 * g, _mm512_fmadd_ps(v[2 * g + 1], x1, sum));
          }
        }
      },
      [&](int64_t s0, int ns) { store_strip(P, acc, strip, s0, ns); });
}

template <int CB, bool kSmall>
void tiles(const Exl3Part& P) {
  switch (P.m) {
    case 1: return tiles_small<CB, kSmall, 1>(P);
    case 2: return tiles_small<CB, kSmall, 2>(P);
    case 3: return tiles_small<CB, kSmall, 3>(P);
    default: return tiles_many<CB, kSmall>(P);
  }
}

template <int CB>
void tiles_cb(const Exl3Part& P) {
  if (extract_tables(P.t->bits).small_tile) tiles<CB, true>(P);
  else tiles<CB, false>(P);
}

inline void tiles_vbmi(const Exl3Part& P) {
  switch (P.t->codebook) {
    case Exl3Codebook::k3Inst: return tiles_cb<0>(P);
    case Exl3Codebook::kMcg: return tiles_cb<1>(P);
    case Exl3Codebook::kMul1: return tiles_cb<2>(P);
  }
}

}  // namespace
}  // namespace spw::detail::vbmi
