// EXL3 tile kernel for AVX-512 with VBMI and FP16 (Sapphire Rapids and later): 32 trellis positions per
// vector, decoded in 16-bit lanes. This file alone is built with -mavx512fp16 -mavx512vbmi (and F/BW/VL);
// it runs only after cpu_isa_detect() saw both.
//
// Why a separate kernel: the AVX-512 kernel (exl3_gemm_avx512.cpp) spends ~14 port-0/5 micro-ops per 16
// weights (32-bit lanes: state shifts, vpmulld, a fp32 → fp16 → fp32 round trip), ~140 cycles per tile at
// m = 1, far from the read bandwidth. Here, per 32 weights:
//   states    vpermb (vpermt2b for the ring-wrap group) gathers, for each qword, the 8 stream bytes its
//             4 states live in (MSB-first, as the qword's value), and vpmultishiftqb cuts the 16-bit
//             states out of it (ExtractTables);
//   codebook  in 16-bit lanes: the 32-bit hash x = st·M split as x_lo = lo16(st·M_lo), x_hi = hi16(st·M_lo)
//             + lo16(st·M_hi); mul1 sums x's four bytes (two vpmaddubsw), makes the fp16 1024 + sum by
//             or-ing in the exponent and finishes with one fp16 FMA; MCG/3INST mask both halves (one
//             vpternlogd each) and add them as fp16. Every step is exact up to the single final fp16
//             rounding, the same rounding the scalar definition does (formats/exl3.cpp), so the values are
//             bit-identical (tested for all 65,536 states of each codebook);
//   product   two vcvtph2ps and two fp32 FMAs, as before.
// That is ~18 micro-ops per 32 weights. Layout, work split and accumulation order follow the AVX-512
// kernel: lane e of group g is tile position 32g + e (rows by e, columns g and g + 8) and xe holds a
// k-tile's 32 activations per token in lane order; the tile grid is walked in strips of contiguous tiles
// (tiles_small, tiles_many).
// The table-lookup decode mode (Exl3Decode::kLut) is the AVX-512 kernel's.
#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu/exl3_avx512fp16_decode.h"
#include "cpu/exl3_gemm.h"

