// Dense linear layers on the GPU in the checkpoint's compact formats, with the CPU reference's
// numerics (src/model/linear.cpp; spec specs/deepseek-v4.md §2.1 and §3 "Linear dispatch").
//
// What it computes: y[n_tokens, n_out] = x̂·Wᵀ, fp32 accumulation, where
//   W  = the weight dequantized exactly (FP8 e4m3 · ue8m0 per weight_block² tile; MXFP4 e2m1 · ue8m0
//        per 32 along the row; BF16; F32), and
//   x̂ = fake_quant_fp8(x, act_block) per token (formats/quant.h) when act_block > 0 (FP8/FP4
//        weights under Numerics::fake_quant), else x.
// Then, if round_out and not f32_product, every output is rounded to bf16 (kept as f32).
// x̂ and W are bf16-representable, so the tensor-core path differs from the reference only by the
// order of the fp32 sums.
//
// Two paths (LinearPath), both exact up to summation order:
//   kGemv (decode, n_tokens ≤ 16, the kAuto choice there; forced, any n_tokens in slices of 16 rows, 64 on the
//     tensor-core kernel, each slice reading the weight again): one kernel streams the compact weight once
//     (16 elements per lane per 512-wide k tile, several rows per warp); for 1–2 tokens with the next
//     round's loads in flight and x̂ read through L1, for more with x̂ staged in shared memory
//     (dense_gemv.cu); matrices with few rows split k over a cluster of 2–4 blocks. Each output's sum
//     order depends on the shape only, not on the token count.
//   kGemm (prefill): x̂ converted once to bf16 (f32 when f32_product or the weight is F32), the
//     weight dequantized chunk by chunk into workspace scratch of the same type, cuBLAS GEMM
//     (bf16 inputs, fp32 compute; or pedantic fp32) writes y directly.
// cuBLASLt's FP8 block scaling (VEC128_32F × BLK128x128_32F) would fit V4's 128 blocks only, not
// V4.1's 32×32 weight blocks, so both models take the dequantize-then-bf16 route for now.
//
// Contract: every pointer a device pointer (weights may be mapped pinned host memory), 16-byte
// aligned. x [n_tokens, n_in] f32, y [n_tokens, n_out] f32, overwritten, no aliasing with x.
// On the kGemm path x must be bf16-representable unless f32_product or act_block > 0 (the reference
// feeds BF16 linears bf16 activations); kGemv reads x in f32 either way.
// Limits: n_in % 32 == 0 (16 suffices for BF16/F32 without activation quant), n_in % act_block == 0,
// weight_block ∈ {32, 128}, any n_out ≥ 1, any n_tokens ≥ 1 up to the workspace's max_tokens.
// Scales: exact for ue8m0 codes ≥ 8 (smaller ones underflow bf16 in the reference's dequant).
// One workspace per stream.
// Tests: tests/gpu/test_cuda_dense.cpp. Benchmark: bench/dense/bench_dense.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "base/status.h"

