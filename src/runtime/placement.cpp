#include "runtime/placement.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

namespace spw::runtime {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// A setting as the user typed it: 1.5, not 1.500000.
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string gib(double nbytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", nbytes / kGiB);
  return buf;
}

Status check_request(const PlacementRequest& r) {
  if (!(r.gpu_memory_gib > 0)) return make_error("--gpu-memory must be a positive number of GiB, got ", num(r.gpu_memory_gib));
  if (!(r.kv_gib >= 0)) return make_error("--kv-gib must be ≥ 0, got ", num(r.kv_gib));
  if (!(r.workspace_gib >= 0)) return make_error("--workspace-gib must be ≥ 0, got ", num(r.workspace_gib));
  const Bandwidths& b = r.bandwidths;
  if (!(b.hbm_gbs > 0)) return make_error("--hbm-gbs must be a positive bandwidth in GB/s, got ", num(b.hbm_gbs));
  if (!(b.pcie_gbs > 0)) return make_error("--pcie-gbs must be a positive bandwidth in GB/s, got ", num(b.pcie_gbs));
  if (!(b.cpu_gbs > 0)) return make_error("--cpu-gbs must be a positive bandwidth in GB/s, got ", num(b.cpu_gbs));
  return {};
}

// The host tier an expert takes under the policy. For `auto`, the tier that reads its bytes faster
// (bytes / GB/s); PCIe wins a tie, so the GPU keeps the work and the CPU stays free.
ExpertTier host_tier_for(HostTierPolicy policy, const Bandwidths& b) {
  switch (policy) {
    case HostTierPolicy::Gpu: return ExpertTier::HostGpu;
    case HostTierPolicy::Cpu: return ExpertTier::HostCpu;
    case HostTierPolicy::Auto: return b.cpu_gbs > b.pcie_gbs ? ExpertTier::HostCpu : ExpertTier::HostGpu;
  }
  return ExpertTier::HostGpu;
}

double bandwidth_gbs(ExpertTier tier, const Bandwidths& b) {
  switch (tier) {
    case ExpertTier::Gpu: return b.hbm_gbs;
    case ExpertTier::HostGpu: return b.pcie_gbs;
    case ExpertTier::HostCpu: return b.cpu_gbs;
  }
  return b.hbm_gbs;
}

// Expected activations of each expert per token: top_k × its share of the layer's routed tokens, or
// top_k / n_experts without statistics. Each layer's row sums to top_k.
std::vector<std::vector<double>> activations_per_token(const PlacementModel& m, const RoutingStats* stats) {
  std::vector<std::vector<double>> p(m.n_layers, std::vector<double>(m.n_experts, double(m.top_k) / m.n_experts));
  if (!stats) return p;
  for (int l = 0; l < m.n_layers; ++l) {
    int64_t sum = 0;
    for (int64_t c : stats->counts[l]) sum += c;
    for (int e = 0; e < m.n_experts; ++e) p[l][e] = double(m.top_k) * double(stats->counts[l][e]) / double(sum);
  }
  return p;
}

}  // namespace

Result<PlacementModel> placement_model_from_inventory(const ModelConfig& config, const Inventory& inv) {
  PlacementModel m;
  m.model_type = config.model_type;
  m.n_layers = config.n_layers;
  m.n_experts = config.n_experts;
  m.top_k = config.top_k;
  m.dense_nbytes = inv.dense_nbytes;
  m.dense_decode_nbytes_per_token = inv.dense_decode_nbytes_per_token;
  m.host_table_nbytes = inv.engram_table_nbytes;
  m.host_decode_nbytes_per_token = inv.engram_decode_nbytes_per_token;
  m.expert_nbytes = inv.expert_nbytes_by_layer;
  if (m.n_layers <= 0 || m.n_experts <= 0 || m.top_k <= 0 || m.top_k > m.n_experts)
    return make_error("the model has ", m.n_layers, " layers, ", m.n_experts, " routed experts and top_k ", m.top_k,
                      ": nothing to place");
  if (int(m.expert_nbytes.size()) != m.n_layers) return make_error("the inventory has no routed-expert bytes per layer");
  for (int l = 0; l < m.n_layers; ++l)
    for (int e = 0; e < m.n_experts; ++e)
      if (int(m.expert_nbytes[l].size()) != m.n_experts || m.expert_nbytes[l][e] <= 0)
        return make_error("the checkpoint has no tensors for routed expert ", e, " of layer ", l,
                          " (layers.", l, ".ffn.experts.", e, ".*): a placement needs every expert");
  return m;
}