namespace spw::detail {
namespace fp16 {
namespace {

[[noreturn]] void table_bug(int k_x2, const char* what) {
  std::fprintf(stderr, "exl3 avx512fp16 tables: k_x2=%d: %s\n", k_x2, what);
  std::abort();
}

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

void build_tables(Exl3Bits bits, ExtractTables& X) {
  const int T = 16 * bits.k_x2;
  X.tile_bytes = T;
  X.small_tile = T < 64;
  int64_t a[256];  // stream bit where position p's 16-bit window starts (negative: wraps to the end)
  int64_t end = 0;
  for (int p = 0; p < 256; ++p) {
    end += bits.step_bits(p);
    a[p] = end - 16;
  }
  // Memory byte of stream byte b (mod the ring): MSB-first 32-bit words stored little-endian.
  auto memory_byte = [T](int64_t b) {
    const int64_t r = ((b % T) + T) % T;
    return static_cast<int>(4 * (r / 4) + 3 - r % 4);
  };
  for (int g = 0; g < 8; ++g) {
    int s0 = 0;
    if (!X.small_tile) {
      const int64_t first = floor_div(a[32 * g], 8);
      s0 = g == 0 ? T - 64 : static_cast<int>(std::min<int64_t>(4 * (first / 4), T - 64));
      if (g > 0 && first < 0) table_bug(bits.k_x2, "a group other than the first wraps");
    }
    X.s0[g] = s0;
    for (int j = 0; j < 8; ++j) {
      const int p0 = 32 * g + 4 * j;
      const int64_t b0 = floor_div(a[p0], 8);
      const int64_t last = floor_div(a[p0 + 3] + 15, 8);  // last stream byte the qword's states touch
      if (last - b0 > 7) table_bug(bits.k_x2, "four states span more than a qword");
      for (int i = 0; i < 8; ++i) {
        const int64_t b = b0 + 7 - i;
        int src = 0;  // bytes past `last` are never read by vpmultishiftqb: any index will do
        if (b <= last) {
          const int mb = memory_byte(b);
          if (X.small_tile) {
            src = mb;
          } else if (mb >= s0 && mb < s0 + 64) {
            src = mb - s0;
          } else if (g == 0 && mb < 64) {
            src = 64 + mb;
          } else {
            table_bug(bits.k_x2, "state byte outside its group's window");
          }
        }
        X.gather[g][8 * j + i] = static_cast<uint8_t>(src);
      }
      for (int e = 0; e < 4; ++e) {
        // State bits [a, a + 16) MSB-first; qword bit 63 is stream bit 8·b0, so the state's LSB is at
        // bit 48 − (a − 8·b0).
        const int64_t lsb = 48 - (a[p0 + e] - 8 * b0);
        if (lsb < 0 || lsb > 48) table_bug(bits.k_x2, "state outside its qword");
        X.shift[g][8 * j + 2 * e] = static_cast<uint8_t>(lsb);
        X.shift[g][8 * j + 2 * e + 1] = static_cast<uint8_t>(lsb + 8);
      }
    }
  }
}

}  // namespace

const ExtractTables& extract_tables(Exl3Bits bits) {
  static const ExtractTables* tables = [] {
    auto* out = new ExtractTables[17];
    for (int k_x2 = 2; k_x2 <= 16; ++k_x2) build_tables(Exl3Bits{k_x2}, out[k_x2]);
    return out;
  }();
  return tables[bits.k_x2];
}

namespace {

// Lane l of accumulator g holds column g (l mod 8 < 4) or g + 8 (otherwise).
inline void store_columns(const __m512* acc, float* u) {
  for (int g = 0; g < 8; ++g) {
    u[g] = _mm512_mask_reduce_add_ps(0x0F0F, acc[g]);
    u[g + 8] = _mm512_mask_reduce_add_ps(0xF0F0, acc[g]);
  }
}

// M = 1..3 tokens: each group's values are used at once by every token. The tile grid is walked in strips
// of kStrip column tiles, a k-tile row of the strip at a time: the strip's tiles are contiguous in memory
// (tiles are stored row-major), so each visit to a 4 KB page reads kStrip tiles instead of one (walking
// down one column touched a new page per tile and left the kernel latency-bound from DRAM), and the
// next rows are prefetched a whole strip-row ahead. The accumulators (kStrip × 8 vectors per token) stay
// in L1; each column's sum still runs over tk in order.
constexpr int kStrip = 16, kPrefetchRows = 2;

template <int CB, bool kSmall, int M>
void tiles_small(const Exl3Part& P) {
  const Exl3Tensor& t = *P.t;
  const ExtractTables& X = extract_tables(t.bits);
  const int T = X.tile_bytes;
  const int64_t row_bytes = (t.n / 16) * T;
  alignas(64) float acc[M][kStrip][128];
  for (int64_t s0 = P.tn0; s0 < P.tn1; s0 += kStrip) {
    const int ns = static_cast<int>(std::min<int64_t>(kStrip, P.tn1 - s0));
    std::memset(acc, 0, sizeof acc);
    const uint8_t* row = reinterpret_cast<const uint8_t*>(t.tile(P.tk0, s0));
    for (int64_t tk = P.tk0; tk < P.tk1; ++tk, row += row_bytes) {
      const bool prefetch = tk + kPrefetchRows < P.tk1;
      __m512 x[M][2];
      for (int i = 0; i < M; ++i) {
        x[i][0] = _mm512_loadu_ps(P.xe + (tk * M + i) * 32);
        x[i][1] = _mm512_loadu_ps(P.xe + (tk * M + i) * 32 + 16);
      }
      const uint8_t* w = row;
      for (int j = 0; j < ns; ++j, w += T) {
        if (prefetch) prefetch_tile(w + kPrefetchRows * row_bytes, T);
        const __m512i small = kSmall ? small_tile_bytes(w, X) : _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
          __m512 lo, hi;
          group_values<CB, kSmall>(w, small, X, g, lo, hi);
          for (int i = 0; i < M; ++i) {
            float* a = acc[i][j] + 16 * g;
            __m512 sum = _mm512_fmadd_ps(lo, x[i][0], _mm512_load_ps(a));
            _mm512_store_ps(a, _mm512_fmadd_ps(hi, x[i][1], sum));
          }
        }
      }
    }
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < ns; ++j) {
        __m512 v[8];
        for (int g = 0; g < 8; ++g) v[g] = _mm512_load_ps(acc[i][j] + 16 * g);
        store_columns(v, P.u + i * P.ldu + (s0 + j) * 16);
      }
  }
}

// m ≥ 4: the same strips, each tile decoded once into 16 registers and then applied to every token. The
// accumulators (m × strip × 8 vectors) are kept within kAccBytes of L1 by narrowing the strip as m grows
// (16 column tiles at m = 4, one at m ≥ 64); per token and tile that is 16 FMAs against 8 accumulator
// loads and stores, so the FMA ports bound it rather than the decode.
constexpr int64_t kAccBytes = 16 << 10;

template <int CB, bool kSmall>
void tiles_many(const Exl3Part& P) {
  const Exl3Tensor& t = *P.t;
  const ExtractTables& X = extract_tables(t.bits);
  const int T = X.tile_bytes;
  const int64_t row_bytes = (t.n / 16) * T, m = P.m;
  const int strip = static_cast<int>(std::clamp<int64_t>(kAccBytes / (m * 512), 1, kStrip));
  thread_local std::vector<float> acc_v;
  const size_t acc_floats = static_cast<size_t>(m) * strip * 128;
  if (acc_v.size() < acc_floats + 16) acc_v.resize(acc_floats + 16);
  float* acc = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(acc_v.data()) + 63) & ~uintptr_t(63));
  for (int64_t s0 = P.tn0; s0 < P.tn1; s0 += strip) {
    const int ns = static_cast<int>(std::min<int64_t>(strip, P.tn1 - s0));
    std::memset(acc, 0, sizeof(float) * acc_floats);
    const uint8_t* row = reinterpret_cast<const uint8_t*>(t.tile(P.tk0, s0));
    for (int64_t tk = P.tk0; tk < P.tk1; ++tk, row += row_bytes) {
      const bool prefetch = tk + kPrefetchRows < P.tk1;
      const float* xt = P.xe + tk * m * 32;
      const uint8_t* w = row;
      for (int j = 0; j < ns; ++j, w += T) {
        if (prefetch) prefetch_tile(w + kPrefetchRows * row_bytes, T);
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
      }
    }
    for (int64_t i = 0; i < m; ++i)
      for (int j = 0; j < ns; ++j) {
        __m512 v[8];
        for (int g = 0; g < 8; ++g) v[g] = _mm512_load_ps(acc + (i * strip + j) * 128 + 16 * g);
        store_columns(v, P.u + i * P.ldu + (s0 + j) * 16);
      }
  }
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

}  // namespace
}  // namespace fp16

