// EXL3 tile stage on AMX (BF16 tiles), for m ≥ kAmxMinTokens on machines with AVX-512 FP16 + VBMI, AVX-512
// BF16 and AMX-BF16 (Sapphire Rapids and later; the H200 machine's host has AMX). Built with those flags;
// run only after amx_ready().
//
// Why: with many tokens the AVX-512 kernel is bound by 16 FMAs per token and tile (exl3_gemm_avx512fp16.cpp,
// tiles_many), while one TDPBF16PS does 16 × 16 × 32 multiply-adds. BF16 has 8 significant bits, the
// codebook values 11 (fp16-exact) and the activations 24, so both are split exactly into bf16 planes:
// w = w_hi + w_lo (w_hi = w truncated to bf16, w_lo = the rest, ≤ 3 bits) and x = x1 + x2 + x3. Five
// products are kept — w_hi·x1, w_hi·x2, w_hi·x3, w_lo·x1, w_lo·x2 — each exact in fp32 and accumulated in
// fp32 by the tile unit; the dropped w_lo·x3 is below 2⁻²⁴ of |w·x|. So the result is the fp32 sum of the
// same products as the FMA kernels up to summation order (the tolerance tests of test_exl3_cpu.cpp hold it to
// the same 2e-5·RMS bound as the FMA kernels, which a dropped third plane of x exceeds; one-hot activations
// still give Ŵ bit for bit). The k range is walked in chunks whose activation planes stay in L2 while every
// column tile of the part goes by (C is kept in memory between chunks), and the next pair of tiles is
// decoded while the tile unit multiplies the previous one.
//
// Operands (C[n][token] += Σ_k A[n][k]·B[k][token]): A = the weights, 16 output columns × 32 k of two tiles
// down a column (tk, tk + 1), one row per column; B = the activations in VNNI pairs, 16 k-pairs × 16 tokens.
// The k order inside an A row is the decode's own lane order (lanes e with e mod 8 < 4 hold column g of
// group g, e mod 8 ≥ 4 column g + 8, both in the same row order), and B is built in that order, so no
// transpose is needed: one vpermw per group puts column g's 16 values before column g + 8's. Up to four
// 16-token blocks share each decoded A (four C tiles); more tokens loop over blocks of 64.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/exl3_avx512vbmi_decode.h"
#include "cpu/exl3_gemm.h"

namespace spw::detail {
namespace {

using namespace vbmi;

// Lane order of an A row: lanes e of a group holding column g (e mod 8 < 4), then those holding g + 8.
struct RowOrder {
  alignas(64) uint16_t perm[32];  // vpermw index; its first 16 entries: the xe lane of A-row slot s
  RowOrder() {
    int a = 0, b = 16;
    for (int e = 0; e < 32; ++e) {
      if (e % 8 < 4) perm[a++] = static_cast<uint16_t>(e);
      else perm[b++] = static_cast<uint16_t>(e);
    }
  }
};
const RowOrder& row_order() {
  static const RowOrder r;
  return r;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

constexpr int kTokenBlock = 16, kMaxBlocks = 4;
constexpr int64_t kPlaneBytesPerChunk = 384 << 10;  // of a core's 2 MB L2

// The three bf16 planes of x for one pair of k-tiles and one block of 16 tokens, VNNI: plane p, row r
// (k-pair 2r, 2r + 1), token t → 2 bf16 at [p][r][2t .. 2t + 1]. Slot s < 16 is tile tk, s ≥ 16 tile tk + 1.
struct XPlanes {
  alignas(64) uint16_t v[3][16][32];
};

// bf16 bit patterns of 16 fp32 values that are bf16-exact (their low 16 bits are zero).
inline __m256i top_halves(__m512 v) { return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)); }

void build_planes(const Exl3Part& P, int64_t tk, int64_t t0, int nt, XPlanes& out) {
  const __m512i slot_lane = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row_order().perm)));
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  // Slots 2j, 2j + 1 of a half are one dword of VNNI row 8·half + j: rows are 16 dwords apart.
  const __m256i row_of_pair = _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112);
  std::memset(&out, 0, sizeof out);
  for (int half = 0; half < 2; ++half) {
    if (tk + half >= P.tk1) break;  // odd tail: the second tile's k-slots stay zero
    for (int t = 0; t < nt; ++t) {
      const float* x = P.xe + ((tk + half) * P.m + t0 + t) * 32;
      // The 16 slot values in A-row order, then three truncations: each plane exact, the rest exact in fp32.
      __m512 rest = _mm512_permutex2var_ps(_mm512_loadu_ps(x), slot_lane, _mm512_loadu_ps(x + 16));
      for (int p = 0; p < 3; ++p) {
        const __m512 plane = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(rest), top));
        rest = _mm512_sub_ps(rest, plane);
        _mm256_i32scatter_epi32(reinterpret_cast<int*>(&out.v[p][8 * half][2 * t]), row_of_pair, top_halves(plane), 4);
      }
    }
  }
}