Result<Placement> plan_placement(const PlacementModel& m, const PlacementRequest& request, const RoutingStats* stats,
                                 const std::string& stats_source) {
  SPW_TRY(check_request(request));
  SPW_CHECK(int(m.expert_nbytes.size()) == m.n_layers && m.n_experts > 0 && m.top_k > 0);
  if (stats) SPW_TRY(check_routing_stats(*stats, m.n_layers, m.n_experts, m.top_k, stats_source));

  Placement plan;
  plan.model_type = m.model_type;
  plan.n_layers = m.n_layers;
  plan.n_experts = m.n_experts;
  plan.top_k = m.top_k;
  plan.request = request;
  plan.from_stats = stats != nullptr;
  if (stats) {
    plan.stats_model = stats->model;
    plan.stats_n_tokens = stats->n_tokens;
  }

  const double reserved = (request.kv_gib + request.workspace_gib) * kGiB;
  const double budget = request.gpu_memory_gib * kGiB - reserved - double(m.dense_nbytes);
  if (budget < 0)
    return make_error("the dense weights (", gib(double(m.dense_nbytes)), ") + --kv-gib ", num(request.kv_gib),
                      " + --workspace-gib ", num(request.workspace_gib), " = ", gib(double(m.dense_nbytes) + reserved),
                      " do not fit --gpu-memory ", num(request.gpu_memory_gib),
                      " GiB: raise --gpu-memory or lower the reservations");
  plan.dense_nbytes = m.dense_nbytes;
  plan.expert_budget_nbytes = int64_t(budget);

  const auto p = activations_per_token(m, stats);
  // Order: activations per token (traffic saved per byte of HBM), then expert index, then layer.
  std::vector<std::pair<int, int>> order;  // (layer, expert)
  order.reserve(size_t(m.n_layers) * m.n_experts);
  for (int l = 0; l < m.n_layers; ++l)
    for (int e = 0; e < m.n_experts; ++e) order.emplace_back(l, e);
  std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    return std::make_tuple(-p[a.first][a.second], a.second, a.first) <
           std::make_tuple(-p[b.first][b.second], b.second, b.first);
  });

  const ExpertTier host = host_tier_for(request.host_tier, request.bandwidths);
  plan.tiers.assign(m.n_layers, std::vector<ExpertTier>(m.n_experts, host));
  int64_t left = plan.expert_budget_nbytes;
  for (const auto& [l, e] : order) {
    if (m.expert_nbytes[l][e] > left) continue;  // a smaller expert further down may still fit
    plan.tiers[l][e] = ExpertTier::Gpu;
    left -= m.expert_nbytes[l][e];
  }

  TierTotals& gpu = plan.totals[int(ExpertTier::Gpu)];
  gpu.resident_nbytes = m.dense_nbytes;
  gpu.nbytes_per_token = double(m.dense_decode_nbytes_per_token);
  TierTotals& pcie = plan.totals[int(ExpertTier::HostGpu)];
  pcie.resident_nbytes = m.host_table_nbytes;
  pcie.nbytes_per_token = double(m.host_decode_nbytes_per_token);
  for (int l = 0; l < m.n_layers; ++l)
    for (int e = 0; e < m.n_experts; ++e) {
      TierTotals& t = plan.totals[int(plan.tiers[l][e])];
      t.n_experts += 1;
      t.resident_nbytes += m.expert_nbytes[l][e];
      t.nbytes_per_token += p[l][e] * double(m.expert_nbytes[l][e]);
    }
  for (int t = 0; t < kNumExpertTiers; ++t) {
    TierTotals& tier = plan.totals[t];
    tier.seconds_per_token = tier.nbytes_per_token / (bandwidth_gbs(ExpertTier(t), request.bandwidths) * 1e9);
    plan.seconds_per_token += tier.seconds_per_token;
  }
  plan.tokens_per_s = plan.seconds_per_token > 0 ? 1.0 / plan.seconds_per_token : 0;
  return plan;
}

}  // namespace spw::runtime
