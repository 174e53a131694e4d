// Fused MoE decode for EXL3 routed experts on NVIDIA GPUs: one launch per layer.
//
// What it computes, for every token t < T and routing slot j < topk with expert e = idx[t][j] ≥ 0:
//   g = x[t]·W1[e], u = x[t]·W3[e]                                  (gate, up: d → f)
//   h = silu(min(g, L)) · clamp(u, −L, L)   (no clamp when L = 0)     (V4's SwiGLU, spec deepseek-v4)
//   y[t] = Σ_j weight[t][j] · (h·W2[e])   (W2's bias, if any, is added once per slot, unweighted)
// with every W an EXL3 linear (W = diag(suh)·H·Ŵ·H·diag(svh), + bias if present), decoded from the
// trellis in registers by the same tile code as exl3_gemm_cuda. idx = −1 skips a slot (experts held
// elsewhere, e.g. on another GPU), so y then carries only this shard's experts.
//
// How: a cooperative kernel whose warps walk five phases separated by grid barriers — rotate x by
// each selected gate/up's suh (and group the launch's pairs by expert, up to 8 a group); gate/up products
// in k segments of 256, each decoded once per group by one warp, every pair of the group an MMA column,
// into a slot of the pair's own; the slots summed in order, output Hadamard + svh, SwiGLU, rotate by the down
// projection's suh; down products the same way; output Hadamard + svh, weighted sum. The segments'
// boundaries depend on d and f alone, MMA columns do not mix, and nothing meets by atomics, so results are
// deterministic and a token's output is the same bits whatever else the launch holds (T, the other tokens'
// experts and which of them share its groups). All inputs
// (x, idx, weights) and the expert table live in device memory, so the launch is CUDA-graph
// capturable and never synchronizes with the host. Pointers in the expert table may point at pinned
// host memory (mapped), which the kernel then reads over PCIe.
//
// reference_rounding (the GPU engine, engine/gpu_moe.cpp): the numerics of running each expert as
// three exl3_gemm_cuda calls with the reference's activation roundings — g and u rounded to bf16,
//   h = bf16(silu(min(g, L))·clamp(u, ±L)·weight[t][j]) (silu with an exp evaluated in f64 and rounded
//   once, as cuda/ops/moe.h's swiglu), each slot's down output rounded to bf16 unweighted, and
//   y[t] = 0 + Σ over the token's slots in ascending expert id (ties by slot) — the per-expert
//   scatter-add order. The sums inside each projection are split at other k boundaries than
//   exl3_gemm_cuda's, so results match the per-expert path up to fp32 summation order (then a rare
//   1-ulp bf16 flip).
// T is unbounded: calls of more than max_pairs / topk tokens (the workspace's) launch in pieces of that
// many, which give the same bits. Limits: d and f multiples of 128; all experts share one integer K (2..6)
// and codebook; topk ≤ the workspace's max_pairs. Accuracy: as exl3_gemm_cuda per projection (x and h rounded to fp16 once
// after their rotations), fp32 elsewhere.
// Tests: tests/gpu/test_exl3_moe_cuda.cpp; reference_rounding: tests/gpu/test_engine_batch.cpp. Benchmark: bench/exl3/bench_exl3.cu (moe section).
#pragma once

#include <cstdint>

#include "base/status.h"
#include "formats/exl3.h"

namespace spw {

// One expert's three projections (device pointers): [0] = w1 (gate), [1] = w3 (up), [2] = w2 (down).
struct Exl3CudaExpert {
  const uint16_t* trellis[3] = {};
  const uint16_t* suh[3] = {};
  const uint16_t* svh[3] = {};
  const uint16_t* bias[3] = {};  // null when absent
};

struct Exl3CudaMoeLayer {
  const Exl3CudaExpert* experts = nullptr;  // device array [n_experts]
  int n_experts = 0;
  int64_t d = 0, f = 0;  // hidden size, expert width
  Exl3Bits bits;
  Exl3Codebook codebook = Exl3Codebook::kMul1;
  float swiglu_limit = 0.f;
  bool reference_rounding = false;  // see above
};

struct Exl3CudaMoeWorkspace {
  void* buf = nullptr;  // rotated inputs and the fp32 segment slots
  int max_pairs = 0;
  int64_t d = 0, f = 0;
  // Diagnostics (bench_exl3's phase table): when set, every warp's lane 0 writes %globaltimer (ns) at the
  // start and end of each of the kMoePhases phases, phase_ns[(warp of the grid)·2·kMoePhases + 2·phase + {0, 1}];
  // the buffer needs exl3_moe_phase_stamps() entries. Null in the engine.
  unsigned long long* phase_ns = nullptr;
};

// Phases of the fused kernel, in order: rotate, gate/up, SwiGLU, down, combine.
constexpr int kMoePhases = 5;
// Entries phase_ns needs for the launches exl3_moe_decode_cuda makes with this layer (grid warps × 2·kMoePhases).
int64_t exl3_moe_phase_stamps(const Exl3CudaMoeLayer& layer);

bool exl3_cuda_moe_supports(const Exl3CudaMoeLayer& layer);
size_t exl3_cuda_moe_workspace_nbytes(int max_pairs, int64_t d, int64_t f);
Status exl3_cuda_moe_workspace_alloc(Exl3CudaMoeWorkspace& ws, int max_pairs, int64_t d, int64_t f);
void exl3_cuda_moe_workspace_free(Exl3CudaMoeWorkspace& ws);

// x [T][d] fp32, idx [T][topk] int32, weights [T][topk] fp32, y [T][d] fp32 (overwritten): device
// pointers. stream: a cudaStream_t, nullptr = default stream.
Status exl3_moe_decode_cuda(const Exl3CudaMoeLayer& layer, const float* x, const int32_t* idx, const float* weights,
                            int T, int topk, float* y, Exl3CudaMoeWorkspace& ws, void* stream = nullptr);

}  // namespace spw
