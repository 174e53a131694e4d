// y = x·W for EXL3 linears on the CPU, straight from the trellis (W is never materialized).
//
// What it computes: y[m][n] = x[m][k] · W + bias with W = diag(suh)·Hk·Ŵ·Hn·diag(svh) (formats/exl3.h,
// spec §2.4), as three stages: input rotation xr = had128(x ∘ suh) (fp32, once per call), the trellis
// product u = xr · Ŵ decoding each 16×16 tile in registers (fp16-exact codebook values, fp32 FMAs), and
// the output rotation y = had128(u) ∘ svh + bias. Any K (integer 1..8 or half-integer), every codebook.
//
// How the tile stage runs (exl3_gemm_avx2.cpp / _avx512.cpp, same structure, 8 or 16 positions per
// vector): the 16-bit states of a vector come from one 16-byte chunk of the tile (AVX2: broadcast to both
// halves; AVX-512: four chunks picked by vpermd from an 8-word window), a per-vector vpshufb assembles the
// three stream bytes of each state, a per-element shift aligns it (Exl3Lanes, built once per K). Codebook
// values are computed (kArith: multiply/bytesum or multiply/mask/xor, then a fp16 round trip) or looked
// up in the 65,536-entry fp32 table by gather (kLut; measured slower on both AVX2 and AVX-512, kept for
// comparison). With m < 4 each decoded group of 2 (AVX-512) or 4 (AVX2) vectors is used at once by every
// token; with m ≥ 4, 4 tiles down a column are decoded into L1 and each token then accumulates over them
// in registers. Activations are laid out [k-tile][token][32] so one tile's token rows are contiguous.
// On machines with AVX-512 FP16 + VBMI, exl3_gemm_avx512fp16.cpp replaces this (2× at m = 1): 32 states per
// vpermt2b + vpmultishiftqb, codebooks in 16-bit lanes with fp16 arithmetic (same bits), and the grid walked
// in strips of contiguous tiles instead of down columns (see its header). Threads split the (k-slice ×
// column-range) parts of the tile grid; k-slices are summed in fixed order in stage 3, so results do not
// depend on timing.
//
// Contract: x [m][k] fp32 row-major, y [m][n] fp32 row-major, overwritten; no aliasing; m ≥ 1 (tuned
// for 1..64 tokens; larger m works). Threads: the given pool (global_pool() when null). ISA: AVX-512 FP16
// (+VBMI), else AVX-512 VBMI, else AVX-512 (F+BW+VL), else AVX2+FMA+F16C, else scalar, picked at run time; exl3_matmul_cpu_isa forces one (tests).
// Scratch lives in per-thread buffers that grow and are kept (no allocation once warm).
// Accuracy: differs from exl3_matmul_ref (fp64) only by fp32 summation order: relative error
// ~1e-6·√k; tests allow 1e-4 of RMS(y). Both decode modes give identical codebook values.
// Tests: tests/unit/test_exl3_cpu.cpp (against exl3_matmul_ref at 5120×2304, 2304×5120, 4096×2048
// and awkward sizes, every codebook, K 1..8 and 2.5, m 1..64, both decode modes, forced k-splits,
// guard regions, NaN checks). Bench: bench/exl3/bench_exl3_cpu.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "base/thread_pool.h"
#include "formats/exl3.h"

namespace spw {

// Ordered: each level's machines run every lower level. kAvx512Vbmi = AVX-512 F/BW/VL + VBMI (Zen 4,
// Ice Lake; exl3_gemm_avx512vbmi.cpp), kAvx512Fp16 = that + FP16 (Sapphire Rapids and later;
// exl3_gemm_avx512fp16.cpp).
enum class CpuIsa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Vbmi = 3, kAvx512Fp16 = 4 };
const char* cpu_isa_name(CpuIsa isa);
// Best ISA this machine supports (CPUID, once).
CpuIsa cpu_isa_detect();

// How codebook values are produced in the SIMD kernels (the scalar kernel always uses the table).
enum class Exl3Decode { kArith = 0, kLut = 1 };

// What the activations are multiplied in. kFp32 is exact: the fp16 Ŵ of the definition times fp32 x, summed
// in fp32. kInt16 is a separate, approximate option for MUL1 tensors on AVX-512 VBMI + VNNI machines
// (exl3_gemm_int16.cpp): each token's xr is quantized to 15-bit integers (a scale per 128-row block), multiplied
// by the codebook's byte sums in integer dot products (vpdpwssd), and the codebook's affine map is applied
// after the sum, so Ŵ's fp16 rounding is skipped. Its error against the fp64 reference is measured in
// tests/unit/test_exl3_cpu.cpp and bench_exl3_cpu; elsewhere (other codebooks, machines without VNNI or
// VBMI, the table decode) the exact path runs.
enum class Exl3Activations { kFp32 = 0, kInt16 = 1 };