namespace spw {

// How the weight is stored.
enum class DenseFormat { kFp8, kFp4, kBf16, kF32 };

// The most linears one stacked GEMV launch serves (stacked_linear_cuda).
constexpr int kMaxStackParts = 6;
// The most rows one tensor-core GEMV launch takes (the scalar GEMV takes 16): the weight is read once per slice.
constexpr int kGemvMmaMaxTokens = 64;
const char* dense_format_name(DenseFormat f);

struct DeviceLinear {
  DenseFormat format = DenseFormat::kBf16;
  int n_out = 0, n_in = 0;
  // kFp8: e4m3 [n_out, n_in]; kFp4: packed e2m1 [n_out, n_in/2] (low nibble = even element);
  // kBf16: bf16 bits [n_out, n_in]; kF32: float [n_out, n_in].
  const void* w = nullptr;
  // kFp8: ue8m0 [ceil(n_out/B), ceil(n_in/B)], B = weight_block; kFp4: ue8m0 [n_out, n_in/32].
  const uint8_t* scale = nullptr;
  int weight_block = 128;    // kFp8 only: 128 (V4) or 32 (V4.1)
  int act_block = 0;         // activation fake-quant block (V4 128, V4.1 32); 0 = x used as is
  bool f32_product = false;  // the reference's LinearKind::F32 (router, head): no bf16 anywhere
};

// Weight bytes the product streams (weights plus scales): the decode roofline's numerator.
size_t dense_weight_nbytes(const DeviceLinear& w);

struct LinearWorkspace {
  void* act = nullptr;         // ≥ max_tokens·max_in·4 bytes: x̂ (f32 for kGemv, bf16/f32 for kGemm)
  void* wbuf = nullptr;        // dequantized weight rows for kGemm, wbuf_nbytes
  size_t act_nbytes = 0, wbuf_nbytes = 0;
  void* cublas = nullptr;      // cublasHandle_t
};

// Allocates the workspace (cudaMalloc) and a cuBLAS handle; wbuf_nbytes must hold 128 rows of the
// widest weight (128·n_in·4 bytes for f32 products). Frees them.
Status linear_workspace_alloc(LinearWorkspace& ws, int max_tokens, int max_in, size_t wbuf_nbytes = size_t(64) << 20);
void linear_workspace_free(LinearWorkspace& ws);

enum class LinearPath { kAuto, kGemv, kGemm };
const char* linear_path_name(LinearPath p);

// Whether linear_cuda handles this weight (formats, divisibility limits above).
Status linear_cuda_check(const DeviceLinear& w);

// y = x̂·Wᵀ (see the top of this file). kAuto: kGemv for n_tokens ≤ 16, else kGemm.
Status linear_cuda(const DeviceLinear& w, const float* x, int n_tokens, float* y, bool round_out,
                   LinearWorkspace& ws, cudaStream_t stream, LinearPath path = LinearPath::kAuto);

// Linears that read the same input, run as one GEMV launch: w holds the parts' rows one part after the other,
// contiguous in every array (weights, scales; all parts share format, act_block and f32_product), part p
// having part_rows[p] rows (a multiple of the FP8 weight block, except the last). ys[p] [n_tokens, part_rows[p]]
// come out bit-identical to a linear_cuda call per part on the kGemv path as long as stack_keeps_rows() held
// for the shapes; x̂ is prepared once per slice. 2 to kMaxStackParts parts; kGemv only (any n_tokens, in slices as
// linear_cuda's kGemv).
Status stacked_linear_cuda(const DeviceLinear& w, std::span<const int> part_rows, const float* x, int n_tokens,
                           std::span<float* const> ys, bool round_out, LinearWorkspace& ws, cudaStream_t stream);
// Whether stacking weights like w (format, n_in, blocks) of part_rows rows each keeps every row's summation order
// on the GEMV path: the k split is the same for every part and for the stack.
bool stack_keeps_rows(const DeviceLinear& w, std::span<const int> part_rows);
// The decode path of FP8 weights with activation quant and of BF16 weights: the scalar weight-streaming kernel
// (default) or the tensor-core one (dense_gemv_mma.cu; set_gemv_mma(true): GpuSettings' GemvMma, on by default for
// batch-invariant decoding). Measured on the H200 for FP8 (bench/results/engine_h200.md): the tensor-core kernel is
// 1.4–4× faster at 16 tokens (V4.1 batch-16 decode +14 % tokens/s) but 1.3–1.8× slower at one token (batch-1
// decode −2 %); the BF16 form is not measured yet. The two differ in summation order, so a process keeps one:
// choose before uploading weights (stacking depends on it).
bool gemv_mma_enabled();
void set_gemv_mma(bool on);
// The kGemm path of f32-product bf16 weights (router, head; n_tokens > 16): the pedantic fp32 cuBLAS GEMM on a
// weight dequantized to f32, or three bf16 planes of x through one bf16 tensor-core GEMM with exact products
// (default; set_f32_split_gemm(false), which the CLI calls for SPILLWAY_F32_SPLIT_GEMM=0, takes the fp32 GEMM;
// dense_linear.cu linear_gemm_split3). On the H200 the split GEMM cut a V4.1 batch-64 decode step of 4 layers from
// 22.3 to 17.4 ms and V4's from 45.8 to 41.8 ms (bench/results/engine_h200.md); CudaDense.F32ProductSplitGemm checks it against the fp32 GEMM.
bool f32_split_gemm_enabled();
void set_f32_split_gemm(bool on);
// Whether linear_cuda takes the GEMV path for this path and token count.
bool linear_uses_gemv(LinearPath path, int n_tokens);

// The grouped low-rank output projection (model/attention.cpp): for each group g < n_groups,
// z[:, g·rank + r] = Σ_k o[:, g·per_group + k] · w_a[g·rank + r, k], fp32 accumulation, no activation
// quant; rounded to bf16 when round_out. w_a: bf16 [n_groups·rank, per_group]; o: f32
// [n_tokens, n_groups·per_group]; z: f32 [n_tokens, n_groups·rank], overwritten.
// Paths as linear_cuda (kGemm: strided-batched cuBLAS bf16 GEMM; o must then be bf16-representable,
// as the attention output is).
Status grouped_proj_cuda(const uint16_t* w_a, const float* o, int n_tokens, int n_groups, int rank, int per_group,
                         float* z, bool round_out, LinearWorkspace& ws, cudaStream_t stream,
                         LinearPath path = LinearPath::kAuto);

}  // namespace spw
