// EXL3 quantization of one linear weight (spec ../shared/specs/exl3.md §4): regularisation,
// random signs and 128-block Hadamard rotations on both sides, channel and global scales, block
// LDL + LDLQ error feedback with the tail-biting trellis search, and the least-squares scale
// refit (§4.5). Written from the spec; no exllamav3 code.
//
// Contract:
//   W: [k][n] fp32 row-major, k = in_features, n = out_features (the EXL3 orientation, §1.2);
//      k and n multiples of 128 (the caller pads).
//   H: [k][k] fp64 symmetric PSD proxy Hessian (Σ xᵀx / count, undamped) or empty for the
//      identity (uncalibrated quantization: no feedback, plain Frobenius error).
//   Output: trellis words [k/16][n/16][16K], suh [k], svh [n] as fp16 bits, exactly what the
//   reader (formats/exl3) decodes; proxy errors are measured on that decoded tensor.
// Deterministic for a given (W, H, params) regardless of thread count (one tensor = one thread).
// Tests: tests/unit/test_exl3_quantize.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "base/status.h"
#include "formats/exl3.h"

namespace spw::quant {

// One candidate of the per-tensor search (QuantizeParams::alternatives).
struct QuantizeCandidate {
  double sigma_reg;       // H_ii += sigma_reg · mean(diag H)
  uint64_t seed_offset;   // the random signs come from seed + seed_offset
  double scale_mult = 1;  // the global scale found by the tile search, times this
};

struct QuantizeParams {
  int bits = 3;                                  // K, 1..8
  Exl3Codebook codebook = Exl3Codebook::kMul1;
  double sigma_reg = 0.025;                      // H_ii += sigma_reg · mean(diag H)
  uint64_t seed = 0;                             // signs (suh, svh) come from this seed
  double scale_mult = 1;                         // global scale = tile-search result × scale_mult
  // Further candidates tried after {sigma_reg, 0, scale_mult} when H is usable (none with the
  // identity): the tensor is quantized once per candidate (without the polish) and keeps the lowest
  // proxy error on the undamped H (ties: the earlier); the winner is then polished (polish_passes).
  // Empty = one quantization (`--single-candidate`). Smaller global scales: the scale search (step 5)
  // sees the targets before LDLQ's feedback, which makes them larger, so at K = 2 the best scale
  // sits a few % below the search's; beyond that, another scale or sign draw is another
  // quantization whose error differs by ~1-2 % on the demo tensors, and the best of several draws
  // is lower. Chosen on the 48 tuning tensors of bench/results/quantize_wide_2026-12-03.md (demo
  // layers 5 and 8, experts 8-15; 8 candidates measured): signs+2 ×0.97 replaced ×0.94 (−0.1 to
  // −0.4 % in the mean at K = 2, 3, 4).
  std::vector<QuantizeCandidate> alternatives = {{0.025, 0, 0.97}, {0.025, 1, 0.97}, {0.025, 2, 0.97}};
  bool ldlq = true;                              // false: plain per-tile search (no feedback)
  bool refit = true;                             // §4.5 least-squares scale refit
  int refit_rounds = 2;
  // Passes of block coordinate descent after LDLQ (exl3_polish.h): each 16-row block re-encoded
  // against the final errors of all other blocks, kept per tile only where it lowers LDLQ's
  // objective. A pass costs one more trellis encode per tile. With several candidates they are
  // compared unpolished and only the winner is quantized again with the polish (quantize_search):
  // on the 48 tuning tensors that kept nearly all of the gain of polishing every candidate at 3/4
  // of the cost; one pass lowered the mean proxy error by 0.8 % (K = 2, 3, 4), a second by another
  // 0.25 % (K = 2; bench/results/quantize_wide_2026-12-03.md).
  int polish_passes = 2;
  int scale_sample_tiles = 4;                    // tiles used by the global-scale search (5 scales each)
};

struct QuantizedTensor {
  int64_t k = 0, n = 0;
  int bits = 0;
  Exl3Codebook codebook = Exl3Codebook::kMul1;
  std::vector<uint16_t> trellis;  // [k/16][n/16][16K]
  std::vector<uint16_t> suh, svh; // fp16 bits
  // Quantizer's own inner weight Ŵ (fp32 copies of the fp16 codebook values), [k][n].
  std::vector<float> inner;
  double global_scale = 1;
  // tr(ΔWᵀ H ΔW) / tr(Wᵀ H W) with the given H (identity when absent), on the decoded tensor.
  double proxy_err = 0;
  double proxy_err_before_refit = 0;
  bool refit_kept = false;
  bool fell_back_to_identity = false;  // H unusable (zero, non-finite, not PD after retries)
  double sigma_reg = 0;                // the regularisation strength kept (0: identity H)
  uint64_t seed = 0;                   // the sign seed kept
  double scale_mult = 1;               // the global-scale multiplier kept
  int candidate = 0;                   // index of the kept candidate in quantize_candidates()
  int candidates = 1;                  // how many were tried
  int polish_passes = 0;               // polish passes run on the kept result (0: none, or no LDLQ)
  double seconds = 0;                  // all candidates together

