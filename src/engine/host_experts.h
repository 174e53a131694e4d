// Routed experts on the CPU (tier HostCpu, model/expert_tier.h) inside the GPU forward: the GPU side of the
// host-expert runtime. One MoE layer with CPU experts runs as
//   route on the GPU → post (the rows and the CPU slots into the mailbox; the GPU's own slots keep their
//   ids, the CPU's become −1) → the GPU experts and the shared expert → collect (wait for the worker, add
//   its output into the routed sum),
// so the CPU computes its experts while the GPU computes its own, and the stream never waits on the host
// thread (cpu/host_moe_mailbox.h, engine/host_expert_kernels.h). The worker (cpu/host_moe_worker.h) runs the
// EXL3 CPU kernels on a pool of its own.
// Only steps of at most kCpuExpertMaxRows rows go to the CPU: its kernels' time grows with the tokens per expert,
// while a prefill chunk needs each expert once, which the GPU reads from the same pinned bytes over PCIe
// (bench/results/spill_h200.md measured a prefill both ways).
// Numerics: the GPU paths add a token's slots in ascending expert id with the reference's bf16 roundings
// per expert; here the CPU slots are summed in fp32 without those roundings and added after the GPU's
// slots, so a layer with CPU experts differs from all-GPU by fp32 order and bf16 rounding of per-expert
// outputs (tests/gpu/test_engine_spill.cpp states the tolerance).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "cpu/host_moe_worker.h"
#include "engine/device_buffer.h"
#include "engine/device_weights.h"

namespace spw::engine {

constexpr int kCpuExpertMaxRows = 16;

struct HostExpertOptions {
  int n_threads = 0;                          // the worker's pool (0: the machine's hardware threads)
  uint64_t wait_timeout_ns = 120'000'000'000;  // a collect that waits longer gives up (the step then fails)
  bool int16_activations = false;             // the CPU kernels' approximate int16 activations (cpu/exl3_gemm.h)
};

class HostExperts {
 public:
  // Null when no routed expert of `w` is on the CPU. max_tokens: the most rows of a step.
  static Result<std::unique_ptr<HostExperts>> create(const ModelConfig& c, const DeviceWeights& w, int max_tokens,
                                                     const HostExpertOptions& options);
  ~HostExperts();

  bool serves(int layer) const { return on_cpu_[layer].get() != nullptr; }
  // Posts the layer's CPU slots of experts/weights [n][top_k] (device) and writes the GPU's ids to gpu_experts.
  Status post(int layer, const float* x, const int32_t* experts, const float* weights, int n, int32_t* gpu_experts,
              cudaStream_t stream);
  // acc [n][d] += the worker's answer to the last post (stream-ordered).
  Status collect(float* acc, int n, cudaStream_t stream);
  // An error when a collect timed out since the last call (the step's outputs are then wrong). Call after the
  // stream is synchronized.
  Status check();

  size_t mailbox_nbytes() const { return layout_.nbytes(); }
  const HostMoeWorker& worker() const { return *worker_; }

 private:
  HostExperts() = default;

  HostMoeMailboxLayout layout_;
  MappedHostBuffer mailbox_;
  HostMoeMailbox host_box_, device_box_;
  std::vector<DeviceBuffer<uint8_t>> on_cpu_;  // [layer]: [n_experts] 1 where on the CPU; null for GPU-only layers
  HostExpertOptions options_;
  std::unique_ptr<HostMoeWorker> worker_;
};

}  // namespace spw::engine