using namespace fp16;

void exl3_tiles_avx512fp16(const Exl3Part& P, Exl3Decode decode) {
  if (decode == Exl3Decode::kLut) return exl3_tiles_avx512(P, decode);
  if (P.amx && P.m >= kAmxMinTokens && amx_ready()) return exl3_tiles_amx(P);
  switch (P.t->codebook) {
    case Exl3Codebook::k3Inst: return tiles_cb<0>(P);
    case Exl3Codebook::kMcg: return tiles_cb<1>(P);
    case Exl3Codebook::kMul1: return tiles_cb<2>(P);
  }
}

void exl3_codebook_avx512fp16(Exl3Codebook cb, const uint16_t* states, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; i += 32) {
    const __mmask32 mask = n - i >= 32 ? ~__mmask32(0) : (__mmask32(1) << (n - i)) - 1;
    const __m512i st = _mm512_maskz_loadu_epi16(mask, states + i);
    const __m512h v = cb == Exl3Codebook::kMul1 ? codebook<2>(st) : cb == Exl3Codebook::kMcg ? codebook<1>(st) : codebook<0>(st);
    _mm512_mask_storeu_epi16(out + i, mask, _mm512_castph_si512(v));
  }
}

void exl3_tile_states_avx512fp16(const uint16_t* tile, Exl3Bits bits, uint16_t out[256]) {
  const ExtractTables& X = extract_tables(bits);
  const auto* w = reinterpret_cast<const uint8_t*>(tile);
  const __m512i small = X.small_tile ? small_tile_bytes(w, X) : _mm512_setzero_si512();
  for (int g = 0; g < 8; ++g) {
    const __m512i st = X.small_tile ? group_states<true>(w, small, X, g) : group_states<false>(w, small, X, g);
    _mm512_storeu_si512(out + 32 * g, st);
  }
}

}  // namespace spw::detail
