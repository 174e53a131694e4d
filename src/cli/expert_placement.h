// Where `serve` and `bench` put the routed experts (docs/placement.md): a placement file from `spillway plan`
// (--placement), a plan made at start-up from a GPU memory budget (--gpu-memory, with --routing-stats when
// recorded), or every expert on the GPU (neither flag). The chosen placement is logged per tier.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "model/expert_tier.h"
#include "runtime/placement.h"
#include "runtime/routing_stats.h"

namespace CLI {
class App;
}

namespace spw::cli {

struct PlacementFlags {
  std::string placement_file;           // --placement
  std::string routing_stats;            // --routing-stats (with --gpu-memory)
  std::string host_tier = "auto";       // --host-tier (with --gpu-memory)
  runtime::PlacementRequest request;    // --gpu-memory and the reservations
  int cpu_expert_threads = 0;           // --cpu-expert-threads
  std::string cpu_expert_activations = "exact";  // --cpu-expert-activations: exact or int16
};

// Adds --placement, --gpu-memory, --routing-stats, --host-tier and --cpu-expert-threads to a command.
void add_placement_flags(CLI::App* cmd, PlacementFlags& flags);

// --routing-stats FILE: the statistics, or null when FILE is empty; errors name the flag.
Result<std::unique_ptr<runtime::RoutingStats>> read_routing_stats_flag(const std::string& file);

// A plan from the checkpoint's headers (`spillway plan` and --gpu-memory). `stats` may be null (uniform routing);
// `stats_source` names where they came from, in messages and in the placement.
Result<runtime::Placement> plan_from_checkpoint(const std::string& model_dir, const ModelConfig& config,
                                                const runtime::PlacementRequest& request,
                                                const runtime::RoutingStats* stats, const std::string& stats_source);
Result<runtime::Placement> plan_from_checkpoint(const Checkpoint& headers, const ModelConfig& config,
                                                const runtime::PlacementRequest& request,
                                                const runtime::RoutingStats* stats, const std::string& stats_source);

// The tiers the flags ask for (empty: all on the GPU). Errors name the flag: an unreadable or malformed file, a
// file made for another model (type, layers or experts differ), a budget the dense weights do not fit.
// `headers`: the model's checkpoint when already open (a synthetic model in memory); else model_dir is opened.
Result<ExpertTiers> resolve_expert_tiers(const std::string& model_dir, const ModelConfig& config,
                                         const PlacementFlags& flags, const Checkpoint* headers = nullptr);

}  // namespace spw::cli