struct Exl3CpuOptions {
  CpuIsa isa = CpuIsa::kAvx512Fp16;  // capped at cpu_isa_detect()
  Exl3Decode decode = Exl3Decode::kArith;
  int k_splits = 0;                 // 0: chosen from the shape and thread count; else forced (tests)
  bool amx = true;                  // AMX tiles for m ≥ detail::kAmxMinTokens where the machine has them
  // Parts of the tile grid per pool thread. More than one lets threads that finish early take over parts of
  // slow or late ones (SMT siblings, busy vCPUs, a worker woken late), at the cost of shorter runs per part;
  // on the 2-core dev box 4 was no faster (1–3 % slower, within that VM's noise). bench_exl3_cpu_threads prints both at the
  // sweep's largest thread count, for hosts where the threads are not equal.
  int parts_per_thread = 1;
  Exl3Activations activations = Exl3Activations::kFp32;
};

void exl3_matmul_cpu(const Exl3Tensor& t, const float* x, int64_t m, float* y, ThreadPool* pool = nullptr);
// As above on a given ISA; an ISA the machine lacks falls back to the best one it has.
void exl3_matmul_cpu_isa(CpuIsa isa, const Exl3Tensor& t, const float* x, int64_t m, float* y,
                         ThreadPool* pool = nullptr);
void exl3_matmul_cpu_opts(const Exl3CpuOptions& opt, const Exl3Tensor& t, const float* x, int64_t m, float* y,
                          ThreadPool* pool = nullptr);

