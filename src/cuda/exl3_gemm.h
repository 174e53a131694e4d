// y = x·W for EXL3 linears on NVIDIA GPUs (sm_90; portable to sm_120), straight from the trellis.
//
// What it computes: y[m][n] = x[m][k]·W + bias, W = diag(suh)·Hk·Ŵ·Hn·diag(svh) (formats/exl3.h).
// Per chunk of tokens (≤ 64 on the kBulk path, ≤ 16 on kXSmem), each block rotates its k slice of x
// into shared memory, xr = fp16(had128(x∘suh)) (a 64-row launch copies it from one rotation of the whole
// chunk, exl3_rotate_rows_kernel), then the trellis product (two paths, see Exl3GemmPath): each warp walks one 16-column strip over the
// slice, decoding every 16×16 trellis tile in registers (a lane's 8 positions are exactly its
// mma.m16n8k16 A fragment, spec §1.4) while the next tiles are already in flight, and multiplies on
// tensor cores with fp32 accumulation; the k slices' partial sums meet in an fp32 workspace in slice
// order (deterministic: exl3_bulk.cuh), and the last slice of each 128-column group applies the output
// Hadamard, svh and bias, writes y and zeroes its workspace slice again (no memset between calls). For hundreds of tokens, exl3_prefill.h is faster
// (bench_exl3's prefill table: the crossover is ~128 tokens per matrix).
//
// Contract: all pointers are device pointers. x [m][k] fp32, y [m][n] fp32 (overwritten, no aliasing
// with x). Workspace (exl3_cuda_workspace_alloc): acc ≥ 64·n floats and counters ≥ n/128 uint32 (both
// zero before the first call and left zero after every call) and the rotated-x scratch of 64-row
// launches; one workspace per stream (concurrent launches must not share one).
// Limits: integer K 2..6, every codebook, k and n multiples of 128, any m ≥ 1 (chunks of 64 or 16 tokens).
// Accuracy: Ŵ exact; x is rounded once to fp16 after its rotation (as exllamav3 does), products and
// sums in fp32 ⇒ ~3e-4 relative RMS error against exl3_matmul_ref.
// Tests: tests/gpu/test_exl3_cuda.cpp. Benchmark: bench/exl3/bench_exl3.cu (scripts/gpu_test.sh).
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "formats/exl3.h"

namespace spw {

struct Exl3CudaTensor {
  const uint16_t* trellis = nullptr;  // [k/16][n/16][16·K] int16 as stored
  const uint16_t* suh = nullptr;      // fp16 [k]
  const uint16_t* svh = nullptr;      // fp16 [n]
  const uint16_t* bias = nullptr;     // fp16 [n] or null
  int64_t k = 0, n = 0;
  Exl3Bits bits;
  Exl3Codebook codebook = Exl3Codebook::k3Inst;
};

struct Exl3CudaWorkspace {
  float* acc = nullptr;         // ≥ 64·n floats, zeroed once
  uint32_t* counters = nullptr; // ≥ n/128, zeroed once
  void* xr = nullptr;           // fp16 [64][k]: x rotated once for the bulk path's 64-row launches
  int64_t capacity_k = 0, capacity_n = 0;
  // Launch shape: k splits are chosen for about this many blocks per SM (0 = the tuned default, 4;
  // bench_exl3 sweeps it).
  int blocks_per_sm = 0;
  // Rows of x per launch of the kBulk path: 64 (0, the default: every tile decoded once per 64 rows)
  // or 16 (the earlier chunking, kept for bench_exl3's comparison).
  int rows_per_launch = 0;
};

// Whether exl3_gemm_cuda handles this tensor (K, codebook, shape).
bool exl3_cuda_supports(const Exl3CudaTensor& t);

// Device bytes of a workspace for tensors up to max_k rows and max_n columns (what the alloc below takes).
size_t exl3_cuda_workspace_nbytes(int64_t max_k, int64_t max_n);
// Allocates and zeroes a workspace for tensors up to k rows and n columns (cudaMalloc); frees it.
Status exl3_cuda_workspace_alloc(Exl3CudaWorkspace& ws, int64_t max_k, int64_t max_n);
void exl3_cuda_workspace_free(Exl3CudaWorkspace& ws);

// Two implementations of the same product, kept side by side while the H200 measurements decide:
//   kXSmem: one launch; each block rotates its k-slice of x into shared memory, warps load their strip's
//           trellis in 8-tile register batches.
//   kBulk:  as kXSmem, but a producer warp streams the trellis into a shared-memory ring by bulk copies
//           (cp.async.bulk, sm_90+), so loads take almost no issue slots.
// kAuto picks the one measured faster (currently kBulk).
enum class Exl3GemmPath { kAuto, kXSmem, kBulk };
const char* exl3_gemm_path_name(Exl3GemmPath p);

// stream: a cudaStream_t (void* so host code needs no CUDA headers); nullptr = default stream.
// round_out_bf16: y rounded to bf16 (round to nearest even) as it is written, bit-identical to rounding
// it afterwards (the GPU engine's bf16 activations) without another pass over y.
Status exl3_gemm_cuda(const Exl3CudaTensor& t, const float* x, int64_t m, float* y, Exl3CudaWorkspace& ws,
                      void* stream = nullptr, Exl3GemmPath path = Exl3GemmPath::kAuto, bool round_out_bf16 = false);

// xr [m][k] fp16 = fp16(had128(x ∘ suh)) per row and 128-block: the input rotation every path applies
// (the 64-row launches and exl3_prefill_cuda take it from here). Device pointers; k a multiple of 128.
Status exl3_rotate_rows_cuda(const float* x, const uint16_t* suh, void* xr, int64_t k, int64_t m, void* stream);

}  // namespace spw
