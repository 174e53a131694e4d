// EXL3 y = x·W for many tokens (prefill): decode Ŵ once into an fp16 scratch, then a cuBLAS tensor-core
// GEMM, then the output rotation. The alternative — the small-batch kernels of exl3_gemm.h in launches of
// 16 or 64 tokens, decoding every tile once per launch — is measured against it in bench/exl3/bench_exl3.cu
// (prefill section), together with a dense bf16 cuBLAS GEMM of the same shape: the 64-token launches win
// up to ~100 tokens per matrix, this path beyond (H200, bench/results/exl3_h200.md).
//
// What it computes: the same product as exl3_gemm_cuda (formats/exl3.h: W = diag(suh)·Hk·Ŵ·Hn·diag(svh)):
//   xr = fp16(had128(x ∘ suh))            [m, k]   exl3_rotate_rows_cuda (exl3_gemm.h; the 64-row launches use it too)
//   Ŵᵀ = decode(trellis)                  [n, k]   fp16, exact (every codebook value is an fp16)
//   z  = xr · Ŵ                           [m, n]   cuBLAS, fp16 inputs, fp32 accumulation and output
//   y  = had128(z) ∘ svh + bias           [m, n]   in place
// Contract: device pointers; x [m, k] fp32, y [m, n] fp32 (overwritten; no aliasing with x). The
// workspace holds Ŵᵀ (n·k halves) and xr (m·k halves) for tensors up to its capacity.
// Limits: as exl3_cuda_supports (integer K 2..6, every codebook, k and n multiples of 128); m ≥ 1.
// Accuracy: as exl3_gemm_cuda (x rounded once to fp16 after its rotation; sums in fp32).
// Tests: tests/gpu/test_exl3_prefill.cpp. Benchmark: bench/exl3/bench_exl3.cu.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "cuda/exl3_gemm.h"

namespace spw {

struct Exl3PrefillWorkspace {
  uint16_t* w_t = nullptr;  // fp16 [n][k]: the decoded tensor, transposed
  uint16_t* xr = nullptr;   // fp16 [m][k]: rotated activations
  void* cublas = nullptr;   // cublasHandle_t
  int64_t capacity_k = 0, capacity_n = 0, capacity_m = 0;
};

Status exl3_prefill_workspace_alloc(Exl3PrefillWorkspace& ws, int64_t max_k, int64_t max_n, int64_t max_m);
void exl3_prefill_workspace_free(Exl3PrefillWorkspace& ws);

// Ŵᵀ of one tensor into w_t [n][k] fp16 (the first step of exl3_prefill_cuda; exposed for tests).
Status exl3_decode_transposed_cuda(const Exl3CudaTensor& t, uint16_t* w_t, void* stream);

// stream: a cudaStream_t (nullptr = default stream).
Status exl3_prefill_cuda(const Exl3CudaTensor& t, const float* x, int64_t m, float* y, Exl3PrefillWorkspace& ws,
                         void* stream = nullptr);

}  // namespace spw
