// A loaded ModelWeights on the GPU, in compact form: every linear in the format its
// checkpoint stores it, read as raw bytes from the checkpoint (not re-encoded from the f32 copy):
//   FP8 e4m3 + ue8m0 block scales, MXFP4 nibbles + ue8m0 per 32, BF16 or F32 as stored.
// Exceptions, each exact: wo_a (FP8 in the checkpoint, used unquantized as BF16 by the reference)
// is uploaded as bf16 bits of its dequantized values. Routed experts stored as EXL3 go up as their
// trellis, suh and svh (run by cuda/exl3_gemm.h) when their shapes are multiples of 128 (no padding);
// any other linear the checkpoint does not hold in a dense form is uploaded as its exact f32 copy. Small vectors (norms, mHC,
// sinks, biases, the compressors' ape) and the embedding table are f32; hash routes int32.
// The numerics switches (act_block for FP8/FP4 weights, f32_product for FP32 products) come from
// the weight's LinearKind and Numerics::fake_quant exactly as model/linear.cpp decides them.
// Engram tables are not uploaded: GpuModel keeps them in mapped pinned host memory (engram_kernels.h).
// Tests: tests/gpu/test_engine_golden.cpp (through the forward).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "cuda/dense/dense_linear.h"
#include "cpu/exl3_moe.h"
#include "cuda/exl3_gemm.h"
#include "engine/device_buffer.h"
#include "model/expert_tier.h"
#include "model/model.h"

namespace spw::engine {

struct DeviceHc {
  const float* fn = nullptr;     // [(2+hc)·hc, hc·d] (V4 head: [hc, hc·d])
  const float* base = nullptr;   // [(2+hc)·hc]
  const float* scale = nullptr;  // [3]
};

// Linears that read the same input, uploaded as one weight (each part's rows in turn, in every array) that the
// parts view: stacked_linear_cuda runs them as one GEMV launch in decode, bit-identical to a launch per part.
// Uploaded so only when every part is stored in the same format and numerics and the stack keeps every row's
// summation order (stack_keeps_rows); otherwise empty, and the parts are uploaded alone.
struct DeviceStack {
  DeviceLinear w;
  std::vector<int> rows;  // each part's rows, in stack order
  bool stacked() const { return w.n_out > 0; }
};

struct DeviceExpert {
  DeviceLinear w1, w2, w3;  // gate [F, d], down [d, F], up [F, d]; empty for EXL3 experts
  DeviceStack w13;          // the shared expert's w1 and w3 (FP8); empty for routed experts and other formats
  // EXL3 experts (`spillway quantize` packs): the stored trellis, suh, svh; [0] w1, [1] w2, [2] w3.
  Exl3CudaTensor exl3[3];
  // Gpu: the pointers above are device memory. HostGpu: mapped pinned host memory. HostCpu: mapped pinned host
  // memory too, which the CPU worker computes from in small steps and the GPU reads over PCIe in large ones
  // (engine/host_experts.h).
  ExpertTier tier = ExpertTier::Gpu;
  bool is_exl3() const { return exl3[0].trellis != nullptr; }
};

// A routed expert placed on the CPU (tier HostCpu): host views of the same pinned bytes its DeviceExpert points
// at (the checkpoint's maps are dropped after load), for the CPU worker (cpu/host_moe_worker.h).
struct HostCpuExpert {
  Exl3Tensor w1, w3, w2;  // gate, up, down
  Exl3ExpertWeights view() const { return {&w1, &w3, &w2}; }
};

struct DeviceLayer {
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  DeviceHc hc_attn, hc_ffn;
  DeviceLinear wq_a, wq_b, wkv, wo_b;
  // Stacks (DeviceStack) of the linears reading one input: wq_a and wkv (x, FP8); the compressors' wkv and wgate
  // and the indexer compressor's, whichever the layer has (x, BF16 with f32 products); wq_b and the indexer's
  // wq_b (the q latent, FP8).
  DeviceStack wq_a_wkv, compressors, wq_b_idx;
  const uint16_t* wo_a = nullptr;  // bf16 [o_groups·o_lora_rank, H·D/o_groups]
  const float* q_norm = nullptr;
  const float* kv_norm = nullptr;
  const float* attn_sink = nullptr;
  DeviceLinear comp_wkv, comp_wgate;
  const float* comp_ape = nullptr;  // V4 only
  const float* comp_norm = nullptr;
  DeviceLinear idx_wq_b, idx_weights_proj, idx_comp_wkv, idx_comp_wgate, idx_wk;
  const float* idx_comp_ape = nullptr;
  const float* idx_comp_norm = nullptr;
  const float* idx_k_norm = nullptr;
  DeviceLinear gate;
  const float* gate_bias = nullptr;
  const float* gate_bias_vl = nullptr;  // V4.1: image positions' selection bias
  const int32_t* tid2eid = nullptr;
  std::vector<DeviceExpert> experts;
  DeviceExpert shared;
  DeviceLinear engram_wkv;
};

struct DeviceWeights {
  const float* embed = nullptr;  // [vocab, d]
  DeviceLinear head;
  const float* norm = nullptr;
  DeviceHc hc_head;  // V4 only
  std::vector<DeviceLayer> layers;
  size_t nbytes = 0;             // device bytes of all of the above
  size_t routed_gpu_nbytes = 0;  // of which routed experts
  WeightArena device;                              // the bytes of all of the above
  MappedHostArena host_mapped;                     // the HostGpu experts' bytes
  MappedHostArena host_cpu_mapped;                 // the HostCpu experts' bytes
  std::vector<std::vector<HostCpuExpert>> host_cpu;  // [layer][expert]; empty entries (w1.n = 0) elsewhere
  int64_t n_experts_in[kNumExpertTiers] = {};      // routed experts per tier (ExpertTier order)
};

// Uploads every weight the forward reads, each routed expert where `tiers` places it (empty: all on the GPU).
// Errors: CUDA allocation or copy failures, a linear that linear_cuda cannot take (names the tensor), tiers
// that do not match the model's layers and experts, or an expert placed on the CPU that is not stored as
// EXL3 (the CPU runtime computes EXL3 experts only).
Result<std::unique_ptr<DeviceWeights>> upload_weights(const ModelConfig& c, const ModelWeights& w,
                                                      const Numerics& numerics, const ExpertTiers& tiers = {});

}  // namespace spw::engine
