// `spillway plan`: host-expert placement under a GPU memory budget (docs/placement.md). Reads the
// checkpoint's headers (no tensor data needed), plans with runtime/placement.h, prints a summary and
// writes the placement file the GPU runtime loads.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>

#include "base/log.h"
#include "cli/commands.h"
#include "cli/expert_placement.h"
#include "cli/routing_calibration.h"
#include "model/config.h"
#include "runtime/routing_stats.h"
#include "runtime/placement.h"
#include "runtime/placement_file.h"

namespace spw::cli {
namespace {

struct PlanOptions {
  std::string model_dir;
  std::string routing_stats;  // empty: uniform routing (or --calibration)
  CalibrationOptions calibration;  // text_file set: record the statistics on this text first
  std::string record_routing;      // with --calibration: where the recorded statistics are written
  std::string out = "placement.json";
  std::string host_tier = "auto";
  runtime::PlacementRequest request;
};

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double to_gib(double nbytes) { return nbytes / kGiB; }

void print_summary(const runtime::Placement& plan, const PlanOptions& o) {
  using runtime::ExpertTier;
  const auto& r = plan.request;
  std::printf("placement    %s, %d layers x %d routed experts (top %d), %s\n", plan.model_type.c_str(), plan.n_layers,
              plan.n_experts, plan.top_k, o.model_dir.c_str());
  if (plan.from_stats)
    std::printf("routing      statistics from %s: %lld tokens recorded on \"%s\"%s%s\n", o.routing_stats.c_str(),
                (long long)plan.stats_n_tokens, plan.stats_model.c_str(),
                o.calibration.text_file.empty() ? "" : ", by calibration on ", o.calibration.text_file.c_str());
  else
    std::printf("routing      uniform: no --routing-stats given, every expert assumed equally likely (%d of %d per layer)\n",
                plan.top_k, plan.n_experts);
  std::printf("GPU memory   %.2f GiB = dense weights %.2f + KV %.2f + workspace %.2f + routed-expert budget %.2f GiB\n",
              r.gpu_memory_gib, to_gib(double(plan.dense_nbytes)), r.kv_gib, r.workspace_gib,
              to_gib(double(plan.expert_budget_nbytes)));
  std::printf("\n%-9s %8s %7s %13s %15s %8s %10s\n", "tier", "experts", "share", "resident GiB", "MiB per token",
              "GB/s", "ms/token");
  const double bw[] = {r.bandwidths.hbm_gbs, r.bandwidths.pcie_gbs, r.bandwidths.cpu_gbs};
  const int64_t n_all = int64_t(plan.n_layers) * plan.n_experts;
  for (int t = 0; t < runtime::kNumExpertTiers; ++t) {
    const runtime::TierTotals& tier = plan.totals[t];
    std::printf("%-9s %8lld %6.1f%% %13.2f %15.2f %8.0f %10.3f\n", runtime::expert_tier_name(ExpertTier(t)),
                (long long)tier.n_experts, 100.0 * double(tier.n_experts) / double(n_all),
                to_gib(double(tier.resident_nbytes)), tier.nbytes_per_token / (1024.0 * 1024.0), bw[t],
                tier.seconds_per_token * 1e3);
  }
  std::printf("(gpu includes the dense weights and what every token reads of them; host_gpu includes the Engram tables\n"
              " and rows; host-tier policy %s)\n", o.host_tier.c_str());
  std::printf("\npredicted    %.2f tokens/s at batch 1: a bandwidth bound (1 / sum of bytes per token / GB/s over the\n"
              "             tiers, not overlapped) from the bandwidths above, not a measurement\n",
              plan.tokens_per_s);
  std::printf("\nlayer      gpu  host_gpu  host_cpu\n");
  for (int l = 0; l < plan.n_layers; ++l) {
    int n[runtime::kNumExpertTiers] = {};
    for (ExpertTier t : plan.tiers[l]) ++n[int(t)];
    std::printf("%5d %8d %9d %9d\n", l, n[0], n[1], n[2]);
  }
}

int run_plan(PlanOptions& o) {
  if (o.host_tier == "gpu") o.request.host_tier = runtime::HostTierPolicy::Gpu;
  else if (o.host_tier == "cpu") o.request.host_tier = runtime::HostTierPolicy::Cpu;
  else o.request.host_tier = runtime::HostTierPolicy::Auto;

  auto config = read_model_config(o.model_dir);
  if (!config.ok()) {
    SPW_LOG_ERROR("{}", config.error().message);
    return 1;
  }
  // The routing statistics: recorded here on a calibration text (and saved for serve/bench --routing-stats),
  // read from --routing-stats, or none (uniform).
  std::unique_ptr<runtime::RoutingStats> stats;
  if (!o.calibration.text_file.empty()) {
    if (!o.routing_stats.empty()) {
      SPW_LOG_ERROR("--calibration and --routing-stats both given: pass one (each supplies the routing statistics)");
      return 2;
    }
    o.calibration.model_dir = o.model_dir;
    auto recorded = record_routing_on_text(o.calibration);
    if (!recorded.ok()) {
      SPW_LOG_ERROR("{}", recorded.error().message);
      return 1;
    }
    o.routing_stats = o.record_routing.empty() ? o.out + ".routing.json" : o.record_routing;
    if (Status st = runtime::write_routing_stats(*recorded, o.routing_stats); !st.ok()) {
      SPW_LOG_ERROR("--record-routing: {}", st.error().message);
      return 1;
    }
    SPW_LOG_INFO("routing statistics of {} tokens written to {}", recorded->n_tokens, o.routing_stats);
    stats = std::make_unique<runtime::RoutingStats>(std::move(recorded.value()));
  } else {
    auto read = read_routing_stats_flag(o.routing_stats);
    if (!read.ok()) {
      SPW_LOG_ERROR("{}", read.error().message);
      return 1;
    }
    stats = std::move(read.value());
  }
  SPW_LOG_INFO("reading the checkpoint headers of {}", o.model_dir);
  const auto started = std::chrono::steady_clock::now();
  auto plan = plan_from_checkpoint(o.model_dir, *config, o.request, stats.get(), o.routing_stats);
  if (!plan.ok()) {
    SPW_LOG_ERROR("{}", plan.error().message);
    return 1;
  }
  SPW_LOG_INFO("planned in {:.1f} s", std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  print_summary(*plan, o);

  std::ofstream out(o.out, std::ios::binary | std::ios::trunc);
  out << runtime::placement_to_json(*plan);
  out.close();
  if (!out) {
    SPW_LOG_ERROR("--out {}: cannot write the placement file", o.out);
    return 1;
  }
  std::printf("\nwrote        %s\n", o.out.c_str());
  return 0;
}

}  // namespace

std::function<int()> add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Place routed experts in HBM or host RAM under a GPU memory budget; predict bytes and tokens/s per token");
  cmd->add_option("--model,-m", o->model_dir,
                  "model directory (header-only checkpoints work, except with --calibration, which runs the model)")
      ->required();
  cmd->add_option("--gpu-memory", o->request.gpu_memory_gib, "GiB of GPU memory the model may use")->required();
  cmd->add_option("--routing-stats", o->routing_stats,
                  "routing statistics JSON (docs/placement.md); without it routing is assumed uniform");
  cmd->add_option("--calibration", o->calibration.text_file,
                  "record routing statistics on this text file first (the model runs it: CPU reference or GPU, see "
                  "--device) and plan with them");
  cmd->add_option("--calibration-tokens", o->calibration.max_tokens, "with --calibration: tokens of the text routed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--calibration-seq-len", o->calibration.seq_len,
                  "with --calibration: tokens per sequence (BOS and the text's next tokens)")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 20))
      ->capture_default_str();
  cmd->add_option("--device", o->calibration.device, "with --calibration: the runner, auto, cpu or cuda (as serve's)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--record-routing", o->record_routing,
                  "with --calibration: write the statistics here (default: the --out path + .routing.json)");
  cmd->add_option("--kv-gib", o->request.kv_gib, "GiB reserved for the KV cache")->capture_default_str();
  cmd->add_option("--workspace-gib", o->request.workspace_gib, "GiB reserved for activations and workspaces")
      ->capture_default_str();
  cmd->add_option("--host-tier", o->host_tier,
                  "where host experts run: gpu (read over PCIe), cpu (CPU runtime), auto (the faster by bandwidth)")
      ->check(CLI::IsMember({"gpu", "cpu", "auto"}))
      ->capture_default_str();
  cmd->add_option("--hbm-gbs", o->request.bandwidths.hbm_gbs, "HBM read bandwidth, GB/s")->capture_default_str();
  cmd->add_option("--pcie-gbs", o->request.bandwidths.pcie_gbs, "pinned host-to-device PCIe bandwidth, GB/s")
      ->capture_default_str();
  cmd->add_option("--cpu-gbs", o->request.bandwidths.cpu_gbs, "host memory bandwidth the CPU runtime reaches, GB/s")
      ->capture_default_str();
  cmd->add_option("--out,-o", o->out, "placement file to write")->capture_default_str();
  return [o] { return run_plan(*o); };
}

}  // namespace spw::cli