namespace detail {

// State-extraction program for one bit width (spec §1.4), positions in canonical order p = 8q + e (AVX2)
// or 16q + e (AVX-512). A chunk base of -1 means the ring wraps: the chunk starts with the tile's last
// word. Every byte a state needs lies inside its chunk (checked when built).
struct Exl3Lanes {
  int n_words = 0;                 // 32-bit words per tile
  int n_edge8 = 0, n_edge16 = 0;   // leading vectors whose base is -1
  int32_t base8[32];               // AVX2: first word of vector q's 4-word chunk
  alignas(64) uint8_t shuf8[32][32];    // vpshufb control (same 16 bytes in both halves)
  alignas(64) uint32_t shl8[32][8];     // left shift of each element before >> 16
  int32_t base16[16];              // AVX-512: first word of vector q's 8-word window
  alignas(64) uint32_t perm16[16][16];  // vpermd: window word for each dword of the four chunks
  alignas(64) uint8_t shuf16[16][64];
  alignas(64) uint32_t shl16[16][16];
};
// Built once per k_x2 (2..16), thread-safe.
const Exl3Lanes& exl3_lanes(Exl3Bits bits);

// One part of the tile grid: tiles [tk0, tk1) × [tn0, tn1). The kernel overwrites
// u[i·ldu + 16·tn + c] (i < m, tn in range, c < 16) with Σ over its tk of xr · Ŵ.
struct Exl3Part {
  const Exl3Tensor* t;
  const float* xe;  // per k-tile tk, per token i: 32 floats at (tk·m + i)·32, xr rows in lane order
  int64_t m;
  int64_t tk0, tk1, tn0, tn1;
  float* u;
  int64_t ldu;
  bool amx = true;  // the AVX-512 FP16 kernel may hand m ≥ kAmxMinTokens to AMX (Exl3CpuOptions::amx)
  // Exl3Activations::kInt16 (exl3_tiles_int16 only): xe quantized, same layout as xe, and the scales
  // [k-block of 128 rows][token] (exl3_quantize_xe).
  const int16_t* xq = nullptr;
  const float* xq_scale = nullptr;
};
using Exl3TileFn = void (*)(const Exl3Part& part, Exl3Decode decode);
void exl3_tiles_scalar(const Exl3Part&, Exl3Decode);
void exl3_tiles_avx2(const Exl3Part&, Exl3Decode);
void exl3_tiles_avx512(const Exl3Part&, Exl3Decode);
void exl3_tiles_avx512vbmi(const Exl3Part&, Exl3Decode);  // kLut: exl3_tiles_avx512's
void exl3_tiles_avx512fp16(const Exl3Part&, Exl3Decode);  // kLut: exl3_tiles_avx512's
// AMX (BF16 tiles over exact bf16 planes of Ŵ and x; exl3_gemm_amx.cpp): taken by exl3_tiles_avx512fp16 for
// m ≥ kAmxMinTokens when amx_ready() (AMX-BF16 + AVX-512 BF16 present and the OS granted the tile state).
// From 10 tokens AMX wins: its cost per tile is nearly flat up to 16 tokens (decode-bound) while the FMA path
// grows with m (bench/exl3/bench_exl3_cpu_tiles: K3 mul1, m = 10 / 12 / 16 ≈ 55–64 / 58–60 / 61–63 ns with AMX,
// 59–67 / 75–77 / 86–99 without; at 8 tokens the FMA path is as fast).
inline constexpr int64_t kAmxMinTokens = 10;
bool amx_ready();
void exl3_tiles_amx(const Exl3Part&);
// The VBMI kernels' pieces, for tests (callable only where cpu_isa_detect() reaches the ISA in the name):
// the fp16 codebook values of n states (FP16 arithmetic; fp32 and one rounding), and a tile's 256 states
// in canonical position order.
void exl3_codebook_avx512fp16(Exl3Codebook cb, const uint16_t* states, int64_t n, uint16_t* out);
void exl3_codebook_avx512vbmi(Exl3Codebook cb, const uint16_t* states, int64_t n, uint16_t* out);
void exl3_tile_states_avx512vbmi(const uint16_t* tile, Exl3Bits bits, uint16_t out[256]);
Exl3TileFn exl3_tile_fn(CpuIsa isa);
// The int16-activation MUL1 kernel (Exl3Activations::kInt16; needs P.xq, P.xq_scale and a MUL1 tensor) and
// whether this machine runs it (AVX-512 VBMI and VNNI).
void exl3_tiles_int16(const Exl3Part& P);
bool exl3_int16_ready();
// Whether a product of m tokens with these options takes the int16 kernel: below kAmxMinTokens tokens. Dev box,
// 8192² K = 3, 2 threads (bench/results/exl3_cpu_ci_class.md): m = 1 2.56 ms int16 vs 3.52 ms exact,
// m = 4 4.91 vs 5.34 ms, m = 8 8.18 ms int16; from 10 tokens the exact kernel's AMX path takes over (m = 16: one
// run of the int16 kernel before this cutoff took 13.4 ms against the exact 9.5 ms).
bool exl3_use_int16(const Exl3CpuOptions& opt, const Exl3Tensor& t, int64_t m);
// Quantizes token i's xe (all n_tk k-tiles, layout as exl3_expand_x with tk_stride = 32·m) to xq (same
// layout), one scale per 128-row block b (8 k-tiles): scale[b·m + i] = max|xe over the block| / kExl3Int16Max
// (1 when all zero), |q| ≤ kExl3Int16Max.
inline constexpr int kExl3Int16Max = 16383;
void exl3_quantize_xe(const float* xe, int64_t n_tk, int64_t m, int64_t i, int16_t* xq, float* scale);

// Normalized fp32 Sylvester Hadamard of 128 values in place (AVX2 version bit-identical to scalar).
void had128_f32_scalar(float* v);
void had128_f32_avx2(float* v);

// Stage 1 for one token: xe[tk·tk_stride + lane] = had128(x ∘ suh) in the kernels' lane order (for token i
// of m: xe = base + 32·i, tk_stride = 32·m, so one k-tile's rows of all tokens are contiguous).
void exl3_expand_x(const float* x, const float* suh, int64_t k, float* xe, int64_t tk_stride, CpuIsa isa);
// Stage 3 for one token: y = had128(Σ_s u_s) ∘ svh + bias over n columns, u_s = u + s·u_stride.
void exl3_finish_y(const float* u, int64_t n_splits, int64_t u_stride, const float* svh, const float* bias,
                   int64_t n, float* y, CpuIsa isa);

// Work split of one tile grid into n_parts = k_splits·n_splits parts (k_splits divides n_parts), and
// part `index` of it (k-slice index / n_splits writes u + slice·m·ldu).
void exl3_split(int64_t n_tk, int64_t n_tn, int64_t n_parts, int64_t* k_splits, int64_t* n_splits);
Exl3Part exl3_part(const Exl3Tensor& t, const float* xe, int64_t m, int64_t k_splits, int64_t n_splits, int64_t index,
                   float* u, int64_t ldu);
// suh, svh, bias as fp32 (bias empty when absent).
void exl3_factors(const Exl3Tensor& t, std::vector<float>& suh, std::vector<float>& svh, std::vector<float>& bias);

}  // namespace detail

}  // namespace spw
