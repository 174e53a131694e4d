// MoE dispatch on the device: the routed experts of a step run as grouped GEMVs over its
// (token, slot) pairs, reading each pair's expert id from device memory, so the router's choices
// never go to the host. For decode-sized steps; prefill chunks keep the per-expert GEMMs
// (gpu_moe.cpp's host dispatch), which read each expert's weights once.
//
// ExpertTable: per layer, a device array of every routed expert's (w1, w2, w3) weight and scale
// pointers; built at load when all experts are dense linears of one format and shape (MXFP4 in the
// checkpoints). Exl3MoeTable: the same for EXL3 experts (`spillway quantize` packs), which run as
// the fused decode kernel cuda/exl3_moe.h in its reference_rounding mode (the per-expert path's
// numerics up to fp32 summation order).
//
// grouped_expert_gemv_cuda: for every pair p < n_pairs with e = experts[p] (≥ 0),
//   y[p, o] = Σ_k x[p / x_div, k] · W_e[o, k]   (o < n_out, k < n_in; W dequantized exactly as the
//   dense library does, cuda/dense/dense_device.cuh), rounded to bf16 when round_out.
//   x must already be fake-quantized when the weight's act_block > 0 (the caller runs
//   cuda::fake_quant_fp8 on it, as the dense library's activation prep does). One warp per two
//   outputs of a pair, their weight loads issued in rounds of four chunks per lane: lane l sums its
//   16-element chunks l, l + 32, ... in order (fp32 FMA), then a fixed xor tree across lanes —
//   deterministic, and a row's result does not depend on the other pairs. It differs from the dense
//   library's GEMV only by summation order.
// moe_combine_cuda: acc[t, ch] = 0 + ys[t·K + j₁, ch] + ys[t·K + j₂, ch] + ... over the token's K ≤ 16
//   slots in ascending expert id (ties by slot; slots of expert −1 skipped): the per-expert path's
//   scatter-add order. ys rows 16-byte aligned when d % 4 == 0 (read as float4).
// Contract: device pointers; x [*, n_in] f32, y [n_pairs, n_out] f32 (overwritten), experts
// [n_pairs] int32, ys [n_tokens·K, d], acc [n_tokens, d] (overwritten). n_in % 32 == 0; x 16-byte
// aligned (its rows are read as float4).
// Tests: tests/gpu/test_engine_batch.cpp (EngineBatch.*DeviceMoeMatchesHostDispatch), test_engine_kernels.cpp
// (EngineKernels.MoeCombine*).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "base/settings.h"
#include "base/status.h"
#include "cuda/dense/dense_linear.h"
#include "cuda/exl3_moe.h"
#include "engine/device_buffer.h"

