// Host-expert placement (`spillway plan`, docs/placement.md): which routed experts of which layer
// live in HBM and which spill to the host, under a GPU memory budget, and what that costs per token.
//
// Tiers: Gpu (resident in HBM), HostGpu (pinned host RAM that GPU kernels read over PCIe), HostCpu
// (host RAM, computed by the CPU runtime). Dense weights (attention, shared experts, router, norms,
// embedding, head) are always on the GPU; Engram tables always in host RAM.
//
// Choice: an expert's expected traffic is its activations per token × its bytes. Moving it from a host
// tier to HBM saves traffic × (1/host GB/s − 1/HBM GB/s) per token and costs its bytes of HBM, so the
// planner fills the expert budget in order of activations per token (saving per byte of HBM: for
// experts of one size this is the order of expected traffic), ties broken by expert index, then layer,
// so a uniform plan spreads the GPU experts evenly over the layers. Each expert left on the host goes to
// the tier the --host-tier policy names; `auto` takes the tier with the higher bandwidth (the tier
// that reads the expert's bytes faster; for the serial model below the expert's size cancels out).
//
// Prediction: time per token = Σ over tiers of (bytes read from the tier / its bandwidth), the tiers
// taken one after the other (no overlap): a bandwidth bound, not a measurement.
// Tests: tests/unit/test_runtime_placement.cpp, tests/python/test_plan.py.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/expert_tier.h"
#include "model/inventory.h"
#include "runtime/routing_stats.h"

namespace spw::runtime {

using ::spw::ExpertTier;
using ::spw::expert_tier_name;
using ::spw::kNumExpertTiers;

enum class HostTierPolicy { Gpu, Cpu, Auto };

// What the planner needs to know of a model; from a checkpoint's inventory (placement_model_from_inventory)
// or, for the GPU engine, from the bytes it uploads.
struct PlacementModel {
  std::string model_type;
  int n_layers = 0, n_experts = 0, top_k = 0;
  int64_t dense_nbytes = 0;                    // HBM-resident whatever the placement
  int64_t dense_decode_nbytes_per_token = 0;   // read from HBM per decoded token
  int64_t host_table_nbytes = 0;               // host-resident whatever the placement (Engram tables)
  int64_t host_decode_nbytes_per_token = 0;    // read over PCIe per decoded token (Engram rows)
  std::vector<std::vector<int64_t>> expert_nbytes;  // [layer][expert], each > 0
};

// Errors when the checkpoint lacks a routed expert (a plan must place every expert of every layer).
Result<PlacementModel> placement_model_from_inventory(const ModelConfig& config, const Inventory& inventory);

// Bandwidths in GB/s (1e9 bytes per second). The defaults are assumptions for the H200 machine
// (docs/placement.md "Bandwidths"); pass measured values for another host.
struct Bandwidths {
  double hbm_gbs = 4200;  // HBM read: the H200's measured device copy rate (bench/results/engine_h200.md)
  double pcie_gbs = 50;   // pinned host → device over PCIe Gen5 x16 (64 GB/s raw): assumed, not measured
  double cpu_gbs = 70;    // host DRAM read by the CPU runtime: the H200 host's 16-core read rate
};

struct PlacementRequest {
  double gpu_memory_gib = 0;  // HBM the model may use, all of it
  double kv_gib = 8;          // reserved for the KV cache
  double workspace_gib = 2;   // reserved for activations, workspaces and the allocator's slack
  HostTierPolicy host_tier = HostTierPolicy::Auto;
  Bandwidths bandwidths;
};

struct TierTotals {
  int64_t n_experts = 0;
  int64_t resident_nbytes = 0;   // weights held in the tier (Gpu: with the dense weights; HostGpu: with Engram tables)
  double nbytes_per_token = 0;   // expected bytes read from the tier per decoded token
  double seconds_per_token = 0;  // nbytes_per_token / the tier's bandwidth
};

struct Placement {
  std::string model_type;
  int n_layers = 0, n_experts = 0, top_k = 0;
  PlacementRequest request;
  bool from_stats = false;          // false: uniform routing assumed
  std::string stats_model;          // RoutingStats::model when from_stats
  int64_t stats_n_tokens = 0;
  int64_t dense_nbytes = 0;          // PlacementModel::dense_nbytes
  int64_t expert_budget_nbytes = 0;  // HBM left for routed experts after dense weights and reservations
  std::vector<std::vector<ExpertTier>> tiers;  // [layer][expert]
  TierTotals totals[kNumExpertTiers];          // indexed by ExpertTier
  double seconds_per_token = 0;                // Σ totals[].seconds_per_token
  double tokens_per_s = 0;                     // 1 / seconds_per_token: a bandwidth bound

  const TierTotals& total(ExpertTier tier) const { return totals[int(tier)]; }
};

// `stats` may be null (uniform routing); `stats_source` names its file in errors. Errors (naming the flag
// to change) on non-positive bandwidths or memory, and when the dense weights plus the reservations do
// not fit --gpu-memory.
Result<Placement> plan_placement(const PlacementModel& model, const PlacementRequest& request,
                                 const RoutingStats* stats = nullptr, const std::string& stats_source = "");

}  // namespace spw::runtime
