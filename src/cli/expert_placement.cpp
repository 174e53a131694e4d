#include "cli/expert_placement.h"

#include <CLI/CLI.hpp>

#include <fstream>
#include <memory>
#include <sstream>

#include "base/log.h"
#include "model/inventory.h"
#include "runtime/placement_file.h"
#include "runtime/routing_stats.h"

namespace spw::cli {

void add_placement_flags(CLI::App* cmd, PlacementFlags& f) {
  cmd->add_option("--placement", f.placement_file,
                  "expert placement file from `spillway plan` (GPU runner; docs/placement.md)");
  cmd->add_option("--gpu-memory", f.request.gpu_memory_gib,
                  "plan the expert placement at start-up for this many GiB of GPU memory (GPU runner; 0 = every expert on "
                  "the GPU unless --placement)")
      ->capture_default_str();
  cmd->add_option("--routing-stats", f.routing_stats, "routing statistics for the --gpu-memory plan (else uniform)");
  cmd->add_option("--kv-gib", f.request.kv_gib, "with --gpu-memory: GiB the plan reserves for the KV cache")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--workspace-gib", f.request.workspace_gib,
                  "with --gpu-memory: GiB the plan reserves for activations and workspaces")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--host-tier", f.host_tier,
                  "with --gpu-memory, where host experts run: gpu (read over PCIe), cpu (CPU runtime), auto")
      ->check(CLI::IsMember({"gpu", "cpu", "auto"}))
      ->capture_default_str();
  cmd->add_option("--cpu-expert-threads", f.cpu_expert_threads,
                  "threads computing the experts placed on the CPU (0 = all hardware threads)")
      ->capture_default_str();
  cmd->add_option("--cpu-expert-activations", f.cpu_expert_activations,
                  "how the CPU multiplies its experts: exact (fp32) or int16 (approximate, ~2e-4 relative; MUL1 "
                  "experts on AVX-512 VNNI machines, else exact)")
      ->check(CLI::IsMember({"exact", "int16"}))
      ->capture_default_str();
}

Result<std::unique_ptr<runtime::RoutingStats>> read_routing_stats_flag(const std::string& file) {
  if (file.empty()) return std::unique_ptr<runtime::RoutingStats>();
  auto read = runtime::read_routing_stats(file);
  if (!read.ok()) return make_error("--routing-stats: ", read.error().message);
  return std::make_unique<runtime::RoutingStats>(std::move(*read));
}

Result<runtime::Placement> plan_from_checkpoint(const Checkpoint& headers, const ModelConfig& config,
                                                const runtime::PlacementRequest& request,
                                                const runtime::RoutingStats* stats, const std::string& stats_source) {
  const Inventory inventory = take_inventory(headers, config);
  auto model = runtime::placement_model_from_inventory(config, inventory);
  if (!model.ok()) return make_error(headers.root(), ": ", model.error().message);
  return runtime::plan_placement(*model, request, stats, stats_source);
}

Result<runtime::Placement> plan_from_checkpoint(const std::string& model_dir, const ModelConfig& config,
                                                const runtime::PlacementRequest& request,
                                                const runtime::RoutingStats* stats, const std::string& stats_source) {
  OpenOptions open;
  open.allow_missing_data = true;
  auto ckpt = Checkpoint::open(model_dir, open);
  if (!ckpt.ok()) return ckpt.error();
  return plan_from_checkpoint(*ckpt, config, request, stats, stats_source);
}

namespace {

void log_tiers(const ExpertTiers& tiers, const std::string& source) {
  int64_t n[kNumExpertTiers] = {}, all = 0;
  for (const auto& layer : tiers)
    for (ExpertTier t : layer) ++n[int(t)], ++all;
  SPW_LOG_INFO("expert placement ({}): {} on the GPU, {} in pinned host memory read by the GPU, {} on the CPU, of {}",
               source, n[0], n[1], n[2], all);
}

}  // namespace

Result<ExpertTiers> resolve_expert_tiers(const std::string& model_dir, const ModelConfig& config,
                                         const PlacementFlags& f, const Checkpoint* headers) {
  if (!f.placement_file.empty() && f.request.gpu_memory_gib > 0)
    return make_error("--placement and --gpu-memory both given: pass one (the file already fixes every expert)");
  if (!f.placement_file.empty()) {
    std::ifstream in(f.placement_file, std::ios::binary);
    if (!in) return make_error("--placement ", f.placement_file, ": cannot read the file");
    std::stringstream text;
    text << in.rdbuf();
    auto file = runtime::parse_placement(text.str(), f.placement_file);
    if (!file.ok()) return make_error("--placement: ", file.error().message);
    if (file->model_type != config.model_type || file->n_layers != config.n_layers ||
        file->n_experts != config.n_experts) {
      // A model built in memory has no directory for `spillway plan`; fixed_share.py makes its placements.
      const std::string remedy = headers ? "make one with `tools/placement/fixed_share.py --v41-flash-layers " +
                                               std::to_string(config.n_layers) + "`"
                                         : "run `spillway plan --model " + model_dir + "` again";
      return make_error("--placement ", f.placement_file, " was planned for ", file->model_type, " with ",
                        file->n_layers, " layers of ", file->n_experts, " experts; ", model_dir, " is ",
                        config.model_type, " with ", config.n_layers, " layers of ", config.n_experts, " experts: ",
                        remedy);
    }
    log_tiers(file->tiers, f.placement_file);
    return std::move(file->tiers);
  }
  if (f.request.gpu_memory_gib <= 0) return ExpertTiers{};
  runtime::PlacementRequest request = f.request;
  request.host_tier = f.host_tier == "gpu"   ? runtime::HostTierPolicy::Gpu
                      : f.host_tier == "cpu" ? runtime::HostTierPolicy::Cpu
                                             : runtime::HostTierPolicy::Auto;
  auto stats = read_routing_stats_flag(f.routing_stats);
  if (!stats.ok()) return make_error("--gpu-memory ", f.request.gpu_memory_gib, ": ", stats.error().message);
  auto plan = headers ? plan_from_checkpoint(*headers, config, request, stats->get(), f.routing_stats)
                      : plan_from_checkpoint(model_dir, config, request, stats->get(), f.routing_stats);
  if (!plan.ok()) return make_error("--gpu-memory ", f.request.gpu_memory_gib, ": ", plan.error().message);
  log_tiers(plan->tiers, plan->from_stats ? "planned for --gpu-memory from --routing-stats"
                                          : "planned for --gpu-memory, routing assumed uniform");
  SPW_LOG_INFO("the plan predicts at most {:.1f} tokens/s at batch 1 (a bandwidth bound; `spillway plan` prints the "
               "tiers)", plan->tokens_per_s);
  return std::move(plan->tiers);
}

}  // namespace spw::cli