namespace spw::engine {

// Steps of at most this many rows take the device dispatch under MoeDispatch::kAuto (EXL3 experts: the
// fused kernel's workspace is sized for it; and the most rows a decode step is captured into CUDA graphs
// with).
constexpr int kDeviceDispatchRows = 16;
// For dense-table experts (MXFP4 as released, FP8, BF16) the device dispatch is taken up to
// MoePaths::dense_device_rows rows (default kDeviceDispatchRowsDense, SPILLWAY_DENSE_DEVICE_ROWS). Why more than 16: the host dispatch reads each distinct expert once but costs a host round trip and ~5 launches
// per expert; the device dispatch reads one expert per (token, slot) pair in a few launches. V4-Flash
// (256 experts of 3 × 4096 × 2048 MXFP4, 13.4 MB; top-6) at 64 rows: host ≈ 200 distinct experts × (3.2 µs
// of HBM + launches) — measured 46.5 ms per 4-layer step on the H200 (batch 64 slower than batch 16) —
// against 384 pairs × 3.2 µs ≈ 1.2 ms per layer for the device path before L2 reuse. The
// break-even is near 300 rows by that arithmetic; 64 is the largest decode bucket the benches run.
// Measured on the H200 (bench/results/engine_h200.md): V4 batch 64 45.8 → 31.7 ms per 4-layer step with 64
// here instead of 16; EngineBatch.V4DeviceMoeMatchesHostDispatch48Rows checks the device path at 48 rows
// against the host dispatch. SPILLWAY_DENSE_DEVICE_ROWS=16 gives the 16-row rule for A/B runs.
constexpr int kDeviceDispatchRowsDense = 64;

// Which MoE paths the engine takes (GpuModelOptions::moe_paths), for A/B runs; the defaults are the fast ones.
// gpu_moe.cpp says what each path does and how they were chosen.
struct MoePaths {
  bool exl3_grouped = true;  // EXL3 experts of host-dispatched steps in grouped launches, not per expert
  Exl3DecodeKernel exl3_decode = Exl3DecodeKernel::kByRows;  // EXL3 decode: fused below 8 rows, else grouped
  int dense_device_rows = kDeviceDispatchRowsDense;        // device dispatch limit of dense-table experts
  // Device dispatch limit of EXL3 experts. Past kDeviceDispatchRows only the fused kernel takes them (in
  // launches of kDeviceDispatchRows tokens, cuda/exl3_moe.h): the batch-invariant runner raises it to its
  // sequence count, so a decode of every running sequence is one step instead of one per 16.
  int exl3_device_rows = kDeviceDispatchRows;
  // Batch-invariant EXL3 experts under host dispatch (GpuRunner's batch_invariant): the grouped launches' items take
  // one row class per kind of step (GpuStep::exl3_item_class) — class 0 (≤ 8 rows: the device pairs' bits) in decode
  // steps, class 2 (≤ 64 rows) in row-invariant prefill steps — instead of a class by each item's rows, so that no
  // row's bits depend on how many rows its expert has in the step.
  bool exl3_fixed_classes = false;
};
// The paths the process's settings ask for (SPILLWAY_EXL3_GROUPED, SPILLWAY_EXL3_DECODE,
// SPILLWAY_DENSE_DEVICE_ROWS).
inline MoePaths moe_paths_from(const GpuSettings& g) {
  MoePaths p;
  p.exl3_grouped = g.exl3_grouped;
  p.exl3_decode = g.exl3_decode;
  if (g.dense_device_rows > 0) p.dense_device_rows = g.dense_device_rows;
  return p;
}

struct DeviceExpert;

struct ExpertPtrs {
  const void* w[3] = {};            // [0] w1 (gate), [1] w2 (down), [2] w3 (up)
  const uint8_t* scale[3] = {};
};

struct ExpertTable {
  DeviceBuffer<ExpertPtrs> ptrs;  // [n_experts]
  DeviceLinear shape[3];          // format, n_out, n_in, weight_block, act_block, f32_product (w, scale unused)
  bool ready() const { return ptrs.get() != nullptr; }
};

// Builds the table; leaves it empty (not ready) when the experts are not uniform dense linears.
Status expert_table_build(const std::vector<DeviceExpert>& experts, ExpertTable& t);

struct Exl3MoeTable {
  DeviceBuffer<Exl3CudaExpert> experts;  // [n_experts]
  Exl3CudaMoeLayer layer;
  bool ready() const { return experts.get() != nullptr; }
};

// Builds the table; leaves it empty when the experts are not EXL3 of one K and codebook or the fused
// kernel does not take their shapes (exl3_cuda_moe_supports).
Status exl3_moe_table_build(const std::vector<DeviceExpert>& experts, float swiglu_limit, Exl3MoeTable& t);

Status grouped_expert_gemv_cuda(const ExpertTable& t, int which, const float* x, int x_div, const int32_t* experts,
                                int64_t n_pairs, float* y, bool round_out, cudaStream_t stream);

Status moe_combine_cuda(const float* ys, const int32_t* experts, int64_t n_tokens, int top_k, int64_t d, float* acc,
                        cudaStream_t stream);

}  // namespace spw::engine
