// EXL3 tile kernel for AVX-512 with VBMI and FP16 (Sapphire Rapids and later): 32 trellis positions per
// vector, decoded in 16-bit lanes. This file alone is built with -mavx512fp16 -mavx512vbmi (and F/BW/VL);
// it runs only after cpu_isa_detect() saw both. The decode is exl3_avx512vbmi_decode.h, the loops
// exl3_avx512vbmi_tiles.h (shared with the VBMI-only kernel, exl3_gemm_avx512vbmi.cpp); this file is their
// FP16 instance and the AMX hand-off.
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
#include "cpu/exl3_avx512vbmi_tiles.h"
#include "cpu/exl3_gemm.h"

namespace spw::detail {

void exl3_tiles_avx512fp16(const Exl3Part& P, Exl3Decode decode) {
  if (decode == Exl3Decode::kLut) return exl3_tiles_avx512(P, decode);
  if (P.amx && P.m >= kAmxMinTokens && amx_ready()) return exl3_tiles_amx(P);
  vbmi::tiles_vbmi(P);
}

void exl3_codebook_avx512fp16(Exl3Codebook cb, const uint16_t* states, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; i += 32) {
    const __mmask32 mask = n - i >= 32 ? ~__mmask32(0) : (__mmask32(1) << (n - i)) - 1;
    const __m512i st = _mm512_maskz_loadu_epi16(mask, states + i);
    const __m512h v = cb == Exl3Codebook::kMul1 ? vbmi::codebook<2>(st)
                      : cb == Exl3Codebook::kMcg ? vbmi::codebook<1>(st)
                                                 : vbmi::codebook<0>(st);
    _mm512_mask_storeu_epi16(out + i, mask, _mm512_castph_si512(v));
  }
}

}  // namespace spw::detail