// A (hi and lo planes, 16 rows × 32 bf16) of one tile into k-slots [16·half, 16·half + 16).
template <int CB, bool kSmall>
inline void decode_a(const uint8_t* w, const ExtractTables& X, int half, uint16_t (*a_hi)[32],
                     uint16_t (*a_lo)[32]) {
  const __m512i small = kSmall ? small_tile_bytes(w, X) : _mm512_setzero_si512();
  const __m512i perm = _mm512_load_si512(row_order().perm);
  // The high 16 bits of each dword of two fp32 vectors, as 32 words (a's 16 first).
  alignas(64) static constexpr uint16_t kOddWords[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                                         23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                                         45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  const __m512i odd_words = _mm512_load_si512(kOddWords);
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) {
    // 32 fp16 values, column g's 16 then column g + 8's; each normal or ±0 (codebook values).
    const __m512i v = _mm512_permutexvar_epi16(perm, _mm512_castph_si512(codebook<CB>(group_states<kSmall>(w, small, X, g))));
    // hi: v truncated to bf16's 8 significant bits, still an fp16; lo = v − hi exactly (≤ 3 bits, may be subnormal).
    const __m512i hi = _mm512_and_si512(v, _mm512_set1_epi16(static_cast<short>(0xFFF8)));
    const __m512h lo = _mm512_sub_ph(_mm512_castsi512_ph(v), _mm512_castsi512_ph(hi));
    // hi as bf16 by its bits: exponent rebased by 127 − 15 (0x3800 after the shift), zeros kept zero, sign kept.
    const __mmask32 nonzero = _mm512_test_epi16_mask(hi, _mm512_set1_epi16(0x7FFF));
    const __m512i hi_mag = _mm512_maskz_add_epi16(
        nonzero, _mm512_and_si512(_mm512_srli_epi16(hi, 3), _mm512_set1_epi16(0x0FFF)), _mm512_set1_epi16(0x3800));
    const __m512i hi_bf = _mm512_ternarylogic_epi32(hi_mag, hi, _mm512_set1_epi16(static_cast<short>(0x8000)), 0xF8);
    // lo through fp32 (subnormal fp16 inputs convert exactly), then its bf16 bits (exact: ≤ 3 bits).
    const __m512i lo_bits = _mm512_castph_si512(lo);
    const __m512i lo_bf = _mm512_permutex2var_epi16(
        _mm512_castps_si512(_mm512_cvtph_ps(_mm512_castsi512_si256(lo_bits))), odd_words,
        _mm512_castps_si512(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(lo_bits, 1))));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&a_hi[g][16 * half]), _mm512_castsi512_si256(hi_bf));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&a_hi[g + 8][16 * half]), _mm512_extracti64x4_epi64(hi_bf, 1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&a_lo[g][16 * half]), _mm512_castsi512_si256(lo_bf));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&a_lo[g + 8][16 * half]), _mm512_extracti64x4_epi64(lo_bf, 1));
  }
}

// C[block] += A_hi·(x1 + x2 + x3) + A_lo·(x1 + x2), A in tmm4/5, B planes through tmm6/7. (GCC's tile
// intrinsics paste the register number into the instruction text, so it must be a literal: a macro.)
#define SPW_AMX_ACCUMULATE(C, xp)   \
  do {                              \
    _tile_loadd(6, (xp).v[0], 64);  \
    _tile_dpbf16ps(C, 4, 6);        \
    _tile_dpbf16ps(C, 5, 6);        \
    _tile_loadd(7, (xp).v[1], 64);  \
    _tile_dpbf16ps(C, 4, 7);        \
    _tile_dpbf16ps(C, 5, 7);        \
    _tile_loadd(6, (xp).v[2], 64);  \
    _tile_dpbf16ps(C, 4, 6);        \
  } while (0)