  // A reader view (borrows trellis) for decode/matmul with formats/exl3.
  Exl3Tensor view(const std::string& name) const;
};

Result<QuantizedTensor> exl3_quantize_tensor(const float* w, int64_t k, int64_t n, const std::vector<double>& h,
                                             const QuantizeParams& params);

// The candidates exl3_quantize_tensor (and its CUDA twin) tries, in order: {sigma_reg, 0}, then
// params.alternatives when h_usable.
std::vector<QuantizeCandidate> quantize_candidates(const QuantizeParams& params, bool h_usable);
// The per-tensor search of exl3_quantize_tensor and its CUDA twin, around `one` (one candidate's
// whole quantization): one candidate → it, with params.polish_passes. Several → each without the
// polish, the lowest proxy error kept (ties: the earlier); then, when params.polish_passes > 0,
// that winner again with the polish, kept if its proxy error is lower. Sets candidate/candidates.
Result<QuantizedTensor> quantize_search(const QuantizeParams& params, bool h_usable,
                                        const std::function<Result<QuantizedTensor>(const QuantizeParams&)>& one);
// The params of one candidate alone (sigma_reg, seed and scale_mult set, no alternatives).
QuantizeParams candidate_params(const QuantizeParams& params, const QuantizeCandidate& c);
// The sign seed `spillway quantize` gives expert projection w (1..3) of (layer, expert).
uint64_t tensor_seed(uint64_t seed, int layer, int expert, int w);
// Whether exl3_quantize_tensor uses h (non-empty, finite, mean diagonal > 1e-20).
bool hessian_usable(const std::vector<double>& h, int64_t k);

// tr(ΔWᵀ H ΔW) / tr(Wᵀ H W) for ΔW = wq − w; H empty = identity. w, wq: [k][n].
double exl3_proxy_error(const float* w, const float* wq, int64_t k, int64_t n, const std::vector<double>& h);

// Block LDL of a symmetric PD matrix in 16×16 blocks: H = L·D·Lᵀ with L unit block-lower-
// triangular. Returns L ([k][k], row-major) or an error when H is not PD.
Result<std::vector<double>> block_ldl(const std::vector<double>& h, int64_t k);

// Proxy Hessian accumulation: h[d][d] += ω_t·x_tᵀx_t for each row t of x [m][d] (ω = 1 when
// weights is null), fp64, rows in order. calibration.cpp accumulates with it; it is also the
// reference of hessian_accumulate_cuda (quantize/cuda/exl3_steps_cuda.h).
void hessian_add_outer(std::vector<double>& h, const float* x, const float* weights, int m, int d);
// The same for rows [a0, a1) of h only (callers split the rows over threads; each element's sum is unchanged).
void hessian_add_outer_rows(std::vector<double>& h, const float* x, const float* weights, int m, int d, int a0, int a1);

// Standard deviation of a codebook's 65,536 values.
double codebook_sigma(Exl3Codebook cb);

}  // namespace spw::quant
