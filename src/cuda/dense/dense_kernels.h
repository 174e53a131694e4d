// Internal launchers of the dense-linear kernels (dense_gemv.cu, dense_prep.cu); the public entry
// points are in dense_linear.h. Every launcher enqueues on `stream` and returns the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cuda/dense/dense_linear.h"

namespace spw::densedev {

// The weight-streaming product of the decode path. Group g = 0..n_groups−1 reads the weight at
// byte offset g·w_group_nbytes, x at g·x_group_off and writes y at g·y_group_off (n_groups = 1 for a
// plain linear). x̂ [n_tokens ≤ 16, ldx] f32 (already quantized), y [n_tokens, ldy].
struct GemvArgs {
  DenseFormat format = DenseFormat::kBf16;
  const void* w = nullptr;
  const uint8_t* scale = nullptr;
  int n_out = 0, n_in = 0, weight_block = 128;
  const float* x = nullptr;
  int ldx = 0;
  float* y = nullptr;
  int ldy = 0;
  int n_tokens = 0;
  bool round_out = false;
  int n_groups = 1;
  size_t w_group_nbytes = 0;
  int x_group_off = 0, y_group_off = 0;
  // A stacked weight (n_groups = 1, n_parts > 1): rows [part_row0[p], part_row0[p + 1]) are written to
  // part_y[p] [n_tokens, part_ld[p]] at row − part_row0[p] (part_row0[0] = 0, part_y[0] = y); y and ldy unused.
  int n_parts = 1;
  int part_row0[kMaxStackParts] = {};
  float* part_y[kMaxStackParts] = {};
  int part_ld[kMaxStackParts] = {};
  // The tensor-core path (gemv_mma_launch), where x is unused. FP8: x̂ as f16 e4m3 codes [n_tokens, n_in] and
  // f32 scales [n_tokens, n_in / act_block] (act_codes_launch). BF16: xc holds x_planes bf16 planes
  // [x_planes][n_tokens][ldx] (1: x itself, bf16-representable; 3: hi, mid, lo of an f32 product), group g's
  // columns from g·x_group_off.
  const uint16_t* xc = nullptr;
  const float* xs = nullptr;
  int act_block = 0;
  int x_planes = 0;
};
cudaError_t gemv_launch(const GemvArgs& a, cudaStream_t stream);
// The device's SMs (looked up once; 132 if the query fails), and the blocks of 256 threads of a GEMV kernel one SM
// holds at once (occupancy, looked up once per kernel): the GEMV kernels size their grids by them.
int sm_count();
int resident_blocks(void (*kernel)(GemvArgs));

// The tensor-core decode path of FP8 weights with activation quant and of BF16 weights (dense_gemv_mma.cu): whether a
// weight takes it, the warps its k range is split over (a function of n_in alone: a row's summation order), and the
// launch, for up to kGemvMmaMaxTokens tokens (the weight read once for all).
bool gemv_uses_mma(DenseFormat format, int weight_block, int act_block, int n_in);
int gemv_mma_k_splits(int n_in);
cudaError_t gemv_mma_launch(const GemvArgs& a, cudaStream_t stream);
// Its form for 17 to kGemvMmaMaxTokens tokens and weights of many rows (dense_gemv_mma_wide.cu; the same bits per
// token), splits as above; gemv_mma_launch calls it where it pays.
cudaError_t gemv_mma_wide_launch(const GemvArgs& a, int splits, cudaStream_t stream);

// x̂ = fake_quant_fp8(x, act_block) as codes: codes[t, i] the f16 bits of e4m3(x/s), scales[t, b] = s of block b
// (x̂ = code·s, bit-identical to act_prepare_launch's values). x [n_tokens, n_in] contiguous.
cudaError_t act_codes_launch(const float* x, int n_tokens, int n_in, int act_block, uint16_t* codes, float* scales,
                             cudaStream_t stream);
// The blocks a row's k range is split over (1, 2 or 4) for `rows` output rows of n_in inputs: a function of
// the shape alone, and it decides the summation order of every row.
int gemv_k_splits(long rows, int n_in);

// out[t, ·] = fake_quant_fp8(x[t, ·], act_block) (act_block > 0) or x (act_block == 0), stored as f32
// (out_bf16 false) or bf16 (exact when quantized). x and out [n_tokens, n_in], contiguous.
cudaError_t act_prepare_launch(const float* x, int n_tokens, int n_in, int act_block, void* out, bool out_bf16,
                               cudaStream_t stream);

// Rows [row0, row0 + n_rows) of the weight dequantized into out [n_rows, n_in] (bf16 bits or f32).
cudaError_t dequant_rows_launch(const DeviceLinear& w, int row0, int n_rows, void* out, bool out_bf16,
                                cudaStream_t stream);

// The f32-product GEMM on bf16 tensor cores (dense_linear.cu, f32_split_gemm): x [n] f32 → x3 [3][n] bf16 with
// x = x3[0] + x3[1] + x3[2] exactly; and y[t, row0 + o] = (y3[t][o] + y3[T + t][o]) + y3[2T + t][o] for the three
// products of a chunk y3 [3·T][n_rows] (T = n_tokens).
cudaError_t split3_bf16_launch(const float* x, size_t n, void* x3, cudaStream_t stream);
cudaError_t sum3_rows_launch(const float* y3, int n_tokens, int n_rows, float* y, int ldy, int row0,
                             cudaStream_t stream);

// y[i] = bf16(y[i]) for i < n.
cudaError_t round_bf16_launch(float* y, size_t n, cudaStream_t stream);

}  // namespace spw::densedev
