// EXL3 tile kernel for AVX-512 with VBMI but without FP16 arithmetic (AMD Zen 4 and 5, Intel Ice Lake): the
// state extraction and 16-bit-lane hash of the AVX-512 FP16 kernel (exl3_gemm_avx512fp16.cpp, whose header
// explains the method) and its strips of contiguous tiles; the codebook values are computed exactly in
// fp32 and rounded once to fp16 precision (a Veltkamp split, round_f16) instead of by fp16 arithmetic. Built with
// -mavx512vbmi (and F/BW/VL), without -mavx512fp16; runs where cpu_isa_detect() ≥ CpuIsa::kAvx512Vbmi. This
// file also builds the extraction tables both kernels (and AMX) use. The table-lookup decode mode is the
// AVX-512 kernel's.
#include <cstdio>
#include <cstdlib>

#include "cpu/exl3_avx512vbmi_tiles.h"
#include "cpu/exl3_gemm.h"

namespace spw::detail {
namespace vbmi {
namespace {

[[noreturn]] void table_bug(int k_x2, const char* what) {
  std::fprintf(stderr, "exl3 avx512vbmi tables: k_x2=%d: %s\n", k_x2, what);
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

}  // namespace vbmi

void exl3_tiles_avx512vbmi(const Exl3Part& P, Exl3Decode decode) {
  if (decode == Exl3Decode::kLut) return exl3_tiles_avx512(P, decode);
  vbmi::tiles_vbmi(P);
}

void exl3_codebook_avx512vbmi(Exl3Codebook cb, const uint16_t* states, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; i += 32) {
    const __mmask32 mask = n - i >= 32 ? ~__mmask32(0) : (__mmask32(1) << (n - i)) - 1;
    const __m512i st = _mm512_maskz_loadu_epi16(mask, states + i);
    __m512 lo, hi;
    if (cb == Exl3Codebook::kMul1) vbmi::codebook_f32<2>(st, lo, hi);
    else if (cb == Exl3Codebook::kMcg) vbmi::codebook_f32<1>(st, lo, hi);
    else vbmi::codebook_f32<0>(st, lo, hi);
    const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT)),
                                         _mm512_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT), 1);
    _mm512_mask_storeu_epi16(out + i, mask, h);
  }
}

void exl3_tile_states_avx512vbmi(const uint16_t* tile, Exl3Bits bits, uint16_t out[256]) {
  const vbmi::ExtractTables& X = vbmi::extract_tables(bits);
  const auto* w = reinterpret_cast<const uint8_t*>(tile);
  const __m512i small = X.small_tile ? vbmi::small_tile_bytes(w, X) : _mm512_setzero_si512();
  for (int g = 0; g < 8; ++g) {
    const __m512i st = X.small_tile ? vbmi::group_states<true>(w, small, X, g) : vbmi::group_states<false>(w, small, X, g);
    _mm512_storeu_si512(out + 32 * g, st);
  }
}

}  // namespace spw::detail
