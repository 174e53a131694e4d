// Where a routed expert lives and who computes it (docs/placement.md): the placement planner
// (runtime/placement.h) assigns a tier to every expert of every layer and the GPU engine loads and runs
// each expert by it (engine/host_experts.h).
//   Gpu      resident in HBM, computed by the GPU's kernels;
//   HostGpu  in pinned host RAM mapped into the device's address space, read by the same GPU kernels over PCIe;
//   HostCpu  in host RAM, computed by the CPU runtime (cpu/host_moe_worker.h).
#pragma once

#include <vector>

namespace spw {

enum class ExpertTier { Gpu, HostGpu, HostCpu };
constexpr int kNumExpertTiers = 3;

inline const char* expert_tier_name(ExpertTier tier) {  // "gpu", "host_gpu", "host_cpu"
  switch (tier) {
    case ExpertTier::Gpu: return "gpu";
    case ExpertTier::HostGpu: return "host_gpu";
    case ExpertTier::HostCpu: return "host_cpu";
  }
  return "?";
}

// [layer][expert]; empty means every expert on the GPU.
using ExpertTiers = std::vector<std::vector<ExpertTier>>;

}  // namespace spw
