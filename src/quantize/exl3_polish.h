// The polish step of the EXL3 quantizer (exl3_quantize.h, QuantizeParams::polish_passes): block
// coordinate descent on the LDLQ result, in LDLQ's own metric. Written for this project (not in
// spec exl3.md §4 nor in exllamav3 1.6.5).
//
// LDLQ quantizes each 16-row block knowing only the errors of the blocks below it. With every other
// block fixed, the best error for block i is Δ_i = −H_ii⁻¹·g_i, g_i = Σ_{j≠i} H_ij·Δ_j (Δ = T − Q,
// H = hi, the rotated damped Hessian the LDL factored), so a pass re-encodes each block, top to
// bottom, towards Q_i = T_i + H_ii⁻¹·g_i. The trellis search minimizes the plain squared distance,
// not the H_ii-weighted one, so a re-encoded tile is kept only where it lowers the exact objective
// Σ_cols Δ_iᵀH_iiΔ_i + 2·Δ_iᵀg_i (columns are independent, so the test is per 16×16 tile): a pass
// never raises tr(Δᵀ·H·Δ). Cost: one more trellis encode per tile per pass, plus k²·n flops.
//
// The block steps are shared by the CPU quantizer (polish_pass) and the CUDA one (which keeps
// G = H·Δ on the GPU and runs these on the host per block), so both make the same decisions from
// the same inputs. Tests: tests/unit/test_exl3_quantize.cpp (PolishNeverRaisesTheObjective ...).
#pragma once

#include <cstdint>
#include <vector>

#include "quantize/trellis_encode.h"

namespace spw::quant {

// One 16-row block (rows r0..r0+15): the row slices are [16][n] row-major, contiguous.
struct PolishBlock {
  int64_t n = 0;
  double h[16][16] = {};    // H_ii
  double chol[16][16] = {}; // its lower Cholesky factor
  std::vector<double> off;  // g_i = G_i − H_ii·Δ_i, [16][n]
};

// Sets up block (h_block: H_ii, row-major 16×16, PD) and writes the re-encoding targets
// T_i + H_ii⁻¹·g_i as fp32 tiles [n/16][256] (each tile row-major 16×16) from the rows of
// G = H·Δ, T and Δ.
void polish_block_targets(const double* h_block, const double* g_rows, const double* t_rows,
                          const double* delta_rows, int64_t n, PolishBlock& block, std::vector<float>& tiles);

// Per tile tn: whether the decoded tile dec (row-major 16×16, fp32 codebook values) lowers the
// block objective against the current Δ rows (strictly; an identical tile gives exactly 0).
bool polish_tile_improves(const PolishBlock& block, const double* t_rows, const double* delta_rows, int64_t tn,
                          const float* dec);

// Keeps tile tn: q and Δ rows take dec, d_new rows get Δ_new − Δ_old (for the G update).
void polish_tile_keep(const double* t_rows, int64_t n, int64_t tn, const float* dec, double* q_rows,
                      double* delta_rows, double* d_new_rows);

// One full pass on the CPU: q, delta [k][n] and the trellis words [k/16][n/16][16K] updated in
// place; hi [k][k], t [k][n]. Returns how many tiles changed.
int64_t polish_pass(const std::vector<double>& hi, const std::vector<double>& t, std::vector<double>& q,
                    std::vector<double>& delta, std::vector<uint16_t>& words, TrellisEncoder& enc, int64_t k,
                    int64_t n);

}  // namespace spw::quant
