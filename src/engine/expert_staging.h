// HostGpu experts of a decode step, staged into HBM before the fused / grouped-pairs MoE kernels read them.
//
// Why: those kernels read an expert's trellis a tile per warp with few loads in flight, which HBM hides and PCIe
// does not: reading experts in mapped pinned host memory they reach about half of the rate a streaming read
// kernel gets over the same link (bench/results/spill_h200.md). So a step first copies each selected HostGpu
// expert, once, with a streaming copy kernel (16-byte loads, several in flight per thread) into a slot of a
// device ring, and runs the MoE kernels on a per-step copy of the layer's expert table whose HostGpu entries
// point at those slots. All on the stream, CUDA-graph capturable: which experts and how many are found on the
// device. Experts past the ring's slots keep their mapped pointers (read over PCIe, correct, slower).
// Results are the same bits: the kernels read the same bytes from another address.
// Tests: tests/gpu/test_engine_spill.cpp (HostMappedExpertsGiveTheSameBits).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "cuda/exl3_moe.h"
#include "engine/device_buffer.h"

namespace spw::engine {

// HBM slots for staged experts: enough for the distinct HostGpu experts of a small decode step.
constexpr int kStagingSlots = 24;

struct ExpertStaging {
  DeviceBuffer<uint8_t> ring;             // [kStagingSlots][expert bytes]
  DeviceBuffer<Exl3CudaExpert> table;     // the step's expert table [n_experts]
  DeviceBuffer<int32_t> slot_expert;      // [kStagingSlots + 1]: the expert of each slot, then the slot count
  size_t tensor_nbytes[3] = {};           // per projection (fused order: gate, up, down)
  size_t expert_nbytes = 0;
  bool ready() const { return ring.get() != nullptr; }
};

// Sizes the ring for the layer's expert shape (every EXL3 layer of a model shares it).
Status expert_staging_alloc(ExpertStaging& st, const Exl3CudaMoeLayer& layer, int n_experts);
size_t expert_staging_nbytes(const Exl3CudaMoeLayer& layer, int n_experts);

// For pairs ids [n_pairs] (< 0: skipped), stages each distinct expert with on_host[e] into a slot and writes
// st.table = layer's table with those experts pointing at their slots; returns the layer to run (experts = st.table).
Status stage_host_experts_cuda(ExpertStaging& st, const Exl3CudaMoeLayer& layer, const int32_t* ids, int64_t n_pairs,
                               const uint8_t* on_host, Exl3CudaMoeLayer& staged, cudaStream_t stream);

}  // namespace spw::engine
