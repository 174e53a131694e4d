// The steps of the EXL3 quantizer (quantize/exl3_quantize.h, spec exl3.md §4) as GPU building
// blocks, each tested against the CPU quantizer. All matrices are row-major device arrays; W-like
// arrays are [k][n] fp64, Hessians [k][k] fp64. Everything is asynchronous on the context's stream.
//
// Exactness: compiled without FMA contraction (--fmad=false), the elementwise steps (scales,
// signs, block-128 Hadamards, sequential column/row sums of squares, LDLQ error feedback summed in
// the CPU's order) round exactly like the CPU code. cuBLAS GEMMs (Hessian accumulation, refit,
// proxy error) and the cuSOLVER Cholesky (block LDL, refit solve) sum in another order: those are
// compared with tolerances (tests/gpu/test_quantize_cuda_steps.cpp).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <cstdint>
#include <vector>

#include "base/status.h"

namespace spw::quant {

struct QuantCudaContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cusolverDnHandle_t solver = nullptr;
};
Status quant_cuda_context_create(QuantCudaContext& ctx);
void quant_cuda_context_destroy(QuantCudaContext& ctx);

// H[d][d] += Σ_t ω_t·x_tᵀx_t (ω = 1 when weights is null); x: [m][d] fp32, weights: [m] fp32.
// The CPU reference is hessian_add_outer (exl3_quantize.h).
Status hessian_accumulate_cuda(QuantCudaContext& ctx, const float* x, const float* weights, int64_t m, int64_t d,
                               double* h);

// X ← Hk·X (blocks of 128 rows) / X ← X·Hn (blocks of 128 columns), normalized Sylvester
// Hadamards in fp64, the CPU's butterflies (rows, cols multiples of 128 where transformed).
void had_left_cuda(QuantCudaContext& ctx, double* x, int64_t rows, int64_t cols);
void had_right_cuda(QuantCudaContext& ctx, double* x, int64_t rows, int64_t cols);

// Step 4, the Hessian in the rotated basis: hi = Hk·diag(su)·H·diag(su)·Hk (h, su, hi device;
// hi may not alias h). Bit-exact with the CPU's hi ∘= su·suᵀ, then the two Hadamards.
void hessian_rotate_cuda(QuantCudaContext& ctx, const double* h, const double* su, int64_t k, double* hi);

// Block LDL (block_ldl on the GPU): L [k][k] (lower, unit block diagonal in exact arithmetic) from
// a symmetric PD h. Returns false in *not_pd (L undefined) when the Cholesky fails.
Status block_ldl_cuda(QuantCudaContext& ctx, const double* h, int64_t k, double* l, bool* not_pd);

// The 256 tensor-core-order fp32 targets of a 16-row block of LDLQ (rows r0..r0+15, every tile):
// target = T + Σ_{jr ≥ r0+16} L[jr][r0+r]·Δ[jr] summed in jr order (l null: T alone).
// targets: [n/16][256].
void ldlq_targets_cuda(QuantCudaContext& ctx, const double* t, const double* l, const double* delta, int64_t k,
                       int64_t n, int64_t r0, float* targets);
// Decoded states of that row block into Q and Δ = T − Q (rows r0..r0+15).
void ldlq_decode_cuda(QuantCudaContext& ctx, const uint16_t* states, const float* lut32, const double* t, int64_t n,
                      int64_t r0, double* q, double* delta);

// Σ_i a[i]·b[i] over count elements, deterministic (fixed reduction tree); result on the host.
Result<double> dot_cuda(QuantCudaContext& ctx, const double* a, const double* b, int64_t count);
// tr(Aᵀ·H·B) for A, B [k][n]; h null = identity. scratch: [k][n].
Result<double> trace_form_cuda(QuantCudaContext& ctx, const double* h, const double* a, const double* b, int64_t k,
                               int64_t n, double* scratch);
// C[m][n] = A[m][kk]·B[kk][n] (row-major DGEMM).
Status gemm_cuda(QuantCudaContext& ctx, const double* a, const double* b, double* c, int64_t m, int64_t kk, int64_t n);

}  // namespace spw::quant
