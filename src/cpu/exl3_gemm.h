// y = x·W for EXL3 linears on the CPU, straight from the trellis (W is never materialized).
//
// What it computes: y[m][n] = x[m][k] · W + bias with W = diag(suh)·Hk·Ŵ·Hn·diag(svh) (formats/exl3.h,
// spec §2.4), as three stages: input rotation xr = had128(x ∘ suh) (fp32), the trellis product
// u = xr · Ŵ decoding each 16×16 tile in registers (fp16-exact codebook values, fp32 FMAs), and the
// output rotation y = had128(u) ∘ svh + bias. Any K (integer 1..8 or half-integer), every codebook.
//
// Contract: x [m][k] fp32 row-major, y [m][n] fp32 row-major, overwritten; no aliasing; m ≥ 1 (the
// fast path is tuned for 1..64 tokens; larger m works). Threads: the given pool (global_pool() when
// null) splits the output tiles. ISA: AVX-512 (F+BW+VL), else AVX2+FMA+F16C, else scalar, picked
// at run time; exl3_matmul_cpu_isa forces one (tests).
// Accuracy: differs from exl3_matmul_ref (fp64) only by fp32 summation order: relative error
// ~1e-6·√k; tests allow 1e-4 of RMS(y).
// Tests: tests/unit/test_exl3_cpu.cpp (against exl3_matmul_ref at 5120×2304, 2304×5120, 4096×2048
// and awkward sizes, every codebook, K 1..8 and 2.5, m 1..64, guard regions, NaN checks).
#pragma once

#include <cstdint>

#include "base/thread_pool.h"
#include "formats/exl3.h"

namespace spw {

enum class CpuIsa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
const char* cpu_isa_name(CpuIsa isa);
// Best ISA this machine supports (CPUID, once).
CpuIsa cpu_isa_detect();

void exl3_matmul_cpu(const Exl3Tensor& t, const float* x, int64_t m, float* y, ThreadPool* pool = nullptr);
// As above on a given ISA; an ISA the machine lacks falls back to the best one it has.
void exl3_matmul_cpu_isa(CpuIsa isa, const Exl3Tensor& t, const float* x, int64_t m, float* y,
                         ThreadPool* pool = nullptr);

namespace detail {
// Tile stage for output tiles [tn0, tn1): u[i][16·tn + c] for every token i.
// xe: per token i, per k-tile tk, 32 floats = xr rows in the lane order of the kernels
// (see exl3_gemm.cpp: exl3_expand_x). starts[p]: first stream bit of position p's 16-bit window,
// +32 (the kernels read a copy of the ring with the last word prepended). u is [m][n].
using Exl3TileFn = void (*)(const Exl3Tensor& t, const float* xe, int64_t m, int64_t tn0, int64_t tn1,
                            const int32_t* starts, float* u);
void exl3_tiles_scalar(const Exl3Tensor&, const float*, int64_t, int64_t, int64_t, const int32_t*, float*);
void exl3_tiles_avx2(const Exl3Tensor&, const float*, int64_t, int64_t, int64_t, const int32_t*, float*);
void exl3_tiles_avx512(const Exl3Tensor&, const float*, int64_t, int64_t, int64_t, const int32_t*, float*);
}  // namespace detail

}  // namespace spw