template <int CB, bool kSmall>
void tiles_amx(const Exl3Part& P) {
  const Exl3Tensor& t = *P.t;
  const ExtractTables& X = extract_tables(t.bits);
  const int T = X.tile_bytes;
  const int64_t row_bytes = (t.n / 16) * T, n_pairs = (P.tk1 - P.tk0 + 1) / 2;

  TileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.colsb[i] = 64;
    cfg.rows[i] = 16;
  }
  _tile_loadconfig(&cfg);

  thread_local std::vector<XPlanes> planes_v;
  thread_local std::vector<float> c_acc_v;  // [column tile][block][16 columns][16 tokens] between k-chunks
  struct alignas(64) ABuf {
    uint16_t hi[16][32], lo[16][32];
  } abuf[2];
  const int64_t n_tn = P.tn1 - P.tn0;
  for (int64_t t0 = 0; t0 < P.m; t0 += kTokenBlock * kMaxBlocks) {
    const int n_blocks = static_cast<int>(std::min<int64_t>(kMaxBlocks, (P.m - t0 + kTokenBlock - 1) / kTokenBlock));
    planes_v.resize(static_cast<size_t>(n_pairs) * n_blocks);
    for (int64_t pr = 0; pr < n_pairs; ++pr)
      for (int b = 0; b < n_blocks; ++b) {
        const int64_t tb = t0 + b * kTokenBlock;
        build_planes(P, P.tk0 + 2 * pr, tb, static_cast<int>(std::min<int64_t>(kTokenBlock, P.m - tb)),
                     planes_v[pr * n_blocks + b]);
      }
    c_acc_v.resize(static_cast<size_t>(n_tn) * n_blocks * 256 + 16);
    float* c_acc = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(c_acc_v.data()) + 63) & ~uintptr_t(63));
    // k in chunks whose activation planes stay in L2 while every column tile of the part goes by.
    const int64_t chunk = std::max<int64_t>(1, kPlaneBytesPerChunk / (n_blocks * static_cast<int64_t>(sizeof(XPlanes))));
    for (int64_t p0 = 0; p0 < n_pairs; p0 += chunk) {
      const int64_t p1 = std::min(n_pairs, p0 + chunk);
      for (int64_t tn = P.tn0; tn < P.tn1; ++tn) {
        float* c = c_acc + (tn - P.tn0) * n_blocks * 256;
        if (p0 == 0) {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
        } else {
          _tile_loadd(0, c, 64);
          if (n_blocks > 1) _tile_loadd(1, c + 256, 64);
          if (n_blocks > 2) _tile_loadd(2, c + 512, 64);
          if (n_blocks > 3) _tile_loadd(3, c + 768, 64);
        }
        const uint8_t* w = reinterpret_cast<const uint8_t*>(t.tile(P.tk0 + 2 * p0, tn));
        // Pair pr is decoded into buffer pr mod 2 while the tile unit multiplies pair pr − 1: a tile load
        // straight after the stores that wrote its data would wait for them to reach L1.
        for (int64_t pr = p0; pr <= p1; ++pr) {
          if (pr < p1) {
            ABuf& a = abuf[pr & 1];
            for (int half = 0; half < 2; ++half, w += row_bytes) {
              const int64_t tk = P.tk0 + 2 * pr + half;
              if (tk >= P.tk1) {  // odd tail: zero weights in the second half
                for (int r = 0; r < 16; ++r) {
                  std::memset(&a.hi[r][16], 0, 32);
                  std::memset(&a.lo[r][16], 0, 32);
                }
                break;
              }
              if (tk + kPrefetchTiles < P.tk1) prefetch_tile(w + kPrefetchTiles * row_bytes, T);
              decode_a<CB, kSmall>(w, X, half, a.hi, a.lo);
            }
          }
          if (pr == p0) continue;
          const ABuf& a = abuf[(pr - 1) & 1];
          _tile_loadd(4, a.hi, 64);
          _tile_loadd(5, a.lo, 64);
          const XPlanes* xp = &planes_v[(pr - 1) * n_blocks];
          SPW_AMX_ACCUMULATE(0, xp[0]);
          if (n_blocks > 1) SPW_AMX_ACCUMULATE(1, xp[1]);
          if (n_blocks > 2) SPW_AMX_ACCUMULATE(2, xp[2]);
          if (n_blocks > 3) SPW_AMX_ACCUMULATE(3, xp[3]);
        }
        _tile_stored(0, c, 64);
        if (n_blocks > 1) _tile_stored(1, c + 256, 64);
        if (n_blocks > 2) _tile_stored(2, c + 512, 64);
        if (n_blocks > 3) _tile_stored(3, c + 768, 64);
      }
    }
    for (int64_t tn = P.tn0; tn < P.tn1; ++tn)
      for (int b = 0; b < n_blocks; ++b) {
        const float* c = c_acc + ((tn - P.tn0) * n_blocks + b) * 256;  // [16 columns][16 tokens]
        const int64_t tb = t0 + b * kTokenBlock;
        const int nt = static_cast<int>(std::min<int64_t>(kTokenBlock, P.m - tb));
        for (int i = 0; i < nt; ++i)
          for (int n = 0; n < 16; ++n) P.u[(tb + i) * P.ldu + tn * 16 + n] = c[n * 16 + i];
      }
  }
  _tile_release();
}

#undef SPW_AMX_ACCUMULATE

template <int CB>
void tiles_amx_cb(const Exl3Part& P) {
  if (extract_tables(P.t->bits).small_tile) tiles_amx<CB, true>(P);
  else tiles_amx<CB, false>(P);
}

bool cpu_has_amx_bf16() {
  unsigned a, b, c, d;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  const bool tile = (d >> 24) & 1, bf16_tiles = (d >> 22) & 1;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
  const bool avx512_bf16 = (a >> 5) & 1;
  return tile && bf16_tiles && avx512_bf16;
}

}  // namespace

bool amx_ready() {
  // Linux hands out the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA);
  // without it the first tile instruction faults.
  static const bool ready = [] {
    if (cpu_isa_detect() < CpuIsa::kAvx512Fp16 || !cpu_has_amx_bf16()) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ready;
}

void exl3_tiles_amx(const Exl3Part& P) {
  switch (P.t->codebook) {
    case Exl3Codebook::k3Inst: return tiles_amx_cb<0>(P);
    case Exl3Codebook::kMcg: return tiles_amx_cb<1>(P);
    case Exl3Codebook::kMul1: return tiles_amx_cb<2>(P);
  }
}

}  // namespace spw::detail
